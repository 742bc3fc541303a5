// Facts about the current CUDA device that launch paths need on every call (compute capability,
// SM count, opt-in shared memory), queried once per device and cached, and the one-time raising of
// a kernel's dynamic shared-memory limit. Driver queries are system calls; a launch path that
// runs once per layer per token must not repeat them. Internal; CUDA sources only.
#pragma once

#include <cstdint>

#include "llmq/device.hpp"
#include "llmq/status.hpp"

namespace llmq::cuda {

struct DeviceFacts {
  int ordinal = 0, major = 0, minor = 0, sms = 0;
  int64_t smem_optin = 0;  // the most dynamic shared memory a block may opt in to, bytes
};

// The current device's facts (cached per device after the first call; thread-safe).
Status current_device_facts(DeviceFacts* out);

// sm_90a machine code (wgmma, TMA) runs here (llmq/device.hpp has the rule).
inline bool has_sm90a(const DeviceFacts& d) { return compute_capability_has_sm90a(d.major, d.minor); }

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes) once per (device, kernel, bytes).
Status allow_dynamic_smem(const void* kernel, int bytes, int device);

}  // namespace llmq::cuda
