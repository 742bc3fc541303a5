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
};

Status cuda_half_int8_attention(const HalfInt8AttentionArgs& a, CudaStream stream);

// Full-INT8 (llmq's variant of the specification: QuantAttentionOptions{kFullInt8, V kPerBlock,
// p_max 255, p_tile_max, block_kv 64}): INT8 V with one scale per (64-key tile, channel), P in
// [0, 255] against the tile's row maximum, P V as u8 x s8 products summed exactly in INT32.
struct FullInt8AttentionArgs {
  HalfInt8AttentionArgs qk;        // q_len .. q_scale, k, k_scale, out as above; qk.v unused
  const int8_t* v = nullptr;       // [kv_len, kv_heads, head_dim]
  const float* v_scale = nullptr;  // [kv_heads, ceil(kv_len / 64), head_dim]
};
Status cuda_full_int8_attention(const FullInt8AttentionArgs& a, CudaStream stream);

// FP8 (the specification's kFp8 with block-scaled V): the same arguments, every 8-bit operand an
// E4M3 code (the int8_t pointers carry the bytes); scales per token for Q/K (a per-tensor scale is
// given as that value for every token) and per (tile, channel) for V; P = e4m3(2^(s - m + 8))
// against the running maximum, E4M3 x E4M3 products in FP32 (fresh per tile). sm_89+.
Status cuda_fp8_attention(const FullInt8AttentionArgs& a, CudaStream stream);

}  // namespace llmq
