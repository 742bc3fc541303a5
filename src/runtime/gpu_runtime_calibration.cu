// GpuRuntime::begin_calibration / end_calibration (gpu_runtime.hpp): attach and detach the
// calibration observer (calibration_observer.hpp) that the forward pass feeds.
#include <cuda_runtime.h>

#include "llmq/calibration.hpp"
#include "runtime/gpu_runtime_impl.hpp"

namespace llmq {

Status GpuRuntime::begin_calibration() {
  Impl& g = *impl_;
  if (g.calibration) return invalid_argument("begin_calibration: already calibrating (end_calibration first)");
  // Paged steps replay CUDA graphs of their padded batches; skipped stages leave inputs unproduced.
  if (g.paged) return unsupported("calibration on the GPU: the runtime is paged (kv_blocks > 0); use fixed slots");
  if (g.kv_fp8)
    return unsupported("calibration on the GPU: the KV cache is E4M3 (its codes are not the keys and values); use a BF16 "
                       "KV cache");
  if (g.skip != 0)
    return unsupported("calibration on the GPU: skip_stages '" + g.options.skip_stages + "' leaves linears' inputs unproduced");
  return runtime::CalibrationObserver::create(*g.model, g.stream, &g.calibration);
}

Status GpuRuntime::end_calibration(CalibrationStats* stats) {
  Impl& g = *impl_;
  if (!g.calibration) return invalid_argument("end_calibration: not calibrating (begin_calibration first)");
  std::unique_ptr<runtime::CalibrationObserver> observer = std::move(g.calibration);  // detached whatever happens
  if (stats == nullptr) {
    LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g.stream));  // its buffers may still be read by queued kernels
    return {};
  }
  return observer->finish(g.stream, stats);
}

}  // namespace llmq
