// quantize / dequantize: RFC 0003's error budgets, exactness on the grid, static vs dynamic
// scales, SmoothQuant fusion, stochastic rounding, and the edge cases (zeros, extremes, NaN/Inf,
// odd shapes, bad arguments).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "llmq/quantize_tensor.hpp"
#include "llmq/scale.hpp"
#include "support.hpp"

namespace llmq {
namespace {

// RFC 0003 error budget for symmetric INT8: |x - x_hat| <= 0.5 * scale (inside the range).
constexpr double kIntBudgetSteps = 0.5;
// FP8 round to nearest: relative error <= 2^-(M+1) for normals; subnormals: <= half the
// smallest subnormal step times the scale.
double fp8_error_bound(double x, double scale, DType d) {
  const FormatInfo& f = format_info(d);
  return std::max(std::fabs(x) * std::ldexp(1.0, -(f.mantissa_bits + 1)), 0.5 * f.min_subnormal * scale);
}

std::vector<float> dequantized(const QuantizedTensor& q) {
  std::vector<float> out(static_cast<size_t>(q.rows * q.cols));
  const Status st = dequantize(q, matrix_view(out.data(), q.rows, q.cols));
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

const QuantSpec kGranularities[] = {
    QuantSpec::per_tensor(DType::kI8),        QuantSpec::per_token(DType::kI8),
    QuantSpec::per_channel(DType::kI8),       QuantSpec::per_block(DType::kI8, 128, 128),
    QuantSpec::per_block(DType::kI8, 1, 128), QuantSpec::per_group(DType::kI8, 19),
};

QuantSpec with_format(QuantSpec s, DType d) {
  s.format = d;
  return s;
}

TEST(RoundTrip, ErrorWithinBudgetEveryFormatAndGranularity) {
  struct Shape { int64_t rows, cols; };
  for (Shape shape : {Shape{1, 19}, Shape{19, 99}, Shape{3, 989}, Shape{130, 266}}) {
    const uint64_t seed = static_cast<uint64_t>(shape.rows * 1000 + shape.cols);
    const auto x = testing::outlier_matrix(shape.rows, shape.cols, seed);
    for (QuantSpec base : kGranularities) {
      if (base.granularity == Granularity::kPerGroup && shape.cols % base.group_size != 0) continue;
      for (DType d : {DType::kI8, DType::kE4M3, DType::kE5M2, DType::kE4M3Ieee, DType::kE4M3Fnuz, DType::kE5M2Fnuz}) {
        const QuantSpec spec = with_format(base, d);
        QuantizedTensor q;
        ASSERT_TRUE(quantize(matrix_view(x.data(), shape.rows, shape.cols), spec, &q).ok());
        EXPECT_EQ(q.clipped, 0) << "absmax scales never clip";
        const auto y = dequantized(q);
        for (int64_t r = 0; r < shape.rows; ++r)
          for (int64_t c = 0; c < shape.cols; ++c) {
            const size_t i = static_cast<size_t>(r * shape.cols + c);
            const double s = q.scales.scale(r, c);
            // The float32 products x * (1/s) and q * s add at most a couple of float32 ulps.
            const double slack = 4.0 * std::ldexp(std::fabs(x[i]), -24);
            const double bound = (d == DType::kI8 ? kIntBudgetSteps * s : fp8_error_bound(x[i], s, d)) + slack;
            ASSERT_LE(std::fabs(y[i] - x[i]), bound)
                << testing::repro(seed, shape.rows, shape.cols, describe(spec)) << " at (" << r << ", " << c
                << ") x=" << x[i] << " y=" << y[i] << " s=" << s;
          }
      }
    }
  }
}

TEST(RoundTrip, RfcMeanErrorBudgetInt8PerTensor) {
  // RFC 0003: INT8 symmetric mean error <= 0.25 * scale (uniform rounding error averages 0.25).
  constexpr double kMeanBudgetSteps = 0.25 + 0.01;
  const auto x = testing::normal_vector(100000, 5);
  QuantizedTensor q;
  ASSERT_TRUE(quantize(matrix_view(x.data(), 1, 100000), QuantSpec::per_tensor(DType::kI8), &q).ok());
  const auto y = dequantized(q);
  double sum = 0;
  for (size_t i = 0; i < x.size(); ++i) sum += std::fabs(y[i] - x[i]);
  EXPECT_LE(sum / x.size(), kMeanBudgetSteps * q.scales.scale(0, 0));
}

TEST(RoundTrip, ExactOnTheGrid) {
  // Values k * s for integers k (INT8) or FP8 grid values times a power-of-two scale come back
  // exactly: quantization is the identity on its own grid.
  const auto noise = testing::normal_vector(19 * 98, 11);  // even cols: int4 packs pairs
  for (DType d : {DType::kI8, DType::kI4, DType::kE4M3, DType::kE5M2}) {
    std::vector<float> x(noise.size());
    for (size_t i = 0; i < x.size(); ++i) {
      float v;
      if (format_info(d).is_integer) {
        v = static_cast<float>(static_cast<int>(noise[i] * 3) % static_cast<int>(format_info(d).qmax));
      } else {
        v = fp8_to_float(float_to_fp8(noise[i] * 50.0f, d), d);
      }
      x[i] = std::ldexp(v, -3);
    }
    x[0] = static_cast<float>(std::ldexp(format_info(d).max_finite, -3));  // pins absmax -> s = 2^-3
    QuantizedTensor q;
    ASSERT_TRUE(quantize(matrix_view(x.data(), 19, 98), QuantSpec::per_tensor(d), &q).ok());
    ASSERT_EQ(q.scales.scale(0, 0), 0.125f) << dtype_name(d);
    const auto y = dequantized(q);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], x[i]) << dtype_name(d) << " element " << i;
  }
}

TEST(EdgeCases, AllZeroRowsGetTheFloorScaleAndStayZero) {
  std::vector<float> x(4 * 64, 0.0f);
  for (int c = 0; c < 64; ++c) x[64 + c] = static_cast<float>(c - 30) * 0.37f;  // row 1 non-zero
  for (DType d : {DType::kE4M3, DType::kI8}) {
    QuantizedTensor q;
    const QuantSpec spec = QuantSpec::per_token(d);
    ASSERT_TRUE(quantize(matrix_view(x.data(), 4, 64), spec, &q).ok());
    EXPECT_EQ(q.scales.scale(0, 0), effective_min_scale(spec));
    EXPECT_GT(q.scales.scale(1, 0), effective_min_scale(spec));
    const auto y = dequantized(q);
    for (int c = 0; c < 64; ++c) {
      EXPECT_EQ(y[c], 0.0f);
      EXPECT_EQ(y[3 * 64 + c], 0.0f);
    }
  }
}

TEST(EdgeCases, ExtremeMagnitudes) {
  // 1e-30 and 3e38 in one tensor: per-token scales handle both rows; per-tensor flushes the tiny
  // row to zero (documented: the floor of a shared scale).
  std::vector<float> x = {1e-30f, -2e-30f, 3e-30f, 4e-30f, 3e38f, -1e38f, 2e37f, 1.0f};
  QuantizedTensor q;
  ASSERT_TRUE(quantize(matrix_view(x.data(), 2, 4), QuantSpec::per_token(DType::kE4M3), &q).ok());
  const auto y = dequantized(q);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(y[i], 0.0f) << "below MIN_SCALE * min subnormal: flushed";
  for (size_t i = 4; i < 7; ++i) EXPECT_NEAR(y[i], x[i], std::fabs(x[i]) / 16) << i;
  QuantSpec tiny = QuantSpec::per_token(DType::kE4M3);
  tiny.min_scale = 1e-40f;  // a caller who wants tiny rows represented lowers the floor
  ASSERT_TRUE(quantize(matrix_view(x.data(), 2, 4), tiny, &q).ok());
  const auto z = dequantized(q);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(z[i], x[i], std::fabs(x[i]) / 16) << i;
}

TEST(EdgeCases, NanStaysNanInFp8AndIsZeroInInt8) {
  std::vector<float> x = {1.0f, std::nanf(""), -3.0f, 2.0f};
  QuantizedTensor q;
  ASSERT_TRUE(quantize(matrix_view(x.data(), 1, 4), QuantSpec::per_tensor(DType::kE4M3), &q).ok());
  EXPECT_EQ(q.nan_count, 1);
  EXPECT_EQ(q.scales.scale(0, 0), 3.0f / 448.0f) << "absmax ignores NaN";
  auto y = dequantized(q);
  EXPECT_TRUE(std::isnan(y[1]));
  EXPECT_EQ(y[2], -3.0f);
  ASSERT_TRUE(quantize(matrix_view(x.data(), 1, 4), QuantSpec::per_tensor(DType::kI8), &q).ok());
  y = dequantized(q);
  EXPECT_EQ(y[1], 0.0f);
}

TEST(EdgeCases, InfIsAnErrorForDynamicScalesAndSaturatesForStatic) {
  std::vector<float> x = {1.0f, INFINITY, -3.0f, 2.0f};
  QuantizedTensor q;
  const Status st = quantize(matrix_view(x.data(), 1, 4), QuantSpec::per_tensor(DType::kE4M3), &q);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("x"), std::string::npos) << st.message();
  // With a static scale the Inf saturates to max and is counted as clipped.
  QuantSpec spec = QuantSpec::per_tensor(DType::kE4M3);
  spec.source = ScaleSource::kStatic;
  ScaleSet s;
  s.scales = Tensor(DType::kF32, {1, 1});
  s.scales.data_as<float>()[0] = 0.5f;
  s.block = {1, 4};
  ASSERT_TRUE(quantize(matrix_view(x.data(), 1, 4), spec, &q, &s).ok());
  EXPECT_EQ(q.clipped, 1);
  EXPECT_EQ(dequantized(q)[1], 224.0f);
}

