// Device ports of llmq's reference numerics for quantize: the saturating FP8 encoder of
// src/core/format.cpp (integer path, RNE and stochastic), the INT8 encoder, exceeds_range (the
// clip count), Philox4x32-10, and absmax_scale / round_scale of src/core/scale.cpp. Every function
// here must agree with its CPU original bit for bit; tests/test_cuda_quantize.cu checks that.
// Internal header; CUDA sources only.
//
// Everything but the hardware cvt is __host__ __device__, with host fallbacks for the intrinsics
// (IEEE float/double arithmetic is the same on both sides), so the tests can compare these very
// functions with the CPU reference over millions of inputs without a GPU.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace llmq::quant_kernels {

#define LLMQ_HD __host__ __device__ __forceinline__

// ---- Intrinsics with host twins.
LLMQ_HD uint32_t as_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
LLMQ_HD float as_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
LLMQ_HD uint32_t mul_hi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}
// Correctly rounded float ops, never contracted into an FMA (the build also passes -fmad=false).
LLMQ_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LLMQ_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
LLMQ_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
LLMQ_HD double ddiv_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
LLMQ_HD float double_to_float_rn(double d) {
#if defined(__CUDA_ARCH__)
  return __double2float_rn(d);
#else
  return static_cast<float>(d);
#endif
}
// cvt.rni.s32.f32: nearest even; NaN -> 0; out of range (Inf included) saturates.
LLMQ_HD int float_to_int_rn(float v) {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(v);
#else
  if (v != v) return 0;
  if (v >= 2147483648.0f) return INT_MAX;
  if (v <= -2147483648.0f) return INT_MIN;
  return static_cast<int>(std::nearbyint(v));
#endif
}
// Truncating float -> uint32 for an integral value in [0, 2^32).
LLMQ_HD uint32_t float_to_uint_rz(float v) {
#if defined(__CUDA_ARCH__)
  return __float2uint_rz(v);
#else
  return static_cast<uint32_t>(v);
#endif
}

// How codes are produced; the rounding mode is part of the encoder, so every kernel instance is
// compiled for one mode (no per-element branch on it). The hardware cvt is used where it equals the
// reference (OCP E4M3 and E5M2, saturating); every other FP8 case runs the integer encoder.
enum class Encoder : int {
  kE4M3Hw,     // RNE: cvt.rn.satfinite.e4m3x2.f32
  kE5M2Hw,     // RNE: cvt.rn.satfinite.e5m2x2.f32
  kSoftFp8,    // RNE, any FP8 layout (the integer path of encode_float)
  kInt8,       // RNE: clamp, then round by adding 1.5 * 2^23 (no cvt; NaN -> 0)
  kE4M3HwSr,   // stochastic OCP E4M3: Philox noise added to the float bits, truncated to the FP8
               // grid, then the exact hardware cvt (the integer path below the FP8 normal range)
  kE5M2HwSr,   // stochastic OCP E5M2, the same way
  kSoftFp8Sr,  // stochastic, any FP8 layout (the integer path)
  kInt8Sr,     // stochastic INT8
};

__host__ __device__ constexpr bool is_stochastic(Encoder e) {
  return e == Encoder::kE4M3HwSr || e == Encoder::kE5M2HwSr || e == Encoder::kSoftFp8Sr || e == Encoder::kInt8Sr;
}
__host__ __device__ constexpr bool is_int8(Encoder e) { return e == Encoder::kInt8 || e == Encoder::kInt8Sr; }

// Everything the element encoders read. Filled on the host from llmq::format_info and the
// reference encoder itself (nan_code, max_code, clip_bits), so the facts have one source.
struct EncodeParams {
  int mantissa_bits = 3;
  int exponent_bias = 7;
  uint32_t max_bits = 0;        // float32 bits of the largest finite value
  uint32_t max_code = 0;        // code magnitude of the largest finite value
  uint32_t nan_code = 0;        // what NaN encodes to (0x7F, or 0x80 for fnuz)
  bool no_negative_zero = false;  // fnuz: -0 and negative values rounding to 0 store 0x00
  // FP8 clip test: |v| clips iff its float bits are >= clip_bits (and v is not NaN): the smallest
  // magnitude that round-to-nearest carries past max (465 > 464 for E4M3, Inf included).
  uint32_t clip_bits = 0x7F800000u;
  bool stochastic = false;
  uint64_t seed = 0;  // Philox key; the counter is the flat element index r * cols + c
};

