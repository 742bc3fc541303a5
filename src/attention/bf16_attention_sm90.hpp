// The Hopper (sm_90a) BF16 flash attention: internal host entry, no CUDA headers. Head dim 128,
// one sequence (a cached prefix allowed), K token-major and V given transposed; no window, no sinks
// yet. The kernel is FlashAttention-3's schedule on wgmma fed by TMA (bf16_attention_sm90.cu).
#pragma once

#include <cstdint>

#include "cuda/device_facts.cuh"
#include "llmq/cuda_stream.hpp"
#include "llmq/status.hpp"

namespace llmq::attention {

struct Bf16AttentionArgs {
  int64_t q_len = 0, kv_len = 0, heads = 0, kv_heads = 0;  // head_dim 128; query i at position kv_len - q_len + i
  bool causal = true;
  float softmax_scale = 0.f;     // 0: 1 / sqrt(128)
  const uint16_t* q = nullptr;   // BF16 [q_len, heads, 128]
  const uint16_t* k = nullptr;   // BF16 [kv_len, kv_heads, 128]
  const uint16_t* v_t = nullptr; // BF16 [kv_heads, 128, attention_v_t_stride(kv_len)]: channel rows, keys in order, zeros past kv_len
  uint16_t* out = nullptr;       // BF16 [q_len, heads, 128]
};

// An sm_90 device and the library built with sm_90a code.
bool sm90_bf16_attention_runs(const cuda::DeviceFacts& dev);
Status sm90_bf16_attention(const Bf16AttentionArgs& a, CudaStream stream);

}  // namespace llmq::attention