TEST(StaticScales, CalibratedScaleClipsLargerRuntimeValues) {
  const auto calib = testing::outlier_matrix(64, 128, 21);
  ScaleSet calibrated;
  ASSERT_TRUE(compute_scale(matrix_view(calib.data(), 64, 128), QuantSpec::per_tensor(DType::kE4M3), &calibrated).ok());
  auto runtime = testing::outlier_matrix(64, 128, 22);
  for (auto& v : runtime) v *= 3.0f;  // drift beyond the calibration range
  QuantSpec spec = QuantSpec::per_tensor(DType::kE4M3);
  spec.source = ScaleSource::kStatic;
  QuantizedTensor q;
  ASSERT_TRUE(quantize(matrix_view(runtime.data(), 64, 128), spec, &q, &calibrated).ok());
  EXPECT_EQ(q.scales.scale(0, 0), calibrated.scale(0, 0));
  EXPECT_GT(q.clipped, 0);
  const auto y = dequantized(q);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_LE(std::fabs(y[i]), 448.0f * calibrated.scale(0, 0) * 1.0001f);
}

TEST(StaticScales, ArgumentErrorsNameTheArgument) {
  const auto x = testing::normal_vector(8 * 16, 3);
  QuantSpec spec = QuantSpec::per_tensor(DType::kE4M3);
  spec.source = ScaleSource::kStatic;
  QuantizedTensor q;
  Status st = quantize(matrix_view(x.data(), 8, 16), spec, &q);
  EXPECT_NE(st.message().find("static_scales"), std::string::npos) << st.message();

  ScaleSet bad;
  bad.scales = Tensor(DType::kF32, {1, 1});
  bad.block = {8, 16};
  for (float v : {0.0f, -1.0f, std::nanf(""), INFINITY}) {
    bad.scales.data_as<float>()[0] = v;
    st = quantize(matrix_view(x.data(), 8, 16), spec, &q, &bad);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << v;
    EXPECT_NE(st.message().find("static_scales"), std::string::npos) << st.message();
  }
  bad.scales = Tensor(DType::kF32, {2, 1});  // wrong shape for per-tensor
  st = quantize(matrix_view(x.data(), 8, 16), spec, &q, &bad);
  EXPECT_NE(st.message().find("static_scales"), std::string::npos) << st.message();

  spec.granularity = Granularity::kPerToken;  // static per-token is meaningless
  st = quantize(matrix_view(x.data(), 8, 16), spec, &q, &bad);
  EXPECT_NE(st.message().find("per-token"), std::string::npos) << st.message();
}

