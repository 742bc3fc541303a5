// Attention of the GPU runtime over a paged KV cache: prefill (flash-attention-2 style, many
// queries per sequence, causal or not) and decode (flash-decoding: one query per sequence, the keys
// split into chunks whose partial softmax states a second kernel combines). Queries and outputs are
// BF16; the cache is BF16 or FP8 E4M3 with one scale per kv head.
// Internal host header, no CUDA headers: tensors are BF16 bit patterns (uint16_t) or E4M3 codes
// (uint8_t), sizes int64_t.
//
// Both entry points validate their arguments and return a Status naming the field at fault; they
// allocate nothing and never synchronise with the host, so they can be captured in a CUDA graph
// (the grid depends only on the host fields, never on the device arrays).
#pragma once

#include <cstdint>

#include "llmq/cuda_stream.hpp"
#include "llmq/status.hpp"

namespace llmq::attention {

// KV cache of ONE layer: [num_blocks * block_size, n_kv_heads, head_dim] BF16 (uint16_t bits),
// row-major, paged (KvPages below). Sequence b of a batch reads block-table row slot[b]; its
// keys/values for positions 0..kv_len[b]-1 are valid. Positions at or beyond kv_len[b] may hold anything (NaN included): they are never
// used in the arithmetic. q, out and the caches must be 16-byte aligned (the kernels move 16-byte
// pieces of rows).
// GQA: query head h reads kv head h / (n_heads / n_kv_heads).
//
// Sliding window and attention sinks (both entry points; transformers' semantics):
//  * window W > 0: the query at position p sees key t only if p - W < t <= p (transformers'
//    sliding_window_overlay ANDed with the causal mask); needs causal. 0: no window. A window that
//    covers every position (W >= capacity(), for decode W >= min(capacity(), max_kv_len)) changes
//    nothing and runs the plain path. Key tiles (prefill) and split chunks (decode) wholly before
//    every query's window are never loaded.
//  * sinks (gpt-oss): device [n_heads] f32, one learned logit s_h per QUERY head that joins the
//    softmax denominator and carries no value: with x_t = softmax_scale * q . k_t over the visible
//    keys and m = max(max_t x_t, s_h), out = sum_t e^(x_t - m) v_t / (sum_t e^(x_t - m) + e^(s_h - m)).
//    s_h is NOT multiplied by softmax_scale. Added once, at the final normalisation. null: no sink
//    (bit-identical to the kernels without the feature). s_h = -inf is no sink; a row that sees no
//    key still gets zeros.
//
// kv_dtype = kE4M3: the same layout with one byte per element, OCP E4M3 codes ("e4m3fn") in
// k_cache8 / v_cache8 (k_cache / v_cache are then ignored and may be null), and per-kv-head FP32
// scales k_scale / v_scale on the device ([n_kv_heads] each, read by the kernels so that a captured
// graph follows scale updates): the key (value) of kv head g is decode_e4m3(code) * k_scale[g]
// (v_scale[g]). The result equals BF16-cache attention on those dequantized values: the kernels
// widen codes exactly (every E4M3 value is a BF16 and an FP16 value), fold k_scale[g] into the
// softmax scale and multiply the normalised output by v_scale[g]. Valid positions must not hold
// NaN codes (0x7F / 0xFF); positions at or beyond kv_len[b] may hold any byte.
enum class KvCacheDType { kBF16, kE4M3 };

// Where the K/V rows of the sequences are (the K and V caches of a layer share it). One layer's
// cache is [num_blocks * block_size, n_kv_heads, head_dim]: block p holds cache rows
// p * block_size .. p * block_size + block_size - 1. Row r of the block table (block_table + r *
// table_stride) lists a sequence's physical blocks in position order, so position t of a sequence
// that reads table row r is cache row
//   block_table[r * table_stride + t / block_size] * block_size + t % block_size.
// A sequence holds at most capacity() = table_stride * block_size positions. The kernels address
// every key row through the table (a row is what they move anyway: rows of one kv head are
// n_kv_heads * head_dim apart even in one block), so the block size costs them nothing.
// The fixed-slot runtime is the special case of one table row per slot listing its own blocks.
// Device contract (not checkable on the host): the entries a sequence's positions use are in
// [0, num_blocks); entries past them may hold anything and are never read.
struct KvPages {
  const int32_t* block_table = nullptr;  // device [table rows, table_stride]
  int64_t table_stride = 0;              // blocks per table row, >= 1
  int64_t block_size = 0;                // positions per block: a power of two in [1, 2^16]
  int64_t num_blocks = 0;                // blocks in the cache, >= 1 (cache rows: num_blocks * block_size < 2^31)
  int64_t capacity() const { return table_stride * block_size; }
};
// block_table non-null, table_stride >= 1, block_size a power of two in [1, 2^16], num_blocks >= 1,
// num_blocks * block_size < 2^31 and capacity() <= 2^30. `f` prefixes the message.
Status validate_kv_pages(const KvPages& pages, const char* f);


// Which prefill kernel runs. kAuto: the tensor-core kernel for head_dim 32, 64 and 128, the CUDA-core
// kernel otherwise. kCudaCore forces the CUDA-core kernel (the reference path; for tests).
enum class PrefillKernel { kAuto, kTensorCore, kCudaCore };

struct PrefillAttentionArgs {
  const uint16_t* q = nullptr;       // [total_q, n_heads, head_dim] bf16, sequences packed one after another
  const uint16_t* k_cache = nullptr; // this layer's K cache (layout above), kBF16
  const uint16_t* v_cache = nullptr;
  KvCacheDType kv_dtype = KvCacheDType::kBF16;
  const uint8_t* k_cache8 = nullptr, *v_cache8 = nullptr;  // kE4M3: same layout, 1 byte per element (instead of k_cache / v_cache)
  const float* k_scale = nullptr, *v_scale = nullptr;      // kE4M3: device [n_kv_heads] f32; value = decode_e4m3(code) * scale[kv_head]
  uint16_t* out = nullptr;           // [total_q, n_heads, head_dim] bf16
  const int32_t* q_start = nullptr;  // device [batch + 1]: each sequence's first query row in q and out, absolute
                                     // (prefix sums of query counts; a mixed step's prefill part starts past its decode rows)
  const int32_t* kv_len = nullptr;   // device [batch]: keys of sequence b after this step (= its start position + its query count)
  const int32_t* slot = nullptr;     // device [batch]: block-table row of sequence b
  KvPages pages;                     // where the cache rows of each table row are
  int64_t batch = 0, max_q_len = 0;  // max_q_len: host upper bound of any q count (grid size)
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float softmax_scale = 0.f;         // usually 1/sqrt(head_dim)
  bool causal = true;                // query i of sequence b sits at position kv_len[b] - nq_b + i and sees keys 0..that position
  PrefillKernel kernel = PrefillKernel::kAuto;
  int64_t window = 0;                // sliding window (see above); 0: none; > 0 needs causal
  const float* sinks = nullptr;      // device [n_heads] f32 attention-sink logits (see above), or null
};
// Device-side contract (not checkable on the host): q counts <= max_q_len, nq_b <= kv_len[b] <=
// pages.capacity(). A query row that sees no key (only possible when that contract is broken) gets zeros.
Status prefill_attention(const PrefillAttentionArgs& a, CudaStream stream);

struct DecodeAttentionArgs {          // one query token per sequence
  const uint16_t* q = nullptr;        // [batch, n_heads, head_dim] bf16
  const uint16_t* k_cache = nullptr, *v_cache = nullptr;  // kBF16
  KvCacheDType kv_dtype = KvCacheDType::kBF16;
  const uint8_t* k_cache8 = nullptr, *v_cache8 = nullptr;  // kE4M3: same layout, 1 byte per element (instead of k_cache / v_cache)
  const float* k_scale = nullptr, *v_scale = nullptr;      // kE4M3: device [n_kv_heads] f32; value = decode_e4m3(code) * scale[kv_head]
  uint16_t* out = nullptr;            // [batch, n_heads, head_dim] bf16
  const int32_t* kv_len = nullptr;    // device [batch] (>= 1; includes the current token, already in the cache)
  const int32_t* slot = nullptr;      // device [batch]: block-table row of sequence b
  KvPages pages;
  int64_t batch = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t max_kv_len = 0;             // host upper bound of every kv_len[b]: fixes the grid (split-K count) so the launch can be captured in a CUDA graph once and replayed while kv_len grows on the device
  float softmax_scale = 0.f;
  void* workspace = nullptr; int64_t workspace_bytes = 0;  // split-K partials
  // Sliding window (see above): the query (position kv_len[b] - 1) sees keys [kv_len[b] - window,
  // kv_len[b]); 0: all. The split covers min(max_kv_len, window) keys, offset on the device, so a
  // captured graph stays valid while kv_len grows past the window.
  int64_t window = 0;
  const float* sinks = nullptr;       // device [n_heads] f32 attention-sink logits (see above), or null
};
// Bytes of workspace decode_attention needs for these sizes on any device (an upper bound over
// n_kv_heads, SM counts, both cache types and any window; 256-byte aligned pointer). Returns 0 for non-positive sizes.
int64_t decode_attention_workspace_bytes(int64_t batch, int64_t n_heads, int64_t head_dim, int64_t max_kv_len);
// Device-side: kv_len[b] is clamped to [0, min(max_kv_len, pages.capacity())]; kv_len[b] <= 0 gives zeros.
Status decode_attention(const DecodeAttentionArgs& a, CudaStream stream);

}  // namespace llmq::attention
