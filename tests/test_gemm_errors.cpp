// Tests of the CPU reference scaled 8-bit GEMM (src/ref/gemm.cpp): its errors. Bad shapes, outputs,
// operands and format pairs are refused with the argument named, before anything is written; integer
// segments beyond the int32 accumulator bound are unsupported.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gemm_support.hpp"
#include "llmq/format.hpp"
#include "llmq/gemm.hpp"
#include "llmq/quantize_tensor.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using namespace gemm_test;  // NOLINT: the suite's shared helpers

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// ---------------------------------------------------------------------------------------------
// Errors

class GemmErrors : public ::testing::Test {
 protected:
  static constexpr int64_t kM = 4, kN = 8, kK = 64;
  std::vector<float> a_ = testing::normal_vector(kM * kK, 1);
  std::vector<float> b_ = testing::normal_vector(kN * kK, 2);
  std::vector<float> c_ = std::vector<float>(kM * kN, kNaN);

  QuantizedTensor quantized(const std::vector<float>& x, int64_t rows, int64_t cols, const QuantSpec& s) {
    QuantizedTensor q;
    const Status st = quantize(matrix_view(x.data(), rows, cols), s, &q);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return q;
  }
  static void expect_error(const Status& st, StatusCode code, const char* name) {
    EXPECT_EQ(st.code(), code) << st.to_string();
    EXPECT_TRUE(starts_with(st.message(), name)) << "expected the error to name \"" << name
                                                 << "\": " << st.to_string();
  }
};

TEST_F(GemmErrors, KMismatchNamesB) {
  const GemmOperand a = GemmOperand::of(matrix_view(a_.data(), kM, kK));
  const GemmOperand b = GemmOperand::of(matrix_view(b_.data(), kN * 2, kK / 2));
  expect_error(gemm_can_implement(a, b, matrix_view(c_.data(), kM, kN * 2)),
               StatusCode::kInvalidArgument, "b:");
  const QuantizedTensor qa = quantized(a_, kM, kK, QuantSpec::per_token(DType::kE4M3));
  const QuantizedTensor qb = quantized(b_, kN * 2, kK / 2, QuantSpec::per_channel(DType::kE4M3));
  std::vector<float> c(kM * kN * 2, kNaN);
  expect_error(quantized_gemm(GemmOperand::of(qa), GemmOperand::of(qb), matrix_view(c.data(), kM, kN * 2)),
               StatusCode::kInvalidArgument, "b:");
  EXPECT_EQ(count_nan(c), kM * kN * 2) << "a failed GEMM must not write its output";
}

TEST_F(GemmErrors, BadOutputNamesOut) {
  const GemmOperand a = GemmOperand::of(matrix_view(a_.data(), kM, kK));
  const GemmOperand b = GemmOperand::of(matrix_view(b_.data(), kN, kK));
  expect_error(gemm_can_implement(a, b, matrix_view(c_.data(), kM, kN - 1)),
               StatusCode::kInvalidArgument, "out:");
  expect_error(gemm_can_implement(a, b, matrix_view(c_.data(), kN, kM)), StatusCode::kInvalidArgument,
               "out:");
  TensorView f16 = matrix_view(c_.data(), kM, kN);
  f16.dtype = DType::kF16;
  expect_error(gemm_can_implement(a, b, f16), StatusCode::kInvalidArgument, "out:");
  TensorView device = matrix_view(c_.data(), kM, kN);
  device.device = Device::kCuda;
  expect_error(gemm_can_implement(a, b, device), StatusCode::kInvalidArgument, "out:");
  TensorView null_out = matrix_view(static_cast<float*>(nullptr), kM, kN);
  expect_error(gemm_can_implement(a, b, null_out), StatusCode::kInvalidArgument, "out:");
  EXPECT_TRUE(gemm_can_implement(a, b, matrix_view(c_.data(), kM, kN)).ok());
}