inline constexpr int kMaxHardwareScales = 32;

// absmax_scale + round_scale of src/core/scale.cpp, with the spec's constants precomputed.
struct ScaleParams {
  bool unit = false;            // ScaleMethod::kUnit: s = 1, no rounding
  float floor = 0.0f;           // effective_min_scale(spec)
  double target = 0.0;          // backoff * r_q, in double as the CPU computes it
  float target_f = 0.0f;        // the same as a float when exact (then float division is exact)
  bool float_division = false;  // target == double(target_f)
  int rounding = 0;             // 0 none, 1 power of two, 2 hardware set
  int pow2_min_exp = -126;
  int pow2_max_exp = 127;
  int hardware_count = 0;
  float hardware_scales[kMaxHardwareScales] = {};
};

// ---- Philox4x32-10 (philox_random_u32 in format.cpp): counter (index_lo, index_hi, 0, 0), key
// ---- (seed_lo, seed_hi), first output word.
LLMQ_HD uint32_t philox_u32(uint64_t seed, uint64_t index) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(index), c1 = static_cast<uint32_t>(index >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = mul_hi(kMul0, c0), lo0 = kMul0 * c0;
    const uint32_t hi1 = mul_hi(kMul1, c2), lo1 = kMul1 * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return c0;
}

// Philox words for the 16 consecutive counters flat0 .. flat0 + 15 of one pack, flat0 % 16 == 0
// (so the low counter word never carries into the high one): equal to philox_u32(seed, flat0 + j).
// Rounds 1 and 2 are partly the same for all 16 counters (c2 = c3 = 0 at the start, so round 1's
// new c0 is c1 ^ k0, whose round-2 product is shared); the last two rounds keep only what word 0
// needs (the compiler drops the rest).
struct PhiloxPack {
  static constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  static constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t lo = 0, k0 = 0, k1 = 0;  // counter low word (multiple of 16), key
  uint32_t shared_hi = 0, shared_lo = 0;  // round 2: kMul0 * (c1 ^ k0)
  LLMQ_HD PhiloxPack(uint64_t seed, uint64_t flat0) {
    lo = static_cast<uint32_t>(flat0);
    k0 = static_cast<uint32_t>(seed);
    k1 = static_cast<uint32_t>(seed >> 32);
    const uint32_t c0 = static_cast<uint32_t>(flat0 >> 32) ^ k0;
    shared_hi = mul_hi(kMul0, c0);
    shared_lo = kMul0 * c0;
  }
  LLMQ_HD uint32_t word(uint32_t j) const {
    // Round 1 (c2 = c3 = 0): c0' = c1 ^ k0 (shared), c1' = 0, c2' = hi(M0 c0) ^ k1, c3' = lo(M0 c0).
    const uint32_t c0 = lo + j;
    const uint32_t r1_c2 = mul_hi(kMul0, c0) ^ k1;
    const uint32_t r1_c3 = kMul0 * c0;
    // Round 2 (keys + 1 step): the M0 product is the shared one; c1 = 0.
    uint32_t a0 = mul_hi(kMul1, r1_c2) ^ (k0 + kWeyl0);
    uint32_t a1 = kMul1 * r1_c2;
    uint32_t a2 = shared_hi ^ r1_c3 ^ (k1 + kWeyl1);
    uint32_t a3 = shared_lo;
    uint32_t kk0 = k0 + 2u * kWeyl0, kk1 = k1 + 2u * kWeyl1;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int round = 2; round < 10; ++round) {
      const uint32_t hi0 = mul_hi(kMul0, a0), lo0 = kMul0 * a0;
      const uint32_t hi1 = mul_hi(kMul1, a2), lo1 = kMul1 * a2;
      const uint32_t n0 = hi1 ^ a1 ^ kk0;
      const uint32_t n2 = hi0 ^ a3 ^ kk1;
      a0 = n0;
      a1 = lo1;
      a2 = n2;
      a3 = lo0;
      kk0 += kWeyl0;
      kk1 += kWeyl1;
    }
    return a0;
  }
};

