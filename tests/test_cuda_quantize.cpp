// cuda_quantize against the CPU reference (llmq::quantize on the same host data), bit for bit:
// codes, scales and the clip count, for every granularity x format x input dtype x rounding mode
// on odd shapes with outliers, static scales, and special values (NaN, Inf, zeros, every rounding
// boundary). Every run poisons its outputs first (0xAA, then 0x55 on a second run that must agree
// too). Options and bad arguments are tested in test_cuda_quantize_options.cu, the kernels' element
// math on the host in test_cuda_quantize_numerics.cu. GPU tests SKIP visibly without an
// FP8-capable GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cuda_quantize_support.hpp"
#include "cuda_support.hpp"
#include "llmq/cuda_quantize.hpp"
#include "llmq/format.hpp"
#include "llmq/quantize_tensor.hpp"
#include "llmq/scale.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using namespace cuda_quantize_test;  // NOLINT: the suite's shared helpers

// ---- The main sweep: every granularity x format x input dtype x rounding mode, per shape.
// Odd shapes (scalar kernels) and aligned ones that reach each vectorised path: 7x272 (sub-warp
// teams, a 16-wide edge block), 5x2048 (a warp per row), 33x4112 (CTA team with 3 packs per
// thread), 2x40000 (the 1024-thread team for 2-byte inputs, two passes for f32), 300x4096.
const Shape kShapes[] = {{1, 1}, {1, 19}, {19, 99}, {3, 989}, {129, 257}, {7, 272}, {5, 2048}, {33, 4112}, {2, 40000}, {300, 4096}};

class CudaQuantizeSweep : public ::testing::TestWithParam<Shape> {};

TEST_P(CudaQuantizeSweep, DynamicMatchesReferenceBitForBit) {
  LLMQ_REQUIRE_GPU();
  const Shape shape = GetParam();
  const bool large = shape.rows * shape.cols > 200000;
  Sweep sweep;
  for (DType in : kInputs) {
    const uint64_t seed = static_cast<uint64_t>(shape.rows * 7919 + shape.cols) + static_cast<uint64_t>(in);
    const Problem p = outlier_problem(shape.rows, shape.cols, in, seed);
    for (DType format : kFormats)
      for (QuantSpec spec : dynamic_specs(shape.cols, format))
        for (Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
          // Large shapes: stochastic rounding for one input dtype keeps the CPU reference quick.
          if (large && rounding == Rounding::kStochastic && in != DType::kBF16) continue;
          spec.rounding = rounding;
          spec.seed = kStochasticSeed;
          sweep.check(p, spec, seed);
        }
  }
  sweep.finish();
}

TEST_P(CudaQuantizeSweep, StaticScalesMatchReference) {
  LLMQ_REQUIRE_GPU();
  const Shape shape = GetParam();
  if (shape.rows * shape.cols > 200000) GTEST_SKIP() << "covered by the smaller shapes";
  Sweep sweep;
  std::mt19937 rng(static_cast<uint32_t>(shape.rows * 31 + shape.cols));
  std::uniform_real_distribution<float> factor(0.25f, 2.0f);  // < 1 clips: exercises the counter
  for (DType in : kInputs) {
    const uint64_t seed = static_cast<uint64_t>(shape.rows * 131 + shape.cols);
    const Problem base = outlier_problem(shape.rows, shape.cols, in, seed);
    for (DType format : kFormats)
      for (QuantSpec spec : dynamic_specs(shape.cols, format)) {
        if (spec.granularity == Granularity::kPerToken) continue;  // static per-token is invalid
        ScaleSet s;
        const std::vector<uint8_t> xb = input_bytes(base);
        ASSERT_TRUE(compute_scale(input_view(base, const_cast<uint8_t*>(xb.data()), Device::kCpu), spec, &s).ok());
        for (int64_t i = 0; i < s.scales.numel(); ++i) s.scales.data_as<float>()[i] *= factor(rng);
        spec.source = ScaleSource::kStatic;
        Problem p = base;
        p.static_scales = &s;
        for (Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
          spec.rounding = rounding;
          spec.seed = kStochasticSeed + 1;
          sweep.check(p, spec, seed);
        }
      }
  }
  sweep.finish();
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaQuantizeSweep, ::testing::ValuesIn(kShapes), [](const auto& info) {
  return std::to_string(info.param.rows) + "x" + std::to_string(info.param.cols);
});

// ---- Special values.

