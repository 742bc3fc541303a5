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

#include "attention/attention_mma.cuh"

namespace llmq::attention {

constexpr float kFp8POffset = 8.0f;  // FP8 P: 2^8 = 256 <= 448 (the specification's p_offset)

// Full-INT8 (p_tile_max): P = rint(255 * 2^(x - x_tile)) as an unsigned byte against the tile's
// row maximum, x = s * row_scale the score in log2 units (row_scale: the softmax scale times log2(e),
// and the query's scale where the caller leaves it out of s). O and l are kept in a per-row frame
// (frame[r], log2 units) instead of against the running maximum m (row_max[r], log2 units):
// normally the frame is the latest tile's maximum, so the tile's P V enters as it is (carry = 1)
// and the old O is multiplied by corr = 2^(frame_old - frame), one FMA per element for both; the
// output O / l does not depend on the frame. The frame stays within kFrameGap of m (O and l then
// stay under 2^kFrameGap times their size against m, finite): a tile whose maximum lies further
// below m enters times carry = 2^(x_tile - frame).
// kFp8 (FlashAttention-3's FP8 P): P = e4m3(2^(x - m + 8)) against the running maximum m (the
// frame, which row_max mirrors), the row sum of the decoded codes; carry = 1.
// p_frag[kk]: the k32 A fragment of 32-key step kk in the kappa key order (a0: keys 2t, 2t+1 of
// n-tiles 4kk, 4kk+1 of row g; a1: row g + 8; a2, a3: n-tiles 4kk+2, 4kk+3), which is why V is
// stored transposed in that order (attention_v_t_column).
// x + 1.5 * 2^23 as a float holds the integer nearest x in its low mantissa bits (for |x| < 2^22);
// and an integer |i| < 2^22 added to those bits reads back as float exactly. Both replace the
// quarter-rate conversion instructions (I2F / F2I) that share a pipe with the SFU's exp2.
constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23
constexpr uint32_t kRoundMagicBits = 0x4B400000u;
constexpr float kFrameGap = 64.0f;
__device__ __forceinline__ float small_int_to_float(int32_t i) { return __int_as_float(i + kRoundMagicBits) - kRoundMagic; }
// i * scale in one FMA: (1.5 * 2^23 + i) * scale + neg_magic_scale, neg_magic_scale = -1.5 * 2^23 *
// scale (rounded: the product then carries at most half a unit of i of error, far under any 8-bit
// quantization step).
__device__ __forceinline__ float small_int_times(int32_t i, float scale, float neg_magic_scale) {
  return __fmaf_rn(__int_as_float(i + kRoundMagicBits), scale, neg_magic_scale);
}

// Four E4M3 codes (round to nearest, saturating to +-448) in one register, bytes low to high
// e4m3(a0), e4m3(a1), e4m3(b0), e4m3(b1): on sm_89+ two conversions whose 16-bit halves ptxas
// merges in place (through __nv_cvt_float2_to_fp8x2 each half came back zero-extended and took a
// mask and a permute to join). Older targets (the portable build's compute_80 PTX, where these
// instructions do not exist) take cuda_fp8.h's software path, same codes.
__device__ __forceinline__ uint32_t e4m3x4(float a0, float a1, float b0, float b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t word;
  asm("{\n.reg .b16 lo, hi;\n"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"  // the first source goes to the upper byte
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, {lo, hi};\n}\n"
      : "=r"(word)
      : "f"(a0), "f"(a1), "f"(b0), "f"(b1));
  return word;
#else
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a0, a1), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(b0, b1), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
#endif
}
// The four codes of an e4m3x4 word decoded exactly as FP16 pairs: lo (bytes 0, 1), hi (bytes 2, 3).
__device__ __forceinline__ void e4m3x4_to_half2x2(uint32_t word, __half2& lo, __half2& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t a, b;
  asm("{\n.reg .b16 lo, hi;\n"
      "mov.b32 {lo, hi}, %2;\n"
      "cvt.rn.f16x2.e4m3x2 %0, lo;\n"
      "cvt.rn.f16x2.e4m3x2 %1, hi;\n}\n"
      : "=r"(a), "=r"(b)
      : "r"(word));
  lo = *reinterpret_cast<const __half2*>(&a);
  hi = *reinterpret_cast<const __half2*>(&b);
#else
  lo = __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word & 0xffffu), __NV_E4M3));
  hi = __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> 16), __NV_E4M3));
#endif
}

