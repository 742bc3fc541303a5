// The MSE scale search (ScaleMethod::kMseSearch): its candidate sets, and its choice against a
// brute force over the same candidates with an independent quantizer; per-channel against
// per-tensor, INT4 clipping, all-zero blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
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

// Two sums of the same squared errors in the same order; only guards against reassociation.
constexpr double kErrorRelTol = 1e-12;

// ---- An independent quantizer for the brute force: the nearest value of the format's grid
// ---- (found by search over all decoded codes), saturating. Ties do not matter for the squared
// ---- error, so the tie rule need not be re-implemented.
class GridQuantizer {
 public:
  explicit GridQuantizer(DType format) : format_(format) {
    if (is_fp8(format)) {
      for (uint32_t code = 0; code < 128; ++code) {
        const float v = fp8_to_float(static_cast<uint8_t>(code), format);
        if (std::isfinite(v)) grid_.push_back(static_cast<double>(v));
      }
      std::sort(grid_.begin(), grid_.end());
      grid_.erase(std::unique(grid_.begin(), grid_.end()), grid_.end());
    }
  }
  double quantize(float v) const {
    const FormatInfo& f = format_info(format_);
    if (f.is_integer)
      return std::clamp(std::nearbyint(static_cast<double>(v)), static_cast<double>(f.qmin),
                        static_cast<double>(f.qmax));
    const double a = std::fabs(static_cast<double>(v));
    auto it = std::lower_bound(grid_.begin(), grid_.end(), a);
    double q;
    if (it == grid_.end()) q = grid_.back();  // saturate
    else if (it == grid_.begin()) q = *it;
    else q = (a - *(it - 1) <= *it - a) ? *(it - 1) : *it;
    return v < 0 ? -q : q;
  }
  // || x - s Q(x (1/s)) ||^2 over a block, NaN ignored.
  double block_error(const std::vector<float>& x, int64_t cols, int64_t r0, int64_t nr, int64_t c0,
                     int64_t nc, float s) const {
    const float inverse = 1.0f / s;
    double e = 0;
    for (int64_t r = r0; r < r0 + nr; ++r)
      for (int64_t c = c0; c < c0 + nc; ++c) {
        const float xv = x[static_cast<size_t>(r * cols + c)];
        if (std::isnan(xv)) continue;
        const double d = static_cast<double>(xv) - static_cast<double>(s) * quantize(xv * inverse);
        e += d * d;
      }
    return e;
  }

 private:
  DType format_;
  std::vector<double> grid_;
};

// ---- MSE search

TEST(MseSearch, CandidateSets) {
  QuantSpec spec = QuantSpec::per_tensor(DType::kE4M3);
  spec.method = ScaleMethod::kMseSearch;
  const float s = 0.3f;
  std::vector<float> grid = candidate_scales(s, spec);
  ASSERT_EQ(grid.size(), static_cast<size_t>(spec.grid_points));
  EXPECT_EQ(grid.front(), s) << "the absmax scale itself is the first candidate";
  EXPECT_TRUE(rel_close(grid.back(), spec.grid_min * s, kScaleRelTol)) << grid.back();
  for (size_t i = 1; i < grid.size(); ++i) EXPECT_LT(grid[i], grid[i - 1]);
  spec.explicit_candidates = {0.123f, 5.0f};
  grid = candidate_scales(s, spec);
  EXPECT_EQ(grid.front(), 5.0f);
  EXPECT_NE(std::find(grid.begin(), grid.end(), 0.123f), grid.end());

  spec.candidates = CandidateSet::kPowerOfTwo;
  std::vector<float> p2 = candidate_scales(s, spec);  // 0.3 -> 2^-1 .. 2^-9
  ASSERT_EQ(p2.size(), static_cast<size_t>(spec.pow2_search_below + 1));
  for (size_t i = 0; i < p2.size(); ++i) EXPECT_EQ(p2[i], std::ldexp(1.0f, -1 - static_cast<int>(i)));
  EXPECT_EQ(candidate_scales(0.25f, spec).front(), 0.25f) << "a power of two is its own ceiling";
  spec.pow2_min_exp = -4;
  EXPECT_EQ(candidate_scales(s, spec).size(), 4u) << "clamped to 2^-1 .. 2^-4";

  spec.candidates = CandidateSet::kHardwareSet;
  spec.hardware_scales = {1.0f, 16.0f, 0.0625f, 1.0f};
  EXPECT_EQ(candidate_scales(s, spec), (std::vector<float>{16.0f, 1.0f, 0.0625f}));
}

