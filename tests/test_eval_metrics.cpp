// EvalAccumulator (llmq/eval_metrics.hpp): the `perplexity --kl-divergence` statistics. Identical
// models give KL 0, agreement 1 and a perplexity ratio of exactly 1 ± 0; two-token cases are checked
// against values worked out by hand; KL matches an independent long-double evaluation of the
// textbook definition and is never negative beyond rounding; results are invariant to a shift of
// the logits; percentiles, standard errors and their 1/sqrt(n) scaling; and the error paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "llmq/eval_metrics.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using llmq::testing::outlier_matrix;
using llmq::testing::repro;

// Values worked out by hand (logs and exps of small rationals) agree to a few double ulps.
constexpr double kHandRelTol = 1e-12;
// Identical logits: KL is computed as a difference of equal terms and must vanish.
constexpr double kZeroKlTol = 1e-12;
// The largest negative KL rounding may produce (the task's bound).
constexpr double kMinKl = -1e-12;
// KL against the long-double reference: the double evaluation cancels terms as large as the logit
// range (a few thousand with the outlier spikes), so allow 1e-16 x that, plus a relative part.
constexpr double kKlRefAbsTol = 1e-11;
constexpr double kKlRefRelTol = 1e-9;
// Standard errors of i.i.d. positions: 16x the tokens should shrink them 4x. Averaged over 16
// blocks the small-sample errors land within ~1% of that (checked over several seeds), and
// Jensen's bias of a sample deviation is below that too; 5% leaves room without hiding a wrong
// scaling (1/n or no scaling would give 16 or 1).
constexpr double kSqrtNRatioTol = 0.05;

constexpr uint64_t kSeed = 20240612;

const double kLn2 = std::log(2.0);
const double kLn3 = std::log(3.0);

EvalAccumulator::Summary one_position(const float* base, const float* quant, int64_t vocab, int32_t target) {
  EvalAccumulator acc;
  const Status st = acc.add(base, quant, vocab, target);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return acc.summarize();
}

void expect_rel(double got, double want, double tol, const std::string& what) {
  EXPECT_NEAR(got, want, tol * std::max(1.0, std::fabs(want))) << what;
}

// KL(P_b || P_q) straight from the definition sum p_b log(p_b / p_q) with probabilities formed in
// long double: a different formula, evaluation order and precision than the library's.
double reference_kl(const float* b, const float* q, int64_t vocab) {
  const long double mb = *std::max_element(b, b + vocab), mq = *std::max_element(q, q + vocab);
  long double zb = 0, zq = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    zb += std::exp(static_cast<long double>(b[i]) - mb);
    zq += std::exp(static_cast<long double>(q[i]) - mq);
  }
  long double kl = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const long double pb = std::exp(static_cast<long double>(b[i]) - mb) / zb;
    const long double pq = std::exp(static_cast<long double>(q[i]) - mq) / zq;
    if (pb == 0) continue;  // 0 log 0 = 0
    kl += pb * std::log(pb / pq);
  }
  return static_cast<double>(kl);
}

// Two-token vocabulary, base (0, 0), quant (a, 0): q0 = 1 / (1 + e^-a), q1 = 1 / (1 + e^a) and
// KL = 0.5 ln(0.5 / q0) + 0.5 ln(0.5 / q1) = -ln 2 + 0.5 (ln(1 + e^-a) + ln(1 + e^a)).
double two_token_kl(double a) { return -kLn2 + 0.5 * (std::log1p(std::exp(-a)) + std::log1p(std::exp(a))); }

// ---- Identical models ----

