// query_cuda_device (llmq/device.hpp): the public view of the cached device facts
// (cuda/device_facts.cuh); every call's status is checked.
#include "cuda/device_facts.cuh"
#include "llmq/device.hpp"

namespace llmq {

Status query_cuda_device(int ordinal, CudaDeviceInfo* out) {
  LLMQ_RETURN_IF_ERROR(cuda::check_device(ordinal));
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
