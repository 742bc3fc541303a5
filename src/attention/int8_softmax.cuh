// The online-softmax step of the full-INT8 and FP8 attention kernels (mma.sync and wgmma alike):
// one key tile's scores in the accumulator layout that m16n8 mma.sync and m64nN wgmma share (per
// thread (g, t) of a warp's 16 rows: s[n][e] is row g + 8 (e / 2), key 8n + 2t + e % 2), turned into
// the quantized P as A-operand fragments of the P V product and the factors that fold that
// product into O. Internal; CUDA sources only.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "runtime/attention_mma.cuh"

namespace llmq::attention {

constexpr float kFp8POffset = 8.0f;  // FP8 P: 2^8 = 256 <= 448 (the specification's p_offset)

// Full-INT8 (p_tile_max): P = rint(255 * 2^((s - m_tile) * scale_log2)) as an unsigned byte
// against the tile's row maximum; the tile's row sum and P V enter the running ones times
// carry = 2^((m_tile - m) * scale_log2), the old ones times corr = 2^((m_old - m) * scale_log2).
// kFp8 (FlashAttention-3's FP8 P): P = e4m3(2^((s - m) * scale_log2 + 8)) against the running
// maximum m, the row sum of the decoded codes; carry = 1.
// p_frag[kk]: the k32 A fragment of 32-key step kk in the kappa key order (a0: keys 2t, 2t+1 of
// n-tiles 4kk, 4kk+1 of row g; a1: row g + 8; a2, a3: n-tiles 4kk+2, 4kk+3), which is why V is
// stored transposed in that order (attention_v_t_column).
// x + 1.5 * 2^23 as a float holds the integer nearest x in its low mantissa bits (for |x| < 2^22);
// and an integer |i| < 2^22 added to those bits reads back as float exactly. Both replace the
// quarter-rate conversion instructions (I2F / F2I) that share a pipe with the SFU's exp2.
constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23
constexpr uint32_t kRoundMagicBits = 0x4B400000u;
__device__ __forceinline__ float small_int_to_float(int32_t i) { return __int_as_float(i + kRoundMagicBits) - kRoundMagic; }

template <int kKeys, bool kFp8>
__device__ __forceinline__ void quantize_p_tile(const float (&s)[kKeys / 8][4], float (&row_max)[2], float (&row_sum)[2],
                                                float scale_log2, uint32_t (&p_frag)[kKeys / 32][4], float (&corr)[2],
                                                float (&carry)[2]) {
  using runtime::attn::fast_exp2;
  constexpr int kKeyTiles = kKeys / 8;
  // p_bits[n][e]: the byte of P in the low 8 bits (upper bits don't care; the packing below drops them).
  uint32_t p_bits[kKeyTiles][4];
  float fp8_sum[2] = {0.f, 0.f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mt = -INFINITY;
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) mt = fmaxf(mt, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
    const float m = fmaxf(row_max[r], mt);
    const float m_scaled = m == -INFINITY ? 0.f : m * scale_log2;
    const float mt_scaled = mt == -INFINITY ? 0.f : mt * scale_log2;
    corr[r] = fast_exp2(__fmaf_rn(row_max[r], scale_log2, -m_scaled));
    carry[r] = mt == -INFINITY ? 0.f : fast_exp2(mt_scaled - m_scaled);
    row_max[r] = m;
    if constexpr (kFp8) {
      carry[r] = 1.f;  // P against the running maximum
      // Two codes per conversion; the row sum of the decoded pair in FP16 (P <= 256, 3-bit
      // mantissas: a thread's 16 values sum with at most a few ulp of FP16 rounding).
      __half2 sum2 = __float2half2_rn(0.f);
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
        const float2 x = make_float2(fast_exp2(__fmaf_rn(s[n][2 * r], scale_log2, -m_scaled) + kFp8POffset),
                                     fast_exp2(__fmaf_rn(s[n][2 * r + 1], scale_log2, -m_scaled) + kFp8POffset));
        const __nv_fp8x2_storage_t codes = __nv_cvt_float2_to_fp8x2(x, __NV_SATFINITE, __NV_E4M3);
        p_bits[n][2 * r] = codes;
        p_bits[n][2 * r + 1] = codes >> 8;
        sum2 = __hadd2(sum2, __half2(__nv_cvt_fp8x2_to_halfraw2(codes, __NV_E4M3)));
      }
      const float2 sf = __half22float2(sum2);
      fp8_sum[r] = sf.x + sf.y;
    } else {
      // P = rint(255 * 2^(..)) in one rounding: the FMA's result is 1.5 * 2^23 + P.
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e)
          p_bits[n][e] = __float_as_uint(__fmaf_rn(255.f, fast_exp2(__fmaf_rn(s[n][e], scale_log2, -mt_scaled)), kRoundMagic));
    }
  }
