// EvalAccumulator: the per-position statistics of llama.cpp's `perplexity --kl-divergence` (KL of
// the base distribution to the quantized one, NLL of the true token under each, top-1 agreement,
// Δp) and their summary with standard errors.
//
// Conventions (the summary's documentation):
// - Standard error of a mean: sample standard deviation (n - 1 denominator) / sqrt(n); 0 for n < 2.
// - Top-1 agreement: the binomial standard error sqrt(p (1 - p) / (n - 1)), which is the same
//   formula applied to the 0/1 agreement indicators; 0 for n < 2.
// - Percentiles (median, p99) interpolate linearly between the order statistics at rank
//   h = q (n - 1) (numpy's default, as llama.cpp does), so the median of an even count is the mean
//   of the middle two.
// - Perplexity: exp(mean NLL), error ppl * stderr(NLL) (delta method). The ratio quant / base is
//   exp(mean(nll_quant - nll_base)) with error ratio * stderr of those paired differences: the
//   pairing removes the variance the two models share, and an unchanged model gives exactly 1 ± 0.
#include "llmq/eval_metrics.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace llmq {
namespace {

// Max and first argmax of a logit row, and the first non-finite index (or -1). One pass validates
// and prepares the shift, so a bad row is rejected before anything is accumulated.
struct RowScan {
  float max = 0;
  int64_t argmax = 0;
  int64_t bad = -1;
};

RowScan scan_row(const float* x, int64_t vocab) {
  RowScan s;
  s.max = x[0];
  for (int64_t i = 0; i < vocab; ++i) {
    if (!std::isfinite(x[i])) {
      s.bad = i;
      return s;
    }
    if (x[i] > s.max) {  // strict: the first of equal maxima wins
      s.max = x[i];
      s.argmax = i;
    }
  }
  return s;
}

Status non_finite(const char* name, const float* x, int64_t i) {
  return invalid_argument(std::string(name) + "[" + std::to_string(i) + "]: non-finite logit " +
                          std::to_string(x[i]));
}

// Mean and standard error of the mean. Deviations are taken from the first value before averaging
// (an exact reference that costs nothing): a constant sample then has exactly its value as mean and
// exactly 0 as error, and nearly equal values (KL of a good quantization, all about 1e-4) do not
// lose digits to cancellation. The variance is a second pass around the mean.
EvalAccumulator::Stat mean_stderr(const std::vector<double>& v) {
  EvalAccumulator::Stat s;
  const size_t n = v.size();
  if (n == 0) return s;
  const double ref = v[0];
  double sum = 0;
  for (double x : v) sum += x - ref;
  s.mean = ref + sum / static_cast<double>(n);
  if (n < 2) return s;
  double ss = 0;
  for (double x : v) ss += (x - s.mean) * (x - s.mean);
  s.stderr_ = std::sqrt(ss / static_cast<double>(n - 1) / static_cast<double>(n));
  return s;
}

// Linear interpolation between order statistics at rank q (n - 1); `sorted` is ascending, non-empty.
double percentile(const std::vector<double>& sorted, double q) {
  const double h = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(h));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = h - static_cast<double>(lo);
  return sorted[lo] + frac * (sorted[hi] - sorted[lo]);
}

}  // namespace

