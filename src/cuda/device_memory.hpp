// Owning device allocations for the GPU runtime (no CUDA headers: the runtime's host-side structs
// hold these). An allocation that fails says what it was for, how many bytes it wanted and how
// many the device had free, so "does not fit" reads as a sentence, not as error 2.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "llmq/status.hpp"

namespace llmq::cuda {

class DeviceAllocation {
 public:
  DeviceAllocation() = default;
  ~DeviceAllocation();
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;
  DeviceAllocation(DeviceAllocation&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceAllocation& operator=(DeviceAllocation&& o) noexcept;

  // cudaMalloc on the current device; `what` names the buffer in the error.
  static Status allocate(int64_t bytes, const std::string& what, DeviceAllocation* out);
  // allocate + a synchronous copy of `bytes` host bytes.
  static Status upload(const void* host, int64_t bytes, const std::string& what, DeviceAllocation* out);

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  int64_t bytes() const { return bytes_; }
  bool empty() const { return ptr_ == nullptr; }
  void reset();

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

// "3.2 GB" style, for errors and reports.
std::string format_bytes(int64_t bytes);

// Free and total bytes of the current device.
Status device_memory_info(int64_t* free_bytes, int64_t* total_bytes);

}  // namespace llmq::cuda
