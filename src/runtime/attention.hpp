// BF16 attention of the GPU runtime over a paged-by-slot KV cache: prefill (flash-attention-2
// style, many queries per sequence, causal or not) and decode (flash-decoding: one query per
// sequence, the keys split into chunks whose partial softmax states a second kernel combines).
// Internal host header, no CUDA headers: tensors are BF16 bit patterns (uint16_t), sizes int64_t.
//
// Both entry points validate their arguments and return a Status naming the field at fault; they
// allocate nothing and never synchronise with the host, so they can be captured in a CUDA graph
// (the grid depends only on the host fields, never on the device arrays).
#pragma once

#include <cstdint>

#include "llmq/cuda_stream.hpp"
#include "llmq/status.hpp"

namespace llmq::runtime {

// KV cache of ONE layer: [slots, capacity, n_kv_heads, head_dim] BF16 (uint16_t bits), row-major.
// Sequence b of a batch lives in cache slot slot[b]; its keys/values for positions 0..kv_len[b]-1
// are valid. Positions at or beyond kv_len[b] may hold anything (NaN included): they are never
// used in the arithmetic. Every pointer must be 16-byte aligned (the kernels move 16-byte rows).
// GQA: query head h reads kv head h / (n_heads / n_kv_heads).

// Which prefill kernel runs. kAuto: the tensor-core kernel for head_dim 32, 64 and 128, the CUDA-core
// kernel otherwise. kCudaCore forces the CUDA-core kernel (the reference path; for tests).
enum class PrefillKernel { kAuto, kTensorCore, kCudaCore };

struct PrefillAttentionArgs {
  const uint16_t* q = nullptr;       // [total_q, n_heads, head_dim] bf16, sequences packed one after another
  const uint16_t* k_cache = nullptr; // this layer's K cache (layout above)
  const uint16_t* v_cache = nullptr;
  uint16_t* out = nullptr;           // [total_q, n_heads, head_dim] bf16
  const int32_t* q_start = nullptr;  // device [batch + 1]: prefix sums of query counts (q_start[0] = 0)
  const int32_t* kv_len = nullptr;   // device [batch]: keys of sequence b after this step (= its start position + its query count)
  const int32_t* slot = nullptr;     // device [batch]: cache slot of sequence b
  int64_t batch = 0, max_q_len = 0;  // max_q_len: host upper bound of any q count (grid size)
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0, capacity = 0;
  float softmax_scale = 0.f;         // usually 1/sqrt(head_dim)
  bool causal = true;                // query i of sequence b sits at position kv_len[b] - nq_b + i and sees keys 0..that position
  PrefillKernel kernel = PrefillKernel::kAuto;
};
// Device-side contract (not checkable on the host): q counts <= max_q_len, nq_b <= kv_len[b] <=
// capacity. A query row that sees no key (only possible when that contract is broken) gets zeros.
Status prefill_attention(const PrefillAttentionArgs& a, CudaStream stream);

struct DecodeAttentionArgs {          // one query token per sequence
  const uint16_t* q = nullptr;        // [batch, n_heads, head_dim] bf16
  const uint16_t* k_cache = nullptr, *v_cache = nullptr;
  uint16_t* out = nullptr;            // [batch, n_heads, head_dim] bf16
  const int32_t* kv_len = nullptr;    // device [batch] (>= 1; includes the current token, already in the cache)
  const int32_t* slot = nullptr;      // device [batch]
  int64_t batch = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, capacity = 0;
  int64_t max_kv_len = 0;             // host upper bound of every kv_len[b]: fixes the grid (split-K count) so the launch can be captured in a CUDA graph once and replayed while kv_len grows on the device
  float softmax_scale = 0.f;
  void* workspace = nullptr; int64_t workspace_bytes = 0;  // split-K partials
};
// Bytes of workspace decode_attention needs for these sizes on any device (an upper bound over
// n_kv_heads and SM counts; 256-byte aligned pointer). Returns 0 for non-positive sizes.
int64_t decode_attention_workspace_bytes(int64_t batch, int64_t n_heads, int64_t head_dim, int64_t max_kv_len);
// Device-side: kv_len[b] is clamped to [0, min(max_kv_len, capacity)]; kv_len[b] <= 0 gives zeros.
Status decode_attention(const DecodeAttentionArgs& a, CudaStream stream);

}  // namespace llmq::runtime
