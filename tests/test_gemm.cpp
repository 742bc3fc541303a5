// Tests of the CPU reference scaled 8-bit GEMM (src/ref/gemm.cpp), C = A B^T (+ bias): its numerics.
//  * Exact: codes on the grid (integers in [-2, 2]) with power-of-two scales, so every FP8, INT8
//    and INT4 GEMM is exact in float32 and is compared bit for bit with a float64 product.
//  * Realistic: outlier activations x Gaussian weights over many granularity pairs; the GEMM is
//    compared with a float64 product of the DEQUANTIZED inputs (kernel error alone), and the
//    quantization error against the unquantized product is bounded per format; W8A16.
// Outputs, odd shapes and determinism are in test_gemm_outputs.cpp, errors in test_gemm_errors.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
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

// Relative Frobenius error against the UNQUANTIZED float64 product, the worst over every
// granularity pair below (measured: e4m3 0.032, e5m2 0.061, e4m3 x e5m2 0.058, int8 0.087,
// int8 asymmetric 0.076, W4A8 0.127 / 0.110 asymmetric), with about 1.5x headroom. The worst pair
// is always a per-tensor activation scale: the 40x outlier channels set it for every token.
constexpr double kQuantErrorE4M3 = 0.05;
constexpr double kQuantErrorE5M2 = 0.09;
constexpr double kQuantErrorE4M3xE5M2 = 0.09;
constexpr double kQuantErrorInt8 = 0.13;
constexpr double kQuantErrorInt8Asym = 0.12;
constexpr double kQuantErrorW4A8 = 0.19;

struct Granularity2 {
  const char* name;
  Granularity granularity;
  int64_t block_rows = 0;
  int64_t block_cols = 0;
  int64_t group = 0;
};

const Granularity2 kActivationGranularities[] = {
    {"per-tensor", Granularity::kPerTensor},
    {"per-token", Granularity::kPerToken},
    {"1x128", Granularity::kPerBlock, 1, 128},
    {"group32", Granularity::kPerGroup, 0, 0, 32},
    {"per-input-channel", Granularity::kPerInputChannel},
};
const Granularity2 kWeightGranularities[] = {
    {"per-tensor", Granularity::kPerTensor},
    {"per-channel", Granularity::kPerChannel},
    {"128x128", Granularity::kPerBlock, 128, 128},
    {"group32", Granularity::kPerGroup, 0, 0, 32},
};

QuantSpec make_spec(DType format, const Granularity2& g, bool symmetric = true) {
  QuantSpec s = QuantSpec::per_tensor(format);
  s.granularity = g.granularity;
  if (g.granularity == Granularity::kPerBlock) {
    s.block_rows = g.block_rows;
    s.block_cols = g.block_cols;
  }
  if (g.granularity == Granularity::kPerGroup) s.group_size = g.group;
  s.symmetric = symmetric;
  return s;
}

// Index and values of the first element where got != (float)want, or -1.
int64_t first_inexact(const std::vector<float>& got, const std::vector<double>& want) {
  for (size_t i = 0; i < want.size(); ++i)
    if (!(static_cast<double>(got[i]) == want[i])) return static_cast<int64_t>(i);
  return -1;
}

// Values v * 2^e_r: v in [-2, 2], one exponent e_r in [-2, 2] per row. Quantized with
// power-of-two scales these land exactly on the FP8 and INT8 grids for every granularity.
std::vector<float> grid_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> value(-2, 2), exponent(-2, 2);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const int e = exponent(rng);
    for (int64_t c = 0; c < cols; ++c)
      x[r * cols + c] = std::ldexp(static_cast<float>(value(rng)), e);
  }
  return x;
}

std::vector<float> grid_bias(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> value(-8, 8);
  std::vector<float> b(static_cast<size_t>(n));
  for (auto& v : b) v = static_cast<float>(value(rng)) / 4.0f;
  return b;
}

// ---------------------------------------------------------------------------------------------
// Exact

struct GridFormat {
  const char* name;
  DType a;
  bool a_asym;
  DType b;
  bool b_asym;
};