TEST(EvalMetrics, IdenticalLogitsGiveZeroKlAndRatioExactlyOne) {
  constexpr int64_t kVocab = 512, kPositions = 200;
  const auto logits = outlier_matrix(kPositions, kVocab, kSeed);
  EvalAccumulator acc;
  std::mt19937_64 rng(kSeed);
  for (int64_t t = 0; t < kPositions; ++t) {
    const float* row = logits.data() + t * kVocab;
    const auto target = static_cast<int32_t>(rng() % kVocab);
    ASSERT_TRUE(acc.add(row, row, kVocab, target).ok());
    const auto one = one_position(row, row, kVocab, target);
    ASSERT_LT(std::fabs(one.kl.mean), kZeroKlTol) << repro(kSeed, kPositions, kVocab, "identical") << " t=" << t;
  }
  const auto s = acc.summarize();
  EXPECT_EQ(s.tokens, kPositions);
  EXPECT_LT(std::fabs(s.kl.mean), kZeroKlTol);
  EXPECT_LT(std::fabs(s.kl_max), kZeroKlTol);
  EXPECT_EQ(s.top1_agreement.mean, 1.0);
  EXPECT_EQ(s.top1_agreement.stderr_, 0.0);
  EXPECT_EQ(s.ppl_ratio, 1.0) << "paired differences are exactly zero";
  EXPECT_EQ(s.ppl_ratio_err, 0.0);
  EXPECT_EQ(s.ppl_base, s.ppl_quant);
  EXPECT_EQ(s.ppl_base_err, s.ppl_quant_err);
  EXPECT_GT(s.ppl_base_err, 0.0) << "the targets' NLLs differ, so each perplexity has an error";
  EXPECT_EQ(s.delta_p.mean, 0.0);
  EXPECT_EQ(s.delta_p.stderr_, 0.0);
  EXPECT_EQ(s.delta_p_rms, 0.0);
}

// ---- Two-token cases worked out by hand ----

TEST(EvalMetrics, TwoTokenCaseByHand) {
  // Base (0, 0): p_b = (1/2, 1/2). Quant (ln 3, 0): p_q = (3/4, 1/4).
  // KL = 0.5 ln(0.5 / 0.75) + 0.5 ln(0.5 / 0.25) = 0.5 ln(4/3).
  const float base[2] = {0.0f, 0.0f};
  const float quant[2] = {static_cast<float>(kLn3), 0.0f};
  // The float rounding of ln 3 moves p_q by ~1e-8; use the rounded value for the exact answers.
  const double a = quant[0];
  const double q0 = std::exp(a) / (std::exp(a) + 1.0), q1 = 1.0 / (std::exp(a) + 1.0);
  const double kl = 0.5 * std::log(0.5 / q0) + 0.5 * std::log(0.5 / q1);
  ASSERT_NEAR(kl, 0.5 * std::log(4.0 / 3.0), 1e-7) << "hand value";

  EvalAccumulator acc;
  ASSERT_TRUE(acc.add(base, quant, 2, 0).ok());  // target 0: NLL ln 2 vs ln(4/3), Δp +1/4
  ASSERT_TRUE(acc.add(base, quant, 2, 1).ok());  // target 1: NLL ln 2 vs ln 4,   Δp -1/4
  const auto s = acc.summarize();
  EXPECT_EQ(s.tokens, 2);
  expect_rel(s.kl.mean, kl, kHandRelTol, "KL mean");
  EXPECT_LT(s.kl.stderr_, kZeroKlTol) << "both positions have the same KL";
  expect_rel(s.kl_median, kl, kHandRelTol, "KL median");
  expect_rel(s.kl_max, kl, kHandRelTol, "KL max");
  // Argmax of (0, 0) is token 0 (first max wins) and of (ln 3, 0) is token 0: they agree.
  EXPECT_EQ(s.top1_agreement.mean, 1.0);

  // Base perplexity: both NLLs are ln 2, so ppl 2 with error 0.
  expect_rel(s.ppl_base, 2.0, kHandRelTol, "ppl_base");
  EXPECT_LT(s.ppl_base_err, kZeroKlTol);
  // Quant NLLs -ln q0, -ln q1: ppl = exp(mean), error = ppl * |nll_1 - nll_0| / 2 (n - 1 = 1).
  const double nq0 = -std::log(q0), nq1 = -std::log(q1);
  const double ppl_q = std::exp(0.5 * (nq0 + nq1));
  expect_rel(s.ppl_quant, ppl_q, kHandRelTol, "ppl_quant");
  expect_rel(s.ppl_quant_err, ppl_q * 0.5 * std::fabs(nq1 - nq0), kHandRelTol, "ppl_quant_err");
  ASSERT_NEAR(ppl_q, std::sqrt(16.0 / 3.0), 1e-6) << "hand value";
  // Ratio: paired log differences nq - ln 2; the base NLL is constant, so the error equals the
  // quant's relative error.
  expect_rel(s.ppl_ratio, ppl_q / 2.0, kHandRelTol, "ppl_ratio");
  expect_rel(s.ppl_ratio_err, (ppl_q / 2.0) * 0.5 * std::fabs(nq1 - nq0), kHandRelTol, "ppl_ratio_err");
  ASSERT_NEAR(s.ppl_ratio_err, std::sqrt(4.0 / 3.0) * 0.5 * kLn3, 1e-6) << "hand value";
  // Δp: +(q0 - 1/2) and -(q0 - 1/2): mean 0, stderr |d1 - d0| / 2 = q0 - 1/2, RMS the same.
  EXPECT_NEAR(s.delta_p.mean, 0.0, kZeroKlTol);
  expect_rel(s.delta_p.stderr_, q0 - 0.5, kHandRelTol, "delta_p stderr");
  expect_rel(s.delta_p_rms, q0 - 0.5, kHandRelTol, "delta_p rms");
  ASSERT_NEAR(s.delta_p_rms, 0.25, 1e-7) << "hand value";
}

