// The tensor-core arithmetic of decode attention for head_dim 128, shared by its two kernels
// (attention_decode_mma.cu: a CTA's four warps split each key tile of one GQA group;
// attention_decode_warp.cu: each warp owns a group). Everything here is per warp and per 8 keys:
//
//  * A warp's q heads (2..8 of one GQA group) are rows 0-7 of a 16-row mma A operand (rows past
//    them are zeros and never written out). S = Q K^T for 8 keys is one m16n8 tile: 8 m16n8k16 steps
//    over head_dim. O is kept transposed, O^T += V^T P^T by 8 m16n8k8 steps, the heads in the n8
//    columns, so its accumulators are 32 registers (O's own 16 m16n8 tiles would be 64, half of
//    them padding rows). P^T's B fragment is the S accumulator a lane already holds.
//  * Operands: BF16 for a BF16 cache (q, K, V as stored, P rounded to BF16: FlashAttention's choice,
//    2^-9 relative per weight). FP16 for an E4M3 cache: every E4M3 value is an FP16 value and the
//    conversion of a pair is one instruction (four to BF16); q is scaled by 2^-8 into FP16's range
//    and the scores get it back in FP32; P rounded to FP16 (2^-12 relative; weights below 2^-24 of
//    the row's max drop out).
//  * Fragments come from shared memory as whole 16-byte chunks (two per K fragment and two per V
//    fragment for E4M3), the dims permuted to make that so (k_dim0, and the V^T rows below),
//    instead of 2- and 1-byte loads. ncu, H100, 512 sequences of 256 keys, E4M3 cache: the byte-load
//    form issued 77 M instructions a layer (68% of the issue slots) and moved 1.88 TB/s.
// Internal; CUDA sources only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/attention_mma.cuh"

namespace llmq::attention::decode_frag {

constexpr int kHeadDim = 128;
constexpr int kDimTiles = kHeadDim / 16;  // 8 m16 tiles of O^T
constexpr int kKSteps = kHeadDim / 16;    // 8 k16 steps of Q K^T
// Q is scaled by 2^-8 into FP16 for an E4M3 cache (FP16's 65504 is then 2^24 of q); the scores
// get the 2^8 back in FP32. Powers of two: exact but for q below 2^-6, which keeps FP16's 2^-24
// absolute step there, far below BF16's own rounding of any larger q.
constexpr float kQToF16 = 0.00390625f;
constexpr float kScoreFromF16 = 256.0f;

template <bool kF16>
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  if constexpr (kF16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
// c (16x8 FP32) += a (16x8, row: a0 rows 0-7, a1 rows 8-15) * b (8x8, col)
template <bool kF16>
__device__ __forceinline__ void mma_1688(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  if constexpr (kF16)
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
  else
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}
// Two E4M3 codes (low 16 bits, the first one low) to an FP16 pair, exactly (NaN stays NaN).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two_codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes & 0xffffu), __NV_E4M3);
  return uint32_t{h.x} | (uint32_t{h.y} << 16);
}
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint4 lds_128(const unsigned char* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// Shared tiles hold rows of head_dim elements (one key each); 16-byte chunk c of row r lives at
// chunk c ^ swizzle(r). Every fragment load below is a 16-byte load whose 8-lane phases then touch
// 8 different bank groups: E4M3 rows (8 chunks) by c ^ (r & 7); BF16 rows (16 chunks) by the
// pattern 0,4,1,5,4,0,5,1 (rows g, g + 1 of the K loads fall in opposite halves, rows 2t of the V
// loads in four different pairs).
template <bool kFp8>
__device__ __forceinline__ int swizzle(int row) {
  if constexpr (kFp8) return row & 7;
  else return ((row & 1) << 2) ^ ((row >> 1) & 1) ^ (row & 4);
}
template <bool kFp8>
__device__ __forceinline__ int swizzled_offset(int row, int chunk) {
  constexpr int kRowBytes = kHeadDim * (kFp8 ? 1 : 2);
  return row * kRowBytes + ((chunk ^ swizzle<kFp8>(row)) * 16);
}

// Any permutation of head_dim applied to both Q and K leaves Q K^T as it is, so each lane's K
// fragment is whole 16-byte chunks of its key: for k step kk, lane t holds 4 consecutive dims from
// k_dim0 (b0 / Q's a0 the first two, b1 / Q's a2 the next two). E4M3: chunks 2t, 2t + 1 (dims 32t..
// 32t + 31); BF16: chunks t, t + 4, t + 8, t + 12.
template <bool kFp8>
__device__ __forceinline__ int k_dim0(int kk, int t) {
  return kFp8 ? 32 * t + 4 * kk : 8 * t + 32 * (kk / 2) + 4 * (kk % 2);
}

// Q's A fragments for head row g (q_row: its BF16 values, or null past the group's heads: zeros),
// as four 16-byte loads: k steps 2c and 2c + 1 are 8 consecutive dims from k_dim0(2c, t).
template <bool kFp8>
__device__ __forceinline__ void load_q(uint32_t (&qa)[kKSteps][2], const uint16_t* q_row, int t) {
#pragma unroll
  for (int c = 0; c < kKSteps / 2; ++c) {
    const uint4 v = q_row != nullptr ? *reinterpret_cast<const uint4*>(q_row + k_dim0<kFp8>(2 * c, t)) : make_uint4(0, 0, 0, 0);
    const uint32_t pairs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const uint32_t pair = pairs[p];
      uint32_t& dst = qa[2 * c + p / 2][p % 2];
      if constexpr (kFp8)
        dst = pack_f16x2(__uint_as_float(pair << 16) * kQToF16, __uint_as_float(pair & 0xffff0000u) * kQToF16);
      else
        dst = pair;
    }
  }
}

// s (16 x 8) += Q K^T for the 8 keys of tile rows k_row - g .. k_row - g + 7 (k_row: this lane's key).
template <bool kFp8>
__device__ __forceinline__ void score_8_keys(float (&s)[4], const uint32_t (&qa)[kKSteps][2], const unsigned char* k_tile,
                                             int k_row, int t) {
  constexpr int kRowBytes = kHeadDim * (kFp8 ? 1 : 2);
  const unsigned char* k_at = k_tile + k_row * kRowBytes;
  if constexpr (kFp8) {  // chunks 2t, 2t + 1: word w of chunk j is k step 4j + w
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint4 c = lds_128(k_at + (((2 * t + j) ^ swizzle<true>(k_row)) * 16));
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int kk = 4 * j + w;
        mma_16816<true>(s, qa[kk][0], qa[kk][1], e4m3x2_to_f16x2(word(c, w)), e4m3x2_to_f16x2(word(c, w) >> 16));
      }
    }
  } else {  // chunks t + 4j: words 2h, 2h + 1 of chunk j are k step 2j + h
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint4 c = lds_128(k_at + (((t + 4 * j) ^ swizzle<false>(k_row)) * 16));
      mma_16816<false>(s, qa[2 * j][0], qa[2 * j][1], c.x, c.y);
      mma_16816<false>(s, qa[2 * j + 1][0], qa[2 * j + 1][1], c.z, c.w);
    }
  }
}