TEST(GemmExact, GridCodesEveryFormatAndBlockPairIsExact) {
  constexpr int64_t kM = 19, kN = 23, kK = 989;
  const GridFormat formats[] = {
      {"e4m3", DType::kE4M3, false, DType::kE4M3, false},
      {"e5m2", DType::kE5M2, false, DType::kE5M2, false},
      {"e4m3_ieee", DType::kE4M3Ieee, false, DType::kE4M3Ieee, false},
      {"e4m3fnuz", DType::kE4M3Fnuz, false, DType::kE4M3Fnuz, false},
      {"e5m2fnuz", DType::kE5M2Fnuz, false, DType::kE5M2Fnuz, false},
      {"e4m3 x e5m2", DType::kE4M3, false, DType::kE5M2, false},
      {"int8", DType::kI8, false, DType::kI8, false},
      {"int8 asymmetric", DType::kI8, true, DType::kI8, true},
      {"int8 x int4 asymmetric", DType::kI8, false, DType::kI4, true},
      {"int4 asymmetric x int4", DType::kI4, true, DType::kI4, false},
  };
  // Block shapes along K that cut it differently: whole, 128, 32, 1 (989 = 7 * 128 + 93).
  const BlockShape a_blocks[] = {{kM, kK}, {1, kK}, {1, 128}, {1, 32}, {kM, 1}};
  const BlockShape b_blocks[] = {{kN, kK}, {1, kK}, {128, 128}, {1, 32}, {kN, 1}, {7, 100}};
  // K must be even for INT4 packing by rows; 989 is odd, so INT4 cases use K - 1.
  const std::vector<float> bias = grid_bias(kN, 77);
  uint64_t seed = 1;
  for (const GridFormat& f : formats) {
    const int64_t k = (f.a == DType::kI4 || f.b == DType::kI4) ? kK - 1 : kK;
    for (const BlockShape& ab : a_blocks) {
      for (const BlockShape& bb : b_blocks) {
        ++seed;
        const BlockShape ab_k{ab.rows, std::min(ab.cols, k)};
        const BlockShape bb_k{bb.rows, std::min(bb.cols, k)};
        const GridTensor a = grid_tensor(f.a, kM, k, ab_k, f.a_asym, seed * 2);
        const GridTensor b = grid_tensor(f.b, kN, k, bb_k, f.b_asym, seed * 2 + 1);
        const std::vector<double> want = reference_gemm(a.real, b.real, kM, kN, k, bias.data());
        const std::string what = std::string(f.name) + " a blocks " + std::to_string(ab_k.rows) +
                                 "x" + std::to_string(ab_k.cols) + " b blocks " +
                                 std::to_string(bb_k.rows) + "x" + std::to_string(bb_k.cols);
        std::vector<float> got;
        const Status st = run_f32(GemmOperand::of(a.q), GemmOperand::of(b.q), kM, kN, bias.data(), &got);
        ASSERT_TRUE(st.ok()) << st.to_string() << " " << testing::repro(seed, kM, k, what);
        const int64_t bad = first_inexact(got, want);
        ASSERT_EQ(bad, -1) << "element " << bad << " got " << (bad >= 0 ? got[bad] : 0.0f)
                           << " want " << (bad >= 0 ? want[bad] : 0.0) << " "
                           << testing::repro(seed, kM, k, what);
      }
    }
  }
}

TEST(GemmExact, QuantizedGridInputsWithPowerOfTwoScalesAreExact) {
  // quantize() itself makes the operands: grid inputs with power-of-two scales quantize without
  // error, so the GEMM must reproduce the float64 product of the original inputs bit for bit.
  constexpr int64_t kM = 19, kN = 40, kK = 320;
  const DType formats[] = {DType::kE4M3, DType::kE5M2, DType::kI8};
  const uint64_t seed = 11;
  const std::vector<float> xa = grid_matrix(kM, kK, seed);
  const std::vector<float> xb = grid_matrix(kN, kK, seed + 1);
  const std::vector<float> bias = grid_bias(kN, seed + 2);
  const std::vector<double> want =
      reference_gemm(to_double(xa), to_double(xb), kM, kN, kK, bias.data());
  for (DType format : formats) {
    for (const Granularity2& ga : kActivationGranularities) {
      for (const Granularity2& gb : kWeightGranularities) {
        QuantSpec sa = make_spec(format, ga), sb = make_spec(format, gb);
        sa.scale_rounding = sb.scale_rounding = ScaleRounding::kPowerOfTwo;
        const std::string what = "a=" + spec_text(sa) + " b=" + spec_text(sb);
        QuantizedTensor qa, qb;
        ASSERT_TRUE(quantize(matrix_view(xa.data(), kM, kK), sa, &qa).ok()) << what;
        ASSERT_TRUE(quantize(matrix_view(xb.data(), kN, kK), sb, &qb).ok()) << what;
        // Precondition, so a failure below is the GEMM's: the operands are exact.
        ASSERT_EQ(first_inexact(xa, dequantized(qa)), -1) << "quantize(a) inexact; " << what;
        ASSERT_EQ(first_inexact(xb, dequantized(qb)), -1) << "quantize(b) inexact; " << what;
        std::vector<float> got;
        const Status st = run_f32(GemmOperand::of(qa), GemmOperand::of(qb), kM, kN, bias.data(), &got);
        ASSERT_TRUE(st.ok()) << st.to_string() << " " << testing::repro(seed, kM, kK, what);
        const int64_t bad = first_inexact(got, want);
        ASSERT_EQ(bad, -1) << "element " << bad << " got " << (bad >= 0 ? got[bad] : 0.0f)
                           << " want " << (bad >= 0 ? want[bad] : 0.0) << " "
                           << testing::repro(seed, kM, kK, what);
      }
    }
  }
}