TEST(EvalMetrics, SwappedLogitsByHand) {
  // Base (1, 0), quant (0, 1): p_b = (s, 1 - s), p_q = (1 - s, s) with s = e / (1 + e), and
  // KL = s ln(s / (1 - s)) + (1 - s) ln((1 - s) / s) = (2s - 1) ln(s / (1 - s)) = 2s - 1 = tanh(1/2).
  const float base[2] = {1.0f, 0.0f};
  const float quant[2] = {0.0f, 1.0f};
  const auto s = one_position(base, quant, 2, 0);
  expect_rel(s.kl.mean, std::tanh(0.5), kHandRelTol, "KL");
  EXPECT_EQ(s.top1_agreement.mean, 0.0) << "argmax 0 vs 1";
  const double sig = std::exp(1.0) / (1.0 + std::exp(1.0));
  expect_rel(s.delta_p.mean, (1.0 - sig) - sig, kHandRelTol, "delta_p");
  expect_rel(s.ppl_ratio, sig / (1.0 - sig), kHandRelTol, "ppl ratio = p_b / p_q = e");
  EXPECT_EQ(s.kl.stderr_, 0.0) << "n < 2";
  EXPECT_EQ(s.top1_agreement.stderr_, 0.0) << "n < 2";
}

TEST(EvalMetrics, Top1FirstMaxWinsAndBinomialStderr) {
  const float base[3] = {2.0f, 2.0f, 1.0f};          // argmax 0 (tie with 1)
  const float quant_tie_all[3] = {2.0f, 2.0f, 2.0f};  // argmax 0: agrees
  const float quant_later[3] = {1.0f, 2.0f, 2.0f};    // argmax 1: disagrees
  const float quant_first[3] = {3.0f, 2.0f, 2.0f};    // argmax 0: agrees
  EvalAccumulator acc;
  ASSERT_TRUE(acc.add(base, quant_tie_all, 3, 0).ok());
  ASSERT_TRUE(acc.add(base, quant_later, 3, 0).ok());
  ASSERT_TRUE(acc.add(base, quant_first, 3, 2).ok());
  ASSERT_TRUE(acc.add(base, base, 3, 1).ok());
  const auto s = acc.summarize();
  // 3 of 4 agree: p = 3/4, binomial stderr sqrt(p (1 - p) / (n - 1)) = sqrt(3/16 / 3) = 1/4.
  EXPECT_EQ(s.top1_agreement.mean, 0.75);
  expect_rel(s.top1_agreement.stderr_, 0.25, kHandRelTol, "top1 stderr");
}

// ---- Random logits with outliers ----

