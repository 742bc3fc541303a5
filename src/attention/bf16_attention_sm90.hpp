// The Hopper (sm_90a) BF16 flash attention: internal host entry, no CUDA headers. Head dim 128,
// one sequence or a batch of them (cached prefixes allowed), K token-major and V given transposed;
// no window, no sinks yet. The kernel is FlashAttention-3's schedule on wgmma fed by TMA (bf16_attention_sm90.cu).
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

// A batch of sequences in one launch (the serving engine's prefill steps). Sequence s has q_len[s]
// queries at rows q_begin[s].. of q and out, query i at position kv_len[s] - q_len[s] + i, and
// kv_len[s] keys at rows kv_begin[s].. of k and columns kv_begin[s].. of v_t; kv_begin[s] is a
// multiple of 128 and the rows up to the next multiple of 128 are the sequence's own (zeros in V^T:
// the masked keys there meet them with probability 0, and 0 x garbage could be NaN).
constexpr int kBf16AttentionMaxSeqs = 64;
struct Bf16AttentionBatch {
  int count = 0;
  int q_begin[kBf16AttentionMaxSeqs] = {}, q_len[kBf16AttentionMaxSeqs] = {}, kv_len[kBf16AttentionMaxSeqs] = {},
      kv_begin[kBf16AttentionMaxSeqs] = {};
};
struct Bf16AttentionBatchArgs {
  Bf16AttentionBatch seqs;
  int64_t keys = 0, heads = 0, kv_heads = 0;  // keys: rows of k; v_t's rows are attention_v_t_stride(keys) long
  bool causal = true;
  float softmax_scale = 0.f;     // 0: 1 / sqrt(128)
  const uint16_t* q = nullptr;   // BF16 [*, heads, 128]
  const uint16_t* k = nullptr;   // BF16 [keys, kv_heads, 128]
  const uint16_t* v_t = nullptr; // BF16 [kv_heads, 128, attention_v_t_stride(keys)]
  uint16_t* out = nullptr;       // BF16 [*, heads, 128]
  // An E4M3 cache: k and v_t hold its codes widened to BF16 (exactly), and these per-kv-head scales
  // (device, [kv_heads]) fold into the scores and the output, as the mma.sync kernel folds them.
  // Both null: k and v_t are the values.
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
};

// An sm_90 device and the library built with sm_90a code.
bool sm90_bf16_attention_runs(const cuda::DeviceFacts& dev);
Status sm90_bf16_attention(const Bf16AttentionArgs& a, CudaStream stream);
Status sm90_bf16_attention_batch(const Bf16AttentionBatchArgs& a, CudaStream stream);

}  // namespace llmq::attention
