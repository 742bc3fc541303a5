// Device checks shared by every CUDA entry point, built with or without CUDA.
#include "llmq/device.hpp"

namespace llmq {

Status require_fp8_device(int ordinal) {
  CudaDeviceInfo info;
  LLMQ_RETURN_IF_ERROR(query_cuda_device(ordinal, &info));
  if (!info.supports_fp8())
    return unsupported("device " + std::to_string(ordinal) + " (" + info.name + ", sm_" +
                       std::to_string(info.major) + std::to_string(info.minor) +
                       ") has no FP8 tensor cores: FP8 kernels need sm_89 or newer");
  return {};
}

}  // namespace llmq
