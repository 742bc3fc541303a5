// GPU tests of the cuBLASLt GEMM runner (include/llmq/cuda_gemm.hpp), each against the CPU
// reference quantized_gemm run on the very same quantized operands (so only the GEMM is measured):
//  * Exact: FP8 codes that are small integers and power-of-two scales, so every partial sum, the
//    scaled accumulation and the final rounding are exact; FP32 and BF16 outputs must match the
//    reference bit for bit, for every scale mode (a misplaced block scale changes the result).
//  * Realistic: outlier activations x Gaussian weights quantized by llmq::quantize per tensor,
//    per token x per channel, and 1x128 x 128x128; relative Frobenius error below
//    kRelFrobError, with M in {1, 16, 128, 333}, K not a multiple of 128, partial 128-row blocks.
// The plumbing (strides, batches, plan cache, layouts, can_implement) is tested in
// test_cuda_fp8_gemm_plumbing.cu. Every test SKIPs (visibly) without an FP8 GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_gemm_support.hpp"
#include "cuda_support.hpp"
#include "llmq/cuda_gemm.hpp"
#include "llmq/format.hpp"
#include "llmq/gemm.hpp"
#include "llmq/quantize_tensor.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using namespace cuda_gemm_test;  // NOLINT: the suite's shared helpers

// ---------------------------------------------------------------------------------------------
// Exact: grid operands, bit-for-bit against the reference.

TEST_F(CudaGemmTest, ExactOnGridEveryScaleModeAndOutput) {
  struct Shape {
    int64_t m, n, k;
  };
  // K = 336: three 128-blocks, the last partial, L4 padding; N = 208: a partial 128-row block.
  const Shape shapes[] = {{16, 208, 336}, {128, 256, 1024}, {132, 144, 1040}};
  uint64_t seed = 100;
  for (const ModePair& modes : kSupportedPairs)
    for (const Shape& s : shapes)
      for (DType out : {DType::kF32, DType::kBF16})
        for (bool with_bias : {false, true}) {
          ++seed;
          const QuantizedTensor qa = grid_operand(DType::kE4M3, modes.a, s.m, s.k, seed);
          const QuantizedTensor qb = grid_operand(DType::kE4M3, modes.b, s.n, s.k, seed + 7);
          std::vector<float> bias(static_cast<size_t>(s.n));
          for (int64_t i = 0; i < s.n; ++i) bias[i] = 0.5f * static_cast<float>(i % 7 - 3);
          const std::vector<float> want = reference(qa, qb, out, with_bias ? &bias : nullptr);

          const DeviceOperand da = upload_operand(qa), db = upload_operand(qb);
          const DeviceBuffer dbias = upload(to_bf16_bits(bias));
          const size_t out_bytes = static_cast<size_t>(s.m * s.n * (out == DType::kBF16 ? 2 : 4));
          const DeviceBuffer dd = poisoned(out_bytes);
          CudaGemmProblem p = problem_of(s.m, s.n, s.k,
                                         input_of(da, DType::kE4M3, modes.a),
                                         input_of(db, DType::kE4M3, modes.b), dd.get());
          p.d_dtype = out;
          if (with_bias) p.bias = dbias.get();
          const std::string what = describe(p) + " seed=" + std::to_string(seed);
          const Status st = run(p);
          if (with_bias && st.code() == StatusCode::kUnsupported) {
            // cuBLASLt does not promise a bias epilogue with every scale mode: report, not fail.
            std::printf("[ refused ] %s: %s\n", what.c_str(), st.message().c_str());
            continue;
          }
          ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
          const std::vector<uint8_t> got = download(dd);
          int64_t mismatches = 0, first = -1;
          for (int64_t i = 0; i < s.m * s.n; ++i) {
            const uint32_t g = output_bits(got, out, i);
            const float w = want[i];
            const uint32_t wb = out == DType::kBF16 ? float_to_bf16_bits(w) : [&] {
              uint32_t b;
              std::memcpy(&b, &w, 4);
              return b;
            }();
            if (g != wb) {
              if (first < 0) first = i;
              ++mismatches;
            }
          }
          EXPECT_EQ(mismatches, 0) << what << ": first at (" << first / s.n << ", " << first % s.n
                                   << ") got " << (first >= 0 ? output_value(got, out, first) : 0.0f)
                                   << " want " << (first >= 0 ? want[first] : 0.0f);
        }
}

TEST_F(CudaGemmTest, NullTensorScalesMeanOne) {
  const int64_t m = 16, n = 64, k = 128;
  QuantizedTensor qa = grid_operand(DType::kE4M3, GemmScaleMode::kTensor, m, k, 5);
  QuantizedTensor qb = grid_operand(DType::kE4M3, GemmScaleMode::kTensor, n, k, 6);
  qa.scales.scales.data_as<float>()[0] = 1.0f;
  qb.scales.scales.data_as<float>()[0] = 1.0f;
  const std::vector<float> want = reference(qa, qb, DType::kF32, nullptr);
  const DeviceOperand da = upload_operand(qa), db = upload_operand(qb);
  const DeviceBuffer dd = poisoned(static_cast<size_t>(m * n * 4));
  CudaGemmProblem p = problem_of(m, n, k,
                                 input_of(da, DType::kE4M3, GemmScaleMode::kTensor),
                                 input_of(db, DType::kE4M3, GemmScaleMode::kTensor), dd.get());
  p.a.scales = nullptr;
  p.b.scales = nullptr;
  p.d_dtype = DType::kF32;
  const Status st = run(p);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const std::vector<uint8_t> got = download(dd);
  for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(output_value(got, DType::kF32, i), want[i]) << i;
}

