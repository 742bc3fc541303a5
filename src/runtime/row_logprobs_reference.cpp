// The host reference of a row's log-probabilities (row_logprobs.hpp's definition): double sums, a
// partial sort for the order. Obvious rather than fast: it is the specification the device kernel
// is tested against, and the CPU engine computes its requests' logprobs with it. Built with or
// without CUDA.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "runtime/row_logprobs.hpp"

namespace llmq::runtime {

RowLogprobsReference row_logprobs_reference(const float* logits, int64_t vocab, int32_t token, int32_t k) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  RowLogprobsReference out;
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < vocab; ++i)
    if (!std::isnan(logits[i])) m = std::max(m, static_cast<double>(logits[i]));
  if (std::isfinite(m)) {
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i)
      if (!std::isnan(logits[i])) sum += std::exp(static_cast<double>(logits[i]) - m);
    out.lse = m + std::log(sum);  // sum >= 1: the maximum itself adds exp(0)
  } else {
    out.lse = nan;
  }
  const auto logprob = [&](int64_t i) { return static_cast<double>(logits[i]) - out.lse; };  // NaN stays NaN
  out.token = token >= 0 && token < vocab ? logprob(token) : nan;

  // The order: larger logit first, equal logits (-0 == +0) by lower id, NaN last.
  const int64_t n = std::min<int64_t>(std::max<int32_t>(k, 0), vocab);
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
    const float x = logits[a], y = logits[b];
    if (std::isnan(x) || std::isnan(y)) return !std::isnan(x) || (std::isnan(y) && a < b);
    return x != y ? x > y : a < b;
  });
  out.top_ids.assign(ids.begin(), ids.begin() + n);
  for (int32_t id : out.top_ids) out.top.push_back(logprob(id));
  return out;
}

}  // namespace llmq::runtime
