// Device queries through the CUDA runtime; every call's status is checked.
#include <cuda_runtime.h>

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
  cudaDeviceProp prop{};
  err = cudaGetDeviceProperties(&prop, ordinal);
  if (err != cudaSuccess)
    return {StatusCode::kCudaError, std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(err)};
  out->name = prop.name;
  out->major = prop.major;
  out->minor = prop.minor;
  out->multiprocessors = prop.multiProcessorCount;
  out->global_memory_bytes = static_cast<long long>(prop.totalGlobalMem);
  return {};
}

}  // namespace llmq
