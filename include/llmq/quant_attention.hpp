// The CPU specification of llmq's 8-bit flash attention (INT-FlashAttention and its relatives): the
// forward pass of grouped-query attention, causal or not, computed tile by tile the way the GPU
// kernels compute it: an online softmax over KV tiles in the log2 domain, P quantized per tile, the
// row sum l taken from the quantized P (so P's scale cancels), one final division. Each variant
// quantizes its float inputs itself, with the quantizers the runtime uses (per-token absmax, round
// to nearest even), so the GPU kernels can be held to it. The float variant is the ground truth.
//
// Layouts: q [q_len, heads, head_dim], k and v [kv_len, kv_heads, head_dim], out like q, all float.
// Query row i sits at position kv_len - q_len + i (a prefill after a cached prefix), and the causal
// mask lets it see KV positions <= its own. heads is a multiple of kv_heads (GQA).
#pragma once

#include <cstdint>
#include <string>

#include "llmq/status.hpp"

namespace llmq {

enum class AttentionVariant {
  kFloat,     // float32 inputs, softmax(Q K^T * scale) V with double accumulation: the ground truth
  kBf16,      // BF16 Q, K, V and P, FP32 accumulation (FlashAttention-2/3 BF16)
  kHalfInt8,  // INT8 Q and K; BF16 V and P
  kFullInt8,  // INT8 Q, K and V; P = round(p_max * 2^(s - m)) as an integer; S and P*V exact in INT32
  kFp8,       // E4M3 Q, K, V and P; P = e4m3(2^(s - m + p_offset)) (FlashAttention-3's FP8)
};
const char* attention_variant_name(AttentionVariant v);  // "float", "bf16", "half-int8", "int8", "fp8"
Status parse_attention_variant(const std::string& name, AttentionVariant* out);

enum class QkScaling { kPerToken, kPerTensor };               // one scale per (token, head), or per tensor
enum class VScaling { kPerTensor, kPerChannel, kPerBlock };  // per tensor, per channel, per (KV tile, channel)

struct QuantAttentionOptions {
  AttentionVariant variant = AttentionVariant::kFullInt8;
  QkScaling qk_scaling = QkScaling::kPerToken;
  VScaling v_scaling = VScaling::kPerTensor;  // INT8 and FP8 V
  bool smooth_k = false;    // subtract K's per-channel mean over the KV tokens (per KV head) first:
                            // every score of a query row shifts by the same q . mean, softmax does not
  int p_max = 127;          // full-INT8 P levels: 127 (the paper, signed P) or 255 (unsigned P x signed V)
  // Full-INT8 P against the tile's own row maximum instead of the running one: P = round(p_max *
  // 2^(s - m_tile)) and the tile's P*V and row sum carry 2^(m_tile - m). A tile whose scores all lie
  // below the running maximum then still gets all p_max levels (the paper's P flushes every value
  // under 1/(2 p_max) of the running maximum to 0).
  bool p_tile_max = false;
  float p_offset = 8.0f;    // FP8 P: 2^p_offset is P's largest value (<= 448, E4M3's maximum)
  int64_t block_kv = 64;    // KV tile: the online-softmax step, P's quantization unit and the V block
};

// The options the GPU kernels implement for each variant (cuda_attention_int8.hpp): half-INT8 as
// the paper; full-INT8 with V per (64-key block, channel), unsigned P (255 levels) against the
// tile's row maximum; FP8 with V per block and P against the running maximum. kFloat / kBf16:
// plain options of that variant. block_kv is the mma.sync kernels' 64; the Hopper kernel runs the
// same options with block_kv = 128 (its tile and V block: cuda_attention_v_block), and for FP8
// with V per channel (VScaling::kPerChannel; cuda_attention_v_block gives 0).
QuantAttentionOptions kernel_attention_options(AttentionVariant v);

struct AttentionProblem {
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  bool causal = true;
  float softmax_scale = 0.0f;  // 0: 1 / sqrt(head_dim)
  // Sliding window (transformers' sliding_window): query row i (position pos) sees KV position t
  // only if pos - window < t <= pos. 0: no window; > 0 needs causal. The tiled variants keep their
  // KV tiles at multiples of block_kv (so V's block scales do not move) and skip the tiles wholly
  // before the window.
  int64_t window = 0;
  // Attention sinks (gpt-oss): host [heads] f32, one logit s_h per query head that joins the softmax
  // denominator without a value: out = sum_t e^(x_t - m) v_t / (sum_t e^(x_t - m) + e^(s_h - m)),
  // x_t = softmax_scale * q . k_t, m = max(max_t x_t, s_h); s_h is not multiplied by softmax_scale.
  // The tiled variants add it once at the final division, in P's units against the running
  // maximum m (log2 domain): l + u * 2^(s_h * log2(e) - m) with u = p_max (full INT8), 2^p_offset
  // (FP8) or 1 (BF16, half-INT8); it is not quantized. null: no sink.
  const float* sinks = nullptr;
};

// out = attention(q, k, v) under `options`. Errors name the bad field. `threads` <= 0: hardware
// concurrency (the work is split over heads).
Status quant_attention_reference(const AttentionProblem& p, const QuantAttentionOptions& options, const float* q,
                                 const float* k, const float* v, float* out, int threads = 0);

// Error of `got` against `want` (n elements):
//   mre      mean of |got - want| / |want| over elements with |want| >= 0.1 x mean |want| (nearer zero
//            the ratio is unbounded; `mre_excluded` says how many were left out)
//   rel_l1   sum |got - want| / sum |want|
//   cosine   <got, want> / (|got| |want|)
//   rmse     sqrt(mean (got - want)^2)
struct AttentionError {
  double mre = 0, rel_l1 = 0, cosine = 0, rmse = 0, max_abs = 0;
  int64_t mre_excluded = 0;
};
AttentionError attention_error(const float* got, const float* want, int64_t n);

}  // namespace llmq
