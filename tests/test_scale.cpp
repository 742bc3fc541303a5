// Scale math (llmq/scale.hpp) and compute_scale: absmax scales with backoff and floor, power-of-two
// and hardware-set rounding, every granularity against a naive per-element recomputation, Inf / NaN
// handling and asymmetric integer zero points. The MSE search is tested in
// test_scale_mse_search.cpp, SmoothQuant's factors in test_smoothquant_factors.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/element.hpp"
#include "llmq/format.hpp"
#include "llmq/quantize_tensor.hpp"
#include "llmq/scale.hpp"
#include "scale_support.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using namespace scale_test;  // NOLINT: the suite's shared helpers

// Slack on the s/2 bound of round-to-nearest (the scaled value is rounded once in float32).
constexpr double kHalfStepSlack = 1e-5;

TensorView typed_view(void* data, DType dtype, int64_t rows, int64_t cols) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.shape = {rows, cols};
  return v;
}

// ---- absmax scale, backoff, floor

TEST(AbsmaxScale, ExactOnKnownData) {
  // Row r has absmax r_q * 2^-r, so its absmax scale is exactly 2^-r.
  for (DType d : {DType::kE4M3, DType::kE5M2, DType::kI8, DType::kI4}) {
    const int64_t rows = 6, cols = 10;
    std::vector<float> x(rows * cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        x[r * cols + c] = static_cast<float>(rq(d) * std::ldexp(1.0, -static_cast<int>(r)) *
                                             (c == 3 ? -1.0 : static_cast<double>(c + 1) / 16.0));  // absmax at col 3, negative
    const QuantSpec spec = QuantSpec::per_token(d);
    ScaleSet s;
    ASSERT_TRUE(compute_scale(matrix_view(x.data(), rows, cols), spec, &s).ok());
    ASSERT_EQ(s.scale_rows(), rows);
    ASSERT_EQ(s.scale_cols(), 1);
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(s.scales.data_as<float>()[r], std::ldexp(1.0f, -static_cast<int>(r)))
          << repro(0, rows, cols, describe(spec)) << " row " << r;
    EXPECT_TRUE(s.zero_points.shape().empty()) << "a symmetric spec has no zero points";
  }
  // And the scalar function directly.
  EXPECT_EQ(absmax_scale(224.0, QuantSpec::per_tensor(DType::kE4M3)), 0.5f);
  EXPECT_EQ(absmax_scale(31.75, QuantSpec::per_tensor(DType::kI8)), 0.25f);
}

constexpr double kTwoRoundings = 0x1p-22;  // (1 + 2^-24)^2 - 1, rounded up

TEST(AbsmaxScale, BackoffLeavesHeadroom) {
  QuantSpec spec = QuantSpec::per_tensor(DType::kE4M3);
  spec.backoff = 0.5f;
  EXPECT_EQ(absmax_scale(224.0, spec), 1.0f) << "224 / (0.5 * 448)";
  std::mt19937_64 rng(kSeed);
  std::uniform_real_distribution<double> log_mag(-6.0, 6.0);
  for (float beta : {0.25f, 0.8f, 0.9f, 1.0f}) {
    spec.backoff = beta;
    for (int i = 0; i < 2000; ++i) {
      const float a = static_cast<float>(std::pow(10.0, log_mag(rng)));
      const float s = absmax_scale(a, spec);
      const double want = std::max(static_cast<double>(a) / (static_cast<double>(beta) * 448.0),
                                   static_cast<double>(effective_min_scale(spec)));
      EXPECT_TRUE(rel_close(s, want, kScaleRelTol)) << "absmax " << a << " beta " << beta << " got " << s;
      // The largest element, scaled exactly as quantize scales it, stays within beta r_q up to the
      // two float roundings of s and 1 / s.
      EXPECT_LE(static_cast<double>(a * (1.0f / s)), static_cast<double>(beta) * 448.0 * (1.0 + kTwoRoundings))
          << "absmax " << a << " beta " << beta;
    }
  }
}

TEST(AbsmaxScale, AbsmaxElementIsNeverClipped) {
  // float(a / r_q) can round down; the scale must still map a onto the grid without clipping.
  std::mt19937_64 rng(kSeed + 1);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  for (DType d : kQuantizedDTypes) {
    const QuantSpec spec = QuantSpec::per_tensor(d);
    for (int i = 0; i < 20000; ++i) {
      const float a = std::ldexp(mantissa(rng), exponent(rng));
      const float s = absmax_scale(a, spec);
      bool clipped = false;
      (void)detail::encode_scaled(a * detail::reciprocal(s), d, 0, Rounding::kNearestEven, 0, &clipped);
      ASSERT_FALSE(clipped) << dtype_name(d) << " absmax " << a << " scale " << s;
      const double want = std::max(a / rq(d), static_cast<double>(effective_min_scale(spec)));
      ASSERT_TRUE(rel_close(s, want, kScaleRelTol)) << dtype_name(d) << " absmax " << a;
    }
  }
}

TEST(AbsmaxScale, MinScaleFloorsAllZeroRows) {
  const int64_t rows = 4, cols = 33;
  std::vector<float> x = outlier_matrix(rows, cols, kSeed);
  std::fill(x.begin() + cols, x.begin() + 2 * cols, 0.0f);          // row 1 all zero
  std::fill(x.begin() + 3 * cols, x.end(), -0.0f);                  // row 3 all negative zero
  for (DType d : {DType::kE4M3, DType::kI8}) {
    for (float min_scale : {0.0f, 1e-3f}) {
      QuantSpec spec = QuantSpec::per_token(d);
      spec.min_scale = min_scale;
      const float want_floor = min_scale > 0 ? min_scale : static_cast<float>(1.0 / (rq(d) * 512.0));
      EXPECT_EQ(effective_min_scale(spec), want_floor);
      ScaleSet s;
      ASSERT_TRUE(compute_scale(matrix_view(x.data(), rows, cols), spec, &s).ok());
      const float* p = s.scales.data_as<float>();
      EXPECT_EQ(p[1], want_floor) << repro(kSeed, rows, cols, describe(spec));
      EXPECT_EQ(p[3], want_floor) << repro(kSeed, rows, cols, describe(spec));
      EXPECT_GT(p[0], want_floor) << repro(kSeed, rows, cols, describe(spec));
    }
  }
}

TEST(AbsmaxScale, EmptyTensorGetsOneFloorScale) {
  const QuantSpec spec = QuantSpec::per_token(DType::kE4M3);
  std::vector<float> none;
  TensorView v = matrix_view(none.data(), 0, 7);
  ScaleSet s;
  ASSERT_TRUE(compute_scale(v, spec, &s).ok());
  ASSERT_EQ(s.scale_rows(), 1);
  ASSERT_EQ(s.scale_cols(), 1);
  EXPECT_EQ(s.scales.data_as<float>()[0], effective_min_scale(spec));
}

// ---- scale rounding

TEST(RoundScale, PowerOfTwoKeepsPowersAndRoundsUpOthers) {
  QuantSpec spec = QuantSpec::per_tensor(DType::kE4M3);
  spec.scale_rounding = ScaleRounding::kPowerOfTwo;
  for (int k = -40; k <= 40; ++k) {
    const float p = std::ldexp(1.0f, k), next = std::ldexp(1.0f, k + 1);
    EXPECT_EQ(round_scale(p, spec), p) << "2^" << k << " is already a power of two";
    EXPECT_EQ(round_scale(std::nextafter(p, 1e30f), spec), next) << "2^" << k << " + 1 ulp";
    EXPECT_EQ(round_scale(p * 1.3f, spec), next) << "1.3 * 2^" << k;
    EXPECT_EQ(round_scale(std::nextafter(p, 0.0f), spec), p) << "2^" << k << " - 1 ulp";
  }
  // Subnormal scales, and the default range end 2^-126.
  spec.pow2_min_exp = -149;
  EXPECT_EQ(round_scale(std::ldexp(1.0f, -140), spec), std::ldexp(1.0f, -140));
  EXPECT_EQ(round_scale(std::ldexp(1.5f, -140), spec), std::ldexp(1.0f, -139));
  spec.pow2_min_exp = -126;
  EXPECT_EQ(round_scale(std::ldexp(1.0f, -140), spec), std::ldexp(1.0f, -126));
}

TEST(RoundScale, PowerOfTwoClampsToTheExponentRange) {
  QuantSpec spec = QuantSpec::per_tensor(DType::kE4M3);
  spec.scale_rounding = ScaleRounding::kPowerOfTwo;
  spec.pow2_min_exp = -32;  // Gaudi 3
  spec.pow2_max_exp = 31;
  EXPECT_EQ(round_scale(1e-12f, spec), std::ldexp(1.0f, -32));
  EXPECT_EQ(round_scale(std::ldexp(1.0f, -32), spec), std::ldexp(1.0f, -32));
  EXPECT_EQ(round_scale(1e10f, spec), std::ldexp(1.0f, 31));
  EXPECT_EQ(round_scale(std::ldexp(1.0f, 30) * 1.5f, spec), std::ldexp(1.0f, 31));
  EXPECT_EQ(round_scale(0.3f, spec), 0.5f);

  // Through compute_scale: absmax 300 -> 300 / 448 -> 1; a tiny block -> 2^-32.
  std::vector<float> x = {300.0f, -1.0f, 1e-12f, 0.0f};
  QuantSpec pt = QuantSpec::per_token(DType::kE4M3);
  pt.scale_rounding = ScaleRounding::kPowerOfTwo;
  pt.pow2_min_exp = -32;
  pt.pow2_max_exp = 31;
  pt.min_scale = 1e-20f;
  ScaleSet s;
  ASSERT_TRUE(compute_scale(matrix_view(x.data(), 2, 2), pt, &s).ok());
  EXPECT_EQ(s.scales.data_as<float>()[0], 1.0f);
  EXPECT_EQ(s.scales.data_as<float>()[1], std::ldexp(1.0f, -32));
}

TEST(RoundScale, HardwareSetPicksSmallestMemberAbove) {
  QuantSpec spec = QuantSpec::per_tensor(DType::kE4M3Ieee);
  spec.scale_rounding = ScaleRounding::kHardwareSet;
  const float a = std::ldexp(1.0f, -8), b = std::ldexp(1.0f, -4);
  spec.hardware_scales = {1.0f, 16.0f, a, b};  // Gaudi 2, deliberately unsorted
  struct Case { float in, want; };
  const Case cases[] = {{1e-6f, a}, {std::nextafter(a, 0.0f), a}, {a, a}, {std::nextafter(a, 1.0f), b},
                        {0.05f, b}, {b, b}, {0.07f, 1.0f}, {1.0f, 1.0f}, {1.0001f, 16.0f},
                        {16.0f, 16.0f}, {16.5f, 16.0f}, {1e6f, 16.0f}};
  for (const Case& c : cases) EXPECT_EQ(round_scale(c.in, spec), c.want) << "scale " << c.in;

  // Through compute_scale: absmax 100 (e4m3_ieee, r_q 240) -> 0.4167 -> 1; absmax 5000 -> 16.
  std::vector<float> x = {100.0f, -3.0f, 5000.0f, 1.0f};
  QuantSpec pt = spec;
  pt.granularity = Granularity::kPerToken;
  ScaleSet s;
  ASSERT_TRUE(compute_scale(matrix_view(x.data(), 2, 2), pt, &s).ok());
  EXPECT_EQ(s.scales.data_as<float>()[0], 1.0f);
  EXPECT_EQ(s.scales.data_as<float>()[1], 16.0f);
}

// ---- granularities against a naive recomputation

const Shape kShapes[] = {{1, 1}, {1, 19}, {19, 99}, {99, 989}, {989, 19}, {300, 257}};

int64_t divisor_up_to(int64_t n, int64_t limit) {
  for (int64_t g = std::min(n, limit); g > 1; --g)
    if (n % g == 0) return g;
  return 1;
}

// The block an element belongs to is (r / br, c / bc); every block's scale is its absmax / r_q.
void check_against_naive(const std::vector<float>& x, int64_t rows, int64_t cols, const QuantSpec& spec,
                         int64_t br, int64_t bc, uint64_t seed) {
  const std::string what = repro(seed, rows, cols, describe(spec));
  ScaleSet s;
  const Status st = compute_scale(matrix_view(x.data(), rows, cols), spec, &s);
  ASSERT_TRUE(st.ok()) << st.to_string() << " " << what;
  const int64_t srows = (rows + br - 1) / br, scols = (cols + bc - 1) / bc;
  ASSERT_EQ(s.scale_rows(), srows) << what;
  ASSERT_EQ(s.scale_cols(), scols) << what;
  EXPECT_EQ(s.block.rows, br) << what;
  EXPECT_EQ(s.block.cols, bc) << what;
  std::vector<double> absmax(static_cast<size_t>(srows * scols), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      double& m = absmax[static_cast<size_t>((r / br) * scols + c / bc)];
      m = std::max(m, std::fabs(static_cast<double>(x[static_cast<size_t>(r * cols + c)])));
    }
  const double floor_scale = effective_min_scale(spec);
  for (int64_t i = 0; i < srows * scols; ++i) {
    const double want = std::max(absmax[static_cast<size_t>(i)] / (spec.backoff * rq(spec.format)), floor_scale);
    ASSERT_TRUE(rel_close(s.scales.data_as<float>()[i], want, kScaleRelTol))
        << what << " scale (" << i / scols << ", " << i % scols << ") got "
        << s.scales.data_as<float>()[i] << " want " << want;
  }
}

TEST(Granularity, EveryShapeMatchesNaiveRecomputation) {
  uint64_t seed = kSeed;
  for (const Shape& sh : kShapes) {
    ++seed;
    const std::vector<float> x = outlier_matrix(sh.rows, sh.cols, seed);
    for (DType d : {DType::kE4M3, DType::kE5M2, DType::kI8}) {
      QuantSpec spec = QuantSpec::per_tensor(d);
      spec.backoff = d == DType::kE5M2 ? 0.75f : 1.0f;
      check_against_naive(x, sh.rows, sh.cols, spec, sh.rows, sh.cols, seed);
      check_against_naive(x, sh.rows, sh.cols, QuantSpec::per_token(d), 1, sh.cols, seed);
      check_against_naive(x, sh.rows, sh.cols, QuantSpec::per_channel(d), 1, sh.cols, seed);
      QuantSpec ic = QuantSpec::per_tensor(d);
      ic.granularity = Granularity::kPerInputChannel;
      check_against_naive(x, sh.rows, sh.cols, ic, sh.rows, 1, seed);
      check_against_naive(x, sh.rows, sh.cols, QuantSpec::per_block(d, 128, 128), 128, 128, seed);
      check_against_naive(x, sh.rows, sh.cols, QuantSpec::per_block(d, 1, 128), 1, 128, seed);
      check_against_naive(x, sh.rows, sh.cols, QuantSpec::per_block(d, 19, 7), 19, 7, seed);
      const int64_t g = divisor_up_to(sh.cols, 64);
      check_against_naive(x, sh.rows, sh.cols, QuantSpec::per_group(d, g), 1, g, seed);
    }
  }
}

TEST(Granularity, PerGroupOfRealisticWidths) {
  const Shape shapes[] = {{19, 256}, {300, 384}, {1, 128}};
  for (const Shape& sh : shapes) {
    const std::vector<float> x = outlier_matrix(sh.rows, sh.cols, kSeed + 7);
    check_against_naive(x, sh.rows, sh.cols, QuantSpec::per_group(DType::kI4, 128), 1, 128, kSeed + 7);
    check_against_naive(x, sh.rows, sh.cols, QuantSpec::per_group(DType::kE4M3, 32), 1, 32, kSeed + 7);
  }
}

TEST(Granularity, PerGroupNeedsKDivisibleByGroupSize) {
  const std::vector<float> x = outlier_matrix(4, 300, kSeed);
  ScaleSet s;
  const Status st = compute_scale(matrix_view(x.data(), 4, 300), QuantSpec::per_group(DType::kE4M3, 128), &s);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("group_size"), std::string::npos) << st.message();
}

