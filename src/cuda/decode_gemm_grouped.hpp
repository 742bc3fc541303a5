// The decode GEMM in grouped mode: one launch runs many weight matrices (a grid slice per
// (group, 16-row chunk)), each CTA reading its group's row range before it touches anything, so
// only the groups that hold rows stream their weights. MoE's decode-size expert GEMM
// (moe/moe_decode_gemm.cu) is its user; the groups are experts there. Internal; no CUDA headers.
#pragma once

#include <cstdint>

#include "llmq/cuda_decode_gemm.hpp"

namespace llmq::decode_gemm {

// What grouped mode adds to a launch.
struct GroupLaunch {
  const int32_t* offsets = nullptr;  // [experts + 1]: the groups' first rows (device)
  const int32_t* rows = nullptr;     // A row of each permuted row, or null (A is permuted already)
  int64_t w_stride = 0;              // bytes between groups' weights
  int64_t w_scale_stride = 0;        // floats between groups' scales
  int experts = 0;
  int slices = 0;  // grid z: at least the number of 16-row chunks any routing can make
  int64_t busy_slices = 1;  // of which at least this many hold rows (plans the waves)
  bool w16 = false;  // BF16 x BF16, the problem in bytes (kW16)
  bool block = false;  // 128x128 / 1x128 block scales (kBlock)
  int scale_k_blocks = 0;
};

// The plain decode GEMM when group is null.
Status launch(const DecodeGemmProblem& p, CudaStream stream, const DecodeGemmConfig& config, const GroupLaunch* group);

}  // namespace llmq::decode_gemm