// P for this lane's two scores, packed as the operand type; *rounded_sum: the two as rounded (the
// softmax denominator counts the P that P V uses).
template <bool kFp8>
__device__ __forceinline__ uint32_t pack_p(float p0, float p1, float* rounded_sum) {
  if constexpr (kFp8) {
    const uint32_t pa = pack_f16x2(p0, p1);
    const float2 r = __half22float2(*reinterpret_cast<const __half2*>(&pa));
    *rounded_sum = r.x + r.y;
    return pa;
  } else {
    const uint32_t pa = mma::pack_bf16x2(p0, p1);
    *rounded_sum = __uint_as_float(pa << 16) + __uint_as_float(pa & 0xffff0000u);
    return pa;
  }
}

// O^T += V^T P^T over 8 keys (m16n8k8: A = V^T, 16 dims x the 8 keys; B = P^T, whose fragment pa is
// this lane's (p0, p1) of head g). The V^T rows are permuted like K's dims: m-tile i, row g (a0) is
// dim 16g + i and row g + 8 (a1) is dim 16g + 8 + i, so lane (g, t) reads dims 16g..16g + 15 of keys
// v_row = 2t and v_row + 1 (tile rows) in whole chunks. o[i] = O[heads 2t, 2t + 1][dim 16g + i]
// (0, 1) and [dim 16g + 8 + i] (2, 3).
template <bool kFp8>
__device__ __forceinline__ void accumulate_pv_8_keys(float (&o)[kDimTiles][4], const unsigned char* v_tile, int v_row, int g,
                                                     uint32_t pa) {
  constexpr int kRowBytes = kHeadDim * (kFp8 ? 1 : 2);
  const unsigned char* v0_at = v_tile + v_row * kRowBytes;
  const unsigned char* v1_at = v0_at + kRowBytes;
  if constexpr (kFp8) {  // chunk g of keys v_row, v_row + 1: byte i is dim 16g + i
    const uint4 r0 = lds_128(v0_at + ((g ^ swizzle<true>(v_row)) * 16));
    const uint4 r1 = lds_128(v1_at + ((g ^ swizzle<true>(v_row + 1)) * 16));
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i) {
      const uint32_t sel = (i % 4) | ((4 + i % 4) << 4);  // byte i % 4 of each key's word
      const uint32_t a0 = e4m3x2_to_f16x2(__byte_perm(word(r0, i / 4), word(r1, i / 4), sel));
      const uint32_t a1 = e4m3x2_to_f16x2(__byte_perm(word(r0, 2 + i / 4), word(r1, 2 + i / 4), sel));
      mma_1688<true>(o[i], a0, a1, pa);
    }
  } else {  // chunks 2g (dims 16g..16g + 7) and 2g + 1 of keys v_row, v_row + 1
    const uint4 r0lo = lds_128(v0_at + (((2 * g) ^ swizzle<false>(v_row)) * 16));
    const uint4 r0hi = lds_128(v0_at + (((2 * g + 1) ^ swizzle<false>(v_row)) * 16));
    const uint4 r1lo = lds_128(v1_at + (((2 * g) ^ swizzle<false>(v_row + 1)) * 16));
    const uint4 r1hi = lds_128(v1_at + (((2 * g + 1) ^ swizzle<false>(v_row + 1)) * 16));
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i) {
      const uint32_t sel = i % 2 ? 0x7632u : 0x5410u;  // element i % 2 of each key's word
      const uint32_t a0 = __byte_perm(word(r0lo, i / 2), word(r1lo, i / 2), sel);
      const uint32_t a1 = __byte_perm(word(r0hi, i / 2), word(r1hi, i / 2), sel);
      mma_1688<false>(o[i], a0, a1, pa);
    }
  }
}

