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
  constexpr int kMaxDevices = 64;
  static int state[kMaxDevices] = {};  // 0 unknown, 1 off, 2 on; a race only repeats the query
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return false;
  if (state[device] == 0) {
    cuda::DeviceFacts dev;  // PDL (griddepcontrol) is sm_90 and newer
    state[device] = (cuda::current_device_facts(&dev).ok() && dev.major >= 9) ? 2 : 1;
  }
  return state[device] == 2;
}

}  // namespace detail
}  // namespace llmq