TEST(BadInput, ErrorsNameTheArgument) {
  const auto x = testing::normal_vector(4 * 10, 3);
  QuantizedTensor q;
  QuantSpec spec = QuantSpec::per_group(DType::kI8, 4);  // 4 does not divide 10
  Status st = quantize(matrix_view(x.data(), 4, 10), spec, &q);
  EXPECT_NE(st.message().find("group_size"), std::string::npos) << st.message();

  spec = QuantSpec::per_tensor(DType::kBF16);  // not a quantized format
  st = quantize(matrix_view(x.data(), 4, 10), spec, &q);
  EXPECT_NE(st.message().find("spec.format"), std::string::npos) << st.message();

  spec = QuantSpec::per_tensor(DType::kE4M3);
  spec.backoff = 1.5f;
  st = quantize(matrix_view(x.data(), 4, 10), spec, &q);
  EXPECT_NE(st.message().find("backoff"), std::string::npos) << st.message();

  TensorView ints = matrix_view(x.data(), 4, 10);
  ints.dtype = DType::kI8;
  st = quantize(ints, QuantSpec::per_tensor(DType::kE4M3), &q);
  EXPECT_NE(st.message().find("x: dtype"), std::string::npos) << st.message();

  ASSERT_TRUE(quantize(matrix_view(x.data(), 4, 10), QuantSpec::per_tensor(DType::kE4M3), &q).ok());
  std::vector<float> small(4 * 9);
  st = dequantize(q, matrix_view(small.data(), 4, 9));
  EXPECT_NE(st.message().find("out"), std::string::npos) << st.message();

  st = quantize(matrix_view(x.data(), 4, 10), QuantSpec::per_tensor(DType::kI4), &q);
  EXPECT_TRUE(st.ok()) << "even cols are fine for int4";
  st = quantize(matrix_view(x.data(), 5, 7), QuantSpec::per_tensor(DType::kI4), &q);
  EXPECT_FALSE(st.ok()) << "odd cols cannot pack int4 pairs";
}

