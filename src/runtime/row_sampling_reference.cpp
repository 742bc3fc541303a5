// The host reference of per-row sampling (row_sampling.hpp's definition): double-precision
// weights, a full sort for the order, plain running sums. Obvious rather than fast: it is the
// specification the device kernel is tested against, and CPU code may call it. Built with or
// without CUDA.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "runtime/row_sampling.hpp"

namespace llmq::runtime {
namespace {

// The rank key of the order: larger logit, larger key; -0 and +0 one key; NaN 0, below -Inf.
uint32_t order_key(float v) {
  if (std::isnan(v)) return 0;
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  if ((b << 1) == 0) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The largest non-NaN logit, ties to the lowest id; -1 for a row of NaN only.
int64_t argmax_or_none(const float* logits, int64_t vocab) {
  int64_t best = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[best]) best = i;
  }
  return best;
}

}  // namespace

RowSamplingTrace trace_row_sampling(const float* logits, int64_t vocab, const RowSamplingParams& p) {
  const double inf = std::numeric_limits<double>::infinity();
  RowSamplingTrace t;
  t.u = static_cast<double>(sampling_uniform01(p.seed, p.draw));
  t.draw_margin = inf;
  t.nucleus_margin = inf;
  const int64_t top = argmax_or_none(logits, vocab);
  if (!(p.temperature > 0.0f) || p.top_k == 1 || top < 0) {  // greedy, or nothing to weigh
    t.greedy = true;
    t.token = top < 0 ? 0 : static_cast<int32_t>(top);
    t.kept = {t.token};
    t.probability = {1.0};
    return t;
  }
  const double m = logits[top];
  const double temperature = p.temperature;
  std::vector<double> w(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) {
    const float l = logits[i];
    if (std::isnan(l)) {
      w[i] = 0.0;
    } else if (static_cast<double>(l) == m) {
      w[i] = 1.0;  // the maximum itself, +Inf or -Inf included
    } else {
      const double z = (static_cast<double>(l) - m) / temperature;
      w[i] = std::isnan(z) ? 0.0 : std::exp(z);  // NaN: -Inf at an infinite temperature
    }
  }

  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const uint32_t ka = order_key(logits[a]), kb = order_key(logits[b]);
    return ka != kb ? ka > kb : a < b;
  });

  // Top-k: a prefix of the order. Top-p: the shortest prefix of that whose weight reaches top_p of it.
  int64_t n = vocab;
  if (p.top_k > 1 && p.top_k < vocab) n = p.top_k;
  if (p.top_p < 1.0f) {
    double kept_k = 0.0;
    for (int64_t j = 0; j < n; ++j) kept_k += w[order[j]];
    const double target = static_cast<double>(p.top_p) * kept_k;
    double s = 0.0;
    int64_t j = 0;
    for (; j < n - 1; ++j) {  // the loop's last step is the whole set, whose weight >= target
      s += w[order[j]];
      if (s >= target) break;
    }
    if (j == n - 1) s += w[order[j]];
    const double before = s - w[order[j]];
    t.nucleus_margin = std::min(std::fabs(s - target), std::fabs(before - target)) / kept_k;
    n = j + 1;
  }

  // The draw: inverse CDF over the kept tokens in id order.
  t.kept.assign(order.begin(), order.begin() + n);
  std::sort(t.kept.begin(), t.kept.end());
  double kept = 0.0;
  for (int32_t id : t.kept) kept += w[id];
  const double x = t.u * kept;
  double running = 0.0;
  bool chosen = false;
  t.probability.reserve(t.kept.size());
  for (int32_t id : t.kept) {
    running += w[id];
    t.probability.push_back(w[id] / kept);
    t.draw_margin = std::min(t.draw_margin, std::fabs(running - x) / kept);
    if (!chosen && running > x) {
      t.token = id;
      chosen = true;
    }
  }
  if (!chosen) t.token = static_cast<int32_t>(top);  // unreachable: u < 1 and the argmax weighs 1
  return t;
}

int32_t sample_row_reference(const float* logits, int64_t vocab, const RowSamplingParams& p) {
  return trace_row_sampling(logits, vocab, p).token;
}

}  // namespace llmq::runtime