template <int kKeys, bool kFp8>
__device__ __forceinline__ void quantize_p_tile(const float (&s)[kKeys / 8][4], const float (&row_scale)[2],
                                                float (&row_max)[2], float (&frame)[2], float (&row_sum)[2],
                                                uint32_t (&p_frag)[kKeys / 32][4],
                                                float (&corr)[2], float (&carry)[2]) {
  using attention::mma::fast_exp2;
  constexpr int kKeyTiles = kKeys / 8;
  // INT8: p_bits[n][e] holds the byte of P in its low 8 bits (the packing drops the rest).
  // FP8: words[n / 2][r] holds row r's codes of n-tiles n, n + 1 (keys 2t, 2t + 1 of each).
  uint32_t p_bits[kFp8 ? 1 : kKeyTiles][4];
  uint32_t words[kFp8 ? kKeyTiles / 2 : 1][2];
  float fp8_sum[2] = {0.f, 0.f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mt = -INFINITY;
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) mt = fmaxf(mt, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
    const float xt = mt * row_scale[r];  // -inf stays -inf (row_scale > 0)
    const float old = frame[r];
    if constexpr (kFp8) {
      const float m = fmaxf(old, xt);
      frame[r] = row_max[r] = m;
      corr[r] = m == old ? 1.f : fast_exp2(old - m);
      carry[r] = 1.f;
      const float shift = m == -INFINITY ? 0.f : m - kFp8POffset;
      // Four codes per register (n-tiles n, n + 1: the A fragment's word), two conversions; the
      // row sum of the decoded pairs in FP16, two chains of at most 8 pairs (P <= 256 with 3-bit
      // mantissas: each sum stays <= 2048, a few ulp of FP16 rounding).
      __half2 sum2[2] = {__float2half2_rn(0.f), __float2half2_rn(0.f)};
#pragma unroll
      for (int n = 0; n < kKeyTiles; n += 2) {
        float x[2][2];
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 2; ++e) x[h][e] = fast_exp2(__fmaf_rn(s[n + h][2 * r + e], row_scale[r], -shift));
        const uint32_t word = e4m3x4(x[0][0], x[0][1], x[1][0], x[1][1]);
        words[n / 2][r] = word;
        __half2 lo, hi;
        e4m3x4_to_half2x2(word, lo, hi);
        sum2[0] = __hadd2(sum2[0], lo);
        sum2[1] = __hadd2(sum2[1], hi);
      }
      const float2 s0 = __half22float2(sum2[0]), s1 = __half22float2(sum2[1]);
      fp8_sum[r] = (s0.x + s0.y) + (s1.x + s1.y);
    } else {
      const float m = fmaxf(row_max[r], xt);
      row_max[r] = m;
      float f = fmaxf(xt, m - kFrameGap);
      if (xt == -INFINITY) f = old;  // nothing in this tile's row: the frame stays
      frame[r] = f;
      corr[r] = f == old ? 1.f : fast_exp2(old - f);
      carry[r] = xt == f ? 1.f : (xt == -INFINITY ? 0.f : fast_exp2(xt - f));
      const float shift = xt == -INFINITY ? 0.f : xt;
      // P = rint(255 * 2^(..)) in one rounding: the FMA's result is 1.5 * 2^23 + P.
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e)
          p_bits[n][e] =
              __float_as_uint(__fmaf_rn(255.f, fast_exp2(__fmaf_rn(s[n][e], row_scale[r], -shift)), kRoundMagic));
    }
  }
