// Minifloat and integer conversions: the reference numerics of llmq (rules in llmq/format.hpp).
//
// One encoder serves every floating-point target: the input float32 is exact in double, so the
// value is scaled by a power of two onto the target's integer mantissa grid and rounded there once.
// For subnormal targets the grid is the fixed 2^(emin - M); the code's magnitude bits then equal
// the rounded integer, and a subnormal that rounds up to 2^M lands on the smallest normal code
// with no special case. Likewise a normal mantissa that rounds up to 2^(M+1) carries into the
// exponent field.
#include "llmq/format.hpp"

#include <cmath>
#include <cstring>

namespace llmq {
namespace {

uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

float bits_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

struct Layout {
  int e, m, bias, bits;
  bool has_inf;
  NanEncoding nan;
  double max_finite;
};

Layout layout_of(DType d) {
  const FormatInfo& f = format_info(d);
  return {f.exponent_bits, f.mantissa_bits, f.exponent_bias, f.bits, f.has_inf, f.nan, f.max_finite};
}

uint32_t sign_bit(const Layout& l) { return 1u << (l.bits - 1); }
uint32_t inf_code(const Layout& l) { return ((1u << l.e) - 1u) << l.m; }

// The NaN code of a format; `negative` sets the sign bit where the format has one for NaN.
uint32_t nan_code(const Layout& l, bool negative) {
  switch (l.nan) {
    case NanEncoding::kNegativeZero: return sign_bit(l);
    case NanEncoding::kAllOnes: return (sign_bit(l) - 1u) | (negative ? sign_bit(l) : 0u);
    case NanEncoding::kIeee:
      if (l.bits == 8) return (sign_bit(l) - 1u) | (negative ? sign_bit(l) : 0u);
      if (l.e == 8) return 0x7FC0u;
      return inf_code(l) | (1u << (l.m - 1)) | (negative ? sign_bit(l) : 0u);
    case NanEncoding::kNone: break;
  }
  return 0;
}

// Magnitude of the largest finite code.
uint32_t max_code(const Layout& l) {
  switch (l.nan) {
    case NanEncoding::kAllOnes: return sign_bit(l) - 2u;           // S.1111.110
    case NanEncoding::kNegativeZero: return sign_bit(l) - 1u;      // S.1111.111
    default: return inf_code(l) - 1u;                              // S.11110.11...
  }
}

// Round a non-negative double to an integer: nearest-even, or stochastically from 32 random bits.
double round_magnitude(double q, Rounding rounding, uint32_t random_bits) {
  if (rounding == Rounding::kNearestEven) return std::nearbyint(q);  // default mode: to nearest even
  const double lo = std::floor(q);
  const double frac = q - lo;  // exact: q has at most 53 significant bits
  const double threshold = std::floor(std::ldexp(frac, 32));
  return static_cast<double>(random_bits) < threshold ? lo + 1.0 : lo;
}

}  // namespace

uint32_t encode_float(float x, DType target, ConvertOptions options, uint32_t random_bits) {
  if (target == DType::kF32) return float_bits(x);
  const Layout l = layout_of(target);
  const bool negative = std::signbit(x);
  // NaN input: 8-bit formats write 0x7F whatever the sign (Hopper's cvt, cuda_fp8.h); BF16 writes
  // 0x7FC0 (c10); FP16 keeps the sign (0x7E00 | sign, PyTorch). Overflow to NaN keeps the sign.
  if (std::isnan(x)) return nan_code(l, l.bits == 16 && negative);

  const bool saturate = options.saturation == Saturation::kSatFinite;
  uint32_t abs_bits = float_bits(x) & 0x7FFFFFFFu;
  const uint32_t max_bits = float_bits(static_cast<float>(l.max_finite));
  if (saturate && abs_bits > max_bits) abs_bits = max_bits;  // Inf included
  uint32_t magnitude;
  if (abs_bits == 0x7F800000u) {
    magnitude = l.has_inf ? inf_code(l) : 0xFFFFFFFFu;  // marker: overflow to NaN below
  } else {
    // |x| = significand * 2^(e32 - 23) with a 24-bit significand (hidden bit included for
    // normals). The target grid at exponent `exponent` has step 2^(exponent - M), so the value on
    // that grid is significand >> shift with the dropped bits deciding the rounding.
    const int biased32 = static_cast<int>(abs_bits >> 23);
    const uint64_t significand = (abs_bits & 0x7FFFFFu) | (biased32 != 0 ? 0x800000u : 0u);
    const int e32 = biased32 != 0 ? biased32 - 127 : -126;
    const int emin = 1 - l.bias;  // exponent of the smallest normal
    const int exponent = std::max(biased32 != 0 ? e32 : emin, emin);
    const int shift = 23 + exponent - l.m - e32;  // >= 23 - M > 0 for every target
    uint64_t rounded = shift < 64 ? significand >> shift : 0;
    const uint64_t dropped = shift < 64 ? significand & ((uint64_t{1} << shift) - 1) : significand;
    if (options.rounding == Rounding::kNearestEven) {
      const uint64_t half = shift < 64 ? uint64_t{1} << (shift - 1) : ~uint64_t{0};
      if (dropped > half || (dropped == half && (rounded & 1u))) ++rounded;
    } else {
      // Round up with probability dropped / 2^shift, resolved to 32 bits.
      const uint64_t threshold = shift >= 32 ? (shift - 32 < 64 ? dropped >> (shift - 32) : 0)
                                             : dropped << (32 - shift);
      if (random_bits < threshold) ++rounded;
    }
    // code = (biased exponent - 1) * 2^M + rounded mantissa (hidden bit included). At the
    // smallest exponent the first term is 0, so a subnormal's code is its rounded mantissa.
    const uint64_t code = (static_cast<uint64_t>(exponent + l.bias - 1) << l.m) + rounded;
    magnitude = code > max_code(l) ? 0xFFFFFFFFu : static_cast<uint32_t>(code);
  }
  if (magnitude == 0xFFFFFFFFu) {  // overflow past max
    if (saturate) magnitude = max_code(l);
    else if (l.has_inf) magnitude = inf_code(l);
    else return nan_code(l, negative);
  }
  if (magnitude == 0 && l.nan == NanEncoding::kNegativeZero) return 0;  // fnuz: no -0
  return magnitude | (negative ? sign_bit(l) : 0u);
}

namespace {

float decode_float_slow(uint32_t code, DType source);

// Every 8-bit code of every FP8 format, decoded once: decode is on the hot path of dequantize,
// the MSE search and the GEMM reference.
struct Fp8Tables {
  float values[static_cast<int>(DType::kU8) + 1][256];
  Fp8Tables() {
    for (DType d : kAllDTypes)
      if (is_fp8(d))
        for (uint32_t c = 0; c < 256; ++c) values[static_cast<int>(d)][c] = decode_float_slow(c, d);
  }
};

}  // namespace

float decode_float(uint32_t code, DType source) {
  if (source == DType::kF32) return bits_float(code);
  if (source == DType::kBF16) return bits_float((code & 0xFFFFu) << 16);
  if (is_fp8(source)) {
    static const Fp8Tables tables;
    return tables.values[static_cast<int>(source)][code & 0xFFu];
  }
  return decode_float_slow(code, source);
}

namespace {

float decode_float_slow(uint32_t code, DType source) {
  const Layout l = layout_of(source);
  code &= (l.bits == 32) ? 0xFFFFFFFFu : ((1u << l.bits) - 1u);
  const bool negative = (code & sign_bit(l)) != 0;
  const uint32_t magnitude = code & (sign_bit(l) - 1u);
  const uint32_t exp_field = magnitude >> l.m;
  const uint32_t mantissa = magnitude & ((1u << l.m) - 1u);
  const uint32_t exp_all_ones = (1u << l.e) - 1u;
  switch (l.nan) {
    case NanEncoding::kNegativeZero:
      if (code == sign_bit(l)) return std::nanf("");
      break;
    case NanEncoding::kAllOnes:
      if (magnitude == sign_bit(l) - 1u) return negative ? -std::nanf("") : std::nanf("");
      break;
    case NanEncoding::kIeee:
      if (exp_field == exp_all_ones) {
        if (mantissa != 0) return negative ? -std::nanf("") : std::nanf("");
        return negative ? -INFINITY : INFINITY;
      }
      break;
    case NanEncoding::kNone: break;
  }
  const int emin = 1 - l.bias;
  const double value = exp_field == 0
                           ? std::ldexp(static_cast<double>(mantissa), emin - l.m)
                           : std::ldexp(static_cast<double>(mantissa | (1u << l.m)),
                                        static_cast<int>(exp_field) - l.bias - l.m);
  return static_cast<float>(negative ? -value : value);
}

}  // namespace

uint16_t float_to_bf16_bits(float x) {
  // BF16 is float32 with the low 16 bits rounded off, the same exponent range (subnormals
  // included), so round-to-nearest-even is one add on the bits: add 0x7FFF plus the lowest kept
  // bit, truncate. Overflow carries into the exponent and gives Inf, as non-saturating RNE must.
  // Checkpoints convert billions of values; the general encoder is kept for NaN's canonical code.
  if (!std::isnan(x)) {
    const uint32_t u = float_bits(x);
    return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  }
  return static_cast<uint16_t>(encode_float(x, DType::kBF16, {Rounding::kNearestEven, Saturation::kNonSaturating}));
}
float bf16_bits_to_float(uint16_t bits) { return bits_float(static_cast<uint32_t>(bits) << 16); }
uint16_t float_to_fp16_bits(float x) {
  return static_cast<uint16_t>(encode_float(x, DType::kF16, {Rounding::kNearestEven, Saturation::kNonSaturating}));
}
float fp16_bits_to_float(uint16_t bits) { return decode_float(bits, DType::kF16); }

int32_t encode_int(float x, DType target, Rounding rounding, uint32_t random_bits, bool* clipped) {
  const FormatInfo& f = format_info(target);
  if (clipped) *clipped = false;
  if (std::isnan(x)) return 0;
  const double a = std::fabs(static_cast<double>(x));
  double r = std::isinf(a) ? a : round_magnitude(a, rounding, random_bits);
  if (std::signbit(x)) r = -r;
  if (r < static_cast<double>(f.qmin)) {
    if (clipped) *clipped = true;
    return static_cast<int32_t>(f.qmin);
  }
  if (r > static_cast<double>(f.qmax)) {
    if (clipped) *clipped = true;
    return static_cast<int32_t>(f.qmax);
  }
  return static_cast<int32_t>(r);
}

bool exceeds_range(float x, DType target) {
  const FormatInfo& f = format_info(target);
  if (std::isnan(x)) return false;
  if (f.is_integer) {
    const double r = std::nearbyint(static_cast<double>(x));
    return r < static_cast<double>(f.qmin) || r > static_cast<double>(f.qmax);
  }
  // A clip is a value that round-to-nearest would carry past max: the non-saturating conversion
  // overflows to Inf or NaN. 448.00003 in E4M3 rounds to 448 and is not a clip; 465 is.
  if (std::isinf(x)) return true;
  if (std::fabs(static_cast<double>(x)) <= f.max_finite) return false;  // the common case, cheaply
  const float decoded = decode_float(encode_float(x, target, {Rounding::kNearestEven, Saturation::kNonSaturating}), target);
  return !std::isfinite(decoded);
}

uint32_t philox_random_u32(uint64_t seed, uint64_t index) {
  // Philox4x32-10 (Salmon et al., SC'11): counter (index_lo, index_hi, 0, 0), key (seed_lo,
  // seed_hi); the first output word is used.
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(index), c1 = static_cast<uint32_t>(index >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    const uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return c0;
}

}  // namespace llmq