// ---- FP8, integer path of encode_float with Saturation::kSatFinite, for any 8-bit layout.
// |x| = significand * 2^(e32 - 23); the target grid at `exponent` has step 2^(exponent - M), so
// the value on that grid is significand >> shift and the dropped bits decide the rounding. 32-bit
// arithmetic suffices: the significand has 24 bits, and a shift of 25 or more leaves 0 under
// RNE (the dropped bits are below half a step) while the stochastic threshold is computed exactly.
template <bool kStochastic>
LLMQ_HD uint32_t encode_fp8_soft_t(float x, const EncodeParams& p, uint32_t random_bits) {
  const uint32_t bits = as_bits(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return p.nan_code;  // NaN, either sign
  uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > p.max_bits) abs_bits = p.max_bits;  // satfinite, Inf included
  const int biased32 = static_cast<int>(abs_bits >> 23);
  const uint32_t significand = (abs_bits & 0x7FFFFFu) | (biased32 != 0 ? 0x800000u : 0u);
  const int e32 = biased32 != 0 ? biased32 - 127 : -126;
  const int emin = 1 - p.exponent_bias;
  const int exponent = e32 > emin ? e32 : emin;  // a float32 subnormal has e32 = -126 < emin
  const int shift = 23 + exponent - p.mantissa_bits - e32;  // >= 20
  uint32_t rounded = shift < 32 ? significand >> shift : 0u;
  const uint32_t dropped = shift < 32 ? significand & ((1u << shift) - 1u) : significand;
  if constexpr (!kStochastic) {
    if (shift <= 32) {
      const uint32_t half = 1u << (shift - 1);
      if (dropped > half || (dropped == half && (rounded & 1u))) ++rounded;
    }
  } else {
    // Round up with probability dropped / 2^shift, resolved to 32 bits (< 2^32 in every case).
    const uint32_t threshold = shift >= 32 ? (shift - 32 < 32 ? dropped >> (shift - 32) : 0u)
                                           : dropped << (32 - shift);
    if (random_bits < threshold) ++rounded;
  }
  const uint32_t code = (static_cast<uint32_t>(exponent + p.exponent_bias - 1) << p.mantissa_bits) + rounded;
  const uint32_t magnitude = code > p.max_code ? p.max_code : code;  // cannot happen after the clamp
  if (magnitude == 0 && p.no_negative_zero) return 0;
  return magnitude | ((bits >> 24) & 0x80u);
}

LLMQ_HD uint32_t encode_fp8_soft(float x, const EncodeParams& p, uint32_t random_bits) {
  return p.stochastic ? encode_fp8_soft_t<true>(x, p, random_bits) : encode_fp8_soft_t<false>(x, p, random_bits);
}

// Two elements through the hardware cvt: `lo` lands in the low byte (PTX puts operand a in the
// upper byte). sm_89+ only; the compute_80 PTX build falls back to the integer encoder.
template <Encoder E>
__device__ __forceinline__ uint32_t encode_fp8x2_hw(float lo, float hi, const EncodeParams& p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short d;
  if constexpr (E == Encoder::kE4M3Hw)
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
  return d;
#else
  return encode_fp8_soft_t<false>(lo, p, 0) | (encode_fp8_soft_t<false>(hi, p, 0) << 8);
#endif
}

// exceeds_range(v, fp8 format): Inf and magnitudes that RNE carries past max clip; NaN does not.
LLMQ_HD uint32_t fp8_clips(float v, const EncodeParams& p) {
  const uint32_t a = as_bits(v) & 0x7FFFFFFFu;
  return (a >= p.clip_bits && a <= 0x7F800000u) ? 1u : 0u;
}

