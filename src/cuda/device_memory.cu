// DeviceAllocation (device_memory.hpp): cudaMalloc / cudaFree with errors that name the buffer.
#include <cuda_runtime.h>

#include <cstdio>

#include "cuda/cuda_check.cuh"
#include "cuda/device_memory.hpp"

namespace llmq::cuda {

DeviceAllocation::~DeviceAllocation() { reset(); }

DeviceAllocation& DeviceAllocation::operator=(DeviceAllocation&& o) noexcept {
  if (this != &o) {
    reset();
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void DeviceAllocation::reset() {
  // cudaFree fails only for a pointer it did not hand out, which this class never holds.
  if (ptr_ != nullptr) (void)cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

std::string format_bytes(int64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (b >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6) std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  else std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(bytes));
  return buf;
}

Status device_memory_info(int64_t* free_bytes, int64_t* total_bytes) {
  size_t f = 0, t = 0;
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&f, &t));
  *free_bytes = static_cast<int64_t>(f);
  *total_bytes = static_cast<int64_t>(t);
  return {};
}

Status DeviceAllocation::allocate(int64_t bytes, const std::string& what, DeviceAllocation* out) {
  out->reset();
  if (bytes < 0) return invalid_argument(what + ": negative size " + std::to_string(bytes));
  if (bytes == 0) return {};
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, static_cast<size_t>(bytes));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error state of the runtime API
    size_t f = 0, t = 0;
    (void)cudaMemGetInfo(&f, &t);
    return {StatusCode::kCudaError, what + ": cannot allocate " + format_bytes(bytes) + " on the GPU (" +
                                        format_bytes(static_cast<int64_t>(f)) + " free of " +
                                        format_bytes(static_cast<int64_t>(t)) + "): " + cudaGetErrorString(err)};
  }
  out->ptr_ = p;
  out->bytes_ = bytes;
  return {};
}

Status DeviceAllocation::upload(const void* host, int64_t bytes, const std::string& what, DeviceAllocation* out) {
  LLMQ_RETURN_IF_ERROR(allocate(bytes, what, out));
  if (bytes > 0) LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpy(out->get(), host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice));
  return {};
}

}  // namespace llmq::cuda