// An FP8 tensor with the given scaled-domain values (each must be on the format's grid) and scales.
QuantizedTensor fp8_tensor(DType format, int64_t rows, int64_t cols, BlockShape block,
                           const std::vector<float>& values, const std::vector<float>& scales) {
  QuantizedTensor q;
  q.spec.format = format;
  q.rows = rows;
  q.cols = cols;
  q.data = Tensor(format, {rows, cols});
  for (int64_t i = 0; i < rows * cols; ++i)
    q.data.data_as<uint8_t>()[i] = float_to_fp8(values[i], format);
  q.scales.block = block;
  q.scales.scales = Tensor(DType::kF32, {(rows + block.rows - 1) / block.rows,
                                         (cols + block.cols - 1) / block.cols});
  for (size_t i = 0; i < scales.size(); ++i) q.scales.scales.data_as<float>()[i] = scales[i];
  return q;
}

TEST(GemmExact, RoundingFollowsTheDocumentedOrder) {
  // The reference is the specification, so its float32 rounding sequence is pinned here with
  // scales that are not powers of two. Each case also checks that the plausible alternative
  // order gives a different float, so the pin can fail.
  //
  // W8A8: a has 1x4 blocks, b one scale, so K = 8 is two segments. Per segment the raw FP8 sum,
  // then acc += sum * (scale_a * scale_b).
  const std::vector<float> a_codes{13.0f, -3.25f, 0.0f, 0.0f, 5.5f, 11.0f, 0.0f, 0.0f};
  const std::vector<float> b_codes{7.5f, 1.75f, 1.0f, 1.0f, -2.5f, 0.875f, 1.0f, 1.0f};
  const float sa0 = 0.7f, sa1 = 0.37f, sb = 1.1f;
  const QuantizedTensor qa = fp8_tensor(DType::kE4M3, 1, 8, {1, 4}, a_codes, {sa0, sa1});
  const QuantizedTensor qb = fp8_tensor(DType::kE4M3, 1, 8, {1, 8}, b_codes, {sb});
  float seg0 = 0.0f, seg1 = 0.0f;
  for (int k = 0; k < 4; ++k) seg0 += a_codes[k] * b_codes[k];
  for (int k = 4; k < 8; ++k) seg1 += a_codes[k] * b_codes[k];
  const float descale0 = sa0 * sb, descale1 = sa1 * sb;
  float want = 0.0f;
  want += seg0 * descale0;
  want += seg1 * descale1;
  float scale_one_at_a_time = 0.0f;  // (sum * scale_a) * scale_b: what the pin rules out
  scale_one_at_a_time += (seg0 * sa0) * sb;
  scale_one_at_a_time += (seg1 * sa1) * sb;
  ASSERT_NE(want, scale_one_at_a_time) << "inputs do not tell the two orders apart";
  std::vector<float> got;
  ASSERT_TRUE(run_f32(GemmOperand::of(qa), GemmOperand::of(qb), 1, 1, nullptr, &got).ok());
  EXPECT_EQ(got[0], want) << testing::repro(0, 1, 8, "e4m3 1x4 x per-tensor, pinned order");

  // W8A16: each weight is dequantized in float32 first, then multiplied by the activation.
  const std::vector<float> x{0.1f, 1.7f};
  const std::vector<float> w_codes{3.25f, 1.5f};
  const float sw = 0.3f;
  const QuantizedTensor qw = fp8_tensor(DType::kE4M3, 1, 2, {1, 2}, w_codes, {sw});
  float want16 = 0.0f, activation_first = 0.0f;
  for (int k = 0; k < 2; ++k) {
    const float w = w_codes[k] * sw;
    want16 += x[k] * w;
    activation_first += (x[k] * w_codes[k]) * sw;
  }
  ASSERT_NE(want16, activation_first) << "inputs do not tell the two orders apart";
  ASSERT_TRUE(run_f32(GemmOperand::of(matrix_view(x.data(), 1, 2)), GemmOperand::of(qw), 1, 1,
                      nullptr, &got).ok());
  EXPECT_EQ(got[0], want16) << testing::repro(0, 1, 2, "f32 x e4m3 per-tensor, pinned order");
}

