// SmoothQuant's per-channel factors (llmq/scale.hpp): the formula, dead channels, and smoothing
// that shrinks the activation scale while keeping the product X W^T.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "llmq/format.hpp"
#include "llmq/quantize_tensor.hpp"
#include "llmq/scale.hpp"
#include "scale_support.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using namespace scale_test;  // NOLINT: the suite's shared helpers

// SmoothQuant on data with 40x outlier channels must shrink the activation scale at least this much.
constexpr double kMinSmoothingGain = 2.0;

// ---- SmoothQuant

TEST(SmoothQuant, FactorsFollowTheFormula) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> rx = {0.0f, 1.0f, 4.0f, 100.0f, 0.5f, inf, 2.0f, 3.0f};
  const std::vector<float> rw = {1.0f, 0.0f, 0.25f, 2.0f, 8.0f, 1.0f, nan, 0.01f};
  const bool dead[] = {true, true, false, false, false, true, true, false};
  for (float alpha : {0.0f, 0.5f, 0.8f, 1.0f}) {
    std::vector<float> s;
    ASSERT_TRUE(smoothquant_factors(rx, rw, alpha, &s).ok());
    ASSERT_EQ(s.size(), rx.size());
    for (size_t k = 0; k < rx.size(); ++k) {
      const double want = dead[k] ? 1.0 : std::pow(rx[k], alpha) / std::pow(rw[k], 1.0 - alpha);
      EXPECT_TRUE(rel_close(s[k], want, kScaleRelTol)) << "alpha " << alpha << " channel " << k << " got " << s[k];
    }
  }
  std::vector<float> s;
  for (float bad : {-0.1f, 1.5f, nan}) {
    const Status st = smoothquant_factors(rx, rw, bad, &s);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.message().rfind("alpha", 0), 0u) << st.message();
  }
  Status st = smoothquant_factors(rx, {1.0f, 2.0f}, 0.5f, &s);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("weight_absmax"), std::string::npos) << st.message();
  st = smoothquant_factors({-1.0f}, {1.0f}, 0.5f, &s);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("act_absmax", 0), 0u) << st.message();
}

TEST(SmoothQuant, SmoothingShrinksTheActivationScaleAndKeepsTheProduct) {
  const int64_t tokens = 256, n = 96, k = 512;
  const std::vector<float> x = outlier_matrix(tokens, k, kSeed + 17);
  const std::vector<float> w = llmq::testing::normal_vector(n * k, kSeed + 18, 0.05f);
  const std::string what = repro(kSeed + 17, tokens, k, "smoothquant alpha=0.5 e4m3 per-tensor");
  const std::vector<float> rx = column_absmax(as_mat(x, tokens, k));
  const std::vector<float> rw = column_absmax(as_mat(w, n, k));
  std::vector<float> sc;
  ASSERT_TRUE(smoothquant_factors(rx, rw, 0.5f, &sc).ok());
  const QuantSpec spec = QuantSpec::per_tensor(DType::kE4M3);

  const float before = absmax_scale(*std::max_element(rx.begin(), rx.end()), spec);
  const float after = smoothed_activation_scale(rx, sc, spec);
  EXPECT_LT(after * kMinSmoothingGain, before) << what << " before " << before << " after " << after;

  // eq. 27 is the per-tensor absmax scale of X S_c^-1.
  std::vector<float> xs(x.size());
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < k; ++c) xs[t * k + c] = x[t * k + c] / sc[c];
  ScaleSet s;
  ASSERT_TRUE(compute_scale(matrix_view(xs.data(), tokens, k), spec, &s).ok());
  EXPECT_EQ(after, s.scales.data_as<float>()[0]) << what;

  // W S_c: columns scaled, and (X S_c^-1)(W S_c)^T == X W^T up to float rounding.
  Tensor wbar;
  ASSERT_TRUE(smooth_weight(matrix_view(w.data(), n, k), sc, &wbar).ok());
  ASSERT_EQ(wbar.shape(), (std::vector<int64_t>{n, k}));
  const float* pw = wbar.data_as<float>();
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < k; ++c) ASSERT_EQ(pw[j * k + c], w[j * k + c] * sc[c]) << what;
  constexpr double kProductRelTol = 1e-4;
  for (int64_t t = 0; t < tokens; t += 37)
    for (int64_t j = 0; j < n; j += 13) {
      double ref = 0, smoothed = 0, norm = 0;
      for (int64_t c = 0; c < k; ++c) {
        ref += static_cast<double>(x[t * k + c]) * w[j * k + c];
        smoothed += static_cast<double>(xs[t * k + c]) * pw[j * k + c];
        norm += std::fabs(static_cast<double>(x[t * k + c]) * w[j * k + c]);
      }
      EXPECT_LE(std::fabs(smoothed - ref), kProductRelTol * norm) << what << " t " << t << " n " << j;
    }

  const Status st = smooth_weight(matrix_view(w.data(), n, k), std::vector<float>(k - 1, 1.0f), &wbar);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("smooth", 0), 0u) << st.message();
  EXPECT_TRUE(std::isnan(smoothed_activation_scale(rx, std::vector<float>(3, 1.0f), spec)));
}

}  // namespace
}  // namespace llmq