// INT8 (encode_scaled with a zero point of 0): NaN -> 0 (no clip); round to an integer (RNE, or
// up with probability frac from 32 random bits, on the magnitude); clamp to [-128, 127], and a
// clamp is a clip. Returns the code byte.
template <bool kStochastic>
LLMQ_HD uint32_t encode_int8_t(float v, uint32_t random_bits, uint32_t& clips) {
  if constexpr (!kStochastic) {
    const int r = float_to_int_rn(v);  // NaN -> 0; beyond int32 (Inf included) saturates
    clips += (r < -128 || r > 127) ? 1u : 0u;
    return static_cast<uint32_t>(r < -128 ? -128 : (r > 127 ? 127 : r)) & 0xFFu;
  }
  if (v != v) return 0u;
  const float a = fabsf(v);
  float r = a;  // Inf stays Inf and clamps
  if (a != as_float(0x7F800000u)) {
    // lo and frac = a - lo are exact; frac * 2^32 is exact and below 2^32, so its floor is an
    // exact integer threshold, as round_magnitude's floor(ldexp(frac, 32)) is in double.
    const float lo = floorf(a);
    const uint32_t threshold = float_to_uint_rz(floorf(mul_rn(a - lo, 4294967296.0f)));
    r = random_bits < threshold ? add_rn(lo, 1.0f) : lo;
  }
  if (v < 0.0f) r = -r;
  if (r < -128.0f) {
    ++clips;
    return 0x80u;
  }
  if (r > 127.0f) {
    ++clips;
    return 0x7Fu;
  }
  return static_cast<uint32_t>(static_cast<int>(r)) & 0xFFu;
}

LLMQ_HD uint32_t encode_int8(float v, const EncodeParams& p, uint32_t random_bits, uint32_t& clips) {
  return p.stochastic ? encode_int8_t<true>(v, random_bits, clips) : encode_int8_t<false>(v, random_bits, clips);
}

// INT8 RNE without a conversion instruction: clamping to [-128, 127] first leaves the rounded
// value the same as rounding then clamping (127.5 and up round to 128 and clamp to 127; -128.5
// rounds to -128 and below it to -129, clamped to -128), and c + 1.5 * 2^23 (one ulp = 1) holds
// the rounded integer in its low mantissa bits: the low byte is the code. NaN -> 0.
LLMQ_HD uint32_t int8_rne_bits(float v) {
  float c = fminf(fmaxf(v, -128.0f), 127.0f);
  c = v != v ? 0.0f : c;
  return as_bits(add_rn(c, 12582912.0f));  // low byte: the code
}
// The clip test of the RNE path: the rounded value leaves [-128, 127] (Inf included, NaN not).
LLMQ_HD uint32_t int8_rne_clips(float v) { return (v >= 127.5f || v < -128.5f) ? 1u : 0u; }

// Stochastic rounding of an OCP FP8 format with M mantissa bits, for |x| = 0 or at least the FP8
// minimum normal (or NaN / Inf): the float bits of the rounded value, which lies on the FP8 grid
// (so round-to-nearest conversion of it is exact). At those magnitudes the reference rounds up iff
// random < dropped << (9 + M), i.e. iff dropped + (~random >> (9 + M)) carries into the kept bits,
// and the carry into the exponent field is the reference's carry into its code. NaN passes
// through; Inf and larger magnitudes clamp to max first, as the reference does.
template <int M>
LLMQ_HD uint32_t fp8_sr_grid_bits(uint32_t bits, uint32_t max_bits, uint32_t random_bits) {
  constexpr int kShift = 23 - M;
  const uint32_t ab = bits & 0x7FFFFFFFu;
  const uint32_t clamped = ab < max_bits ? ab : max_bits;
  const uint32_t noise = (~random_bits) >> (32 - kShift);
  const uint32_t rounded = (clamped + noise) & ~((1u << kShift) - 1u);
  return ab > 0x7F800000u ? bits : (rounded | (bits & 0x80000000u));
}
// Magnitudes the grid-bits path above does not cover: 0 < |x| < 2^emin (FP8 subnormal range).
LLMQ_HD bool fp8_sr_needs_soft(uint32_t bits, uint32_t min_normal_bits) {
  return (bits & 0x7FFFFFFFu) - 1u < min_normal_bits - 1u;  // 0 wraps to 2^32 - 1: no
}
LLMQ_HD uint32_t fp8_min_normal_bits(const EncodeParams& p) {
  return static_cast<uint32_t>(127 + 1 - p.exponent_bias) << 23;
}

