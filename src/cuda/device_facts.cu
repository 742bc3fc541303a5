// src/cuda/device_facts.cuh: the caches behind the per-launch device queries.
#include "cuda/device_facts.cuh"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <tuple>

#include "cuda/cuda_check.cuh"

namespace llmq::cuda {

namespace {

constexpr int kMaxCachedDevices = 64;
struct Slot {
  std::atomic<bool> ready{false};
  DeviceFacts facts;
};
Slot g_slots[kMaxCachedDevices];
std::mutex g_slots_mutex;

Status query(int ordinal, DeviceFacts* f) {
  cudaDeviceProp prop{};
  LLMQ_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
  f->ordinal = ordinal;
  f->major = prop.major;
  f->minor = prop.minor;
  f->sms = prop.multiProcessorCount;
  f->smem_optin = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
  f->global_memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  std::snprintf(f->name, sizeof f->name, "%s", prop.name);
  return {};
}

}  // namespace

Status device_count(int* out) {
  static int count = 0;
  // Initialized once per process, thread-safely (a function-local static).
  static const Status status = [] {
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky, but leave no error behind for a later check
      count = 0;
      return detail::cuda_status(err, "cudaGetDeviceCount");
    }
    return count == 0 ? detail::cuda_no_gpu_status(cudaErrorNoDevice) : Status();
  }();
  *out = count;
  return status;
}

Status check_device(int ordinal) {
  int count = 0;
  LLMQ_RETURN_IF_ERROR(device_count(&count));
  if (ordinal < 0 || ordinal >= count)
    return invalid_argument("CUDA device " + std::to_string(ordinal) + " does not exist on this machine (" +
                            std::to_string(count) + " present)");
  return {};
}

Status select_device(int ordinal) {
  LLMQ_RETURN_IF_ERROR(check_device(ordinal));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  return {};
}

Status device_facts(int ordinal, DeviceFacts* out) {
  if (ordinal < 0 || ordinal >= kMaxCachedDevices) return query(ordinal, out);
  Slot& s = g_slots[ordinal];
  if (!s.ready.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(g_slots_mutex);
    if (!s.ready.load(std::memory_order_relaxed)) {
      LLMQ_RETURN_IF_ERROR(query(ordinal, &s.facts));
      s.ready.store(true, std::memory_order_release);
    }
  }
  *out = s.facts;
  return {};
}

Status current_device_facts(DeviceFacts* out) {
  int device = 0;
  LLMQ_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  return device_facts(device, out);
}

Status allow_dynamic_smem(const void* kernel, int bytes, int device) {
  static std::mutex mu;
  static std::set<std::tuple<int, const void*, int>> done;
  const auto key = std::make_tuple(device, kernel, bytes);
  std::lock_guard<std::mutex> lock(mu);
  if (done.count(key) != 0) return {};
  LLMQ_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.insert(key);
  return {};
}

}  // namespace llmq::cuda