// ---------------------------------------------------------------------------------------------
// Realistic

struct FormatCase {
  const char* name;
  DType a;
  bool a_symmetric;
  DType b;
  bool b_symmetric;
  double quant_bound;
  bool weights_grouped_only;  // INT4 weights: per-group 32 only
};

TEST(GemmRealistic, GranularityPairsMatchTheDequantizedProduct) {
  constexpr int64_t kM = 37, kN = 160, kK = 320;  // 320 = 2 * 128 + 64: partial 1x128 blocks
  const uint64_t seed = 2024;
  const std::vector<float> xa = testing::outlier_matrix(kM, kK, seed);
  const std::vector<float> xb = testing::normal_vector(kN * kK, seed + 1, 0.05f);
  const std::vector<float> bias = testing::normal_vector(kN, seed + 2, 0.1f);
  const std::vector<double> exact =
      reference_gemm(to_double(xa), to_double(xb), kM, kN, kK, bias.data());
  const FormatCase cases[] = {
      {"e4m3", DType::kE4M3, true, DType::kE4M3, true, kQuantErrorE4M3, false},
      {"e5m2", DType::kE5M2, true, DType::kE5M2, true, kQuantErrorE5M2, false},
      {"e4m3 x e5m2", DType::kE4M3, true, DType::kE5M2, true, kQuantErrorE4M3xE5M2, false},
      {"int8", DType::kI8, true, DType::kI8, true, kQuantErrorInt8, false},
      {"int8 asymmetric", DType::kI8, false, DType::kI8, false, kQuantErrorInt8Asym, false},
      {"int8 x int4 (W4A8)", DType::kI8, true, DType::kI4, true, kQuantErrorW4A8, true},
      {"int8 x int4 asymmetric", DType::kI8, false, DType::kI4, false, kQuantErrorW4A8, true},
  };
  for (const FormatCase& f : cases) {
    double worst_kernel = 0.0, worst_quant = 0.0;
    std::string worst_quant_pair;
    for (const Granularity2& ga : kActivationGranularities) {
      for (const Granularity2& gb : kWeightGranularities) {
        if (f.weights_grouped_only && gb.granularity != Granularity::kPerGroup) continue;
        const QuantSpec sa = make_spec(f.a, ga, f.a_symmetric);
        const QuantSpec sb = make_spec(f.b, gb, f.b_symmetric);
        const std::string what = "a=" + spec_text(sa) + " b=" + spec_text(sb);
        QuantizedTensor qa, qb;
        Status st = quantize(matrix_view(xa.data(), kM, kK), sa, &qa);
        ASSERT_TRUE(st.ok()) << st.to_string() << " " << what;
        st = quantize(matrix_view(xb.data(), kN, kK), sb, &qb);
        ASSERT_TRUE(st.ok()) << st.to_string() << " " << what;
        const std::vector<double> want =
            reference_gemm(dequantized(qa), dequantized(qb), kM, kN, kK, bias.data());
        std::vector<float> got;
        st = run_f32(GemmOperand::of(qa), GemmOperand::of(qb), kM, kN, bias.data(), &got);
        ASSERT_TRUE(st.ok()) << st.to_string() << " " << testing::repro(seed, kM, kK, what);
        ASSERT_EQ(count_nan(got), 0) << "unwritten (NaN) outputs; " << testing::repro(seed, kM, kK, what);
        const double kernel_error = rel_frobenius(got, want);
        const double quant_error = rel_frobenius(got, exact);
        EXPECT_LT(kernel_error, kKernelRelError) << testing::repro(seed, kM, kK, what);
        EXPECT_LT(quant_error, f.quant_bound) << testing::repro(seed, kM, kK, what);
        worst_kernel = std::max(worst_kernel, kernel_error);
        if (quant_error > worst_quant) {
          worst_quant = quant_error;
          worst_quant_pair = "a " + std::string(ga.name) + ", b " + gb.name;
        }
      }
    }
    std::printf("[ gemm     ] %-24s kernel error <= %.2e, quantization error <= %.4f (%s)\n", f.name,
                worst_kernel, worst_quant, worst_quant_pair.c_str());
  }
}

