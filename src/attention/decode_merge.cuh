// The end of both decode-attention kernels (attention_decode.cu, attention_decode_mma.cu): each of a
// CTA's lanes (the CUDA-core kernel's key lanes, the tensor-core kernel's warps) leaves its running
// max (log2 units), sum and unnormalised output per head in shared memory; they are merged per head
// and dim and written out: BF16 when the chunk is the whole sequence (the sink in its denominator),
// else the normalised partial and its log2-sum-exp for the combine kernel. Internal; CUDA only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/decode_plan.hpp"
#include "attention/kv_pages.cuh"

namespace llmq::attention {

// What one CTA (chunk, head group, sequence) of either kernel reads: keys [key_begin, key_end) of
// kv head kv_head. The window (host-clamped below min(capacity, max_kv_len), or 0) moves every chunk
// up by kv_len - window.
struct DecodeCta {
  int chunk, b, head0, kv_head, key_begin, key_end;
};
// The keys of (chunk, sequence b, head group): the group's q heads are heads_per_cta from
// group * heads_per_cta.
__device__ __forceinline__ DecodeCta decode_item(const DecodeAttentionArgs& a, const DecodePlan& plan, int chunk, int b,
                                                 int group) {
  DecodeCta c;
  c.chunk = chunk;
  c.b = b;
  c.head0 = group * plan.heads_per_cta;
  c.kv_head = c.head0 / static_cast<int>(a.n_heads / a.n_kv_heads);
  const int kv_len = min(max(a.kv_len[c.b], 0), min(pages_capacity(a.pages), static_cast<int>(a.max_kv_len)));
  const int first = a.window > 0 ? max(0, kv_len - static_cast<int>(a.window)) : 0;
  c.key_begin = first + c.chunk * plan.chunk_keys;
  c.key_end = min(kv_len, c.key_begin + plan.chunk_keys);
  return c;
}
// A CTA per item: grid (chunk, group, sequence).
__device__ __forceinline__ DecodeCta decode_cta(const DecodeAttentionArgs& a, const DecodePlan& plan) {
  return decode_item(a, plan, blockIdx.x, blockIdx.z, blockIdx.y);
}
// Where kv head kv_head's keys and values start (cache row 0) and the bytes between cache rows; for
// an E4M3 cache also its scales (1 for BF16: exact factors). Key p is at rows.row(p) * stride_bytes.
struct DecodeKvBases {
  const unsigned char* k;
  const unsigned char* v;
  int64_t stride_bytes;
  float k_scale, v_scale;
};
template <bool kFp8>
__device__ __forceinline__ DecodeKvBases decode_kv_bases(const DecodeAttentionArgs& a, int kv_head, int row_bytes) {
  const int64_t base = static_cast<int64_t>(kv_head) * row_bytes;
  DecodeKvBases kv;
  kv.stride_bytes = a.n_kv_heads * row_bytes;
  if constexpr (kFp8) {
    kv.k = a.k_cache8 + base;
    kv.v = a.v_cache8 + base;
    kv.k_scale = a.k_scale[kv_head];  // scores of the dequantized keys: q . (code * k_scale)
    kv.v_scale = a.v_scale[kv_head];
  } else {
    kv.k = reinterpret_cast<const unsigned char*>(a.k_cache) + base;
    kv.v = reinterpret_cast<const unsigned char*>(a.v_cache) + base;
    kv.k_scale = kv.v_scale = 1.f;
  }
  return kv;
}

// A CTA without keys exits; chunk 0 of an empty sequence still owes the output: zeros, never NaN.
template <int kHeadDim>
__device__ __forceinline__ bool decode_cta_has_no_keys(const DecodeAttentionArgs& a, const DecodePlan& plan,
                                                      const DecodeCta& c) {
  if (c.key_begin < c.key_end) return false;
  if (c.chunk == 0 && plan.n_chunks == 1)
    for (int i = threadIdx.x; i < plan.heads_per_cta * kHeadDim; i += blockDim.x)
      a.out[(static_cast<int64_t>(c.b) * a.n_heads + c.head0) * kHeadDim + i] = 0;
  return true;
}

__device__ __forceinline__ float decode_exp2(float x) {  // the SFU's 2^x (-inf -> +0)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Where lane k's accumulator of head h, dim d sits in red_acc: [kLanes][kHeadStride][kHeadDim] unless
// a kernel lays it out otherwise (AccAt::at(k, h, d)).
template <int kHeadDim, int kHeadStride>
struct LaneHeadDimAt {
  static __device__ __forceinline__ int at(int k, int h, int d) { return (k * kHeadStride + h) * kHeadDim + d; }
};

// red_acc at AccAt, red_m and red_l [kLanes][kHeadStride]; every thread of the CTA takes part (no
// barrier inside: the caller's __syncthreads made the arrays visible).
template <int kHeadDim, int kLanes, int kHeadStride, bool kFp8, class AccAt = LaneHeadDimAt<kHeadDim, kHeadStride>>
__device__ __forceinline__ void decode_merge_and_store(const DecodeAttentionArgs& a, const DecodePlan& plan,
                                                       const DecodeWorkspace& ws, const float* red_acc,
                                                       const float* red_m, const float* red_l, int b, int head0,
                                                       int chunk, float v_scale) {
  constexpr float kLog2e = 1.4426950408889634f;
  const bool single_chunk = plan.n_chunks == 1;
  for (int idx = threadIdx.x; idx < plan.heads_per_cta * kHeadDim; idx += blockDim.x) {
    const int h = idx / kHeadDim, d = idx % kHeadDim;
    float m_max = -INFINITY;
    for (int k = 0; k < kLanes; ++k) m_max = fmaxf(m_max, red_m[k * kHeadStride + h]);
    // m_max is finite (the chunk has a key); a lane whose keys were all masked has -inf: weight 0.
    float sum = 0.f, o = 0.f;
    for (int k = 0; k < kLanes; ++k) {
      const float w = decode_exp2(red_m[k * kHeadStride + h] - m_max);
      sum = __fmaf_rn(red_l[k * kHeadStride + h], w, sum);
      o = __fmaf_rn(red_acc[AccAt::at(k, h, d)], w, o);
    }
    const int64_t bh = static_cast<int64_t>(b) * a.n_heads + head0 + h;
    const float denom =
        single_chunk && a.sinks != nullptr ? sum + decode_exp2(__fmaf_rn(a.sinks[head0 + h], kLog2e, -m_max)) : sum;
    const float out = kFp8 ? o / denom * v_scale : o / denom;
    if (single_chunk) {
      const __nv_bfloat16 v = __float2bfloat16_rn(out);
      a.out[bh * kHeadDim + d] = *reinterpret_cast<const uint16_t*>(&v);
    } else {
      ws.partial_out[(bh * plan.n_chunks + chunk) * kHeadDim + d] = out;
      if (d == 0) ws.partial_lse[bh * plan.n_chunks + chunk] = m_max + __log2f(sum);
    }
  }
}

}  // namespace llmq::attention
