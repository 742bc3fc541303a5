// pdl_enabled (pdl.cuh): whether kernels launched through launch_pdl may overlap their predecessor.
#include <cstdlib>
#include <cstring>

#include "cuda/pdl.cuh"

namespace llmq::detail {

bool pdl_enabled() {
  constexpr int kMaxDevices = 64;
  static int state[kMaxDevices] = {};  // 0 unknown, 1 off, 2 on; a race only repeats the query
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return false;
  if (state[device] == 0) {
    int major = 0;
    const char* env = std::getenv("LLMQ_PDL");
    const bool off = env != nullptr && std::strcmp(env, "0") == 0;
    const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess;
    state[device] = (!off && ok && major >= 9) ? 2 : 1;
  }
  return state[device] == 2;
}

}  // namespace llmq::detail