TEST(Granularity, StridedBf16AndF64InputsGiveTheSameScales) {
  const int64_t rows = 19, cols = 99;
  const std::vector<float> x = outlier_matrix(rows, cols, kSeed + 3);
  // BF16 input vs the same values as float32.
  std::vector<uint16_t> bits(x.size());
  std::vector<float> rounded(x.size());
  std::vector<double> wide(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    bits[i] = float_to_bf16_bits(x[i]);
    rounded[i] = bf16_bits_to_float(bits[i]);
    wide[i] = rounded[i];
  }
  const QuantSpec spec = QuantSpec::per_block(DType::kE4M3, 1, 32);
  const TensorView vb = typed_view(bits.data(), DType::kBF16, rows, cols);
  const TensorView vd = typed_view(wide.data(), DType::kF64, rows, cols);
  ScaleSet sb, sf, sd;
  ASSERT_TRUE(compute_scale(vb, spec, &sb).ok());
  ASSERT_TRUE(compute_scale(matrix_view(rounded.data(), rows, cols), spec, &sf).ok());
  ASSERT_TRUE(compute_scale(vd, spec, &sd).ok());
  ASSERT_EQ(sb.scales.numel(), sf.scales.numel());
  for (int64_t i = 0; i < sf.scales.numel(); ++i) {
    EXPECT_EQ(sb.scales.data_as<float>()[i], sf.scales.data_as<float>()[i]) << "bf16 vs f32, scale " << i;
    EXPECT_EQ(sd.scales.data_as<float>()[i], sf.scales.data_as<float>()[i]) << "f64 vs f32, scale " << i;
  }
  // A transposed (strided) view: per-input-channel of x^T is per-token of x.
  TensorView vt = matrix_view(x.data(), cols, rows);
  vt.strides = {1, cols};  // element (c, r) of x^T is x[r * cols + c]
  QuantSpec ic = QuantSpec::per_tensor(DType::kE4M3);
  ic.granularity = Granularity::kPerInputChannel;
  ScaleSet st, sr;
  ASSERT_TRUE(compute_scale(vt, ic, &st).ok());
  ASSERT_TRUE(compute_scale(matrix_view(x.data(), rows, cols), QuantSpec::per_token(DType::kE4M3), &sr).ok());
  ASSERT_EQ(st.scale_rows(), 1);
  ASSERT_EQ(st.scale_cols(), rows);
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_EQ(st.scales.data_as<float>()[r], sr.scales.data_as<float>()[r]) << "row " << r;
}