TEST(Inputs, Bf16AndStridedViewsGiveTheSameCodesAsFloat) {
  const auto x = testing::outlier_matrix(19, 99, 4);
  std::vector<uint16_t> xb(x.size());
  std::vector<float> xr(x.size());  // x rounded to bf16, as float
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = float_to_bf16_bits(x[i]);
    xr[i] = bf16_bits_to_float(xb[i]);
  }
  TensorView vb{xb.data(), DType::kBF16, {19, 99}, {}, Device::kCpu};
  QuantizedTensor qb, qf, qt;
  ASSERT_TRUE(quantize(vb, QuantSpec::per_token(DType::kE4M3), &qb).ok());
  ASSERT_TRUE(quantize(matrix_view(xr.data(), 19, 99), QuantSpec::per_token(DType::kE4M3), &qf).ok());
  EXPECT_EQ(0, std::memcmp(qb.data.data(), qf.data.data(), static_cast<size_t>(qf.data.nbytes())));
  // A transposed (column-major) view of the same matrix.
  std::vector<float> xt(x.size());
  for (int64_t r = 0; r < 19; ++r)
    for (int64_t c = 0; c < 99; ++c) xt[static_cast<size_t>(c * 19 + r)] = xr[static_cast<size_t>(r * 99 + c)];
  TensorView vt{xt.data(), DType::kF32, {19, 99}, {1, 19}, Device::kCpu};
  ASSERT_TRUE(quantize(vt, QuantSpec::per_token(DType::kE4M3), &qt).ok());
  EXPECT_EQ(0, std::memcmp(qt.data.data(), qf.data.data(), static_cast<size_t>(qf.data.nbytes())));
}

