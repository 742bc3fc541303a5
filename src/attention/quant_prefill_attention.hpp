// The runtime's 8-bit prefill attention (GpuRuntimeOptions::prefill_attention): per sequence of a
// prefill step, its cached keys/values (BF16 paged cache) are gathered into contiguous rows, then
// those and its new queries are quantized by the fused kernel (cuda_quantize_attention_inputs) into
// workspace buffers, then the 8-bit flash-attention kernel (cuda_attention_int8.hpp) writes the
// sequence's rows of the attention output. The BF16 path (prefill_attention in attention.hpp)
// stays the default.
// Internal host header, no CUDA headers.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/attention.hpp"
#include "llmq/cuda_stream.hpp"
#include "llmq/quant_attention.hpp"
#include "llmq/status.hpp"
#include "cuda/device_memory.hpp"

namespace llmq::attention {

// One sequence of a prefill step, known on the host: its queries are rows q_begin .. q_begin +
// q_len - 1 of the step; after the step block-table row `slot` maps its kv_len positions.
struct PrefillSequence {
  int64_t q_begin = 0, q_len = 0, kv_len = 0, slot = 0;
};

// A sequence of a prefill step against buffers of max_q queries and max_kv keys and the pages: the
// error names `what` and the numbers.
Status check_prefill_sequence(const PrefillSequence& s, int64_t max_q, int64_t max_kv, const KvPages& pages,
                              const char* what);

class QuantPrefillAttention {
 public:
  // variant: kHalfInt8, kFullInt8 or kFp8 (kBf16: inactive, allocates nothing). Buffers for up to
  // max_q queries and max_kv keys per sequence. Refuses head dims the kernels do not take.
  Status allocate(AttentionVariant variant, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t max_q,
                  int64_t max_kv);
  bool active() const { return variant_ != AttentionVariant::kBf16; }

  // q: the step's rotated queries [T, heads, head_dim] BF16; k_cache / v_cache: one layer's BF16
  // paged cache (attention.hpp's KvPages; sequence s reads table row s.slot); out: [T, heads,
  // head_dim] BF16. Causal. window: sliding window (0: none), sinks: device [heads] f32
  // attention-sink logits or null, both as HalfInt8AttentionArgs (cuda_attention_int8.hpp) has them.
  Status run(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache, const KvPages& pages,
             const std::vector<PrefillSequence>& seqs, uint16_t* out, float softmax_scale, CudaStream stream,
             int64_t window = 0, const float* sinks = nullptr) const;

 private:
  AttentionVariant variant_ = AttentionVariant::kBf16;
  int64_t heads_ = 0, kv_heads_ = 0, head_dim_ = 0, max_q_ = 0, max_kv_ = 0;
  int64_t v_block_ = 64;  // keys per V scale block: the block the fastest kernel on the device takes (0: per channel)
  cuda::DeviceAllocation q8_, q_scale_, k8_, k_scale_, v_t_, v_scale_;
  cuda::DeviceAllocation k_rows_, v_rows_;  // [max_kv, kv_heads, head_dim] BF16: a sequence's K / V gathered from the paged cache
};

}  // namespace llmq::attention