// One element, scaled already. `flat` is r * cols + c (the Philox counter).
template <Encoder E>
__device__ __forceinline__ uint32_t encode_one(float v, const EncodeParams& p, uint64_t flat, uint32_t& clips) {
  if constexpr (E == Encoder::kInt8) {
    clips += int8_rne_clips(v);
    return int8_rne_bits(v) & 0xFFu;
  } else if constexpr (E == Encoder::kInt8Sr) {
    return encode_int8_t<true>(v, philox_u32(p.seed, flat), clips);
  } else {
    clips += fp8_clips(v, p);
    if constexpr (E == Encoder::kE4M3Hw || E == Encoder::kE5M2Hw)
      return encode_fp8x2_hw<E>(v, 0.0f, p) & 0xFFu;
    else if constexpr (E == Encoder::kSoftFp8)
      return encode_fp8_soft_t<false>(v, p, 0u);
    else  // every stochastic FP8 encoder: the integer path (the scalar kernels are the fallback)
      return encode_fp8_soft_t<true>(v, p, philox_u32(p.seed, flat));
  }
}

// Clips among 16 scaled elements, for the encoders whose clip test does not depend on the random
// bits (FP8: exceeds_range; INT8 RNE). A pack whose largest magnitude is below the threshold has
// none (NaN is ignored by fmaxf and never clips), so the exact test runs only for the rare packs
// at the range's edge.
template <Encoder E>
__device__ __forceinline__ uint32_t pack_clips(const float (&v)[16], const EncodeParams& p) {
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < 16; ++j) m = fmaxf(m, fabsf(v[j]));
  uint32_t n = 0;
  if constexpr (E == Encoder::kInt8) {
    if (m >= 127.5f) {
#pragma unroll
      for (int j = 0; j < 16; ++j) n += int8_rne_clips(v[j]);
    }
  } else {
    if (as_bits(m) >= p.clip_bits) {
#pragma unroll
      for (int j = 0; j < 16; ++j) n += fp8_clips(v[j], p);
    }
  }
  return n;
}

// Low bytes of four words -> one word (byte j from word j).
__device__ __forceinline__ uint32_t pack_low_bytes(uint32_t b0, uint32_t b1, uint32_t b2, uint32_t b3) {
  return __byte_perm(__byte_perm(b0, b1, 0x0040), __byte_perm(b2, b3, 0x0040), 0x5410);
}

