// Mixture-of-experts GEMMs on the GPU. The dense path (the FP8 MoE note): every expert's GEMM in ONE
// strided-batched cuBLASLt FP8 matmul (CudaGemmRunner with batch = experts, the activations
// shared_across_batch, unit scales: a strided call cannot carry a scale per batch entry), then
// cuda_moe_post_scale applies token_scale[t] * expert_scale[e] (or the expert's per-channel
// vector) in one pass. BF16's relative rounding error does not depend on the value's magnitude,
// so scaling after the GEMM is as exact as scaling in its epilogue (test_cuda_moe.cu shows it).
// No CUDA headers here.
#pragma once

#include <cstdint>

#include "llmq/cuda_stream.hpp"
#include "llmq/dtype.hpp"
#include "llmq/status.hpp"

namespace llmq {

// out[e, t, n] = y[e, t, n] * token_scales[t] * expert_scales[e] (per_channel: [e * n_cols + n]).
// y is the unscaled batched GEMM output [experts, tokens, n_cols] (row stride n_cols, expert
// stride tokens * n_cols), F32 or BF16; out is BF16 in the same layout and may be y itself when y
// is BF16. All pointers are device memory.
struct MoePostScale {
  int64_t experts = 0;
  int64_t tokens = 0;
  int64_t n_cols = 0;
  const void* y = nullptr;
  DType y_dtype = DType::kF32;       // kF32 or kBF16
  const float* token_scales = nullptr;   // [tokens]; null means 1 (per-tensor activations folded in elsewhere)
  const float* expert_scales = nullptr;  // [experts] or [experts, n_cols]; required
  bool per_channel = false;
  void* out = nullptr;               // BF16 [experts, tokens, n_cols]
};

Status cuda_moe_post_scale(const MoePostScale& p, CudaStream stream);

}  // namespace llmq
