// Numerics beyond the oracles: the format table, the IEEE-like E4M3 (no oracle has it), integer
// rounding and INT4 packing, stochastic rounding (unbiased, deterministic, never moves grid values).
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "llmq/format.hpp"
#include "support.hpp"

namespace llmq {
namespace {

TEST(FormatTable, MaxFiniteIsTheLargestDecodedCode) {
  for (DType d : kQuantizedDTypes) {
    if (!is_fp8(d)) continue;
    double largest = 0;
    for (uint32_t code = 0; code < 256; ++code) {
      const float v = fp8_to_float(static_cast<uint8_t>(code), d);
      if (std::isfinite(v)) largest = std::max(largest, static_cast<double>(std::fabs(v)));
    }
    EXPECT_EQ(largest, format_info(d).max_finite) << dtype_name(d);
  }
}

TEST(FormatTable, SmallestSubnormalAndNormal) {
  for (DType d : kQuantizedDTypes) {
    if (!is_fp8(d)) continue;
    EXPECT_EQ(fp8_to_float(1, d), format_info(d).min_subnormal) << dtype_name(d);
    const uint8_t first_normal = static_cast<uint8_t>(1u << format_info(d).mantissa_bits);
    EXPECT_EQ(fp8_to_float(first_normal, d), format_info(d).min_normal) << dtype_name(d);
  }
}

TEST(FormatTable, DecodeIsMonotonicOverPositiveCodes) {
  for (DType d : kQuantizedDTypes) {
    if (!is_fp8(d)) continue;
    float previous = -1.0f;
    for (uint32_t code = 0; code < 128; ++code) {
      const float v = fp8_to_float(static_cast<uint8_t>(code), d);
      if (std::isnan(v)) continue;
      EXPECT_GT(v, previous) << dtype_name(d) << " code " << code;
      previous = v;
    }
  }
}

TEST(FormatTable, SpecialCodes) {
  EXPECT_TRUE(std::isnan(fp8_to_float(0x7F, DType::kE4M3)));
  EXPECT_TRUE(std::isnan(fp8_to_float(0xFF, DType::kE4M3)));
  EXPECT_EQ(fp8_to_float(0x7E, DType::kE4M3), 448.0f);
  EXPECT_EQ(fp8_to_float(0x78, DType::kE4M3Ieee), INFINITY);  // S.1111.000
  EXPECT_TRUE(std::isnan(fp8_to_float(0x79, DType::kE4M3Ieee)));
  EXPECT_EQ(fp8_to_float(0x77, DType::kE4M3Ieee), 240.0f);
  EXPECT_EQ(fp8_to_float(0x7C, DType::kE5M2), INFINITY);
  EXPECT_TRUE(std::isnan(fp8_to_float(0x80, DType::kE4M3Fnuz)));
  EXPECT_EQ(fp8_to_float(0x7F, DType::kE4M3Fnuz), 240.0f);
  EXPECT_TRUE(std::isnan(fp8_to_float(0x80, DType::kE5M2Fnuz)));
  EXPECT_EQ(fp8_to_float(0x7F, DType::kE5M2Fnuz), 57344.0f);
  EXPECT_TRUE(std::signbit(fp8_to_float(0x80, DType::kE4M3)));  // OCP has -0
}

TEST(Ieee240, OverflowAndSaturation) {
  // The Gaudi 2 E4M3: 240 (mantissa 111, odd) is the max; 248, the midpoint to the would-be 256,
  // ties to the even 256 and so overflows to Inf, as IEEE rounding does.
  const ConvertOptions nosat{Rounding::kNearestEven, Saturation::kNonSaturating};
  EXPECT_EQ(float_to_fp8(240.0f, DType::kE4M3Ieee), 0x77);
  EXPECT_EQ(float_to_fp8(247.99f, DType::kE4M3Ieee, nosat), 0x77);
  EXPECT_EQ(float_to_fp8(248.0f, DType::kE4M3Ieee, nosat), 0x78);  // Inf
  EXPECT_EQ(float_to_fp8(248.0f, DType::kE4M3Ieee), 0x77);         // satfinite: 240
  EXPECT_EQ(float_to_fp8(-1e9f, DType::kE4M3Ieee, nosat), 0xF8);   // -Inf
  EXPECT_EQ(float_to_fp8(-1e9f, DType::kE4M3Ieee), 0xF7);          // satfinite: -240
  EXPECT_EQ(float_to_fp8(INFINITY, DType::kE4M3Ieee), 0x77);
  EXPECT_EQ(float_to_fp8(std::nanf(""), DType::kE4M3Ieee), 0x7F);
  // Every code of the lower 15 binades matches OCP E4M3 (same bias, same grid).
  for (uint32_t code = 0; code < 0x78; ++code)
    EXPECT_EQ(fp8_to_float(static_cast<uint8_t>(code), DType::kE4M3Ieee),
              fp8_to_float(static_cast<uint8_t>(code), DType::kE4M3)) << code;
}

TEST(Fnuz, NoNegativeZero) {
  for (DType d : {DType::kE4M3Fnuz, DType::kE5M2Fnuz}) {
    EXPECT_EQ(float_to_fp8(-0.0f, d), 0x00) << dtype_name(d);
    EXPECT_EQ(float_to_fp8(-1e-30f, d), 0x00) << dtype_name(d);  // underflow of a negative value
    EXPECT_EQ(float_to_fp8(std::nanf(""), d), 0x80) << dtype_name(d);
  }
}

TEST(Integers, RoundHalfToEvenAndClamp) {
  EXPECT_EQ(encode_int(2.5f, DType::kI8), 2);
  EXPECT_EQ(encode_int(3.5f, DType::kI8), 4);
  EXPECT_EQ(encode_int(-2.5f, DType::kI8), -2);
  EXPECT_EQ(encode_int(-0.5f, DType::kI8), 0);
  bool clipped = false;
  EXPECT_EQ(encode_int(127.4f, DType::kI8, Rounding::kNearestEven, 0, &clipped), 127);
  EXPECT_FALSE(clipped);
  EXPECT_EQ(encode_int(127.6f, DType::kI8, Rounding::kNearestEven, 0, &clipped), 127);
  EXPECT_TRUE(clipped);
  EXPECT_EQ(encode_int(-1e30f, DType::kI8, Rounding::kNearestEven, 0, &clipped), -128);
  EXPECT_TRUE(clipped);
  EXPECT_EQ(encode_int(INFINITY, DType::kI4), 7);
  EXPECT_EQ(encode_int(-INFINITY, DType::kI4), -8);
  EXPECT_EQ(encode_int(std::nanf(""), DType::kI8, Rounding::kNearestEven, 0, &clipped), 0);
  EXPECT_FALSE(clipped);
}

TEST(Integers, Int4PackRoundTripsEveryPair) {
  for (int a = -8; a <= 7; ++a)
    for (int b = -8; b <= 7; ++b) {
      const uint8_t byte = pack_int4(a, b);
      EXPECT_EQ(unpack_int4(byte, 0), a);
      EXPECT_EQ(unpack_int4(byte, 1), b);
    }
  EXPECT_EQ(pack_int4(1, -1), 0xF1);  // element 0 in the low nibble
}

TEST(Stochastic, NeverMovesValuesOnTheGrid) {
  for (DType d : {DType::kE4M3, DType::kE5M2, DType::kBF16, DType::kF16}) {
    for (uint32_t code = 0; code < 0x7F; ++code) {
      const float v = d == DType::kBF16 || d == DType::kF16
                          ? decode_float(code * 97u, d)
                          : fp8_to_float(static_cast<uint8_t>(code), d);
      if (!std::isfinite(v)) continue;
      for (uint32_t bits : {0u, 1u, 0x80000000u, 0xFFFFFFFFu})
        EXPECT_EQ(decode_float(encode_float(v, d, {Rounding::kStochastic, Saturation::kSatFinite}, bits), d), v)
            << dtype_name(d) << " " << v << " bits " << bits;
    }
  }
}

TEST(Stochastic, RoundsToANeighbourAndIsUnbiased) {
  // 1.1 lies between E4M3 neighbours 1.0 and 1.125: expect P(up) = 0.8 and a mean of 1.1.
  constexpr int kDraws = 200000;
  constexpr double kSigmas = 6.0;  // the mean's standard error is at most ulp * 0.5 / sqrt(kDraws)
  const ConvertOptions sr{Rounding::kStochastic, Saturation::kSatFinite};
  for (float x : {1.1f, -1.1f, 0.0031f, 300.0f}) {
    double sum = 0;
    std::set<float> seen;
    for (int i = 0; i < kDraws; ++i) {
      const float v = fp8_to_float(float_to_fp8(x, DType::kE4M3, sr, philox_random_u32(42, static_cast<uint64_t>(i))), DType::kE4M3);
      seen.insert(v);
      sum += v;
    }
    EXPECT_EQ(seen.size(), 2u) << x;
    const double ulp = *seen.rbegin() - *seen.begin();
    EXPECT_NEAR(sum / kDraws, x, kSigmas * ulp * 0.5 / std::sqrt(double{kDraws})) << x;
  }
}

TEST(Stochastic, IntegersUnbiased) {
  constexpr int kDraws = 100000;
  double sum = 0;
  for (int i = 0; i < kDraws; ++i)
    sum += encode_int(-2.3f, DType::kI8, Rounding::kStochastic, philox_random_u32(7, static_cast<uint64_t>(i)));
  EXPECT_NEAR(sum / kDraws, -2.3, 0.01);
}

TEST(Philox, DeterministicAndSpread) {
  EXPECT_EQ(philox_random_u32(1, 2), philox_random_u32(1, 2));
  EXPECT_NE(philox_random_u32(1, 2), philox_random_u32(1, 3));
  EXPECT_NE(philox_random_u32(1, 2), philox_random_u32(2, 2));
  // Known-answer: Philox4x32-10 of counter 0, key 0 (Random123's published test vector).
  EXPECT_EQ(philox_random_u32(0, 0), 0x6627e8d5u);
  double mean = 0;
  for (uint64_t i = 0; i < 100000; ++i) mean += philox_random_u32(9, i) / 4294967296.0;
  EXPECT_NEAR(mean / 100000, 0.5, 0.005);
}

TEST(Bf16, BitsRoundTrip) {
  for (float x : testing::normal_vector(1000, 3, 100.0f)) {
    const float b = bf16_bits_to_float(float_to_bf16_bits(x));
    EXPECT_LE(std::fabs(b - x), std::fabs(x) * std::ldexp(1.0f, -8)) << x;
    EXPECT_EQ(float_to_bf16_bits(b), float_to_bf16_bits(x));
  }
}

}  // namespace
}  // namespace llmq
