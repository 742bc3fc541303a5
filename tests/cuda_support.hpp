// GPU test helpers: skip visibly without a device, assert CUDA calls, RAII device buffers with
// host<->device copies.
// Only test files built with CUDA include this (they are named test_cuda_*.cpp / .cu).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "llmq/device.hpp"

namespace llmq::testing {

// GTEST_SKIP()s the calling test, with the reason, when no FP8-capable GPU is present. The reason is
// the library's own words ("no CUDA driver or GPU on this machine (cudaErrorNoDevice)"), the same
// for every test, so that scripts/test counts these skips under one reason.
#define LLMQ_REQUIRE_GPU()                                                           \
  do {                                                                               \
    ::llmq::CudaDeviceInfo llmq_info_;                                               \
    const ::llmq::Status llmq_st_ = ::llmq::query_cuda_device(0, &llmq_info_);       \
    if (!llmq_st_.ok()) GTEST_SKIP() << llmq_st_.message();                          \
    if (!llmq_info_.supports_fp8()) GTEST_SKIP() << "a GPU without FP8 tensor cores: " << llmq_info_.name; \
  } while (0)

// ASSERT_EQ(call, cudaSuccess), naming the call and the CUDA error.
#define CUDA_ASSERT(call)                                                      \
  do {                                                                         \
    const cudaError_t err_ = (call);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #call << ": " << cudaGetErrorString(err_); \
  } while (0)

// An owning device buffer of `count` elements of T (ok() is false when the allocation failed).
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count_ > 0 && cudaMalloc(&ptr_, count_ * sizeof(T)) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return static_cast<T*>(ptr_); }
  bool ok() const { return count_ == 0 || ptr_ != nullptr; }
  cudaError_t upload(const T* host, size_t count) {
    return cudaMemcpy(ptr_, host, count * sizeof(T), cudaMemcpyHostToDevice);
  }
  cudaError_t upload(const std::vector<T>& host) { return upload(host.data(), host.size()); }
  cudaError_t download(std::vector<T>* host) const {
    host->resize(count_);
    return cudaMemcpy(host->data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost);
  }
  // Every byte set to `byte`: 0xFF gives BF16 NaN 0xFFFF and INT32 -1; 0x7F gives 0x7F7F.
  cudaError_t fill_bytes(int byte) { return cudaMemset(ptr_, byte, count_ * sizeof(T)); }

 private:
  void* ptr_ = nullptr;
  size_t count_ = 0;
};

}  // namespace llmq::testing
