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

// How codes are produced. The hardware cvt is used where it equals the reference (OCP E4M3 and
// E5M2, round to nearest even, saturating); every other FP8 case runs the integer encoder.
enum class Encoder : int {
  kE4M3Hw,   // cvt.rn.satfinite.e4m3x2.f32
  kE5M2Hw,   // cvt.rn.satfinite.e5m2x2.f32
  kSoftFp8,  // any FP8 layout, RNE or stochastic (the integer path of encode_float)
  kInt8,     // RNE (cvt.rni) or stochastic, then clamp to [-128, 127]
};

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

// ---- FP8, integer path of encode_float with Saturation::kSatFinite, for any 8-bit layout.
// |x| = significand * 2^(e32 - 23); the target grid at `exponent` has step 2^(exponent - M), so
// the value on that grid is significand >> shift and the dropped bits decide the rounding. 32-bit
// arithmetic suffices: the significand has 24 bits, and a shift of 25 or more leaves 0 under
// RNE (the dropped bits are below half a step) while the stochastic threshold is computed exactly.
LLMQ_HD uint32_t encode_fp8_soft(float x, const EncodeParams& p, uint32_t random_bits) {
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
  if (!p.stochastic) {
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
  return encode_fp8_soft(lo, p, 0) | (encode_fp8_soft(hi, p, 0) << 8);
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
LLMQ_HD uint32_t encode_int8(float v, const EncodeParams& p, uint32_t random_bits,
                                                uint32_t& clips) {
  if (!p.stochastic) {
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

// One element, scaled already. `flat` is r * cols + c (the Philox counter).
template <Encoder E>
__device__ __forceinline__ uint32_t encode_one(float v, const EncodeParams& p, uint64_t flat, uint32_t& clips) {
  if constexpr (E == Encoder::kInt8) {
    return encode_int8(v, p, p.stochastic ? philox_u32(p.seed, flat) : 0u, clips);
  } else {
    clips += fp8_clips(v, p);
    if constexpr (E == Encoder::kSoftFp8) return encode_fp8_soft(v, p, p.stochastic ? philox_u32(p.seed, flat) : 0u);
    else return encode_fp8x2_hw<E>(v, 0.0f, p) & 0xFFu;
  }
}

// 16 scaled elements -> 16 code bytes (element j in byte j % 4 of word j / 4).
template <Encoder E>
__device__ __forceinline__ uint4 encode_pack(const float (&v)[16], const EncodeParams& p, uint64_t flat0,
                                             uint32_t& clips) {
  uint32_t w[4];
  if constexpr (E == Encoder::kE4M3Hw || E == Encoder::kE5M2Hw) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[k] = encode_fp8x2_hw<E>(v[4 * k], v[4 * k + 1], p) | (encode_fp8x2_hw<E>(v[4 * k + 2], v[4 * k + 3], p) << 16);
#pragma unroll
      for (int j = 0; j < 4; ++j) clips += fp8_clips(v[4 * k + j], p);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[k] = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        w[k] |= encode_one<E>(v[4 * k + j], p, flat0 + static_cast<uint64_t>(4 * k + j), clips) << (8 * j);
    }
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
