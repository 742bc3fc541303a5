// Quantizing one element, shared by quantize, the MSE scale search and the GEMM reference.
// Internal header (not part of the public API).
//
// The scaled value is v = x * (1 / s) in float32: one IEEE division per block for the reciprocal,
// one multiply per element, no FMA. The GPU kernels compute exactly this, so they match bit for
// bit; x / s would differ from it in the last bit for some inputs.
#pragma once

#include <cstdint>

#include "llmq/dtype.hpp"
#include "llmq/format.hpp"

namespace llmq::detail {

inline float reciprocal(float scale) { return 1.0f / scale; }

// The stored code of v (already scaled): the FP8 bit pattern (saturating), or the clamped
// integer including the zero point for integer formats. `clipped` is set when |v| (plus the zero
// point) fell outside the format's range.
inline int32_t encode_scaled(float v, DType format, int32_t zero_point, Rounding rounding,
                             uint32_t random_bits, bool* clipped) {
  if (is_fp8(format)) {
    *clipped = exceeds_range(v, format);
    return float_to_fp8(v, format, {rounding, Saturation::kSatFinite}, random_bits);
  }
  // Integer: round, add the zero point, clamp. Rounding happens before the zero point is added,
  // so the zero point (an integer) cannot change which way a value rounds.
  const int32_t q = encode_int(v, DType::kI32, rounding, random_bits, clipped);
  const FormatInfo& f = format_info(format);
  const int64_t shifted = static_cast<int64_t>(q) + zero_point;
  if (shifted < f.qmin || shifted > f.qmax) {
    *clipped = true;
    return static_cast<int32_t>(shifted < f.qmin ? f.qmin : f.qmax);
  }
  return static_cast<int32_t>(shifted);
}

// The value of a stored code in the scaled domain: FP8 decode, or (q - zero_point).
inline double decode_scaled(int32_t code, DType format, int32_t zero_point) {
  if (is_fp8(format)) return fp8_to_float(static_cast<uint8_t>(code), format);
  return static_cast<double>(code) - zero_point;
}

}  // namespace llmq::detail