// 16 scaled elements -> 16 code bytes (element j in byte j % 4 of word j / 4). `flat0` is the
// Philox counter of element 0, a multiple of 16. Clips are added to `clips` only when `count`.
template <Encoder E>
__device__ __forceinline__ uint4 encode_pack(const float (&v)[16], const EncodeParams& p, uint64_t flat0,
                                             bool count, uint32_t& clips) {
  uint32_t w[4];
  if constexpr (E == Encoder::kE4M3Hw || E == Encoder::kE5M2Hw) {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      w[k] = encode_fp8x2_hw<E>(v[4 * k], v[4 * k + 1], p) | (encode_fp8x2_hw<E>(v[4 * k + 2], v[4 * k + 3], p) << 16);
  } else if constexpr (E == Encoder::kInt8) {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      w[k] = pack_low_bytes(int8_rne_bits(v[4 * k]), int8_rne_bits(v[4 * k + 1]), int8_rne_bits(v[4 * k + 2]),
                            int8_rne_bits(v[4 * k + 3]));
  } else if constexpr (E == Encoder::kE4M3HwSr || E == Encoder::kE5M2HwSr) {
    constexpr Encoder kHw = E == Encoder::kE4M3HwSr ? Encoder::kE4M3Hw : Encoder::kE5M2Hw;
    constexpr int kM = E == Encoder::kE4M3HwSr ? 3 : 2;
    const PhiloxPack philox(p.seed, flat0);
    const uint32_t min_normal = fp8_min_normal_bits(p);
    uint32_t soft = 0;  // elements in the FP8 subnormal range: bit j
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float t[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t bits = as_bits(v[4 * k + j]);
        t[j] = as_float(fp8_sr_grid_bits<kM>(bits, p.max_bits, philox.word(4 * k + j)));
        soft |= fp8_sr_needs_soft(bits, min_normal) ? 1u << (4 * k + j) : 0u;
      }
      w[k] = encode_fp8x2_hw<kHw>(t[0], t[1], p) | (encode_fp8x2_hw<kHw>(t[2], t[3], p) << 16);
    }
    if (soft != 0) {
#pragma unroll
      for (int j = 0; j < 16; ++j)
        if (soft & (1u << j)) {
          const uint32_t code = encode_fp8_soft_t<true>(v[j], p, philox.word(j));
          w[j / 4] = (w[j / 4] & ~(0xFFu << (8 * (j % 4)))) | (code << (8 * (j % 4)));
        }
    }
  } else if constexpr (E == Encoder::kSoftFp8) {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      w[k] = encode_fp8_soft_t<false>(v[4 * k], p, 0u) | (encode_fp8_soft_t<false>(v[4 * k + 1], p, 0u) << 8) |
             (encode_fp8_soft_t<false>(v[4 * k + 2], p, 0u) << 16) | (encode_fp8_soft_t<false>(v[4 * k + 3], p, 0u) << 24);
  } else if constexpr (E == Encoder::kSoftFp8Sr) {
    const PhiloxPack philox(p.seed, flat0);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[k] = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) w[k] |= encode_fp8_soft_t<true>(v[4 * k + j], p, philox.word(4 * k + j)) << (8 * j);
    }
  } else {  // kInt8Sr: the clip depends on the random bits, so it is counted per element
    const PhiloxPack philox(p.seed, flat0);
    uint32_t n = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[k] = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) w[k] |= encode_int8_t<true>(v[4 * k + j], philox.word(4 * k + j), n) << (8 * j);
    }
    if (count) clips += n;
  }
  if constexpr (E != Encoder::kInt8Sr) {
    if (count) clips += pack_clips<E>(v, p);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// ---- Scales (absmax_scale then round_scale).

// ceil(log2 s) for finite s > 0, exact (frexp is exact on the device too).
LLMQ_HD int ceil_log2(float s) {
  int e = 0;
  const float f = frexpf(s, &e);
  return f == 0.5f ? e - 1 : e;
}

LLMQ_HD float round_scale(float s, const ScaleParams& p) {
  if (p.rounding == 1) {
    if (s != s) return s;
    const float lo = ldexpf(1.0f, p.pow2_min_exp), hi = ldexpf(1.0f, p.pow2_max_exp);
    if (!(s > 0.0f)) return lo;
    if ((as_bits(s) & 0x7FFFFFFFu) == 0x7F800000u) return hi;
    int e = ceil_log2(s);
    e = e < p.pow2_min_exp ? p.pow2_min_exp : (e > p.pow2_max_exp ? p.pow2_max_exp : e);
    return ldexpf(1.0f, e);
  }
  if (p.rounding == 2) {
    if (s != s || p.hardware_count == 0) return s;
    // The smallest member >= s, else the largest member (std::max semantics kept).
    float best_above = as_float(0x7F800000u);
    float largest = p.hardware_scales[0];
    for (int i = 0; i < p.hardware_count; ++i) {
      const float h = p.hardware_scales[i];
      if (h >= s && h < best_above) best_above = h;
      largest = largest < h ? h : largest;
    }
    return (as_bits(best_above) & 0x7FFFFFFFu) == 0x7F800000u ? largest : best_above;
  }
  return s;
}

// The scale of a block whose absmax (NaN ignored, Inf kept) is `absmax`. Where the CPU reference
// reports an error (Inf in the block) this returns +Inf: the caller sees it in the scales.
LLMQ_HD float scale_from_absmax(float absmax, const ScaleParams& p) {
  if (p.unit) return 1.0f;
  if ((as_bits(absmax) & 0x7FFFFFFFu) == 0x7F800000u) return absmax;
  float s;
  if (p.float_division) {
    // float(a / b) with a, b floats equals the double quotient rounded to float (53 >= 2 * 24 + 2),
    // and q > floor differs from exact > floor only when q == floor, where both give floor.
    const float q = div_rn(absmax, p.target_f);
    s = q > p.floor ? q : p.floor;
  } else {
    const double exact = ddiv_rn(static_cast<double>(absmax), p.target);
    s = exact > static_cast<double>(p.floor) ? double_to_float_rn(exact) : p.floor;
  }
  return round_scale(s, p);
}

#undef LLMQ_HD

}  // namespace llmq::quant_kernels