#pragma unroll
  for (int kk = 0; kk < kKeys / 32; ++kk) {
    const auto pack = [&](int n, int e) {  // keys 2t, 2t+1 of n-tile n and of n-tile n + 1, row of e
      return __byte_perm(__byte_perm(p_bits[n][e], p_bits[n][e + 1], 0x0040),
                         __byte_perm(p_bits[n + 1][e], p_bits[n + 1][e + 1], 0x0040), 0x5410);
    };
    p_frag[kk][0] = pack(4 * kk, 0);
    p_frag[kk][1] = pack(4 * kk, 2);
    p_frag[kk][2] = pack(4 * kk + 2, 0);
    p_frag[kk][3] = pack(4 * kk + 2, 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum;
    if constexpr (kFp8) {
      sum = fp8_sum[r];
    } else {
      // The row's bytes: fragments a0 / a2 (row g) or a1 / a3 (row g + 8), four per dp4a.
      uint32_t isum = 0;
#pragma unroll
      for (int kk = 0; kk < kKeys / 32; ++kk) {
        isum = __dp4a(p_frag[kk][r], 0x01010101u, isum);
        isum = __dp4a(p_frag[kk][2 + r], 0x01010101u, isum);
      }
      sum = small_int_to_float(static_cast<int32_t>(isum));
    }
    row_sum[r] = __fmaf_rn(row_sum[r], corr[r], sum * carry[r]);
  }
}

// O = O * corr + (P V) * carry * v_scale[channel], the tile's P V fresh in pv (INT32 or FP32, the
// accumulator layout above over channels); v_scale: this tile's per-channel scales.
template <int kHeadDim, typename PvAcc>
__device__ __forceinline__ void fold_pv_tile(float (&o)[kHeadDim / 8][4], const PvAcc (&pv)[kHeadDim / 8][4],
                                             const float (&corr)[2], const float (&carry)[2], const float* v_scale, int t) {
#pragma unroll
  for (int d = 0; d < kHeadDim / 8; ++d) {
    const float2 sv = *reinterpret_cast<const float2*>(v_scale + d * 8 + 2 * t);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x;
      if constexpr (std::is_same_v<PvAcc, int32_t>) {
        x = small_int_to_float(pv[d][e]);  // |P V| <= 64 * 255 * 127 < 2^22
      } else {
        x = pv[d][e];
      }
      o[d][e] = __fmaf_rn(o[d][e], corr[e / 2], x * ((e & 1 ? sv.y : sv.x) * carry[e / 2]));
    }
  }
}

// The epilogue: O / l (l summed over the quad that shares a row) as BF16 into the rows
// `out_row[r]` (row g + 8r; null: a row past the queries, skipped).
template <int kHeadDim>
__device__ __forceinline__ void store_normalized_rows(const float (&o)[kHeadDim / 8][4], const float (&row_sum)[2],
                                                      uint16_t* const (&out_row)[2], int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    if (out_row[r] == nullptr) continue;
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d)
      *reinterpret_cast<uint32_t*>(out_row[r] + d * 8 + 2 * t) =
          runtime::attn::pack_bf16x2(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
  }
}

}  // namespace llmq::attention
