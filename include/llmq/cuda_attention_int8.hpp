// 8-bit flash attention on CUDA (issue 10): the forward pass of grouped-query attention with INT8
// Q and K, held to the CPU specification in quant_attention.hpp. First kernel: half-INT8 (INT8 Q, K
// with per-token scales; BF16 V and P), mma.sync on sm_80+: S = Q K^T as INT8 products summed
// exactly in INT32, one multiply per score by sq * sk, then the BF16 flash-attention P V. Second:
// full-INT8 (INT8 V too, P as unsigned 8-bit), see cuda_full_int8_attention.
// All pointers are device pointers; no CUDA headers here.
#pragma once

#include <cstdint>

#include "llmq/cuda_stream.hpp"
#include "llmq/status.hpp"

namespace llmq {

struct HalfInt8AttentionArgs {
  int64_t q_len = 0;     // query i sits at position kv_len - q_len + i
  int64_t kv_len = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;  // heads is a multiple of it (GQA)
  int64_t head_dim = 0;  // 64 or 128
  bool causal = true;
  float softmax_scale = 0.0f;  // 0: 1 / sqrt(head_dim)
  const int8_t* q = nullptr;       // [q_len, heads, head_dim]
  const float* q_scale = nullptr;  // [heads, q_len]
  const int8_t* k = nullptr;       // [kv_len, kv_heads, head_dim]
  const float* k_scale = nullptr;  // [kv_heads, kv_len]
  const uint16_t* v = nullptr;     // BF16 [kv_len, kv_heads, head_dim]
  uint16_t* out = nullptr;         // BF16 [q_len, heads, head_dim]
  // Sliding window and attention sinks, as the specification's AttentionProblem has them
  // (quant_attention.hpp): query i (position pos) sees keys pos - window < t <= pos (0: no window,
  // > 0 needs causal; key tiles wholly before a CTA's windows are skipped); sinks: device [heads]
  // f32 logits added once to each row's softmax denominator (not scaled by softmax_scale), or null.
  // Every kernel here (half-INT8, full-INT8, FP8, mma.sync and Hopper) implements both.
  int64_t window = 0;
  const float* sinks = nullptr;
};

Status cuda_half_int8_attention(const HalfInt8AttentionArgs& a, CudaStream stream);

// Full-INT8 (llmq's variant of the specification: QuantAttentionOptions{kFullInt8, V kPerBlock,
// p_max 255, p_tile_max, block_kv = v_block}): INT8 V with one scale per (v_block-key tile, channel), P in
// [0, 255] against the tile's row maximum, P V as u8 x s8 products summed exactly in INT32.
// V is given token-major (v) or already transposed into the kernels' layout (v_t, which
// cuda_quantize_attention_inputs writes); with v_t, d = 128 and an sm_90a device, the Hopper
// kernel (wgmma, TMA) runs, else the mma.sync kernel (which needs v).
// v_block: keys per V scale block, which is also the kernel's key tile (the specification's
// block_kv): 64, or 128 for the Hopper kernel (which runs only with 128: its tile; wgmma at N = 64
// and a fold of P V into O every 64 keys cost it a third of its speed).
// cuda_attention_v_block says which one the current device runs fastest.
// v_block 0 (FP8 only, the Hopper kernel): one scale per (kv head, channel) over all keys (the
// specification's VScaling::kPerChannel with block_kv 128). P V then accumulates into O inside the
// tensor core across tiles, which the per-tile scales prevent (FlashAttention-3's schedule).
struct FullInt8AttentionArgs {
  HalfInt8AttentionArgs qk;        // q_len .. q_scale, k, k_scale, out as above; qk.v unused
  const int8_t* v = nullptr;       // [kv_len, kv_heads, head_dim], or null when v_t is given
  const int8_t* v_t = nullptr;     // [kv_heads, head_dim, attention_v_t_stride(kv_len)], see below
  const float* v_scale = nullptr;  // [kv_heads, ceil(kv_len / v_block), head_dim]; v_block 0: [kv_heads, head_dim]
  int64_t v_block = 64;
};

// The transposed V layout (v_t): row (kv head g, channel c) holds that channel's codes of every key,
// key j in column attention_v_t_column(j); columns that hold no key (in the last 128 columns) hold
// zeros. Within each group
// of 32 keys the order is the one in which the P fragments of the score accumulators reach the P V
// product (see int8_attention.cu), so the kernels read V^T tiles without permuting them.
constexpr int64_t attention_v_t_stride(int64_t kv_len) { return (kv_len + 127) / 128 * 128; }
constexpr int64_t attention_v_t_column(int64_t key) {
  const int64_t p = key % 32;
  return key - p + 16 * (p / 16) + 4 * ((p % 8) / 2) + 2 * ((p % 16) / 8) + p % 2;
}
Status cuda_full_int8_attention(const FullInt8AttentionArgs& a, CudaStream stream);

// The v_block the current device's fastest 8-bit attention kernel takes at this head_dim (given
// v_t): 128 where the Hopper kernel runs, else 64; for FP8 (fp8 true) on the Hopper kernel 0, V per
// channel. Quantize V with it (AttentionQuantizeArgs).
Status cuda_attention_v_block(int64_t head_dim, int64_t* v_block, bool fp8 = false);

// FP8 (the specification's kFp8 with block-scaled V): the same arguments, every 8-bit operand an
// E4M3 code (the int8_t pointers carry the bytes); scales per token for Q/K (a per-tensor scale is
// given as that value for every token) and per (tile, channel) for V; P = e4m3(2^(s - m + 8))
// against the running maximum, E4M3 x E4M3 products in FP32 (fresh per tile). sm_89+. With v_block
// 0 (V per channel; Hopper) P V accumulates across tiles in the tensor core's FP32 accumulators.
Status cuda_fp8_attention(const FullInt8AttentionArgs& a, CudaStream stream);

// Fused per-token quantization of BF16 Q, K and V into the 8-bit kernels' inputs, as the CPU
// specification quantizes (scale = absmax / 127 for INT8 or / 448 for E4M3, code = RNE(x * (1 /
// scale)), saturating; an all-zero row gets scale 1): Q and K per (token, head), V per (v_block-key
// block, kv head, channel), written transposed (v_t above). Token t of head h is read at
// x + t * row_stride + h * head_dim (row_stride in elements, so Q/K/V can be slices of a fused QKV
// projection or a KV cache).
struct AttentionQuantizeArgs {
  int64_t q_len = 0, kv_len = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool fp8 = false;         // E4M3 codes (int8_t carries the bytes) instead of INT8
  bool smooth_k = false;    // subtract K's per-channel mean over the kv_len tokens (per kv head) before quantizing
  bool quantize_v = true;   // false: V stays BF16 (half-INT8); v, v_t and v_scale are then unused
  const uint16_t* q = nullptr; int64_t q_row_stride = 0;  // BF16
  const uint16_t* k = nullptr; int64_t k_row_stride = 0;
  const uint16_t* v = nullptr; int64_t v_row_stride = 0;
  int8_t* q8 = nullptr;  float* q_scale = nullptr;        // [q_len, heads, d], [heads, q_len]
  int8_t* k8 = nullptr;  float* k_scale = nullptr;        // [kv_len, kv_heads, d], [kv_heads, kv_len]
  int8_t* v_t = nullptr; float* v_scale = nullptr;        // as FullInt8AttentionArgs
  int64_t v_block = 64;     // keys per V scale block: 64 or 128, or 0 (E4M3 only): per channel over all keys
  float* k_mean = nullptr;  // smooth_k: device workspace [kv_heads, head_dim] (holds the means after)
};
Status cuda_quantize_attention_inputs(const AttentionQuantizeArgs& a, CudaStream stream);

}  // namespace llmq
