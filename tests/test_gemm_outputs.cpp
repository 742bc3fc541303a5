// Tests of the CPU reference scaled 8-bit GEMM (src/ref/gemm.cpp): what it writes. BF16 outputs are
// the F32 result rounded once; strided outputs write only their elements; odd shapes (1, 19, 99,
// 989) write every element of a NaN-poisoned output and two runs agree bit for bit.
#include <gtest/gtest.h>

#include <cstring>
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

// ---------------------------------------------------------------------------------------------
// Outputs

TEST(GemmOutput, Bf16OutputIsTheF32ResultRoundedOnce) {
  constexpr int64_t kM = 19, kN = 99, kK = 256;
  const uint64_t seed = 99;
  const std::vector<float> xa = testing::outlier_matrix(kM, kK, seed);
  const std::vector<float> xb = testing::normal_vector(kN * kK, seed + 1, 0.05f);
  const std::vector<float> bias = testing::normal_vector(kN, seed + 2, 0.1f);
  QuantSpec asym = QuantSpec::per_token(DType::kI8);
  asym.symmetric = false;
  struct Case {
    QuantSpec a, b;
  };
  const Case cases[] = {
      {QuantSpec::per_token(DType::kE4M3), QuantSpec::per_channel(DType::kE4M3)},
      {QuantSpec::per_block(DType::kE4M3, 1, 128), QuantSpec::per_block(DType::kE4M3, 128, 128)},
      {asym, QuantSpec::per_group(DType::kI8, 32)},
  };
  for (const Case& c : cases) {
    const std::string what = "a=" + spec_text(c.a) + " b=" + spec_text(c.b) + " out=bf16";
    QuantizedTensor qa, qb;
    ASSERT_TRUE(quantize(matrix_view(xa.data(), kM, kK), c.a, &qa).ok()) << what;
    ASSERT_TRUE(quantize(matrix_view(xb.data(), kN, kK), c.b, &qb).ok()) << what;
    std::vector<float> f32;
    ASSERT_TRUE(run_f32(GemmOperand::of(qa), GemmOperand::of(qb), kM, kN, bias.data(), &f32).ok());
    Tensor bf16(DType::kBF16, {kM, kN});
    uint16_t* out = bf16.data_as<uint16_t>();
    for (int64_t i = 0; i < kM * kN; ++i) out[i] = 0x7FC0;  // NaN poison
    GemmOptions options;
    options.bias = bias.data();
    const Status st = quantized_gemm(GemmOperand::of(qa), GemmOperand::of(qb), bf16.view(), options);
    ASSERT_TRUE(st.ok()) << st.to_string() << " " << testing::repro(seed, kM, kK, what);
    for (int64_t i = 0; i < kM * kN; ++i)
      ASSERT_EQ(out[i], float_to_bf16_bits(f32[i]))
          << "element " << i << " " << testing::repro(seed, kM, kK, what);
  }
}

TEST(GemmOutput, StridedOutputsWriteOnlyTheirElements) {
  constexpr int64_t kM = 19, kN = 23, kK = 99, kPad = 3;
  constexpr float kSentinel = -7.25f;
  const uint64_t seed = 5;
  const std::vector<float> xa = testing::outlier_matrix(kM, kK, seed);
  const std::vector<float> xb = testing::normal_vector(kN * kK, seed + 1, 0.05f);
  QuantizedTensor qa, qb;
  ASSERT_TRUE(quantize(matrix_view(xa.data(), kM, kK), QuantSpec::per_token(DType::kE4M3), &qa).ok());
  ASSERT_TRUE(quantize(matrix_view(xb.data(), kN, kK), QuantSpec::per_channel(DType::kE4M3), &qb).ok());
  std::vector<float> dense;
  ASSERT_TRUE(run_f32(GemmOperand::of(qa), GemmOperand::of(qb), kM, kN, nullptr, &dense).ok());

  // Row-padded [M, N] (row stride N + pad) and transposed (column-major) outputs.
  struct Layout {
    const char* name;
    int64_t row_stride, col_stride, size;
  };
  const Layout layouts[] = {{"padded rows", kN + kPad, 1, kM * (kN + kPad)},
                            {"column-major", 1, kM + kPad, kN * (kM + kPad)}};
  for (const Layout& l : layouts) {
    std::vector<float> buffer(static_cast<size_t>(l.size), kSentinel);
    for (int64_t m = 0; m < kM; ++m)
      for (int64_t n = 0; n < kN; ++n) buffer[m * l.row_stride + n * l.col_stride] = kNaN;
    TensorView out = matrix_view(buffer.data(), kM, kN);
    out.strides = {l.row_stride, l.col_stride};
    const Status st = quantized_gemm(GemmOperand::of(qa), GemmOperand::of(qb), out);
    ASSERT_TRUE(st.ok()) << st.to_string() << " " << l.name;
    int64_t written = 0;
    for (int64_t m = 0; m < kM; ++m)
      for (int64_t n = 0; n < kN; ++n) {
        float& v = buffer[m * l.row_stride + n * l.col_stride];
        ASSERT_EQ(std::memcmp(&v, &dense[m * kN + n], sizeof(float)), 0)
            << l.name << " (" << m << ", " << n << ") " << testing::repro(seed, kM, kK, "e4m3");
        v = kSentinel;
        ++written;
      }
    EXPECT_EQ(written, kM * kN);
    for (size_t i = 0; i < buffer.size(); ++i)
      ASSERT_EQ(buffer[i], kSentinel) << l.name << ": padding element " << i << " was written";
  }
}

