// Built when llmq is compiled without CUDA: the device queries report that there is no GPU.
#include "llmq/device.hpp"

namespace llmq {

Status query_cuda_device(int /*ordinal*/, CudaDeviceInfo* /*out*/) {
  return unsupported("this llmq was built without CUDA");
}

void set_programmatic_dependent_launch(bool /*enabled*/) {}  // no kernels to launch

}  // namespace llmq
