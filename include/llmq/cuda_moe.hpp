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

// ---------------------------------------------------------------------------------------------
// The sparse top-k path: only the rows routed to an expert meet its weights. Every step runs on
// the device with no host sync (CUDA-graph capturable); an expert nobody routed to costs nothing.
//   route:   router logits -> top-k experts and renormalised weights per token, the per-expert row
//            ranges of the permuted (expert-major) order, and the permutation both ways
//   gather:  token rows (8-bit codes + scales) -> permuted rows, for the wgmma grouped GEMM
//   grouped GEMM (twice, SwiGLU + per-row quantize between them): permuted rows x their expert
//   combine: out[t] = sum_s weight[t, s] * y[row of (t, s)], the un-permute

namespace llmq {

// Routing, as the CPU reference (transformer.cpp), on logits + logit_bias: Mixtral / Qwen3-MoE
// (topk_softmax false) take the softmax over all experts, the top_k largest (ties to the lower
// expert id), their probabilities divided by their sum (summed in rank order) when renormalize;
// gpt-oss (topk_softmax) takes the top_k logits and a softmax over those k (in rank order). Either
// way the picks are listed in ascending expert id. Slot t * top_k + s is token t's s-th expert.
// The permuted order lists the slots of expert 0, then expert 1, ..., each in ascending slot order
// (deterministic).
struct MoeRouteArgs {
  int64_t tokens = 0;
  int64_t experts = 0;  // 1 .. 1024
  int64_t top_k = 0;    // 1 .. min(experts, 16)
  float* logits = nullptr;         // [tokens, experts] f32: the router GEMM's output, read (written when fused)
  int64_t logits_stride = 0;       // elements between rows; 0 means experts
  int32_t* topk_ids = nullptr;     // [tokens, top_k]
  float* topk_weights = nullptr;   // [tokens, top_k]
  int32_t* expert_offsets = nullptr;  // [experts + 1]: expert e owns permuted rows [off[e], off[e+1])
  int32_t* sorted_slots = nullptr;    // [tokens * top_k]: the slot at each permuted row
  int32_t* slot_rows = nullptr;       // [tokens * top_k]: the permuted row of each slot
  int32_t* row_tokens = nullptr;      // optional [tokens * top_k]: the token of each permuted row
  int32_t* row_experts = nullptr;     // optional [tokens * top_k]: the expert of each permuted row
  const float* logit_bias = nullptr;  // optional [experts]: the router's bias (gpt-oss)
  bool topk_softmax = false;          // gpt-oss: the top_k logits, then a softmax over those k
  bool renormalize = true;            // softmax then top_k: divide the k weights by their sum
  // The router GEMM done by the routing kernel itself (decode sizes: moe_route_computes_logits):
  // logits[t, e] = sum_k x[t, k] * router_w[e, k], BF16 operands, f32 accumulation, written to
  // `logits` (then an output, [tokens, experts]; logits_stride ignored). One launch instead of a
  // GEMM (two kernels at these sizes) and the routing.
  const void* router_x = nullptr;  // BF16 [tokens, dim], 16-byte aligned
  const void* router_w = nullptr;  // BF16 [experts, dim], 16-byte aligned
  int64_t dim = 0;
  // An arrival counter (one device word, zero before the first call; every call leaves it zero
  // again; calls that share it must not run concurrently). Required with router_w; otherwise
  // optional: with it the top-k of a larger batch is spread over CTAs, the last one ranking.
  uint32_t* arrivals = nullptr;
};
Status cuda_moe_route(const MoeRouteArgs& args, CudaStream stream);

// Whether cuda_moe_route takes the router GEMM for a step of this size (router_x / router_w):
// at most kMoeRouteFusedMaxTokens tokens, at most 256 experts, dim a multiple of 8.
inline constexpr int64_t kMoeRouteFusedMaxTokens = 8;
inline bool moe_route_computes_logits(int64_t tokens, int64_t experts, int64_t dim) {
  return tokens >= 1 && tokens <= kMoeRouteFusedMaxTokens && experts <= 256 && dim > 0 && dim % 8 == 0;
}

// dst_codes[p] = src_codes[sorted_slots[p] / top_k] (rows of `k` bytes), dst_scales likewise.
struct MoeGatherArgs {
  int64_t rows = 0;  // tokens * top_k
  int64_t top_k = 0;
  int64_t k = 0;     // bytes per row, a multiple of 16
  const void* src_codes = nullptr;
  const float* src_scales = nullptr;
  int64_t scales_per_row = 1;  // ceil(k / 128) for 1x128 block scales
  const int32_t* sorted_slots = nullptr;
  void* dst_codes = nullptr;
  float* dst_scales = nullptr;
};
Status cuda_moe_gather(const MoeGatherArgs& args, CudaStream stream);

// out[t, :] = sum over s (ascending) of topk_weights[t, s] * y[slot_rows[t * top_k + s], :], summed
// in f32, stored BF16. y is BF16 [tokens * top_k, n] (the second grouped GEMM's output).
// With bias (gpt-oss's down_proj biases, f32 [bias_experts, n]) each slot's expert output is
// y + bias[e - bias_first] before its weight, e = topk_ids[t * top_k + s]; experts outside
// [bias_first, bias_first + bias_experts) get none (expert parallelism: their rank adds it).
struct MoeCombineArgs {
  int64_t tokens = 0;
  int64_t top_k = 0;
  int64_t n = 0;
  const uint16_t* y = nullptr;
  const float* topk_weights = nullptr;
  const int32_t* slot_rows = nullptr;
  uint16_t* out = nullptr;  // BF16 [tokens, n]
  const float* bias = nullptr;
  const int32_t* topk_ids = nullptr;  // with bias
  int64_t bias_first = 0;
  int64_t bias_experts = 0;
};
Status cuda_moe_combine(const MoeCombineArgs& args, CudaStream stream);

// The grouped GEMM over experts: for expert e and its permuted rows p in [off[e], off[e+1]),
//   d[p, j] = bf16( acc * (a_scale[r] * w_scale[e * n + j]) ),  acc = sum_k A[r, k] * W[e, j, k],
// with r = a_rows[p] when a_rows is given (rows read in place: the decode kernel) or r = p.
// W: E4M3 [experts, n, k] (nn.Linear layout per expert), per-channel scales (a per-tensor scale
// is expanded by the caller). A: E4M3 with per-row scales (W8A8), or BF16 with a_scale null (W8A16,
// decode kernel only). BF16 experts (w_dtype kBF16, A BF16, no scales) run both kernels too: the
// BF16 baseline the FP8 experts are measured against.
enum class MoeGemmKernel {
  kAuto,    // decode when max_rows_per_expert <= kMoeDecodeMaxRows, else wgmma (sm_90) or decode
  kDecode,  // the decode GEMM's streaming kernel, one grid slice per (expert, 16-row chunk):
            // CTAs of empty experts and chunks exit before reading a byte
  kWgmma,   // persistent TMA + wgmma kernel over 128- or 64-row x 128 tiles of every expert (sm_90a);
            // FP32 accumulators promoted every 128 K (no FP8 fast-accumulation drift); a_rows unsupported
};
// Up to here the decode kernel: at 1 and 2 tokens it streams the routed experts' weights faster than
// the wgmma kernel's 64-row tiles, from 8 tokens slower on every shape measured (H200, one session:
// Mixtral 8 tokens 140 vs 124 us, gpt-oss-20b 88 vs 79, Qwen3-30B-A3B 71 vs 60; at 4, 122 vs 130
// for Mixtral, 49 vs 45 and 39 vs 34 for the other two).
inline constexpr int64_t kMoeDecodeMaxRows = 4;

struct MoeGroupedGemm {
  int64_t rows = 0;     // permuted rows (tokens * top_k): the extent of d and, without a_rows, of A
  int64_t experts = 0;
  int64_t n = 0;
  int64_t k = 0;        // a multiple of 16
  // An upper bound on any expert's rows (the token count: a token meets an expert at most once);
  // sizes the decode kernel's grid and picks the kernel.
  int64_t max_rows_per_expert = 0;
  const int32_t* expert_offsets = nullptr;  // device [experts + 1] (cuda_moe_route's)
  const void* a = nullptr;
  DType a_dtype = DType::kE4M3;    // kE4M3 or kBF16 (decode kernel)
  const int32_t* a_rows = nullptr; // [rows] or null
  int64_t a_rows_count = 0;        // rows of A when a_rows is given
  const float* a_scale = nullptr;  // [rows of A]; null for BF16 A
  const void* w = nullptr;         // [experts, n, k]
  DType w_dtype = DType::kE4M3;    // kE4M3, or kBF16 (BF16 experts: A BF16 too, no scales)
  const float* w_scale = nullptr;  // [experts, n]; null for BF16 weights
  // 128x128 weight blocks and 1x128 activation blocks (DeepSeek-style fp8-block): w_scale is
  // [experts, n / 128, ceil(k / 128)] (n a multiple of 128), a_scale [rows of A, ceil(k / 128)];
  // both kernels apply them per K block (the wgmma kernel per 128, the decode kernel per 64).
  bool block_scales = false;
  // Per-channel FP8 experts in the wgmma kernel: accumulate over all of K in the tensor core's own
  // accumulator (fewer bits than FP32) instead of promoting every 128 of K, like cuBLASLt's FAST_ACCUM
  // (CudaGemmOptions::fp8_fast_accumulation). The decode kernel's accumulation does not change.
  bool fast_accumulation = false;
  uint16_t* d = nullptr;           // BF16 [rows, n]
  // Decode kernel: 16-row tiles per CTA (1, 2, 3 or 4); 0 lets the planner choose. A tuning knob for
  // benchmarks (bench_cuda_moe_sparse --decode-tiles); the planner's choice is measured best.
  int decode_tiles_per_cta = 0;
  // wgmma kernel: tiles of 64 or 128 rows; 0: moe_wgmma_block_rows(rows, experts). Set by callers
  // that know better (expert parallelism: all the rows over all the experts, not this rank's), by
  // tests, and by bench_cuda_moe_sparse's wg-r64 / wg-r128 rows.
  int64_t wgmma_block_rows = 0;
  // wgmma kernel: tiles of 128 or 192 columns (192: per-channel FP8 experts in 128-row tiles); 0:
  // moe_wgmma_block_cols for per-channel FP8, else 128. Set by tests and by bench_cuda_moe_sparse's
  // wg-c128 / wg-c192 rows.
  int64_t wgmma_block_cols = 0;
};
// The one rule for the wgmma kernel's tile height: 64 rows where `rows` over `experts` average at
// most 64 (the routing's per-expert counts stay on the device), else 128.
int64_t moe_wgmma_block_rows(int64_t rows, int64_t experts);
// The one rule for the wgmma kernel's tile width (per-channel FP8 experts in 128-row tiles): 192
// columns where `rows` over `experts` average at least 256 (prefill) and n >= 192, else 128.
int64_t moe_wgmma_block_cols(int64_t rows, int64_t experts, int64_t n);
Status cuda_moe_grouped_gemm(const MoeGroupedGemm& g, CudaStream stream, MoeGemmKernel kernel = MoeGemmKernel::kAuto);
// The one rule for kAuto: the decode kernel when any expert gets at most kMoeDecodeMaxRows rows, when
// A is read in place through a_rows or in another type than the weights, or where sm_90a code cannot
// run; the wgmma kernel otherwise. The runtime asks it before laying out the rows (in place for
// the decode kernel, gathered for wgmma).
MoeGemmKernel moe_gemm_kernel_for(int64_t max_rows_per_expert, bool rows_in_place, bool same_types, int sm_major,
                                  int sm_minor);
// The kernel kAuto picks for g on the current device (for reports).
MoeGemmKernel cuda_moe_grouped_gemm_kernel(const MoeGroupedGemm& g);
const char* moe_gemm_kernel_name(MoeGemmKernel kernel);  // "auto", "decode", "wgmma"

}  // namespace llmq