// ---------------------------------------------------------------------------------------------
// Odd shapes, poison, determinism

TEST(GemmShapes, OddShapesWriteEveryElementAndAreDeterministic) {
  const int64_t mn_sizes[] = {1, 19, 99};
  const int64_t k_sizes[] = {1, 19, 99, 989};
  QuantSpec int8_asym = QuantSpec::per_token(DType::kI8);
  int8_asym.symmetric = false;
  struct Case {
    const char* name;
    bool dense_a;
    QuantSpec a, b;
  };
  const Case cases[] = {
      {"e4m3 per-token x 128x128", false, QuantSpec::per_token(DType::kE4M3),
       QuantSpec::per_block(DType::kE4M3, 128, 128)},
      {"int8 1x128 x per-channel", false, QuantSpec::per_block(DType::kI8, 1, 128),
       QuantSpec::per_channel(DType::kI8)},
      {"int8 asymmetric per-token x per-channel", false, int8_asym, QuantSpec::per_channel(DType::kI8)},
      {"bf16 x e5m2 per-channel (W8A16)", true, {}, QuantSpec::per_channel(DType::kE5M2)},
  };
  uint64_t seed = 300;
  for (const Case& c : cases)
    for (int64_t m : mn_sizes)
      for (int64_t n : mn_sizes)
        for (int64_t k : k_sizes) {
          ++seed;
          const std::string what = std::string(c.name) + " m=" + std::to_string(m) +
                                   " n=" + std::to_string(n) + " k=" + std::to_string(k);
          const std::vector<float> xa = testing::outlier_matrix(m, k, seed);
          const std::vector<float> xb = testing::normal_vector(n * k, seed + 1, 0.05f);
          const std::vector<float> bias = testing::normal_vector(n, seed + 2, 0.1f);
          QuantizedTensor qa, qb;
          ASSERT_TRUE(quantize(matrix_view(xb.data(), n, k), c.b, &qb).ok()) << what;
          std::vector<uint16_t> xa_bf16;
          TensorView a_view;
          std::vector<double> a_values;
          if (c.dense_a) {
            xa_bf16 = to_bf16(xa);
            a_view.data = xa_bf16.data();
            a_view.dtype = DType::kBF16;
            a_view.shape = {m, k};
            for (uint16_t bits : xa_bf16) a_values.push_back(bf16_bits_to_float(bits));
          } else {
            ASSERT_TRUE(quantize(matrix_view(xa.data(), m, k), c.a, &qa).ok()) << what;
            a_values = dequantized(qa);
          }
          const GemmOperand a = c.dense_a ? GemmOperand::of(a_view) : GemmOperand::of(qa);
          std::vector<float> first, second;
          Status st = run_f32(a, GemmOperand::of(qb), m, n, bias.data(), &first);
          ASSERT_TRUE(st.ok()) << st.to_string() << " " << testing::repro(seed, m, k, what);
          ASSERT_EQ(count_nan(first), 0) << "unwritten outputs; " << testing::repro(seed, m, k, what);
          const std::vector<double> want =
              reference_gemm(a_values, dequantized(qb), m, n, k, bias.data());
          EXPECT_LT(rel_frobenius(first, want), kKernelRelError) << testing::repro(seed, m, k, what);
          st = run_f32(a, GemmOperand::of(qb), m, n, bias.data(), &second);
          ASSERT_TRUE(st.ok()) << st.to_string();
          ASSERT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0)
              << "two runs differ; " << testing::repro(seed, m, k, what);
        }
}

}  // namespace
}  // namespace llmq
