// src/attention/quant_prefill_attention.hpp: quantize, then attend, one sequence at a time.
#include "attention/quant_prefill_attention.hpp"

#include <string>

#include "llmq/cuda_attention_int8.hpp"

namespace llmq::attention {

Status QuantPrefillAttention::allocate(AttentionVariant variant, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                       int64_t max_q, int64_t max_kv) {
  variant_ = AttentionVariant::kBf16;
  if (variant == AttentionVariant::kBf16) return {};
  if (variant != AttentionVariant::kHalfInt8 && variant != AttentionVariant::kFullInt8 && variant != AttentionVariant::kFp8)
    return invalid_argument(std::string("--attention: bf16, half-int8, int8 or fp8, got ") + attention_variant_name(variant));
  if (head_dim != 64 && head_dim != 128)
    return unsupported("--attention " + std::string(attention_variant_name(variant)) +
                       ": the 8-bit attention kernels take head_dim 64 or 128, this model has " + std::to_string(head_dim));
  heads_ = heads, kv_heads_ = kv_heads, head_dim_ = head_dim, max_q_ = max_q, max_kv_ = max_kv;
  LLMQ_RETURN_IF_ERROR(cuda_attention_v_block(head_dim, &v_block_));  // 128 where the Hopper kernel runs
  const int64_t tiles = (max_kv + v_block_ - 1) / v_block_;
  LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(max_q * heads * head_dim, "8-bit attention Q", &q8_));
  LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(max_q * heads * 4, "8-bit attention Q scales", &q_scale_));
  LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(max_kv * kv_heads * head_dim, "8-bit attention K", &k8_));
  LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(max_kv * kv_heads * 4, "8-bit attention K scales", &k_scale_));
  if (variant != AttentionVariant::kHalfInt8) {
    LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(kv_heads * head_dim * attention_v_t_stride(max_kv), "8-bit attention V^T", &v_t_));
    LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(kv_heads * tiles * head_dim * 4, "8-bit attention V scales", &v_scale_));
  }
  variant_ = variant;
  return {};
}

Status QuantPrefillAttention::run(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache, int64_t capacity,
                                  const std::vector<PrefillSequence>& seqs, uint16_t* out, float softmax_scale,
                                  CudaStream stream, int64_t window, const float* sinks) const {
  if (!active()) return invalid_argument("QuantPrefillAttention::run: not allocated");
  if (window < 0) return invalid_argument("8-bit prefill attention: window " + std::to_string(window) + " is negative");
  const int64_t q_row = heads_ * head_dim_, kv_row = kv_heads_ * head_dim_;
  for (const PrefillSequence& s : seqs) {
    if (s.q_len <= 0) continue;
    if (s.q_len > max_q_ || s.kv_len > max_kv_ || s.q_len > s.kv_len)
      return invalid_argument("8-bit prefill attention: sequence of " + std::to_string(s.q_len) + " queries over " +
                              std::to_string(s.kv_len) + " keys exceeds the buffers (" + std::to_string(max_q_) + ", " +
                              std::to_string(max_kv_) + ")");
    AttentionQuantizeArgs qa;
    qa.q_len = s.q_len;
    qa.kv_len = s.kv_len;
    qa.heads = heads_;
    qa.kv_heads = kv_heads_;
    qa.head_dim = head_dim_;
    qa.fp8 = variant_ == AttentionVariant::kFp8;
    qa.quantize_v = variant_ != AttentionVariant::kHalfInt8;
    qa.q = q + s.q_begin * q_row;
    qa.q_row_stride = q_row;
    qa.k = k_cache + s.slot * capacity * kv_row;
    qa.k_row_stride = kv_row;
    qa.v = v_cache + s.slot * capacity * kv_row;
    qa.v_row_stride = kv_row;
    qa.q8 = q8_.as<int8_t>();
    qa.q_scale = q_scale_.as<float>();
    qa.k8 = k8_.as<int8_t>();
    qa.k_scale = k_scale_.as<float>();
    qa.v_t = v_t_.as<int8_t>();
    qa.v_scale = v_scale_.as<float>();
    qa.v_block = v_block_;
    LLMQ_RETURN_IF_ERROR(cuda_quantize_attention_inputs(qa, stream));

    FullInt8AttentionArgs a;
    a.qk.q_len = s.q_len;
    a.qk.kv_len = s.kv_len;
    a.qk.heads = heads_;
    a.qk.kv_heads = kv_heads_;
    a.qk.head_dim = head_dim_;
    a.qk.causal = true;
    a.qk.softmax_scale = softmax_scale;
    a.qk.window = window;  // the kernels validate it
    a.qk.sinks = sinks;
    a.qk.q = qa.q8;
    a.qk.q_scale = qa.q_scale;
    a.qk.k = qa.k8;
    a.qk.k_scale = qa.k_scale;
    a.qk.v = qa.v;  // half-INT8: the BF16 V straight from the cache
    a.qk.out = out + s.q_begin * q_row;
    a.v_t = qa.v_t;
    a.v_scale = qa.v_scale;
    a.v_block = v_block_;
    switch (variant_) {
      case AttentionVariant::kHalfInt8: LLMQ_RETURN_IF_ERROR(cuda_half_int8_attention(a.qk, stream)); break;
      case AttentionVariant::kFullInt8: LLMQ_RETURN_IF_ERROR(cuda_full_int8_attention(a, stream)); break;
      default: LLMQ_RETURN_IF_ERROR(cuda_fp8_attention(a, stream)); break;
    }
  }
  return {};
}

}  // namespace llmq::attention
