// CUDA device facts llmq needs before choosing a kernel (FP8 needs sm_89+). No CUDA headers here.
#pragma once

#include <string>

#include "llmq/status.hpp"

namespace llmq {

// What a compute capability can run: the one place each rule is written.
// FP8 tensor-core math (cuBLASLt E4M3/E5M2 matmuls, mma.e4m3): sm_89 (Ada) and newer.
constexpr bool compute_capability_has_fp8(int major, int minor) { return major > 8 || (major == 8 && minor >= 9); }
// sm_90a machine code (wgmma, TMA, clusters as llmq uses them) runs on compute capability 9.0 only.
constexpr bool compute_capability_has_sm90a(int major, int minor) { return major == 9 && minor == 0; }

struct CudaDeviceInfo {
  std::string name;
  int major = 0;
  int minor = 0;
  int multiprocessors = 0;
  long long global_memory_bytes = 0;
  bool supports_fp8() const { return compute_capability_has_fp8(major, minor); }
};

// Fails with kUnsupported when llmq was built without CUDA or the machine has no CUDA driver or
// GPU ("no CUDA driver or GPU on this machine (cudaErrorNoDevice)"), with kInvalidArgument when
// `ordinal` is not one of its devices.
Status query_cuda_device(int ordinal, CudaDeviceInfo* out);

// The standard check before an FP8 kernel: ok on sm_89+, a clear error otherwise.
Status require_fp8_device(int ordinal);

// Programmatic dependent launch (sm_90+: a kernel may start while the one before it drains, which
// hides launch gaps in a decode step) is on wherever the device has it. Turning it off applies to
// the whole process, for kernels launched afterwards: it exists to measure what PDL buys
// (`llmq bench e2e --pdl off`).
void set_programmatic_dependent_launch(bool enabled);

}  // namespace llmq