// O^T *= the corrections of heads 2t (columns 0, 2 of each fragment) and 2t + 1 (1, 3), which the
// lanes owning rows 2t and 2t + 1 of S hold (corr: this lane's, of head g). Once a warp's maxima
// settle every correction is exactly 1 and the warp skips the multiplies.
__device__ __forceinline__ void rescale_o(float (&o)[kDimTiles][4], float corr, int t) {
  if (__all_sync(0xffffffffu, corr == 1.f)) return;
  const float corr_lo = __shfl_sync(0xffffffffu, corr, 8 * t), corr_hi = __shfl_sync(0xffffffffu, corr, 8 * t + 4);
#pragma unroll
  for (int i = 0; i < kDimTiles; ++i) {
    o[i][0] *= corr_lo;
    o[i][1] *= corr_hi;
    o[i][2] *= corr_lo;
    o[i][3] *= corr_hi;
  }
}

// A warp's running state over its keys: Q's fragments, O^T, and per head row g the running max
// (log2 units) and this lane's part of the sum.
template <bool kFp8>
struct WarpSoftmax {
  uint32_t qa[kKSteps][2];
  float o[kDimTiles][4];
  float m, l;

  // q_row: head g's BF16 values, or null past the group's heads.
  __device__ __forceinline__ void start(const uint16_t* q_row, int t) {
    load_q<kFp8>(qa, q_row, t);
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    m = -INFINITY;
    l = 0.f;
  }
  // The online softmax over kSub score tiles (sc[j]: this lane's two scores of tile j, in log2
  // units, -inf where masked): the new max, O^T rescaled, the sum, and P's fragments pa[j].
  template <int kSub>
  __device__ __forceinline__ void step(const float (&sc)[kSub][2], uint32_t (&pa)[kSub], int t) {
    float m_tile = -INFINITY;
#pragma unroll
    for (int j = 0; j < kSub; ++j) m_tile = fmaxf(m_tile, fmaxf(sc[j][0], sc[j][1]));
    m_tile = fmaxf(m_tile, __shfl_xor_sync(0xffffffffu, m_tile, 1));
    m_tile = fmaxf(m_tile, __shfl_xor_sync(0xffffffffu, m_tile, 2));
    const float m_new = fmaxf(m, m_tile);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no key yet: exp2 gives 0, not NaN
    const float corr = mma::fast_exp2(m - m_use);
    m = m_new;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kSub; ++j) {
      float p_sum;
      pa[j] = pack_p<kFp8>(mma::fast_exp2(sc[j][0] - m_use), mma::fast_exp2(sc[j][1] - m_use), &p_sum);
      sum += p_sum;
    }
    l = __fmaf_rn(l, corr, sum);
    rescale_o(o, corr, t);
  }
  // The full sum of head row g in every lane of the row.
  __device__ __forceinline__ void finish_sum() {
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
  }
};

}  // namespace llmq::attention::decode_frag