// ---------------------------------------------------------------------------------------------
// Realistic: llmq::quantize on outlier data.

struct RealisticCase {
  int64_t m, n, k;
  GemmScaleMode mode_a, mode_b;
  DType format_a, format_b;
  DType out;
  bool bias;
  uint64_t seed;
};

// Quantizes, runs on the GPU and on the CPU, compares; returns the measured error (or -1).
double check_realistic(CudaGemmRunner* runner, void* workspace, cudaStream_t stream,
                       const RealisticCase& c) {
  const std::vector<float> x = testing::outlier_matrix(c.m, c.k, c.seed);
  const std::vector<float> w = testing::normal_vector(c.n * c.k, c.seed + 1, 0.05f);
  QuantizedTensor qa, qb;
  const Status qa_st = quantize(matrix_view(x.data(), c.m, c.k), spec_of(c.mode_a, c.format_a, false), &qa);
  EXPECT_TRUE(qa_st.ok()) << qa_st.to_string();
  const Status qb_st = quantize(matrix_view(w.data(), c.n, c.k), spec_of(c.mode_b, c.format_b, true), &qb);
  EXPECT_TRUE(qb_st.ok()) << qb_st.to_string();
  const std::vector<float> bias = bf16_grid_bias(c.n, c.seed + 2);
  const std::vector<float> want = reference(qa, qb, c.out, c.bias ? &bias : nullptr);

  const DeviceOperand da = upload_operand(qa), db = upload_operand(qb);
  const DeviceBuffer dbias = upload(to_bf16_bits(bias));
  const DeviceBuffer dd = poisoned(static_cast<size_t>(c.m * c.n * (c.out == DType::kBF16 ? 2 : 4)));
  CudaGemmProblem p = problem_of(c.m, c.n, c.k, input_of(da, c.format_a, c.mode_a), input_of(db, c.format_b, c.mode_b), dd.get());
  p.d_dtype = c.out;
  if (c.bias) p.bias = dbias.get();
  const std::string what = describe(p) + " " + testing::repro(c.seed, c.m, c.k, "outlier x normal");
  const Status st = runner->run(p, workspace, kWorkspaceBytes, stream);
  EXPECT_TRUE(st.ok()) << what << ": " << st.to_string();
  if (!st.ok()) return -1.0;
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << what;
  int64_t nans = 0;
  const std::vector<float> got = read_output(download(dd), c.out, c.m, c.n, c.n, 0, &nans);
  EXPECT_EQ(nans, 0) << what << ": unwritten (NaN-poisoned) outputs";
  const double err = rel_frobenius(got, want);
  EXPECT_LT(err, kRelFrobError) << what;
  std::printf("[ measured ] rel frobenius %.3e  %s\n", err, what.c_str());
  return err;
}

TEST_F(CudaGemmTest, RealisticTensorAndOuterVectorScales) {
  const int64_t ms[] = {1, 16, 128, 333};
  struct NK {
    int64_t n, k;
  };
  const NK nks[] = {{208, 336}, {512, 1024}};
  const ModePair pairs[] = {{GemmScaleMode::kTensor, GemmScaleMode::kTensor},
                            {GemmScaleMode::kOuterVector, GemmScaleMode::kOuterVector}};
  uint64_t seed = 1000;
  for (const ModePair& modes : pairs)
    for (int64_t m : ms)
      for (const NK& nk : nks)
        for (DType out : {DType::kBF16, DType::kF32}) {
          ++seed;
          const RealisticCase c{m, nk.n, nk.k, modes.a, modes.b, DType::kE4M3, DType::kE4M3,
                                out, seed % 2 == 0, seed};
          check_realistic(runner_.get(), workspace_.get(), stream_, c);
        }
}

TEST_F(CudaGemmTest, RealisticBlockScales) {
  struct Shape {
    int64_t m, n, k;
  };
  const Shape shapes[] = {{16, 208, 336}, {128, 512, 1024}, {336, 256, 1040}};
  uint64_t seed = 2000;
  for (const ModePair& modes : {ModePair{GemmScaleMode::kBlock1x128, GemmScaleMode::kBlock128x128},
                                ModePair{GemmScaleMode::kBlock1x128, GemmScaleMode::kBlock1x128}})
    for (const Shape& s : shapes)
      for (DType out : {DType::kBF16, DType::kF32}) {
        ++seed;
        const RealisticCase c{s.m, s.n, s.k, modes.a, modes.b, DType::kE4M3, DType::kE4M3,
                              out, false, seed};
        check_realistic(runner_.get(), workspace_.get(), stream_, c);
      }
}

TEST_F(CudaGemmTest, RealisticE5M2OnOneSide) {
  uint64_t seed = 3000;
  for (DType fa : {DType::kE5M2, DType::kE4M3})
    for (GemmScaleMode mode : {GemmScaleMode::kTensor, GemmScaleMode::kOuterVector}) {
      const DType fb = fa == DType::kE5M2 ? DType::kE4M3 : DType::kE5M2;
      const RealisticCase c{128, 208, 336, mode, mode, fa, fb, DType::kBF16, true, ++seed};
      check_realistic(runner_.get(), workspace_.get(), stream_, c);
    }
}

}  // namespace
}  // namespace llmq