TEST(Stochastic, DeterministicPerSeedAndUnbiasedOnAverage) {
  const auto x = testing::outlier_matrix(16, 256, 8);
  QuantSpec spec = QuantSpec::per_token(DType::kE4M3);
  spec.rounding = Rounding::kStochastic;
  spec.seed = 1234;
  QuantizedTensor a, b, c;
  ASSERT_TRUE(quantize(matrix_view(x.data(), 16, 256), spec, &a).ok());
  ASSERT_TRUE(quantize(matrix_view(x.data(), 16, 256), spec, &b).ok());
  EXPECT_EQ(0, std::memcmp(a.data.data(), b.data.data(), static_cast<size_t>(a.data.nbytes())));
  spec.seed = 1235;
  ASSERT_TRUE(quantize(matrix_view(x.data(), 16, 256), spec, &c).ok());
  EXPECT_NE(0, std::memcmp(a.data.data(), c.data.data(), static_cast<size_t>(a.data.nbytes())));
  // Averaging many seeds recovers x far better than one RNE quantization does.
  constexpr int kSeeds = 200;
  std::vector<double> mean(x.size(), 0.0);
  for (int s = 0; s < kSeeds; ++s) {
    spec.seed = static_cast<uint64_t>(s);
    ASSERT_TRUE(quantize(matrix_view(x.data(), 16, 256), spec, &c).ok());
    const auto y = dequantized(c);
    for (size_t i = 0; i < x.size(); ++i) mean[i] += y[i] / kSeeds;
  }
  QuantizedTensor rne;
  ASSERT_TRUE(quantize(matrix_view(x.data(), 16, 256), QuantSpec::per_token(DType::kE4M3), &rne).ok());
  const auto yr = dequantized(rne);
  double err_mean = 0, err_rne = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err_mean += (mean[i] - x[i]) * (mean[i] - x[i]);
    err_rne += (yr[i] - x[i]) * (yr[i] - x[i]);
  }
  EXPECT_LT(err_mean, err_rne / 10);
}

TEST(SmoothQuant, FusedDivisionEqualsDividingFirst) {
  const auto x = testing::outlier_matrix(8, 64, 31);
  std::vector<float> smooth(64);
  for (int c = 0; c < 64; ++c) smooth[c] = 0.5f + static_cast<float>(c % 7);
  std::vector<float> divided(x.size());
  for (size_t i = 0; i < x.size(); ++i) divided[i] = x[i] / smooth[i % 64];
  QuantizedTensor fused, manual;
  ASSERT_TRUE(quantize(matrix_view(x.data(), 8, 64), QuantSpec::per_token(DType::kE4M3), &fused, nullptr, smooth.data()).ok());
  ASSERT_TRUE(quantize(matrix_view(divided.data(), 8, 64), QuantSpec::per_token(DType::kE4M3), &manual).ok());
  EXPECT_EQ(0, std::memcmp(fused.data.data(), manual.data.data(), static_cast<size_t>(manual.data.nbytes())));
  smooth[5] = 0.0f;
  EXPECT_FALSE(quantize(matrix_view(x.data(), 8, 64), QuantSpec::per_token(DType::kE4M3), &fused, nullptr, smooth.data()).ok());
}

TEST(Asymmetric, Int8ZeroPointRepresentsAShiftedRange) {
  // All-positive data (post-ReLU-like): asymmetric uses all 256 levels, symmetric only half.
  auto x = testing::normal_vector(4 * 200, 9);
  for (auto& v : x) v = std::fabs(v) + 0.5f;
  QuantSpec asym = QuantSpec::per_token(DType::kI8);
  asym.symmetric = false;
  QuantizedTensor qa, qs;
  ASSERT_TRUE(quantize(matrix_view(x.data(), 4, 200), asym, &qa).ok());
  ASSERT_TRUE(quantize(matrix_view(x.data(), 4, 200), QuantSpec::per_token(DType::kI8), &qs).ok());
  const auto ya = dequantized(qa), ys = dequantized(qs);
  double ea = 0, es = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    ea += (ya[i] - x[i]) * (ya[i] - x[i]);
    es += (ys[i] - x[i]) * (ys[i] - x[i]);
    ASSERT_LE(std::fabs(ya[i] - x[i]), 0.5 * qa.scales.scale(static_cast<int64_t>(i) / 200, 0) * 1.0001) << i;
  }
  EXPECT_LT(ea, es / 2);
}

TEST(Shapes, EmptyAndSingleElement) {
  std::vector<float> one = {-0.75f};
  QuantizedTensor q;
  ASSERT_TRUE(quantize(matrix_view(one.data(), 1, 1), QuantSpec::per_block(DType::kE4M3, 128, 128), &q).ok());
  EXPECT_NEAR(dequantized(q)[0], -0.75f, 0.75f * 1e-6f);
  std::vector<float> none;
  EXPECT_TRUE(quantize(matrix_view(none.data(), 0, 16), QuantSpec::per_token(DType::kE4M3), &q).ok());
  EXPECT_EQ(q.rows, 0);
}

}  // namespace
}  // namespace llmq
