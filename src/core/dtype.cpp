// The format table: one row per DType, the facts scaling and conversion read.
#include "llmq/dtype.hpp"

#include <cctype>
#include <cmath>
#include <string>

namespace llmq {
namespace {

constexpr double pow2(int e) {
  double v = 1.0;
  for (; e > 0; --e) v *= 2.0;
  for (; e < 0; ++e) v *= 0.5;
  return v;
}

// max finite = (2 - 2^-M) * 2^(emax) unless noted; min normal = 2^(1 - bias); min subnormal =
// 2^(1 - bias - M).
const FormatInfo kFormats[] = {
    // name   bits float int  E  M  bias  inf    nan                        max                  min normal      min subnormal    qmin qmax
    {"f32",   32, true, false, 8, 23, 127, true, NanEncoding::kIeee, 3.4028234663852886e38, pow2(-126) , 1.401298464324817e-45, 0, 0},
    {"f64",   64, true, false, 11, 52, 1023, true, NanEncoding::kIeee, 1.7976931348623157e308, 2.2250738585072014e-308, 4.9406564584124654e-324, 0, 0},
    {"bf16",  16, true, false, 8, 7, 127, true, NanEncoding::kIeee, 3.3895313892515355e38, pow2(-126), pow2(-133), 0, 0},
    {"f16",   16, true, false, 5, 10, 15, true, NanEncoding::kIeee, 65504.0, pow2(-14), pow2(-24), 0, 0},
    {"e4m3",   8, true, false, 4, 3, 7, false, NanEncoding::kAllOnes, 448.0, pow2(-6), pow2(-9), 0, 0},
    {"e4m3_ieee", 8, true, false, 4, 3, 7, true, NanEncoding::kIeee, 240.0, pow2(-6), pow2(-9), 0, 0},
    {"e5m2",   8, true, false, 5, 2, 15, true, NanEncoding::kIeee, 57344.0, pow2(-14), pow2(-16), 0, 0},
    {"e4m3fnuz", 8, true, false, 4, 3, 8, false, NanEncoding::kNegativeZero, 240.0, pow2(-7), pow2(-10), 0, 0},
    {"e5m2fnuz", 8, true, false, 5, 2, 16, false, NanEncoding::kNegativeZero, 57344.0, pow2(-15), pow2(-17), 0, 0},
    {"int8",   8, false, true, 0, 0, 0, false, NanEncoding::kNone, 127.0, 1.0, 1.0, -128, 127},
    {"int4",   4, false, true, 0, 0, 0, false, NanEncoding::kNone, 7.0, 1.0, 1.0, -8, 7},
    {"int32", 32, false, true, 0, 0, 0, false, NanEncoding::kNone, 2147483647.0, 1.0, 1.0, INT32_MIN, INT32_MAX},
    {"uint8",  8, false, true, 0, 0, 0, false, NanEncoding::kNone, 255.0, 1.0, 1.0, 0, 255},
};
static_assert(sizeof(kFormats) / sizeof(kFormats[0]) == sizeof(kAllDTypes) / sizeof(kAllDTypes[0]),
              "one FormatInfo per DType");

}  // namespace

const FormatInfo& format_info(DType dtype) { return kFormats[static_cast<int>(dtype)]; }

std::optional<DType> parse_dtype(std::string_view name) {
  std::string n(name);
  for (auto& ch : n) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  struct Alias { const char* name; DType dtype; };
  static const Alias kAliases[] = {
      {"f32", DType::kF32}, {"float32", DType::kF32}, {"fp32", DType::kF32}, {"float", DType::kF32},
      {"f64", DType::kF64}, {"float64", DType::kF64}, {"double", DType::kF64},
      {"bf16", DType::kBF16}, {"bfloat16", DType::kBF16},
      {"f16", DType::kF16}, {"fp16", DType::kF16}, {"float16", DType::kF16}, {"half", DType::kF16},
      {"e4m3", DType::kE4M3}, {"e4m3fn", DType::kE4M3}, {"fp8", DType::kE4M3}, {"fp8_e4m3", DType::kE4M3},
      {"float8_e4m3fn", DType::kE4M3}, {"f8_e4m3", DType::kE4M3},
      {"e4m3_ieee", DType::kE4M3Ieee}, {"e4m3ieee", DType::kE4M3Ieee},
      {"e5m2", DType::kE5M2}, {"fp8_e5m2", DType::kE5M2}, {"float8_e5m2", DType::kE5M2}, {"f8_e5m2", DType::kE5M2},
      {"e4m3fnuz", DType::kE4M3Fnuz}, {"float8_e4m3fnuz", DType::kE4M3Fnuz},
      {"e5m2fnuz", DType::kE5M2Fnuz}, {"float8_e5m2fnuz", DType::kE5M2Fnuz},
      {"int8", DType::kI8}, {"i8", DType::kI8},
      {"int4", DType::kI4}, {"i4", DType::kI4},
      {"int32", DType::kI32}, {"i32", DType::kI32},
      {"uint8", DType::kU8}, {"u8", DType::kU8},
  };
  for (const auto& a : kAliases)
    if (n == a.name) return a.dtype;
  return std::nullopt;
}

int64_t dtype_storage_bytes(DType dtype, int64_t n) {
  const int bits = format_info(dtype).bits;
  return (n * bits + 7) / 8;
}

}  // namespace llmq