TEST_F(GemmErrors, Fp8TimesIntegerIsAnError) {
  const QuantizedTensor e4m3 = quantized(a_, kM, kK, QuantSpec::per_token(DType::kE4M3));
  const QuantizedTensor int8 = quantized(b_, kN, kK, QuantSpec::per_channel(DType::kI8));
  const QuantizedTensor int8_a = quantized(a_, kM, kK, QuantSpec::per_token(DType::kI8));
  const QuantizedTensor e5m2_b = quantized(b_, kN, kK, QuantSpec::per_channel(DType::kE5M2));
  const TensorView out = matrix_view(c_.data(), kM, kN);
  expect_error(gemm_can_implement(GemmOperand::of(e4m3), GemmOperand::of(int8), out),
               StatusCode::kInvalidArgument, "b:");
  expect_error(quantized_gemm(GemmOperand::of(int8_a), GemmOperand::of(e5m2_b), out),
               StatusCode::kInvalidArgument, "b:");
  EXPECT_EQ(count_nan(c_), kM * kN);
  EXPECT_TRUE(gemm_can_implement(GemmOperand::of(int8_a), GemmOperand::of(int8), out).ok());
  EXPECT_TRUE(gemm_can_implement(GemmOperand::of(e4m3), GemmOperand::of(e5m2_b), out).ok());
}

TEST_F(GemmErrors, BadOperandsNameTheirArgument) {
  const TensorView out = matrix_view(c_.data(), kM, kN);
  const GemmOperand b = GemmOperand::of(matrix_view(b_.data(), kN, kK));
  expect_error(gemm_can_implement(GemmOperand::of(matrix_view(static_cast<float*>(nullptr), kM, kK)),
                                  b, out),
               StatusCode::kInvalidArgument, "a:");
  TensorView int8_view = matrix_view(a_.data(), kM, kK);
  int8_view.dtype = DType::kI8;  // raw int8 data must come as a QuantizedTensor
  expect_error(gemm_can_implement(GemmOperand::of(int8_view), b, out), StatusCode::kInvalidArgument, "a:");
  QuantizedTensor qb = quantized(b_, kN, kK, QuantSpec::per_channel(DType::kE4M3));
  qb.scales.scales = Tensor(DType::kF32, {kN, 2});  // wrong scale shape for per-channel
  expect_error(gemm_can_implement(GemmOperand::of(matrix_view(a_.data(), kM, kK)), GemmOperand::of(qb), out),
               StatusCode::kInvalidArgument, "b:");
  QuantizedTensor empty;  // default: no data at all
  expect_error(gemm_can_implement(GemmOperand::of(empty), b, out), StatusCode::kInvalidArgument, "a:");
}

TEST_F(GemmErrors, IntegerSegmentsBeyondTheInt32BoundAreUnsupported) {
  constexpr int64_t kLongK = kMaxInt8SegmentK + 1;
  std::vector<float> c(1, kNaN);
  const TensorView out = matrix_view(c.data(), 1, 1);
  const GridTensor a = grid_tensor(DType::kI8, 1, kLongK, {1, kLongK}, false, 1);
  const GridTensor b = grid_tensor(DType::kI8, 1, kLongK, {1, kLongK}, false, 2);
  expect_error(gemm_can_implement(GemmOperand::of(a.q), GemmOperand::of(b.q), out),
               StatusCode::kUnsupported, "b:");
  // One operand blocked along K bounds every segment, so the same problem is fine.
  const GridTensor b_blocked = grid_tensor(DType::kI8, 1, kLongK, {1, 128}, false, 3);
  EXPECT_TRUE(gemm_can_implement(GemmOperand::of(a.q), GemmOperand::of(b_blocked.q), out).ok());
  // FP8 sums in float32 and has no such bound.
  const GridTensor fa = grid_tensor(DType::kE4M3, 1, kLongK, {1, kLongK}, false, 4);
  const GridTensor fb = grid_tensor(DType::kE4M3, 1, kLongK, {1, kLongK}, false, 5);
  EXPECT_TRUE(gemm_can_implement(GemmOperand::of(fa.q), GemmOperand::of(fb.q), out).ok());
  // Exactly at the bound is allowed.
  const GridTensor a_max = grid_tensor(DType::kI8, 1, kMaxInt8SegmentK, {1, kMaxInt8SegmentK}, false, 6);
  const GridTensor b_max = grid_tensor(DType::kI8, 1, kMaxInt8SegmentK, {1, kMaxInt8SegmentK}, false, 7);
  std::vector<float> got;
  ASSERT_TRUE(run_f32(GemmOperand::of(a_max.q), GemmOperand::of(b_max.q), 1, 1, nullptr, &got).ok());
  EXPECT_EQ(static_cast<double>(got[0]),
            reference_gemm(a_max.real, b_max.real, 1, 1, kMaxInt8SegmentK, nullptr)[0]);
}

}  // namespace
}  // namespace llmq
