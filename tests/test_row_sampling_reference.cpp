// The host reference of per-row sampling (src/runtime/row_sampling.hpp's definition), on
// hand-worked rows: greedy ties and NaN, the top-k set (ties at the k-th by id), the nucleus
// (top-k first, then top-p), the inverse CDF in id order, non-finite logits, the uniform's known
// values and determinism in (seed, draw), and 20000 draws against the exact distribution. The GPU
// kernel is checked against this reference in test_cuda_row_sampling.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "row_sampling_support.hpp"
#include "runtime/row_sampling.hpp"

namespace llmq {
namespace {

using runtime::RowSamplingParams;
using runtime::RowSamplingTrace;
using runtime::sample_row_reference;
using runtime::trace_row_sampling;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

RowSamplingParams params(float temperature, float top_p = 1.0f, int32_t top_k = 0, uint64_t seed = 1, int64_t draw = 0) {
  RowSamplingParams p;
  p.temperature = temperature;
  p.top_p = top_p;
  p.top_k = top_k;
  p.seed = seed;
  p.draw = draw;
  return p;
}

RowSamplingTrace trace(const std::vector<float>& logits, const RowSamplingParams& p) {
  return trace_row_sampling(logits.data(), static_cast<int64_t>(logits.size()), p);
}

// Logits whose softmax at temperature 1 is `probabilities` (each > 0).
std::vector<float> logits_of(const std::vector<double>& probabilities) {
  std::vector<float> l;
  for (double p : probabilities) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

void expect_probabilities(const RowSamplingTrace& t, const std::vector<int32_t>& kept, const std::vector<double>& want) {
  ASSERT_EQ(t.kept, kept);
  ASSERT_EQ(t.probability.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(t.probability[i], want[i], 1e-6) << "kept id " << kept[i];
}

TEST(RowSamplingReference, GreedyIsTheArgmaxWithTiesToTheLowestId) {
  EXPECT_EQ(sample_row_reference(std::vector<float>{1, 3, 3, 2}.data(), 4, params(0.0f)), 1);
  EXPECT_EQ(sample_row_reference(std::vector<float>{kNaN, 2, 5, 5}.data(), 4, params(0.0f)), 2);
  EXPECT_EQ(sample_row_reference(std::vector<float>{-0.0f, 0.0f, -1}.data(), 3, params(0.0f)), 0);  // -0 == +0
  EXPECT_EQ(sample_row_reference(std::vector<float>{kNaN, kNaN}.data(), 2, params(0.0f)), 0);
  EXPECT_EQ(sample_row_reference(std::vector<float>{-kInf, -kInf, kNaN}.data(), 3, params(0.0f)), 0);
  // Temperature not > 0 is greedy; so is top_k = 1 at any temperature and any draw.
  EXPECT_EQ(sample_row_reference(std::vector<float>{0, 4, 4.5f}.data(), 3, params(-1.0f)), 2);
  EXPECT_EQ(sample_row_reference(std::vector<float>{0, 4, 4.5f}.data(), 3, params(kNaN)), 2);
  for (int64_t d = 0; d < 50; ++d)
    EXPECT_EQ(sample_row_reference(std::vector<float>{0, 4.5f, 4, 4.5f}.data(), 4, params(2.0f, 1.0f, 1, 9, d)), 1);
  EXPECT_TRUE(trace(std::vector<float>{0, 1}, params(0.0f)).greedy);
}

TEST(RowSamplingReference, TemperatureScalesTheLogits) {
  const std::vector<float> l = {0.0f, static_cast<float>(std::log(3.0))};
  expect_probabilities(trace(l, params(1.0f)), {0, 1}, {0.25, 0.75});
  expect_probabilities(trace(l, params(0.5f)), {0, 1}, {0.1, 0.9});  // 1 : 9
}

TEST(RowSamplingReference, TopKKeepsTheKMostProbableTiesByLowestId) {
  const std::vector<float> l = logits_of({0.1, 0.4, 0.2, 0.3});
  expect_probabilities(trace(l, params(1.0f, 1.0f, 2)), {1, 3}, {0.4 / 0.7, 0.3 / 0.7});
  expect_probabilities(trace(l, params(1.0f, 1.0f, 3)), {1, 2, 3}, {0.4 / 0.9, 0.2 / 0.9, 0.3 / 0.9});
  for (int32_t k : {0, -5, 4, 100}) EXPECT_EQ(trace(l, params(1.0f, 1.0f, k)).kept, (std::vector<int32_t>{0, 1, 2, 3})) << k;
  // Three tokens tie at the 2nd largest logit: exactly k are kept, the lowest ids first.
  const std::vector<float> ties = {1, 2, 2, 2, 0};
  EXPECT_EQ(trace(ties, params(1.0f, 1.0f, 2)).kept, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(trace(ties, params(1.0f, 1.0f, 3)).kept, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(trace(ties, params(1.0f, 1.0f, 4)).kept, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(trace(std::vector<float>{2, 2, 1, 2}, params(1.0f, 1.0f, 2)).kept, (std::vector<int32_t>{0, 1}));
}

TEST(RowSamplingReference, TopPKeepsTheShortestPrefixReachingTopPAfterTopK) {
  const std::vector<float> l = logits_of({0.1, 0.4, 0.2, 0.3});  // order: 1 (0.4), 3 (0.3), 2 (0.2), 0 (0.1)
  EXPECT_EQ(trace(l, params(1.0f, 0.65f)).kept, (std::vector<int32_t>{1, 3}));     // 0.7 >= 0.65
  EXPECT_EQ(trace(l, params(1.0f, 0.75f)).kept, (std::vector<int32_t>{1, 2, 3}));  // 0.7 < 0.75 <= 0.9
  EXPECT_EQ(trace(l, params(1.0f, 0.35f)).kept, (std::vector<int32_t>{1}));
  EXPECT_EQ(trace(l, params(1.0f, 0.95f)).kept, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(trace(l, params(1.0f, 0.0f)).kept, (std::vector<int32_t>{1}));  // at least the argmax
  // Top-k first: k = 3 keeps 0.9 of the mass, and 0.75 of that is 0.675, which {1, 3} reaches.
  expect_probabilities(trace(l, params(1.0f, 0.75f, 3)), {1, 3}, {0.4 / 0.7, 0.3 / 0.7});
  // Equal logits: the nucleus is cut inside the tie, by id.
  EXPECT_EQ(trace(std::vector<float>{0, 0, 0, 0}, params(1.0f, 0.5f)).kept, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(trace(std::vector<float>{0, 0, 0, 0}, params(1.0f, 0.6f)).kept, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_LT(trace(l, params(1.0f, 0.65f)).nucleus_margin, 0.06);  // |0.7 - 0.65|
  EXPECT_GT(trace(l, params(1.0f, 0.65f)).nucleus_margin, 0.04);
}

TEST(RowSamplingReference, DrawIsTheInverseCdfInIdOrder) {
  const std::vector<float> l = logits_of({0.1, 0.4, 0.2, 0.3});  // running weight in id order: .1 .5 .7 1
  std::set<int32_t> drawn;
  for (int64_t d = 0; d < 400; ++d) {
    const RowSamplingTrace t = trace(l, params(1.0f, 1.0f, 0, 12345, d));
    const double u = runtime::sampling_uniform01(12345, d);
    EXPECT_EQ(t.u, u);
    const int32_t want = u < 0.1 - 1e-6 ? 0 : u < 0.5 - 1e-6 ? 1 : u < 0.7 - 1e-6 ? 2 : 3;
    if (std::fabs(u - 0.1) > 1e-5 && std::fabs(u - 0.5) > 1e-5 && std::fabs(u - 0.7) > 1e-5)
      EXPECT_EQ(t.token, want) << "u " << u;
    drawn.insert(t.token);
  }
  EXPECT_EQ(drawn.size(), 4u);
}

TEST(RowSamplingReference, UniformHasKnownValuesAndDependsOnSeedAndDrawOnly) {
  // splitmix64's finaliser of seed * 0x9E3779B97F4A7C15 + draw, top 24 bits (computed apart).
  EXPECT_EQ(runtime::sampling_uniform24(1, 0), 14819496u);
  EXPECT_EQ(runtime::sampling_uniform24(1, 1), 9505325u);
  EXPECT_EQ(runtime::sampling_uniform24(42, 7), 15432199u);
  EXPECT_EQ(runtime::sampling_uniform24(0xDEADBEEFull, 1000000007), 9745325u);
  EXPECT_EQ(runtime::sampling_uniform01(42, 7), 15432199.0f / 16777216.0f);
  double sum = 0.0;
  for (int64_t d = 0; d < 100000; ++d) {
    const float u = runtime::sampling_uniform01(77, d);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / 100000.0, 0.5, 0.005);  // std of the mean 0.0009
  // Same (logits, params): same token; another draw or seed moves it.
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> l(1000);
  for (float& v : l) v = normal(rng);
  std::set<int32_t> by_draw, by_seed;
  for (int64_t d = 0; d < 20; ++d) {
    const RowSamplingParams p = params(1.0f, 0.9f, 0, 3, d);
    EXPECT_EQ(sample_row_reference(l.data(), 1000, p), sample_row_reference(l.data(), 1000, p));
    by_draw.insert(sample_row_reference(l.data(), 1000, p));
    by_seed.insert(sample_row_reference(l.data(), 1000, params(1.0f, 0.9f, 0, 100 + static_cast<uint64_t>(d), 0)));
  }
  EXPECT_GT(by_draw.size(), 10u);
  EXPECT_GT(by_seed.size(), 10u);
}

TEST(RowSamplingReference, NonFiniteLogits) {
  // +Inf: the maximum, and the only tokens that weigh; NaN never drawn.
  const std::vector<float> inf_row = {kNaN, 1, kInf, 0, kInf};
  expect_probabilities(trace(inf_row, params(1.0f)), {0, 1, 2, 3, 4}, {0, 0, 0.5, 0, 0.5});
  std::set<int32_t> drawn;
  for (int64_t d = 0; d < 100; ++d) drawn.insert(trace(inf_row, params(1.0f, 1.0f, 0, 8, d)).token);
  EXPECT_EQ(drawn, (std::set<int32_t>{2, 4}));
  // -Inf weighs nothing (unless every non-NaN logit is -Inf: then they are the maximum).
  drawn.clear();
  for (int64_t d = 0; d < 100; ++d) drawn.insert(trace(std::vector<float>{-kInf, 0, kNaN, 0}, params(0.7f, 1.0f, 0, 8, d)).token);
  EXPECT_EQ(drawn, (std::set<int32_t>{1, 3}));
  drawn.clear();
  for (int64_t d = 0; d < 100; ++d) drawn.insert(trace(std::vector<float>{kNaN, -kInf, -kInf}, params(0.7f, 1.0f, 0, 8, d)).token);
  EXPECT_EQ(drawn, (std::set<int32_t>{1, 2}));
  EXPECT_EQ(sample_row_reference(std::vector<float>{kNaN, kNaN}.data(), 2, params(1.0f)), 0);
}

TEST(RowSamplingReference, TwentyThousandDrawsFollowTheRenormalisedDistribution) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> l(50);
  for (float& v : l) v = normal(rng);
  const RowSamplingParams cases[] = {params(0.8f, 0.9f, 20, 77), params(1.3f, 1.0f, 0, 78), params(1.0f, 0.6f, 0, 79),
                                     params(0.7f, 1.0f, 7, 80)};
  for (const RowSamplingParams& base : cases) {
    const RowSamplingTrace exact = trace(l, base);
    std::vector<int32_t> tokens;
    for (int64_t d = 0; d < 20000; ++d) {
      RowSamplingParams p = base;
      p.draw = d;
      tokens.push_back(sample_row_reference(l.data(), 50, p));
    }
    EXPECT_TRUE(testing::matches_distribution(tokens, exact,
                                              "T " + std::to_string(base.temperature) + " top_p " +
                                                  std::to_string(base.top_p) + " top_k " + std::to_string(base.top_k)));
  }
}

}  // namespace
}  // namespace llmq
