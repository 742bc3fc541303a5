// Programmatic dependent launch (PDL, sm_90): a kernel launched with the programmatic-stream-
// serialization attribute may start while the kernel before it on the stream is still running;
// it must execute griddepcontrol.wait before it touches anything that kernel writes (the wait
// returns once the previous grid has completed and its memory is visible). Its own
// griddepcontrol.launch_dependents lets the next such kernel be scheduled early in turn. In a
// decode step of a few hundred short kernels this hides each launch and each grid's ramp-up
// behind the kernel before it. Internal header; CUDA sources only.
//
// Rule kept by every caller: a kernel launched through launch_pdl calls pdl_wait() before reading
// or writing memory that earlier work on the stream touches. Kernels launched without it are
// ordinary stream-ordered launches (they wait for everything before them).
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace llmq::detail {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// PDL on the current device: sm_90 or newer, unless set_programmatic_dependent_launch(false) turned
// it off (for A/B timing). Asked of the driver once per device.
bool pdl_enabled();

// The launch attribute to add to a cudaLaunchConfig_t (value 0 when PDL is off, which is the
// ordinary launch).
inline cudaLaunchAttribute pdl_attribute() {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  return a;
}

template <typename... KernelArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  cudaLaunchAttribute attr[1] = {pdl_attribute()};
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace llmq::detail