TEST(ComputeScale, RejectsNonHighPrecisionInput) {
  std::vector<int8_t> q(12, 1);
  const TensorView v = typed_view(q.data(), DType::kI8, 3, 4);
  ScaleSet s;
  const Status st = compute_scale(v, QuantSpec::per_tensor(DType::kE4M3), &s);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("x:", 0), 0u) << st.message();
}

TEST(ComputeScale, UnitMethodGivesOnes) {
  const std::vector<float> x = outlier_matrix(19, 99, kSeed);
  QuantSpec spec = QuantSpec::per_block(DType::kE4M3, 8, 32);
  spec.method = ScaleMethod::kUnit;
  ScaleSet s;
  ASSERT_TRUE(compute_scale(matrix_view(x.data(), 19, 99), spec, &s).ok());
  ASSERT_EQ(s.scales.numel(), 3 * 4);
  for (int64_t i = 0; i < s.scales.numel(); ++i) EXPECT_EQ(s.scales.data_as<float>()[i], 1.0f);
}

// ---- Inf and NaN

TEST(ComputeScale, InfIsAnErrorNamingXAndTheBlock) {
  const int64_t rows = 19, cols = 99;
  for (float inf : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
    std::vector<float> x = outlier_matrix(rows, cols, kSeed);
    x[5 * cols + 40] = inf;  // row 5, column 40: block (5, 1) of 1 x 32 blocks
    QuantSpec absmax = QuantSpec::per_block(DType::kE4M3, 1, 32);
    QuantSpec mse = absmax;
    mse.method = ScaleMethod::kMseSearch;
    QuantSpec asym = QuantSpec::per_block(DType::kI8, 1, 32);
    asym.symmetric = false;
    for (const QuantSpec& spec : {absmax, mse, asym}) {
      ScaleSet s;
      const Status st = compute_scale(matrix_view(x.data(), rows, cols), spec, &s);
      ASSERT_FALSE(st.ok()) << repro(kSeed, rows, cols, describe(spec));
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(st.message().rfind("x:", 0), 0u) << st.message();
      EXPECT_NE(st.message().find("Inf"), std::string::npos) << st.message();
      EXPECT_NE(st.message().find("(5, 1)"), std::string::npos) << st.message();
    }
  }
}