TEST(EvalMetrics, KlNonNegativeAndMatchesReferenceOnRandomLogits) {
  constexpr int64_t kVocab = 512, kPositions = 1000;
  const auto base = outlier_matrix(kPositions, kVocab, kSeed);
  const auto other = outlier_matrix(kPositions, kVocab, kSeed + 1);
  std::mt19937_64 rng(kSeed + 2);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> quant(base.size());
  // Three regimes: per-row INT8 absmax round trip of the logits (a realistic quantization), an
  // unrelated distribution (large KL) and one-ulp nudges of a few logits (KL near 0, where rounding
  // could turn the sign).
  for (int64_t t = 0; t < kPositions; ++t) {
    const float* b = base.data() + t * kVocab;
    float* q = quant.data() + t * kVocab;
    if (t % 3 == 0) {
      float amax = 0;
      for (int64_t i = 0; i < kVocab; ++i) amax = std::max(amax, std::fabs(b[i]));
      const float step = amax / 127.0f;
      for (int64_t i = 0; i < kVocab; ++i) q[i] = std::nearbyint(b[i] / step) * step;
    } else if (t % 3 == 1) {
      std::copy(other.begin() + t * kVocab, other.begin() + (t + 1) * kVocab, q);
    } else {
      for (int64_t i = 0; i < kVocab; ++i)
        q[i] = uniform(rng) < 0.05f ? std::nextafter(b[i], uniform(rng) < 0.5f ? -1e30f : 1e30f) : b[i];
    }
  }
  EvalAccumulator acc;
  std::vector<double> kls;
  for (int64_t t = 0; t < kPositions; ++t) {
    const float* b = base.data() + t * kVocab;
    const float* q = quant.data() + t * kVocab;
    const auto target = static_cast<int32_t>(rng() % kVocab);
    ASSERT_TRUE(acc.add(b, q, kVocab, target).ok());
    const double kl = one_position(b, q, kVocab, target).kl.mean;
    const double want = reference_kl(b, q, kVocab);
    ASSERT_GE(kl, kMinKl) << repro(kSeed, kPositions, kVocab, "outlier logits") << " t=" << t;
    ASSERT_NEAR(kl, want, kKlRefAbsTol + kKlRefRelTol * want)
        << repro(kSeed, kPositions, kVocab, "outlier logits") << " t=" << t;
    kls.push_back(kl);
  }
  const auto s = acc.summarize();
  EXPECT_EQ(s.tokens, kPositions);
  const double mean = std::accumulate(kls.begin(), kls.end(), 0.0) / static_cast<double>(kPositions);
  expect_rel(s.kl.mean, mean, kHandRelTol, "mean of the per-position KLs");
  EXPECT_EQ(s.kl_max, *std::max_element(kls.begin(), kls.end()));
  EXPECT_GT(s.kl.mean, 0.1) << "the unrelated third dominates";
  EXPECT_GT(s.top1_agreement.mean, 0.5);
  EXPECT_LT(s.top1_agreement.mean, 1.0);
}

TEST(EvalMetrics, ShiftInvariance) {
  // Logits on a 1/256 grid below 2^10 in magnitude, shifted by constants below 2^11: every shifted
  // value is exact in float, so the max-shifted logits, and every statistic, must be identical.
  constexpr int64_t kVocab = 99, kPositions = 19;
  std::mt19937_64 rng(kSeed);
  std::uniform_int_distribution<int> grid(-256 * 64, 256 * 64);
  std::vector<float> base(kPositions * kVocab), quant(base.size());
  for (auto& v : base) v = static_cast<float>(grid(rng)) / 256.0f;
  for (auto& v : quant) v = static_cast<float>(grid(rng)) / 256.0f;
  for (int64_t i = 0; i < kVocab; i += 7) base[static_cast<size_t>(i)] = 900.0f;  // an outlier logit
  std::vector<int32_t> targets(kPositions);
  for (auto& t : targets) t = static_cast<int32_t>(rng() % kVocab);

  auto summarize_shifted = [&](float shift_base, float shift_quant) {
    std::vector<float> b = base, q = quant;
    for (auto& v : b) v += shift_base;
    for (auto& v : q) v += shift_quant;
    EvalAccumulator acc;
    for (int64_t t = 0; t < kPositions; ++t)
      EXPECT_TRUE(acc.add(b.data() + t * kVocab, q.data() + t * kVocab, kVocab, targets[t]).ok());
    return acc.summarize();
  };
  const auto ref = summarize_shifted(0.0f, 0.0f);
  EXPECT_GT(ref.kl.mean, 0.1);
  for (auto shifts : {std::pair<float, float>{1024.0f, 1024.0f}, {-37.25f, 500.5f}, {-1000.0f, 3.0f}}) {
    const auto s = summarize_shifted(shifts.first, shifts.second);
    const std::string what = "shift " + std::to_string(shifts.first) + ", " + std::to_string(shifts.second);
    EXPECT_EQ(s.kl.mean, ref.kl.mean) << what;
    EXPECT_EQ(s.kl.stderr_, ref.kl.stderr_) << what;
    EXPECT_EQ(s.kl_p99, ref.kl_p99) << what;
    EXPECT_EQ(s.top1_agreement.mean, ref.top1_agreement.mean) << what;
    EXPECT_EQ(s.ppl_base, ref.ppl_base) << what;
    EXPECT_EQ(s.ppl_quant_err, ref.ppl_quant_err) << what;
    EXPECT_EQ(s.ppl_ratio, ref.ppl_ratio) << what;
    EXPECT_EQ(s.delta_p.mean, ref.delta_p.mean) << what;
    EXPECT_EQ(s.delta_p_rms, ref.delta_p_rms) << what;
  }
}

