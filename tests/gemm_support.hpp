// Helpers shared by the CPU reference GEMM tests (test_gemm.cpp: exact and realistic numerics;
// test_gemm_outputs.cpp: output types, strides, odd shapes; test_gemm_errors.cpp): the kernel
// tolerance, a NaN-poisoned F32 run, a float64 reference product, and tensors built code by code
// on the grid.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "llmq/format.hpp"
#include "llmq/gemm.hpp"
#include "llmq/quantize_tensor.hpp"
#include "support.hpp"

namespace llmq {
namespace gemm_test {

// Relative Frobenius error of the GEMM against float64 on the same (dequantized) inputs. FP32
// accumulation over K <= 989 of outlier data measures about 1e-7 .. 1e-6 (a random walk of
// ~sqrt(K) roundings of 2^-24); 1e-5 leaves a 10x margin and still catches any misplaced scale,
// zero point or segment (those give errors of 1e-3 and up).
constexpr double kKernelRelError = 1e-5;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

inline std::string spec_text(const QuantSpec& s) {
  std::string t = describe(s);
  if (s.granularity == Granularity::kPerBlock)
    t += " " + std::to_string(s.block_rows) + "x" + std::to_string(s.block_cols);
  if (s.granularity == Granularity::kPerGroup) t += " g" + std::to_string(s.group_size);
  if (!s.symmetric) t += " asymmetric";
  return t;
}

// Runs the GEMM into an F32 [m, n] output poisoned with NaN.
inline Status run_f32(const GemmOperand& a, const GemmOperand& b, int64_t m, int64_t n, const float* bias,
                      std::vector<float>* c) {
  c->assign(static_cast<size_t>(m * n), kNaN);
  GemmOptions options;
  options.bias = bias;
  return quantized_gemm(a, b, matrix_view(c->data(), m, n), options);
}

inline int64_t count_nan(const std::vector<float>& c) {
  int64_t n = 0;
  for (float v : c) n += std::isnan(v) ? 1 : 0;
  return n;
}

inline std::vector<double> dequantized(const QuantizedTensor& q) {
  Tensor out(DType::kF64, {q.rows, q.cols});
  const Status st = dequantize(q, out.view());
  EXPECT_TRUE(st.ok()) << st.to_string();
  const double* p = out.data_as<double>();
  return std::vector<double>(p, p + out.numel());
}

inline std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// C[m, n] = sum_k A[m, k] B[n, k] (+ bias[n]) in float64.
inline std::vector<double> reference_gemm(const std::vector<double>& a, const std::vector<double>& b,
                                          int64_t m_size, int64_t n_size, int64_t k_size,
                                          const float* bias) {
  std::vector<double> c(static_cast<size_t>(m_size * n_size));
  for (int64_t m = 0; m < m_size; ++m)
    for (int64_t n = 0; n < n_size; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < k_size; ++k) acc += a[m * k_size + k] * b[n * k_size + k];
      if (bias != nullptr) acc += bias[n];
      c[m * n_size + n] = acc;
    }
  return c;
}

inline double rel_frobenius(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// A quantized tensor built code by code: every element's value in the scaled domain is an
// integer v in [-2, 2] (FP8: the code of v; integers: v + zero point), every scale a power of
// two 2^[-2, 2], zero points in [-5, 5]. `real` holds the exact dequantized values.
struct GridTensor {
  QuantizedTensor q;
  std::vector<double> real;
};

inline GridTensor grid_tensor(DType format, int64_t rows, int64_t cols, BlockShape block, bool asymmetric,
                              uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> value(-2, 2), exponent(-2, 2), zero_point(-5, 5);
  const int64_t sr = (rows + block.rows - 1) / block.rows, sc = (cols + block.cols - 1) / block.cols;
  GridTensor t;
  QuantizedTensor& q = t.q;
  q.spec.format = format;
  q.spec.symmetric = !asymmetric;
  q.rows = rows;
  q.cols = cols;
  q.data = Tensor(format, {rows, cols});
  q.scales.block = block;
  q.scales.scales = Tensor(DType::kF32, {sr, sc});
  if (asymmetric) q.scales.zero_points = Tensor(DType::kI32, {sr, sc});
  float* scales = q.scales.scales.data_as<float>();
  for (int64_t i = 0; i < sr * sc; ++i) {
    scales[i] = std::ldexp(1.0f, exponent(rng));
    if (asymmetric) q.scales.zero_points.data_as<int32_t>()[i] = zero_point(rng);
  }
  uint8_t* bytes = q.data.data_as<uint8_t>();
  t.real.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int v = value(rng);
      const int64_t si = (r / block.rows) * sc + c / block.cols;
      const int32_t zp = asymmetric ? q.scales.zero_points.data_as<int32_t>()[si] : 0;
      const int64_t i = r * cols + c;
      if (is_fp8(format)) {
        bytes[i] = float_to_fp8(static_cast<float>(v), format);
      } else if (format == DType::kI8) {
        bytes[i] = static_cast<uint8_t>(static_cast<int8_t>(v + zp));
      } else {  // INT4: low nibble first
        const uint8_t nibble = static_cast<uint8_t>(static_cast<uint32_t>(v + zp) & 0xFu);
        bytes[i / 2] = static_cast<uint8_t>(bytes[i / 2] | (i % 2 == 0 ? nibble : nibble << 4));
      }
      t.real[i] = static_cast<double>(v) * scales[si];
    }
  return t;
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = float_to_bf16_bits(x[i]);
  return out;
}

}  // namespace gemm_test
}  // namespace llmq
