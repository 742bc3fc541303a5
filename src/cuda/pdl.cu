// pdl_enabled (pdl.cuh): whether kernels launched through launch_pdl may overlap their predecessor;
// set_programmatic_dependent_launch (llmq/device.hpp) turns it off for the process.
#include <atomic>

#include "cuda/device_facts.cuh"
#include "cuda/pdl.cuh"
#include "llmq/device.hpp"

namespace llmq {
namespace {
std::atomic<bool> g_pdl_allowed{true};
}  // namespace

void set_programmatic_dependent_launch(bool enabled) { g_pdl_allowed.store(enabled); }

namespace detail {

bool pdl_enabled() {
  if (!g_pdl_allowed.load(std::memory_order_relaxed)) return false;
  cuda::DeviceFacts dev;  // cached per device; PDL (griddepcontrol) is sm_90 and newer
  return cuda::current_device_facts(&dev).ok() && dev.major >= 9;
}

}  // namespace detail
}  // namespace llmq
