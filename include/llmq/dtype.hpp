// DType: every element type llmq stores, with the facts about each 8-bit (and 4-bit) format that
// scaling needs: the largest finite magnitude r_q, whether the format has Inf, how NaN is spelled.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace llmq {

enum class DType : uint8_t {
  kF32,
  kF64,
  kBF16,
  kF16,
  kE4M3,       // OCP E4M3 ("e4m3fn"): bias 7, max 448, NaN = S.1111.111, no Inf
  kE4M3Ieee,   // IEEE-like E4M3 (Gaudi 2): bias 7, exponent 1111 reserved, max 240, Inf and NaN
  kE5M2,       // OCP E5M2: bias 15, max 57344, Inf = S.11111.00, NaN = S.11111.{01,10,11}
  kE4M3Fnuz,   // E4M3 "fnuz": bias 8, max 240, one NaN = 0x80, no Inf, no negative zero
  kE5M2Fnuz,   // E5M2 "fnuz": bias 16, max 57344, one NaN = 0x80, no Inf, no negative zero
  kI8,         // two's complement int8 [-128, 127]
  kI4,         // two's complement int4 [-8, 7], two per byte, element 2i in the low nibble
  kI32,
  kU8,         // raw bytes (MXFP4 blocks and E8M0 scales); read as given, never quantized to
};

inline constexpr DType kAllDTypes[] = {
    DType::kF32,  DType::kF64,      DType::kBF16,     DType::kF16,      DType::kE4M3, DType::kE4M3Ieee,
    DType::kE5M2, DType::kE4M3Fnuz, DType::kE5M2Fnuz, DType::kI8,       DType::kI4,   DType::kI32,
    DType::kU8};

// The formats a tensor can be quantized to (the targets of `quantize`).
inline constexpr DType kQuantizedDTypes[] = {DType::kE4M3,     DType::kE4M3Ieee, DType::kE5M2,
                                             DType::kE4M3Fnuz, DType::kE5M2Fnuz, DType::kI8,
                                             DType::kI4};

enum class NanEncoding {
  kNone,         // integers
  kAllOnes,      // OCP E4M3: S.1111.111 only
  kIeee,         // exponent all ones, mantissa != 0 (Inf when the mantissa is 0)
  kNegativeZero, // fnuz: the single code 0x80
};

struct FormatInfo {
  const char* name;       // "e4m3", "e5m2", "int8", ...
  int bits;               // storage bits per element
  bool is_float;
  bool is_integer;
  // Floating-point layout (0 for integers).
  int exponent_bits;
  int mantissa_bits;
  int exponent_bias;
  bool has_inf;
  NanEncoding nan;
  // Range. For floats: largest finite, smallest normal, smallest subnormal magnitude.
  // For integers: qmin / qmax. r_q in the FP8 paper is max_finite.
  double max_finite;
  double min_normal;
  double min_subnormal;
  int64_t qmin;
  int64_t qmax;
};

const FormatInfo& format_info(DType dtype);
inline const char* dtype_name(DType dtype) { return format_info(dtype).name; }
std::optional<DType> parse_dtype(std::string_view name);  // accepts aliases: e4m3fn, fp8, int8, ...
// Bytes needed for n elements (INT4 rounds up to whole bytes).
int64_t dtype_storage_bytes(DType dtype, int64_t n);
inline bool is_fp8(DType d) {
  return d == DType::kE4M3 || d == DType::kE4M3Ieee || d == DType::kE5M2 ||
         d == DType::kE4M3Fnuz || d == DType::kE5M2Fnuz;
}
inline bool is_quantized(DType d) { return is_fp8(d) || d == DType::kI8 || d == DType::kI4; }
inline bool is_high_precision(DType d) {
  return d == DType::kF32 || d == DType::kF64 || d == DType::kBF16 || d == DType::kF16;
}

}  // namespace llmq