TEST(ComputeScale, NanIsIgnored) {
  const int64_t rows = 19, cols = 99;
  std::vector<float> x = outlier_matrix(rows, cols, kSeed + 5);
  std::vector<float> with_nan = x;
  std::mt19937_64 rng(kSeed + 5);
  for (int i = 0; i < 200; ++i) {
    const size_t at = static_cast<size_t>(rng() % x.size());
    with_nan[at] = std::numeric_limits<float>::quiet_NaN();
    x[at] = 0.0f;  // zero never changes an absmax
  }
  for (int64_t c = 0; c < 32; ++c) {  // block (0, 0) of 1 x 32 blocks: all NaN
    with_nan[c] = std::numeric_limits<float>::quiet_NaN();
    x[c] = 0.0f;
  }
  QuantSpec absmax = QuantSpec::per_block(DType::kE4M3, 1, 32);
  QuantSpec mse = absmax;
  mse.method = ScaleMethod::kMseSearch;
  for (const QuantSpec& spec : {absmax, mse}) {
    ScaleSet a, b;
    ASSERT_TRUE(compute_scale(matrix_view(with_nan.data(), rows, cols), spec, &a).ok());
    ASSERT_TRUE(compute_scale(matrix_view(x.data(), rows, cols), spec, &b).ok());
    for (int64_t i = 0; i < a.scales.numel(); ++i)
      EXPECT_EQ(a.scales.data_as<float>()[i], b.scales.data_as<float>()[i])
          << repro(kSeed + 5, rows, cols, describe(spec)) << " scale " << i;
    EXPECT_EQ(a.scales.data_as<float>()[0], effective_min_scale(spec)) << "an all-NaN block gets the floor";
  }
}

