// query_cuda_device (llmq/device.hpp): the public view of the cached device facts
// (cuda/device_facts.cuh); every call's status is checked.
#include <cuda_runtime.h>

#include "cuda/device_facts.cuh"
#include "llmq/device.hpp"

namespace llmq {

Status query_cuda_device(int ordinal, CudaDeviceInfo* out) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess)
    return {StatusCode::kUnsupported, std::string("no CUDA device: ") + cudaGetErrorString(err)};
  if (ordinal < 0 || ordinal >= count)
    return invalid_argument("device: ordinal " + std::to_string(ordinal) + " but " +
                            std::to_string(count) + " device(s) present");
  cuda::DeviceFacts f;
  LLMQ_RETURN_IF_ERROR(cuda::device_facts(ordinal, &f));
  out->name = f.name;
  out->major = f.major;
  out->minor = f.minor;
  out->multiprocessors = f.sms;
  out->global_memory_bytes = f.global_memory_bytes;
  return {};
}

}  // namespace llmq