TEST(GemmRealistic, W8A16DenseActivationsMatchTheDequantizedProduct) {
  constexpr int64_t kM = 37, kN = 160, kK = 320;
  const uint64_t seed = 4242;
  const std::vector<float> xa = testing::outlier_matrix(kM, kK, seed);
  const std::vector<uint16_t> xa_bf16 = to_bf16(xa);
  std::vector<double> xa_bf16_values(xa.size());
  for (size_t i = 0; i < xa.size(); ++i) xa_bf16_values[i] = bf16_bits_to_float(xa_bf16[i]);
  const std::vector<float> xb = testing::normal_vector(kN * kK, seed + 1, 0.05f);
  const std::vector<float> bias = testing::normal_vector(kN, seed + 2, 0.1f);
  TensorView a_bf16;
  a_bf16.data = const_cast<uint16_t*>(xa_bf16.data());
  a_bf16.dtype = DType::kBF16;
  a_bf16.shape = {kM, kK};

  QuantSpec int4_group = QuantSpec::per_group(DType::kI4, 32);
  QuantSpec int4_group_asym = int4_group;
  int4_group_asym.symmetric = false;
  QuantSpec int8_group_asym = QuantSpec::per_group(DType::kI8, 32);
  int8_group_asym.symmetric = false;
  const QuantSpec weight_specs[] = {
      QuantSpec::per_channel(DType::kE4M3), QuantSpec::per_block(DType::kE5M2, 128, 128),
      QuantSpec::per_channel(DType::kI8),   int8_group_asym,
      int4_group,                           int4_group_asym,
  };
  for (const QuantSpec& sb : weight_specs) {
    const std::string what = "a=bf16 b=" + spec_text(sb);
    QuantizedTensor qb;
    Status st = quantize(matrix_view(xb.data(), kN, kK), sb, &qb);
    ASSERT_TRUE(st.ok()) << st.to_string() << " " << what;
    const std::vector<double> want =
        reference_gemm(xa_bf16_values, dequantized(qb), kM, kN, kK, bias.data());
    std::vector<float> got;
    st = run_f32(GemmOperand::of(a_bf16), GemmOperand::of(qb), kM, kN, bias.data(), &got);
    ASSERT_TRUE(st.ok()) << st.to_string() << " " << testing::repro(seed, kM, kK, what);
    ASSERT_EQ(count_nan(got), 0) << testing::repro(seed, kM, kK, what);
    EXPECT_LT(rel_frobenius(got, want), kKernelRelError) << testing::repro(seed, kM, kK, what);
  }

  // The mirror image (A quantized, B dense) and dense x dense are plain float32 GEMMs.
  QuantizedTensor qa;
  ASSERT_TRUE(quantize(matrix_view(xa.data(), kM, kK), QuantSpec::per_token(DType::kE4M3), &qa).ok());
  std::vector<float> got;
  Status st = run_f32(GemmOperand::of(qa), GemmOperand::of(matrix_view(xb.data(), kN, kK)), kM, kN,
                      nullptr, &got);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_LT(rel_frobenius(got, reference_gemm(dequantized(qa), to_double(xb), kM, kN, kK, nullptr)),
            kKernelRelError)
      << testing::repro(seed, kM, kK, "a=e4m3 per-token b=f32");
  st = run_f32(GemmOperand::of(a_bf16), GemmOperand::of(matrix_view(xb.data(), kN, kK)), kM, kN,
               bias.data(), &got);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_LT(rel_frobenius(got, reference_gemm(xa_bf16_values, to_double(xb), kM, kN, kK, bias.data())),
            kKernelRelError)
      << testing::repro(seed, kM, kK, "a=bf16 b=f32");
}

}  // namespace
}  // namespace llmq