TEST(EvalMetrics, UniformLogitsPerplexityEqualsVocab) {
  for (int64_t vocab : {int64_t{1}, int64_t{2}, int64_t{1000}, int64_t{32000}}) {
    const std::vector<float> logits(static_cast<size_t>(vocab), 3.25f);
    EvalAccumulator acc;
    for (int32_t t = 0; t < 50; ++t)
      ASSERT_TRUE(acc.add(logits.data(), logits.data(), vocab, static_cast<int32_t>(t % vocab)).ok());
    const auto s = acc.summarize();
    expect_rel(s.ppl_base, static_cast<double>(vocab), kHandRelTol, "vocab " + std::to_string(vocab));
    expect_rel(s.ppl_quant, static_cast<double>(vocab), kHandRelTol, "vocab " + std::to_string(vocab));
    EXPECT_EQ(s.ppl_base_err, 0.0) << "every NLL is ln vocab: a constant sample has no spread";
    EXPECT_EQ(s.ppl_ratio, 1.0);
  }
}

// ---- Percentiles and standard errors ----

TEST(EvalMetrics, MedianP99MaxLinearInterpolation) {
  // KL of base (0, 0) vs quant (a, 0) increases with |a|: a_k = k / 16 gives an ascending set,
  // added in shuffled order.
  const float base[2] = {0.0f, 0.0f};
  auto add_a = [&](EvalAccumulator* acc, int k) {
    const float quant[2] = {static_cast<float>(k) / 16.0f, 0.0f};
    ASSERT_TRUE(acc->add(base, quant, 2, 0).ok());
  };
  auto kl_k = [](int k) { return two_token_kl(static_cast<double>(k) / 16.0); };

  // 101 values: rank q (n - 1) is an integer for q = 0.5 and 0.99.
  std::vector<int> ks(101);
  std::iota(ks.begin(), ks.end(), 0);
  std::shuffle(ks.begin(), ks.end(), std::mt19937_64(kSeed));
  EvalAccumulator odd;
  for (int k : ks) add_a(&odd, k);
  const auto so = odd.summarize();
  expect_rel(so.kl_median, kl_k(50), kHandRelTol, "median of 101");
  expect_rel(so.kl_p99, kl_k(99), kHandRelTol, "p99 of 101");
  expect_rel(so.kl_max, kl_k(100), kHandRelTol, "max of 101");

  // 4 values: median is the mean of the middle two, p99 sits at rank 2.97 between the top two
  // (nearest rank would give the maximum).
  EvalAccumulator four;
  for (int k : {12, 4, 16, 8}) add_a(&four, k);
  const auto sf = four.summarize();
  expect_rel(sf.kl_median, 0.5 * (kl_k(8) + kl_k(12)), kHandRelTol, "median of 4");
  expect_rel(sf.kl_p99, kl_k(12) + 0.97 * (kl_k(16) - kl_k(12)), kHandRelTol, "p99 of 4");
  EXPECT_LT(sf.kl_p99, sf.kl_max);
  expect_rel(sf.kl_max, kl_k(16), kHandRelTol, "max of 4");
}

