// Facts about a CUDA device (compute capability, SM count, opt-in shared memory, name, memory),
// queried once per device (one cudaGetDeviceProperties) and cached: the one source of device facts,
// for the launch paths, which read them on every call, and for query_cuda_device
// (llmq/device.hpp), their public view. The hot path is a cudaGetDevice and an acquire load; a
// launch path that runs once per layer per token must not repeat driver queries. Also the one-time
// raising of a kernel's dynamic shared-memory limit. Internal; CUDA sources only.
#pragma once

#include <cstdint>

#include "llmq/device.hpp"
#include "llmq/status.hpp"

namespace llmq::cuda {

// Plain data (copied on every launch without allocating).
struct DeviceFacts {
  int ordinal = 0, major = 0, minor = 0, sms = 0;
  int64_t smem_optin = 0;  // the most dynamic shared memory a block may opt in to, bytes
  int64_t global_memory_bytes = 0;
  char name[256] = {};
};

// How many CUDA devices this machine has. The driver is asked once per process, at the first
// device touch of any entry point (model loading, query_cuda_device, a tensor-parallel group), so
// a machine without a driver or GPU is told so in one message before anything else fails:
// kUnsupported "no CUDA driver or GPU on this machine (cudaErrorNoDevice)".
Status device_count(int* out);
// device_count's check, then whether `ordinal` is one of the devices (kInvalidArgument naming it).
Status check_device(int ordinal);
// check_device, then cudaSetDevice: how library code picks a device a caller named.
Status select_device(int ordinal);

// Device `ordinal`'s facts (cached per device after the first call; thread-safe). The ordinal must
// be a present device (query_cuda_device checks it for callers that take one from a user).
Status device_facts(int ordinal, DeviceFacts* out);
// The current device's.
Status current_device_facts(DeviceFacts* out);
// Whether the device has FP8 tensor cores (llmq/device.hpp has the rule).
inline bool has_fp8(const DeviceFacts& d) { return compute_capability_has_fp8(d.major, d.minor); }

// sm_90a machine code (wgmma, TMA) runs here (llmq/device.hpp has the rule).
inline bool has_sm90a(const DeviceFacts& d) { return compute_capability_has_sm90a(d.major, d.minor); }

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes) once per (device, kernel, bytes).
Status allow_dynamic_smem(const void* kernel, int bytes, int device);

}  // namespace llmq::cuda
