// Helpers of the per-row sampling tests (test_row_sampling_reference.cpp on the CPU,
// test_cuda_row_sampling.cpp on the GPU): a chi-square goodness-of-fit check of drawn tokens against
// the reference's renormalised distribution.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/row_sampling.hpp"

namespace llmq::testing {

// The chi-square statistic's bound that a correct sampler exceeds with probability about 1e-6
// (Wilson-Hilferty's approximation of the 1 - 1e-6 quantile, z = 4.753), for `df` degrees of
// freedom. The draws are seeded, so a pass or a failure repeats; this says how unlikely a false
// failure was when the seeds were chosen.
inline double chi_square_bound(int64_t df) {
  const double z = 4.753, d = static_cast<double>(df);
  const double c = 1.0 - 2.0 / (9.0 * d) + z * std::sqrt(2.0 / (9.0 * d));
  return d * c * c * c;
}

// Checks drawn `tokens` against trace.kept / trace.probability: no token outside the kept set, and
// Pearson's chi-square over the kept tokens (those expected fewer than 5 times pooled into one cell)
// under chi_square_bound. `what` names the case in failure messages.
inline ::testing::AssertionResult matches_distribution(const std::vector<int32_t>& tokens,
                                                      const runtime::RowSamplingTrace& trace, const std::string& what) {
  std::map<int32_t, int64_t> seen;
  for (int32_t t : tokens) ++seen[t];
  std::map<int32_t, double> expected;
  const double n = static_cast<double>(tokens.size());
  for (size_t i = 0; i < trace.kept.size(); ++i) expected[trace.kept[i]] = trace.probability[i] * n;
  for (const auto& [token, count] : seen)
    if (expected.count(token) == 0)
      return ::testing::AssertionFailure() << what << ": token " << token << " drawn " << count
                                           << " times, outside the kept set of " << trace.kept.size();
  double chi2 = 0.0, pooled_expected = 0.0;
  int64_t cells = 0, pooled_seen = 0;
  for (const auto& [token, e] : expected) {
    const double o = static_cast<double>(seen.count(token) ? seen[token] : 0);
    if (e < 5.0) {
      pooled_expected += e;
      pooled_seen += static_cast<int64_t>(o);
      continue;
    }
    chi2 += (o - e) * (o - e) / e;
    ++cells;
  }
  if (pooled_expected >= 5.0) {
    const double o = static_cast<double>(pooled_seen);
    chi2 += (o - pooled_expected) * (o - pooled_expected) / pooled_expected;
    ++cells;
  }
  if (cells < 2) return ::testing::AssertionFailure() << what << ": fewer than 2 cells to test";
  const double bound = chi_square_bound(cells - 1);
  if (chi2 <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": chi-square " << chi2 << " over " << cells - 1
                                       << " degrees of freedom, bound " << bound << " (p ~ 1e-6)";
}

}  // namespace llmq::testing