// ---- asymmetric integer scales

TEST(Asymmetric, ZeroPointMakesBlockMinAndMaxRepresentable) {
  const int64_t rows = 19, cols = 98;  // int4 packs pairs: even cols
  std::vector<float> x = outlier_matrix(rows, cols, kSeed + 19);
  for (int64_t c = 0; c < cols; ++c) {
    x[2 * cols + c] = std::fabs(x[2 * cols + c]) + 1.0f;   // all positive (post-ReLU/GELU)
    x[4 * cols + c] = -std::fabs(x[4 * cols + c]) - 0.5f;  // all negative
    x[6 * cols + c] = 0.0f;                                 // all zero
    x[8 * cols + c] = std::fabs(x[8 * cols + c]) * 0.25f - 0.1f;  // skewed
  }
  for (DType d : {DType::kI8, DType::kI4}) {
    for (Granularity g : {Granularity::kPerToken, Granularity::kPerBlock}) {
      QuantSpec spec = QuantSpec::per_block(d, 4, 32);
      spec.granularity = g;
      spec.symmetric = false;
      const std::string what = repro(kSeed + 19, rows, cols, describe(spec));
      ScaleSet s;
      const Status st = compute_scale(matrix_view(x.data(), rows, cols), spec, &s);
      ASSERT_TRUE(st.ok()) << st.to_string() << " " << what;
      ASSERT_EQ(s.zero_points.dtype(), DType::kI32);
      ASSERT_EQ(s.zero_points.shape(), s.scales.shape()) << what;
      const FormatInfo& f = format_info(d);
      const int64_t br = s.block.rows, bc = s.block.cols;
      for (int64_t i = 0; i < s.scales.numel(); ++i) {
        const int64_t r0 = (i / s.scale_cols()) * br, c0 = (i % s.scale_cols()) * bc;
        const int64_t r1 = std::min(rows, r0 + br), c1 = std::min(cols, c0 + bc);
        double lo = 0, hi = 0;  // the range always includes 0
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) {
            lo = std::min(lo, static_cast<double>(x[r * cols + c]));
            hi = std::max(hi, static_cast<double>(x[r * cols + c]));
          }
        const float scale = s.scales.data_as<float>()[i];
        const int32_t zp = s.zero_points.data_as<int32_t>()[i];
        const std::string at = what + " block " + std::to_string(i);
        ASSERT_GE(zp, f.qmin) << at;
        ASSERT_LE(zp, f.qmax) << at;
        const double want = std::max((hi - lo) / static_cast<double>(f.qmax - f.qmin),
                                     static_cast<double>(effective_min_scale(spec)));
        EXPECT_TRUE(rel_close(scale, want, kScaleRelTol)) << at << " scale " << scale << " want " << want;
        const double half_step = 0.5 * scale * (1 + kHalfStepSlack);
        // Every element of the block, its min and max included, round-trips within s/2 unclipped.
        const float inverse = detail::reciprocal(scale);
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) {
            const float v = x[r * cols + c];
            bool clipped = false;
            const int32_t q = detail::encode_scaled(v * inverse, d, zp, Rounding::kNearestEven, 0, &clipped);
            ASSERT_FALSE(clipped) << at << " element (" << r << ", " << c << ") = " << v;
            const double back = detail::decode_scaled(q, d, zp) * scale;
            ASSERT_LE(std::fabs(back - v), half_step) << at << " element (" << r << ", " << c << ")";
          }
        bool clipped = false;
        EXPECT_EQ(detail::encode_scaled(0.0f, d, zp, Rounding::kNearestEven, 0, &clipped), zp)
            << at << ": zero is exact";
        EXPECT_EQ(detail::encode_scaled(static_cast<float>(lo) * inverse, d, zp, Rounding::kNearestEven, 0, &clipped),
                  f.qmin)
            << at << ": the minimum maps to qmin";
      }
    }
  }
}