TEST(EvalMetrics, StandardErrorsUseSampleDeviation) {
  // The same n positions repeated 4 times: means are unchanged and, with the n - 1 denominator,
  // each standard error shrinks by exactly sqrt((4n - 1) / (n - 1)) (an n denominator would give 2).
  constexpr int64_t kVocab = 64, kPositions = 10;
  const auto base = testing::normal_vector(kPositions * kVocab, kSeed, 2.0f);
  const auto noise = testing::normal_vector(kPositions * kVocab, kSeed + 1, 0.7f);
  std::vector<float> quant(base.size());
  for (size_t i = 0; i < base.size(); ++i) quant[i] = base[i] + noise[i];
  EvalAccumulator once, four;
  for (int rep = 0; rep < 4; ++rep)
    for (int64_t t = 0; t < kPositions; ++t) {
      const auto target = static_cast<int32_t>((t * 37) % kVocab);
      const float* b = base.data() + t * kVocab;
      const float* q = quant.data() + t * kVocab;
      if (rep == 0) {
        ASSERT_TRUE(once.add(b, q, kVocab, target).ok());
      }
      ASSERT_TRUE(four.add(b, q, kVocab, target).ok());
    }
  const auto s1 = once.summarize(), s4 = four.summarize();
  const double n = kPositions;
  const double shrink = std::sqrt((4.0 * n - 1.0) / (n - 1.0));
  ASSERT_GT(s1.kl.stderr_, 0.0);
  ASSERT_GT(s1.top1_agreement.stderr_, 0.0) << "need a mix of agreeing and disagreeing positions";
  expect_rel(s4.kl.mean, s1.kl.mean, kHandRelTol, "KL mean");
  expect_rel(s1.kl.stderr_ / s4.kl.stderr_, shrink, kHandRelTol, "KL stderr");
  expect_rel(s1.top1_agreement.stderr_ / s4.top1_agreement.stderr_, shrink, kHandRelTol, "top1 stderr");
  expect_rel(s1.delta_p.stderr_ / s4.delta_p.stderr_, shrink, kHandRelTol, "delta_p stderr");
  expect_rel(s4.ppl_base, s1.ppl_base, kHandRelTol, "ppl_base");
  expect_rel((s1.ppl_base_err / s1.ppl_base) / (s4.ppl_base_err / s4.ppl_base), shrink, kHandRelTol, "ppl_base_err");
  expect_rel((s1.ppl_ratio_err / s1.ppl_ratio) / (s4.ppl_ratio_err / s4.ppl_ratio), shrink, kHandRelTol,
             "ppl_ratio_err");
  expect_rel(s4.delta_p_rms, s1.delta_p_rms, kHandRelTol, "delta_p rms");
}

TEST(EvalMetrics, StandardErrorsShrinkAsOneOverSqrtN) {
  // Independent positions from one distribution, the true token drawn from the base model (as in
  // real text, where the model is roughly calibrated). The standard error of all 1600 positions
  // must be 1/4 of that of 100: the 100-position error is averaged over the 16 disjoint blocks,
  // which makes the comparison stable to about 1%.
  constexpr int64_t kVocab = 64, kBlock = 100, kBlocks = 16, kLarge = kBlock * kBlocks;
  const auto base = testing::normal_vector(kLarge * kVocab, kSeed, 2.0f);
  const auto noise = testing::normal_vector(kLarge * kVocab, kSeed + 1, 0.7f);
  std::mt19937_64 rng(kSeed + 2);
  std::vector<EvalAccumulator> blocks(kBlocks);
  EvalAccumulator large;
  std::vector<float> quant(static_cast<size_t>(kVocab));
  std::vector<double> cdf(static_cast<size_t>(kVocab));
  for (int64_t t = 0; t < kLarge; ++t) {
    const float* b = base.data() + t * kVocab;
    double z = 0;
    for (int64_t i = 0; i < kVocab; ++i) {
      quant[i] = b[i] + noise[t * kVocab + i];
      z += std::exp(static_cast<double>(b[i]));
      cdf[i] = z;
    }
    // Inverse-CDF sampling with a 53-bit uniform: the same targets on every standard library.
    const double u = static_cast<double>(rng() >> 11) * 0x1p-53 * z;
    const auto target = static_cast<int32_t>(std::min<int64_t>(
        std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin(), kVocab - 1));
    ASSERT_TRUE(blocks[t / kBlock].add(b, quant.data(), kVocab, target).ok());
    ASSERT_TRUE(large.add(b, quant.data(), kVocab, target).ok());
  }
  const auto sl = large.summarize();
  EXPECT_GT(sl.top1_agreement.mean, 0.3) << "need a mix of agreeing and disagreeing positions";
  EXPECT_LT(sl.top1_agreement.mean, 0.9) << "need a mix of agreeing and disagreeing positions";
  const double want = std::sqrt(static_cast<double>(kBlocks));
  auto check = [&](double (*err)(const EvalAccumulator::Summary&), const char* what) {
    double block_mean = 0;
    for (const auto& blk : blocks) block_mean += err(blk.summarize()) / static_cast<double>(kBlocks);
    ASSERT_GT(err(sl), 0.0) << what;
    EXPECT_NEAR(block_mean / err(sl), want, kSqrtNRatioTol * want) << what << " (REPRO seed=" << kSeed << ")";
  };
  using Summary = EvalAccumulator::Summary;
  check([](const Summary& s) { return s.kl.stderr_; }, "KL");
  check([](const Summary& s) { return s.top1_agreement.stderr_; }, "top1");
  check([](const Summary& s) { return s.delta_p.stderr_; }, "delta_p");
  check([](const Summary& s) { return s.ppl_base_err / s.ppl_base; }, "ppl_base");
  check([](const Summary& s) { return s.ppl_quant_err / s.ppl_quant; }, "ppl_quant");
  check([](const Summary& s) { return s.ppl_ratio_err / s.ppl_ratio; }, "ppl_ratio");
  // Pairing removes the shared variance: the ratio is far better determined than either perplexity.
  EXPECT_LT(sl.ppl_ratio_err / sl.ppl_ratio, 0.5 * sl.ppl_base_err / sl.ppl_base);
}