#pragma unroll
  for (int kk = 0; kk < kKeys / 32; ++kk) {
    if constexpr (kFp8) {  // whole fragment words already
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int r = 0; r < 2; ++r) p_frag[kk][2 * h + r] = words[2 * kk + h][r];
    } else {
      const auto pack = [&](int n, int e) {  // keys 2t, 2t+1 of n-tile n and of n-tile n + 1, row of e
        return __byte_perm(__byte_perm(p_bits[n][e], p_bits[n][e + 1], 0x0040),
                           __byte_perm(p_bits[n + 1][e], p_bits[n + 1][e + 1], 0x0040), 0x5410);
      };
      p_frag[kk][0] = pack(4 * kk, 0);
      p_frag[kk][1] = pack(4 * kk, 2);
      p_frag[kk][2] = pack(4 * kk + 2, 0);
      p_frag[kk][3] = pack(4 * kk + 2, 2);
    }
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
// accumulator layout above over channels); v_scale: this tile's per-channel scales. carry is 1 for
// every row of the warp but after a frame clamp (quantize_p_tile): the common path skips it; so
// does FP8's common path skip corr when it is 1.
// The scales come as floats, or (float2) as pairs {scale, -1.5 * 2^23 * scale} for small_int_times.
template <int kHeadDim, typename PvAcc, typename Scale>
__device__ __forceinline__ void fold_pv_tile(float (&o)[kHeadDim / 8][4], const PvAcc (&pv)[kHeadDim / 8][4],
                                             const float (&corr)[2], const float (&carry)[2], const Scale* v_scale, int t) {
  constexpr bool kInt = std::is_same_v<PvAcc, int32_t>;  // |P V| <= 128 * 255 * 127 < 2^22
  constexpr bool kPairs = std::is_same_v<Scale, float2>;
  const auto fold = [&](auto with_carry, auto with_corr) {
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d) {
      float sv[2], neg_magic_sv[2];  // channels 2t, 2t + 1 of this 8-channel tile
      if constexpr (kPairs) {
        const float4 s4 = *reinterpret_cast<const float4*>(v_scale + d * 8 + 2 * t);
        sv[0] = s4.x, neg_magic_sv[0] = s4.y, sv[1] = s4.z, neg_magic_sv[1] = s4.w;
      } else {
        const float2 s2 = *reinterpret_cast<const float2*>(v_scale + d * 8 + 2 * t);
        sv[0] = s2.x, sv[1] = s2.y;
        neg_magic_sv[0] = -kRoundMagic * s2.x, neg_magic_sv[1] = -kRoundMagic * s2.y;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float scale = sv[e & 1];
        if constexpr (!decltype(with_corr)::value) {
          o[d][e] = __fmaf_rn(pv[d][e], scale, o[d][e]);  // FP32 P V, corr = carry = 1
        } else {
          float x;
          if constexpr (kInt) {
            x = small_int_times(pv[d][e], scale, neg_magic_sv[e & 1]);
          } else {
            x = pv[d][e] * scale;
          }
          if constexpr (decltype(with_carry)::value) x *= carry[e / 2];
          o[d][e] = __fmaf_rn(o[d][e], corr[e / 2], x);
        }
      }
    }
  };
  if constexpr (kInt) {
    if (__all_sync(0xffffffffu, carry[0] == 1.f && carry[1] == 1.f)) fold(std::false_type{}, std::true_type{});
    else fold(std::true_type{}, std::true_type{});
  } else {
    // FP8 (carry 1, P against the running maximum): once the maxima settle, corr is 1 for every
    // row of the warp in most tiles, and O takes the tile in one FMA per element.
    if (__all_sync(0xffffffffu, corr[0] == 1.f && corr[1] == 1.f)) fold(std::false_type{}, std::false_type{});
    else fold(std::false_type{}, std::true_type{});
  }
}

// The attention sink's share of a row's denominator (the specification's u * 2^(s_h log2(e) - m)),
// in the units of that row's sum: a score equal to ref_log2 (log2 units: the running maximum or
// the frame the row sum is kept against) weighs 1 (BF16 P), 255 (full-INT8 P) or 2^8 (FP8 P).
// A row that saw no key (ref -inf) gets 0: it writes zeros.
enum SinkUnit { kSinkUnit, kSinkInt8, kSinkFp8 };
template <SinkUnit kUnit>
__device__ __forceinline__ float sink_share(float sink, float ref_log2) {
  using attention::mma::fast_exp2;
  if (ref_log2 == -INFINITY) return 0.f;
  const float x = __fmaf_rn(sink, attention::mma::kLog2e, -ref_log2);
  if constexpr (kUnit == kSinkInt8) return 255.f * fast_exp2(x);
  if constexpr (kUnit == kSinkFp8) return fast_exp2(x + kFp8POffset);
  return fast_exp2(x);
}

// The epilogue: O out_scale / (l + sink[r]) (l summed over the quad that shares a row; sink:
// sink_share, read only with kSink; out_scale / (l + sink) taken once) as BF16 into the rows
// `out_row[r]` (row g + 8r; null: a row past the queries, skipped).
template <int kHeadDim, bool kSink>
__device__ __forceinline__ void store_normalized_rows(const float (&o)[kHeadDim / 8][4], const float (&row_sum)[2],
                                                      const float (&sink)[2], uint16_t* const (&out_row)[2], int t,
                                                      float out_scale = 1.f) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if constexpr (kSink) sum += sink[r];
    const float inv = sum > 0.f ? out_scale / sum : 0.f;
    if (out_row[r] == nullptr) continue;
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d)
      *reinterpret_cast<uint32_t*>(out_row[r] + d * 8 + 2 * t) =
          attention::mma::pack_bf16x2(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
  }
}

}  // namespace llmq::attention
