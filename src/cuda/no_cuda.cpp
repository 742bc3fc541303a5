// Built when llmq is compiled without CUDA (CMakeLists.txt picks this file instead of the .cu
// sources): the device queries report that there is no GPU, and the GEMM runner refuses to run.
#include <memory>

#include "llmq/cuda_gemm.hpp"
#include "llmq/device.hpp"

namespace llmq {

Status query_cuda_device(int /*ordinal*/, CudaDeviceInfo* /*out*/) {
  return unsupported("this llmq was built without CUDA");
}

void set_programmatic_dependent_launch(bool /*enabled*/) {}  // no kernels to launch

// The cuBLASLt runner (cuda_gemm.hpp) exists so that callers compile, and says why it cannot run.
struct CudaGemmRunner::Impl {};
CudaGemmRunner::CudaGemmRunner() = default;
CudaGemmRunner::~CudaGemmRunner() = default;
Status CudaGemmRunner::create(int /*device_ordinal*/, std::unique_ptr<CudaGemmRunner>* /*out*/) {
  return unsupported("this llmq was built without CUDA");
}
Status CudaGemmRunner::create(int /*device_ordinal*/, const CudaGemmOptions& /*options*/,
                              std::unique_ptr<CudaGemmRunner>* /*out*/) {
  return unsupported("this llmq was built without CUDA");
}
Status CudaGemmRunner::can_implement(const CudaGemmProblem& /*p*/) const {
  return unsupported("this llmq was built without CUDA");
}
int64_t CudaGemmRunner::workspace_size(const CudaGemmProblem& /*p*/) const { return 0; }
Status CudaGemmRunner::run(const CudaGemmProblem& /*p*/, void* /*workspace*/,
                           int64_t /*workspace_bytes*/, CudaStream /*stream*/) {
  return unsupported("this llmq was built without CUDA");
}
int CudaGemmRunner::device_ordinal() const { return -1; }
const CudaGemmOptions& CudaGemmRunner::options() const {
  static const CudaGemmOptions none;
  return none;
}
int64_t CudaGemmRunner::heuristic_queries() const { return 0; }
int64_t CudaGemmRunner::cached_plans() const { return 0; }
int64_t CudaGemmRunner::tuned_shapes() const { return 0; }

}  // namespace llmq
