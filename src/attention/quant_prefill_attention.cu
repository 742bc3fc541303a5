// src/attention/quant_prefill_attention.hpp: gather, quantize, then attend, one sequence at a time.
// The cache is paged (attention.hpp's KvPages), while the quantize kernel and the half-INT8
// kernel's BF16 V (public cuda_attention_int8.hpp interfaces) read a sequence's K / V as rows a
// fixed stride apart. So each sequence's kv_len K and V rows are first copied through its block
// table into contiguous BF16 buffers (gather_kv_rows_kernel): the later kernels read the very same
// bytes as from a contiguous cache, so the results are those of the contiguous layout bit for bit.
// The copy reads and writes each BF16 K / V row once more, linear in kv_len against attention's
// q_len * kv_len, and the quantize reads it back mostly from L2.
#include "attention/quant_prefill_attention.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "attention/kv_pages.cuh"
#include "cuda/cuda_check.cuh"
#include "llmq/cuda_attention_int8.hpp"

namespace llmq::attention {
namespace {

constexpr int kGatherThreads = 256;
constexpr int64_t kMaxGatherCtas = 4096;  // a grid-stride loop past this: plenty to fill the GPU

// Positions 0..kv_len-1 of table row `table_row`, K and V, into k_out / v_out [kv_len, row] BF16,
// 16 bytes a thread (row_pieces 16-byte pieces per row).
__global__ void __launch_bounds__(kGatherThreads)
    gather_kv_rows_kernel(const uint4* k_cache, const uint4* v_cache, KvPages pages, int64_t table_row, int64_t kv_len,
                          int64_t row_pieces, uint4* k_out, uint4* v_out) {
  const PagedRows rows = paged_rows(pages, static_cast<int>(table_row));
  const int64_t total = kv_len * row_pieces;
  for (int64_t i = blockIdx.x * int64_t{kGatherThreads} + threadIdx.x; i < total; i += gridDim.x * int64_t{kGatherThreads}) {
    const int64_t pos = i / row_pieces, piece = i % row_pieces;
    const int64_t src = static_cast<int64_t>(rows.row(static_cast<int>(pos))) * row_pieces + piece;
    k_out[i] = __ldg(k_cache + src);
    v_out[i] = __ldg(v_cache + src);
  }
}

Status gather_kv_rows(const uint16_t* k_cache, const uint16_t* v_cache, const KvPages& pages, int64_t table_row,
                      int64_t kv_len, int64_t row_elems, uint16_t* k_out, uint16_t* v_out, cudaStream_t stream) {
  const int64_t row_pieces = row_elems / 8;  // row_elems: a multiple of 8 (head_dim 64 or 128)
  const int64_t ctas = std::min(kMaxGatherCtas, (kv_len * row_pieces + kGatherThreads - 1) / kGatherThreads);
  if (ctas <= 0) return {};
  gather_kv_rows_kernel<<<static_cast<unsigned>(ctas), kGatherThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(k_cache), reinterpret_cast<const uint4*>(v_cache), pages, table_row, kv_len,
      row_pieces, reinterpret_cast<uint4*>(k_out), reinterpret_cast<uint4*>(v_out));
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("gather_kv_rows_kernel");
  return {};
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

Status check_prefill_sequence(const PrefillSequence& s, int64_t max_q, int64_t max_kv, const KvPages& pages,
                              const char* what) {
  if (s.q_len > max_q || s.kv_len > max_kv || s.q_len > s.kv_len)
    return invalid_argument(std::string(what) + ": sequence of " + std::to_string(s.q_len) + " queries over " +
                            std::to_string(s.kv_len) + " keys exceeds the buffers (" + std::to_string(max_q) + ", " +
                            std::to_string(max_kv) + ")");
  if (s.kv_len > pages.capacity())
    return invalid_argument(std::string(what) + ": sequence of " + std::to_string(s.kv_len) + " keys exceeds pages.capacity() " +
                            std::to_string(pages.capacity()));
  if (s.slot < 0 || s.slot > INT32_MAX)
    return invalid_argument(std::string(what) + ": slot (block-table row) " + std::to_string(s.slot) + " not in [0, 2^31)");
  return {};
}

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
  // 128 where the Hopper kernel runs; FP8 there: 0, V per channel.
  LLMQ_RETURN_IF_ERROR(cuda_attention_v_block(head_dim, &v_block_, variant == AttentionVariant::kFp8));
  const int64_t tiles = v_block_ == 0 ? 1 : (max_kv + v_block_ - 1) / v_block_;
  LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(max_q * heads * head_dim, "8-bit attention Q", &q8_));
  LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(max_q * heads * 4, "8-bit attention Q scales", &q_scale_));
  LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(max_kv * kv_heads * head_dim, "8-bit attention K", &k8_));
  LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(max_kv * kv_heads * 4, "8-bit attention K scales", &k_scale_));
  // The sequence's K and V rows gathered from the paged cache (BF16, 2 bytes an element).
  LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(max_kv * kv_heads * head_dim * 2, "8-bit attention K rows", &k_rows_));
  LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(max_kv * kv_heads * head_dim * 2, "8-bit attention V rows", &v_rows_));
  if (variant != AttentionVariant::kHalfInt8) {
    LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(kv_heads * head_dim * attention_v_t_stride(max_kv), "8-bit attention V^T", &v_t_));
    LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(kv_heads * tiles * head_dim * 4, "8-bit attention V scales", &v_scale_));
  }
  variant_ = variant;
  return {};
}

Status QuantPrefillAttention::run(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache, const KvPages& pages,
                                  const std::vector<PrefillSequence>& seqs, uint16_t* out, float softmax_scale,
                                  CudaStream stream, int64_t window, const float* sinks) const {
  if (!active()) return invalid_argument("QuantPrefillAttention::run: not allocated");
  if (window < 0) return invalid_argument("8-bit prefill attention: window " + std::to_string(window) + " is negative");
  LLMQ_RETURN_IF_ERROR(validate_kv_pages(pages, "8-bit prefill attention: "));
  if (k_cache == nullptr || v_cache == nullptr) return invalid_argument("8-bit prefill attention: k_cache or v_cache is null");
  if (!aligned16(k_cache) || !aligned16(v_cache))
    return invalid_argument("8-bit prefill attention: k_cache and v_cache must be 16-byte aligned (rows move 16 bytes at a time)");
  const int64_t q_row = heads_ * head_dim_, kv_row = kv_heads_ * head_dim_;
  for (const PrefillSequence& s : seqs) {
    if (s.q_len <= 0) continue;
    LLMQ_RETURN_IF_ERROR(check_prefill_sequence(s, max_q_, max_kv_, pages, "8-bit prefill attention"));
    uint16_t* k_rows = k_rows_.as<uint16_t>();
    uint16_t* v_rows = v_rows_.as<uint16_t>();
    LLMQ_RETURN_IF_ERROR(gather_kv_rows(k_cache, v_cache, pages, s.slot, s.kv_len, kv_row, k_rows, v_rows, stream));
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
    qa.k = k_rows;
    qa.k_row_stride = kv_row;
    qa.v = v_rows;
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
    a.qk.v = qa.v;  // half-INT8: the BF16 V rows gathered from the cache
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