// The chosen scale's error is the minimum over the candidates (brute force, independent
// quantizer) and, for the grid, no worse than the absmax scale.
TEST(MseSearch, ChoosesTheMinimumErrorCandidate) {
  const Shape shapes[] = {{64, 256}, {19, 98}};
  for (const Shape& sh : shapes) {
    const std::vector<float> x = outlier_matrix(sh.rows, sh.cols, kSeed + 11);
    const MatrixView m = as_mat(x, sh.rows, sh.cols);
    for (DType d : {DType::kE4M3, DType::kE5M2, DType::kI8, DType::kI4}) {
      const GridQuantizer oracle(d);
      for (CandidateSet set : {CandidateSet::kGrid, CandidateSet::kPowerOfTwo, CandidateSet::kHardwareSet}) {
        QuantSpec spec = QuantSpec::per_token(d);
        spec.method = ScaleMethod::kMseSearch;
        spec.candidates = set;
        spec.grid_points = 40;
        spec.hardware_scales = {std::ldexp(1.0f, -8), std::ldexp(1.0f, -4), 1.0f, 16.0f};
        const std::string what = repro(kSeed + 11, sh.rows, sh.cols, describe(spec));
        ScaleSet s;
        ASSERT_TRUE(compute_scale(matrix_view(x.data(), sh.rows, sh.cols), spec, &s).ok()) << what;
        int better_than_absmax = 0;
        for (int64_t r = 0; r < sh.rows; ++r) {
          const float chosen = s.scales.data_as<float>()[r];
          const float s_absmax = absmax_scale(block_absmax(m, r, 1, 0, sh.cols), spec);
          const std::vector<float> cands = candidate_scales(s_absmax, spec);
          ASSERT_NE(std::find(cands.begin(), cands.end(), chosen), cands.end()) << what << " row " << r;
          const double e_chosen = oracle.block_error(x, sh.cols, r, 1, 0, sh.cols, chosen);
          EXPECT_TRUE(rel_close(block_quant_error(m, r, 1, 0, sh.cols, chosen, spec), e_chosen, kErrorRelTol))
              << what << " row " << r << ": library and oracle errors differ";
          for (float c : cands)
            ASSERT_LE(e_chosen, oracle.block_error(x, sh.cols, r, 1, 0, sh.cols, c) * (1 + kErrorRelTol))
                << what << " row " << r << " candidate " << c << " beats chosen " << chosen;
          const double e_absmax = oracle.block_error(x, sh.cols, r, 1, 0, sh.cols, s_absmax);
          if (set == CandidateSet::kGrid) {
            EXPECT_LE(e_chosen, e_absmax * (1 + kErrorRelTol)) << what << " row " << r;
          }
          better_than_absmax += e_chosen < e_absmax ? 1 : 0;
        }
        // With 16 levels, clipping the largest values pays off on many rows: a search that
        // always kept the absmax scale would pass every check above but fail this one.
        if (d == DType::kI4 && set == CandidateSet::kGrid) {
          EXPECT_GT(better_than_absmax, 0) << what;
        }
      }
    }
  }
}

// Gaussian rows quantized to int4: the MSE-optimal clip lies below the absmax (about 2.5 sigma
// against an absmax near 3 sigma for 1024 samples), so the search must beat absmax on every row.
TEST(MseSearch, Int4GaussianRowsClipBelowAbsmax) {
  const int64_t rows = 32, cols = 1024;
  const std::vector<float> x = llmq::testing::normal_vector(rows * cols, kSeed + 12);
  const MatrixView m = as_mat(x, rows, cols);
  const GridQuantizer oracle(DType::kI4);
  QuantSpec spec = QuantSpec::per_token(DType::kI4);
  spec.method = ScaleMethod::kMseSearch;
  ScaleSet s;
  ASSERT_TRUE(compute_scale(matrix_view(x.data(), rows, cols), spec, &s).ok());
  for (int64_t r = 0; r < rows; ++r) {
    const float s_absmax = absmax_scale(block_absmax(m, r, 1, 0, cols), spec);
    const float chosen = s.scales.data_as<float>()[r];
    EXPECT_LT(chosen, s_absmax) << repro(kSeed + 12, rows, cols, describe(spec)) << " row " << r;
    EXPECT_LT(oracle.block_error(x, cols, r, 1, 0, cols, chosen),
              oracle.block_error(x, cols, r, 1, 0, cols, s_absmax))
        << repro(kSeed + 12, rows, cols, describe(spec)) << " row " << r;
  }
}

TEST(MseSearch, PerChannelBeatsPerTensor) {
  const int64_t n = 64, k = 256;
  const std::vector<float> w = outlier_matrix(n, k, kSeed + 13);
  for (DType d : {DType::kE4M3, DType::kI8, DType::kI4}) {
    const GridQuantizer oracle(d);
    QuantSpec per_tensor = QuantSpec::per_tensor(d);
    per_tensor.method = ScaleMethod::kMseSearch;
    QuantSpec per_channel = per_tensor;
    per_channel.granularity = Granularity::kPerChannel;
    ScaleSet st, sc;
    ASSERT_TRUE(compute_scale(matrix_view(w.data(), n, k), per_tensor, &st).ok());
    ASSERT_TRUE(compute_scale(matrix_view(w.data(), n, k), per_channel, &sc).ok());
    const double e_tensor = oracle.block_error(w, k, 0, n, 0, k, st.scales.data_as<float>()[0]);
    double e_channel = 0;
    for (int64_t r = 0; r < n; ++r) e_channel += oracle.block_error(w, k, r, 1, 0, k, sc.scales.data_as<float>()[r]);
    EXPECT_LT(e_channel, e_tensor) << repro(kSeed + 13, n, k, describe(per_channel));
  }
}

TEST(MseSearch, AllZeroBlockGetsTheFloor) {
  std::vector<float> x = outlier_matrix(3, 16, kSeed);
  std::fill(x.begin() + 16, x.begin() + 32, 0.0f);
  QuantSpec spec = QuantSpec::per_token(DType::kE4M3);
  spec.method = ScaleMethod::kMseSearch;
  ScaleSet s;
  ASSERT_TRUE(compute_scale(matrix_view(x.data(), 3, 16), spec, &s).ok());
  EXPECT_EQ(s.scales.data_as<float>()[1], effective_min_scale(spec));
}

}  // namespace
}  // namespace llmq