// min / s = -1.5 and max / s = 253.5 with s = 1: round-half-even sends them to -2 and 254, 256
// codes apart, one more than int8 has. The scale must grow (by an ulp) so that max does not clip.
TEST(Asymmetric, TiesAtBothEndsDoNotClip) {
  std::vector<float> x = {-1.5f, 0.25f, 100.0f, 253.5f};
  QuantSpec spec = QuantSpec::per_tensor(DType::kI8);
  spec.symmetric = false;
  ScaleSet s;
  ASSERT_TRUE(compute_scale(matrix_view(x.data(), 1, 4), spec, &s).ok());
  const float scale = s.scales.data_as<float>()[0];
  const int32_t zp = s.zero_points.data_as<int32_t>()[0];
  EXPECT_TRUE(rel_close(scale, 1.0, kScaleRelTol)) << scale;
  for (float v : x) {
    bool clipped = false;
    const int32_t q = detail::encode_scaled(v * detail::reciprocal(scale), DType::kI8, zp,
                                            Rounding::kNearestEven, 0, &clipped);
    EXPECT_FALSE(clipped) << "value " << v << " scale " << scale << " zero point " << zp;
    EXPECT_LE(std::fabs(detail::decode_scaled(q, DType::kI8, zp) * scale - v), 0.5 * scale * (1 + kHalfStepSlack))
        << "value " << v;
  }
}

TEST(Asymmetric, RejectedForFp8) {
  std::vector<float> x = {1.0f, -2.0f};
  QuantSpec spec = QuantSpec::per_tensor(DType::kE4M3);
  spec.symmetric = false;
  ScaleSet s;
  EXPECT_FALSE(compute_scale(matrix_view(x.data(), 1, 2), spec, &s).ok());
}

}  // namespace
}  // namespace llmq