TEST(CudaQuantizeSpecial, EveryRoundingBoundaryStaticUnitScale) {
  LLMQ_REQUIRE_GPU();
  Sweep sweep;
  for (DType format : kFormats) {
    std::vector<float> v = boundary_values(format);
    for (int aligned = 0; aligned < 2; ++aligned) {
      // Aligned: a multiple of 16 columns (pack kernel); otherwise odd (scalar kernel).
      std::vector<float> row = v;
      if (aligned) row.resize((row.size() + 15) / 16 * 16, 1.0f);
      else if (row.size() % 2 == 0) row.push_back(0.75f);
      Problem p;
      p.rows = 1;
      p.cols = static_cast<int64_t>(row.size());
      p.values = row;
      p.in = DType::kF32;
      ScaleSet s;
      s.block = {1, p.cols};
      s.scales = Tensor(DType::kF32, {1, 1});
      s.scales.data_as<float>()[0] = 1.0f;
      p.static_scales = &s;
      QuantSpec spec = QuantSpec::per_tensor(format);
      spec.source = ScaleSource::kStatic;
      for (Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic})
        for (uint64_t seed : {uint64_t{1}, uint64_t{0xFFFFFFFF00000001ull}}) {
          spec.rounding = rounding;
          spec.seed = seed;
          sweep.check(p, spec, seed);
          if (rounding == Rounding::kNearestEven) break;
        }
    }
  }
  sweep.finish();
}

TEST(CudaQuantizeSpecial, ZeroNanAndDenormalRows) {
  LLMQ_REQUIRE_GPU();
  Sweep sweep;
  for (int64_t cols : {256, 250, 4096})
    for (DType in : kInputs) {
      const Problem p = special_rows(cols, in);
      for (DType format : kFormats)
        for (QuantSpec spec : dynamic_specs(cols, format)) {
          sweep.check(p, spec, 77);
          spec.rounding = Rounding::kStochastic;
          sweep.check(p, spec, 77);
        }
    }
  sweep.finish();
}

// Dynamic scales of a block holding +-Inf: the CPU reference reports an error; the kernel writes
// scale +Inf for that block and the codes of x * 0 (signed zeros; NaN for the Inf elements), and
// every other block exactly as the reference computes it.
TEST(CudaQuantizeSpecial, InfBlockGetsInfScaleOthersMatch) {
  LLMQ_REQUIRE_GPU();
  for (int64_t cols : {256, 250}) {
    for (DType format : {DType::kE4M3, DType::kE5M2, DType::kI8, DType::kE4M3Fnuz}) {
      Problem p = outlier_problem(6, cols, DType::kBF16, 5);
      const int64_t inf_row = 2;
      p.values[static_cast<size_t>(inf_row * cols + 7)] = std::numeric_limits<float>::infinity();
      p.values[static_cast<size_t>(inf_row * cols + 9)] = -std::numeric_limits<float>::infinity();
      const QuantSpec spec = QuantSpec::per_token(format);
      // Reference for the other rows: the same data with the Inf row zeroed.
      Problem finite = p;
      for (int64_t c = 0; c < cols; ++c) finite.values[static_cast<size_t>(inf_row * cols + c)] = 0.0f;
      const std::vector<uint8_t> fb = input_bytes(finite);
      QuantizedTensor ref;
      ASSERT_TRUE(quantize(input_view(finite, const_cast<uint8_t*>(fb.data()), Device::kCpu), spec, &ref).ok());
      std::vector<GpuResult> runs;
      const std::string err = run_gpu(p, spec, p.rows, 1, 1, &runs);
      ASSERT_EQ(err, "");
      const GpuResult& g = runs[0];
      const std::string what = case_name(p, spec, 5);
      EXPECT_TRUE(std::isinf(g.scales[inf_row]) && g.scales[inf_row] > 0) << what << " scale " << g.scales[inf_row];
      for (int64_t r = 0; r < p.rows; ++r) {
        if (r != inf_row) {
          EXPECT_EQ(std::memcmp(&g.scales[r], ref.scales.scales.data_as<float>() + r, 4), 0) << what << " row " << r;
        }
        for (int64_t c = 0; c < cols; ++c) {
          const size_t i = static_cast<size_t>(r * cols + c);
          uint8_t want = static_cast<const uint8_t*>(ref.data.data())[i];
          if (r == inf_row) {
            const float v = stored_value(p, i) * 0.0f;  // x * (1 / Inf)
            want = format == DType::kI8 ? static_cast<uint8_t>(encode_int(v, DType::kI8))
                                        : float_to_fp8(v, format);
          }
          ASSERT_EQ(g.codes[i], want) << what << " at (" << r << ", " << c << ")";
        }
      }
    }
  }
}

}  // namespace
}  // namespace llmq
