// Helpers shared by the scale tests (test_scale.cpp: absmax, rounding, granularities, Inf / NaN,
// zero points; test_scale_mse_search.cpp; test_smoothquant_factors.cpp): the seed, the float32
// scale tolerance, and small views.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "llmq/format.hpp"
#include "llmq/quantize_tensor.hpp"
#include "llmq/scale.hpp"
#include "support.hpp"

namespace llmq {
namespace scale_test {

using llmq::testing::outlier_matrix;
using llmq::testing::repro;

// A float32 scale differs from the exact quotient by its own rounding: 2^-21 (8 float ulps) is far
// below any real scale difference.
constexpr double kScaleRelTol = 0x1p-21;

constexpr uint64_t kSeed = 20240611;

struct Shape { int64_t rows, cols; };

inline MatrixView as_mat(const std::vector<float>& x, int64_t rows, int64_t cols) {
  MatrixView m;
  const Status st = as_matrix(matrix_view(x.data(), rows, cols), "x", &m);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return m;
}

inline double rq(DType d) { return format_info(d).max_finite; }

inline bool rel_close(double got, double want, double tol) {
  return std::fabs(got - want) <= tol * std::fabs(want);
}

}  // namespace scale_test
}  // namespace llmq