// ---- Empty input and error paths ----

TEST(EvalMetrics, ZeroTokensSummarizeToZeros) {
  const EvalAccumulator acc;
  const auto s = acc.summarize();
  EXPECT_EQ(s.tokens, 0);
  EXPECT_EQ(s.kl.mean, 0.0);
  EXPECT_EQ(s.kl.stderr_, 0.0);
  EXPECT_EQ(s.kl_median, 0.0);
  EXPECT_EQ(s.kl_p99, 0.0);
  EXPECT_EQ(s.kl_max, 0.0);
  EXPECT_EQ(s.top1_agreement.mean, 0.0);
  EXPECT_EQ(s.ppl_base, 0.0);
  EXPECT_EQ(s.ppl_quant, 0.0);
  EXPECT_EQ(s.ppl_ratio, 0.0);
  EXPECT_EQ(s.ppl_ratio_err, 0.0);
  EXPECT_EQ(s.delta_p.mean, 0.0);
  EXPECT_EQ(s.delta_p_rms, 0.0);
}

TEST(EvalMetrics, ErrorsNameTheArgumentAndAddNothing) {
  const float ok[4] = {0.5f, -1.0f, 2.0f, 0.25f};
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float with_nan[4] = {0.5f, nan, 2.0f, 0.25f};
  const float with_inf[4] = {0.5f, -1.0f, 2.0f, inf};
  const float with_neg_inf[4] = {-inf, -1.0f, 2.0f, 0.25f};
  EvalAccumulator acc;
  ASSERT_TRUE(acc.add(ok, ok, 4, 1).ok());
  struct Case {
    const float* base;
    const float* quant;
    int64_t vocab;
    int32_t target;
    const char* name;
  };
  const Case cases[] = {
      {ok, ok, 0, 0, "vocab"},
      {ok, ok, -4, 0, "vocab"},
      {ok, ok, 4, -1, "target"},
      {ok, ok, 4, 4, "target"},
      {nullptr, ok, 4, 0, "base_logits"},
      {ok, nullptr, 4, 0, "quant_logits"},
      {with_nan, ok, 4, 0, "base_logits[1]"},
      {ok, with_inf, 4, 0, "quant_logits[3]"},
      {with_neg_inf, ok, 4, 0, "base_logits[0]"},
      {ok, with_nan, 4, 0, "quant_logits[1]"},
  };
  for (const Case& c : cases) {
    const Status st = acc.add(c.base, c.quant, c.vocab, c.target);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_EQ(st.message().rfind(c.name, 0), 0u) << "message should start with '" << c.name << "': " << st.message();
  }
  EXPECT_EQ(acc.count(), 1) << "a rejected position must not be accumulated";
  EXPECT_EQ(acc.summarize().tokens, 1);
}

}  // namespace
}  // namespace llmq
