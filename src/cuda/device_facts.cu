// src/cuda/device_facts.cuh: the caches behind the per-launch device queries.
#include "cuda/device_facts.cuh"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "cuda/cuda_check.cuh"

namespace llmq::cuda {

Status current_device_facts(DeviceFacts* out) {
  static std::mutex mu;
  static std::map<int, DeviceFacts> cache;
  int device = 0;
  LLMQ_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(device);
  if (it == cache.end()) {
    DeviceFacts f;
    f.ordinal = device;
    int optin = 0;
    LLMQ_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&f.major, cudaDevAttrComputeCapabilityMajor, device));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&f.minor, cudaDevAttrComputeCapabilityMinor, device));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, device));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    f.smem_optin = optin;
    it = cache.emplace(device, f).first;
  }
  *out = it->second;
  return {};
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