Status EvalAccumulator::add(const float* base_logits, const float* quant_logits, int64_t vocab, int32_t target) {
  if (base_logits == nullptr) return invalid_argument("base_logits: null pointer");
  if (quant_logits == nullptr) return invalid_argument("quant_logits: null pointer");
  if (vocab <= 0) return invalid_argument("vocab: must be positive, got " + std::to_string(vocab));
  if (target < 0 || target >= vocab)
    return invalid_argument("target: " + std::to_string(target) + " outside [0, " + std::to_string(vocab) + ")");
  const RowScan b = scan_row(base_logits, vocab);
  if (b.bad >= 0) return non_finite("base_logits", base_logits, b.bad);
  const RowScan q = scan_row(quant_logits, vocab);
  if (q.bad >= 0) return non_finite("quant_logits", quant_logits, q.bad);

  // Shifted logits s = x - max are <= 0, so exp never overflows and the largest term is 1. With
  // Z = sum exp(s) and lse = log Z, log p = s - lse, and
  //   KL = sum p_b (log p_b - log p_q) = E_b[s_b - s_q] - (lse_b - lse_q).
  // One pass accumulates Z_b, Z_q and sum exp(s_b) (s_b - s_q). Identical rows give exactly 0 (every
  // difference is 0), and an exact shift of all logits leaves every s, hence every result, unchanged.
  const double mb = b.max, mq = q.max;
  double z_b = 0, z_q = 0, weighted_diff = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const double sb = static_cast<double>(base_logits[i]) - mb;
    const double sq = static_cast<double>(quant_logits[i]) - mq;
    const double eb = std::exp(sb);
    z_b += eb;
    z_q += std::exp(sq);
    weighted_diff += eb * (sb - sq);
  }
  const double lse_b = std::log(z_b), lse_q = std::log(z_q);
  // Rounding can leave a tiny negative KL (order 1e-16 times the logit range); it is kept as
  // computed rather than clamped, so a bias in the formula would still show in the mean.
  const double kl = weighted_diff / z_b - (lse_b - lse_q);

  const double st_b = static_cast<double>(base_logits[target]) - mb;
  const double st_q = static_cast<double>(quant_logits[target]) - mq;
  const double nll_b = lse_b - st_b, nll_q = lse_q - st_q;

  kl_.push_back(kl);
  nll_base_.push_back(nll_b);
  nll_quant_.push_back(nll_q);
  delta_p_.push_back(std::exp(-nll_q) - std::exp(-nll_b));
  if (b.argmax == q.argmax) ++top1_same_;
  return {};
}

void EvalAccumulator::append(const EvalAccumulator& other) {
  kl_.insert(kl_.end(), other.kl_.begin(), other.kl_.end());
  nll_base_.insert(nll_base_.end(), other.nll_base_.begin(), other.nll_base_.end());
  nll_quant_.insert(nll_quant_.end(), other.nll_quant_.begin(), other.nll_quant_.end());
  delta_p_.insert(delta_p_.end(), other.delta_p_.begin(), other.delta_p_.end());
  top1_same_ += other.top1_same_;
}

EvalAccumulator::Summary EvalAccumulator::summarize() const {
  Summary s;
  const int64_t n = count();
  if (n == 0) return s;
  const double nd = static_cast<double>(n);
  s.tokens = n;

  s.kl = mean_stderr(kl_);
  std::vector<double> sorted = kl_;
  std::sort(sorted.begin(), sorted.end());
  s.kl_median = percentile(sorted, 0.5);
  s.kl_p99 = percentile(sorted, 0.99);
  s.kl_max = sorted.back();

  const double p = static_cast<double>(top1_same_) / nd;
  s.top1_agreement.mean = p;
  if (n >= 2) s.top1_agreement.stderr_ = std::sqrt(p * (1.0 - p) / (nd - 1.0));

  const Stat nb = mean_stderr(nll_base_), nq = mean_stderr(nll_quant_);
  s.ppl_base = std::exp(nb.mean);
  s.ppl_base_err = s.ppl_base * nb.stderr_;
  s.ppl_quant = std::exp(nq.mean);
  s.ppl_quant_err = s.ppl_quant * nq.stderr_;

  std::vector<double> log_ratio(nll_base_.size());
  for (size_t i = 0; i < log_ratio.size(); ++i) log_ratio[i] = nll_quant_[i] - nll_base_[i];
  const Stat lr = mean_stderr(log_ratio);
  s.ppl_ratio = std::exp(lr.mean);
  s.ppl_ratio_err = s.ppl_ratio * lr.stderr_;

  s.delta_p = mean_stderr(delta_p_);
  double sq = 0;
  for (double d : delta_p_) sq += d * d;
  s.delta_p_rms = std::sqrt(sq / nd);
  return s;
}

}  // namespace llmq
