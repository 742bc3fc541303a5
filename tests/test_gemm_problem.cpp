// Host-only tests of the cuBLASLt GEMM's problem checks and scale layouts
// (src/cuda/cuda_gemm_problem.cpp): no GPU needed, so they run everywhere. The GPU results are in
// test_cuda_fp8_gemm.cu.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "llmq/cuda_gemm.hpp"

namespace llmq {
namespace {

// Fake, suitably aligned "device" addresses: can_implement only looks at their alignment.
const void* addr(uintptr_t a) { return reinterpret_cast<const void*>(a); }

CudaGemmProblem fp8_problem() {
  CudaGemmProblem p;
  p.m = 16;
  p.n = 208;
  p.k = 336;
  p.a.data = addr(0x10000);
  p.b.data = addr(0x20000);
  p.d = const_cast<void*>(addr(0x30000));
  p.a.scales = static_cast<const float*>(addr(0x40000));
  p.b.scales = static_cast<const float*>(addr(0x40100));
  return p;
}

bool mentions(const Status& st, const std::string& text) {
  return st.message().find(text) != std::string::npos;
}

TEST(CudaGemmProblem, DocumentedCombinationsPassOnSm90) {
  const GemmScaleMode t = GemmScaleMode::kTensor, o = GemmScaleMode::kOuterVector,
                      v = GemmScaleMode::kBlock1x128, b = GemmScaleMode::kBlock128x128;
  const std::pair<GemmScaleMode, GemmScaleMode> ok[] = {{t, t}, {o, o}, {v, b}, {v, v}, {b, v}};
  for (const auto& modes : ok)
    for (DType out : {DType::kBF16, DType::kF32}) {
      CudaGemmProblem p = fp8_problem();
      p.a.scale_mode = modes.first;
      p.b.scale_mode = modes.second;
      p.d_dtype = out;
      const Status st = cuda_gemm_can_implement(p, 9, 0);
      EXPECT_TRUE(st.ok()) << describe(p) << ": " << st.to_string();
    }
  const std::pair<GemmScaleMode, GemmScaleMode> refused[] = {{t, o}, {o, t}, {t, v}, {b, t},
                                                             {o, v}, {b, b}};
  for (const auto& modes : refused) {
    CudaGemmProblem p = fp8_problem();
    p.a.scale_mode = modes.first;
    p.b.scale_mode = modes.second;
    const Status st = cuda_gemm_can_implement(p, 9, 0);
    EXPECT_EQ(st.code(), StatusCode::kUnsupported) << describe(p);
  }
}

TEST(CudaGemmProblem, DeviceGenerations) {
  CudaGemmProblem p = fp8_problem();
  EXPECT_TRUE(mentions(cuda_gemm_can_implement(p, 8, 0), "sm_89 or newer"));
  EXPECT_TRUE(cuda_gemm_can_implement(p, 8, 9).ok());   // tensor-wide scales on Ada
  EXPECT_TRUE(cuda_gemm_can_implement(p, 10, 0).ok());  // and on Blackwell
  p.a.scale_mode = p.b.scale_mode = GemmScaleMode::kOuterVector;
  EXPECT_TRUE(mentions(cuda_gemm_can_implement(p, 8, 9), "sm_90 only"));
  EXPECT_TRUE(mentions(cuda_gemm_can_implement(p, 10, 0), "sm_90 only"));
  CudaGemmProblem bf16 = fp8_problem();
  bf16.a.dtype = bf16.b.dtype = DType::kBF16;
  bf16.a.scales = bf16.b.scales = nullptr;
  EXPECT_TRUE(cuda_gemm_can_implement(bf16, 8, 0).ok());  // BF16 needs no FP8 tensor cores
}

TEST(CudaGemmProblem, AlignmentAndShapes) {
  CudaGemmProblem p = fp8_problem();
  p.m = 333;  // any M with tensor or outer-vector scales
  EXPECT_TRUE(cuda_gemm_can_implement(p, 9, 0).ok());
  p.m = 1;
  EXPECT_TRUE(cuda_gemm_can_implement(p, 9, 0).ok());
  p.k = 328;
  EXPECT_TRUE(mentions(cuda_gemm_can_implement(p, 9, 0), "K = 328 is not a multiple of 16"));
  p = fp8_problem();
  p.n = 200;
  EXPECT_TRUE(mentions(cuda_gemm_can_implement(p, 9, 0), "N = 200 is not a multiple of 16"));
  p = fp8_problem();
  p.a.row_stride = 344;  // 344 bytes: not 16-byte aligned rows
  EXPECT_TRUE(mentions(cuda_gemm_can_implement(p, 9, 0), "a.row_stride"));
  p.a.row_stride = 352;
  EXPECT_TRUE(cuda_gemm_can_implement(p, 9, 0).ok());
  p = fp8_problem();
  p.d_row_stride = 212;  // 424 bytes of BF16: not a multiple of 16
  EXPECT_TRUE(mentions(cuda_gemm_can_implement(p, 9, 0), "d_row_stride"));
  p.d_row_stride = 216;
  EXPECT_TRUE(cuda_gemm_can_implement(p, 9, 0).ok());
  p = fp8_problem();
  p.a.scale_mode = GemmScaleMode::kBlock1x128;
  p.b.scale_mode = GemmScaleMode::kBlock128x128;
  p.b.scales = static_cast<const float*>(addr(0x40104));  // 4-byte aligned: enough for a scalar only
  EXPECT_TRUE(mentions(cuda_gemm_can_implement(p, 9, 0), "b.scales is not 16-byte aligned"));
  p.b.scales = static_cast<const float*>(addr(0x40110));
  EXPECT_TRUE(cuda_gemm_can_implement(p, 9, 0).ok());
  p.m = 18;
  EXPECT_TRUE(mentions(cuda_gemm_can_implement(p, 9, 0), "multiples of 4, M = 18"));
  // BF16 operands: 16-byte rows are 8 elements.
  CudaGemmProblem bf16 = fp8_problem();
  bf16.a.dtype = bf16.b.dtype = DType::kBF16;
  bf16.a.scales = bf16.b.scales = nullptr;
  bf16.k = 328;
  bf16.n = 200;
  EXPECT_TRUE(cuda_gemm_can_implement(bf16, 9, 0).ok());
  bf16.k = 324;
  EXPECT_TRUE(mentions(cuda_gemm_can_implement(bf16, 9, 0), "multiple of 8"));
}

TEST(CudaGemmProblem, BiasTypeFollowsCublasLt) {
  CudaGemmProblem p = fp8_problem();
  p.bias = addr(0x50000);
  p.d_dtype = DType::kF32;
  EXPECT_EQ(required_bias_dtype(p), DType::kBF16);  // FP8 with FP32 output still takes BF16
  p.bias_dtype = DType::kF32;
  EXPECT_TRUE(mentions(cuda_gemm_can_implement(p, 9, 0), "takes a bf16 bias"));
  p.bias_dtype = DType::kBF16;
  EXPECT_TRUE(cuda_gemm_can_implement(p, 9, 0).ok());
  p.a.dtype = p.b.dtype = DType::kBF16;
  p.a.scales = p.b.scales = nullptr;
  EXPECT_EQ(required_bias_dtype(p), DType::kF32);
}

TEST(CudaGemmProblem, BatchKeepsTensorScales) {
  CudaGemmProblem p = fp8_problem();
  p.batch = 8;
  p.a.batch_stride = p.m * p.k + 16;
  EXPECT_TRUE(cuda_gemm_can_implement(p, 9, 0).ok());
  p.a.batch_stride = p.m * p.k + 8;
  EXPECT_TRUE(mentions(cuda_gemm_can_implement(p, 9, 0), "a.batch_stride"));
  p = fp8_problem();
  p.batch = 8;
  p.a.scale_mode = p.b.scale_mode = GemmScaleMode::kOuterVector;
  EXPECT_TRUE(mentions(cuda_gemm_can_implement(p, 9, 0), "no batch stride for scale tensors"));
}

// Scale layouts: index formulas of the header comment, checked element by element.
TEST(CudaGemmProblem, PackScalesForCublasLt) {
  const int64_t rows = 260, k = 336;  // L = 3 blocks along K (last partial), L4 = 4
  const int64_t blocks = 3, blocks4 = 4, row_blocks = 3;
  EXPECT_EQ(row_major_scale_count(GemmScaleMode::kBlock1x128, rows, k), rows * blocks);
  EXPECT_EQ(cublaslt_scale_count(GemmScaleMode::kBlock1x128, rows, k), rows * blocks);
  EXPECT_EQ(row_major_scale_count(GemmScaleMode::kBlock128x128, rows, k), row_blocks * blocks);
  EXPECT_EQ(cublaslt_scale_count(GemmScaleMode::kBlock128x128, rows, k), row_blocks * blocks4);
  EXPECT_EQ(cublaslt_scale_count(GemmScaleMode::kBlock128x128, rows, 512), row_blocks * 4);
  EXPECT_EQ(cublaslt_scale_count(GemmScaleMode::kOuterVector, rows, k), rows);
  EXPECT_EQ(cublaslt_scale_count(GemmScaleMode::kTensor, rows, k), 1);

  std::vector<float> src(static_cast<size_t>(rows * blocks));
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) + 0.5f;
  std::vector<float> vec(static_cast<size_t>(rows * blocks), -1.0f);
  ASSERT_TRUE(pack_scales_for_cublaslt(GemmScaleMode::kBlock1x128, rows, k, src.data(), vec.data()).ok());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t kb = 0; kb < blocks; ++kb)
      ASSERT_EQ(vec[kb * rows + r], src[r * blocks + kb]) << r << ", " << kb;

  std::vector<float> blk(static_cast<size_t>(row_blocks * blocks4), -1.0f);
  ASSERT_TRUE(pack_scales_for_cublaslt(GemmScaleMode::kBlock128x128, rows, k, src.data(), blk.data()).ok());
  for (int64_t rb = 0; rb < row_blocks; ++rb)
    for (int64_t kb = 0; kb < blocks4; ++kb)
      ASSERT_EQ(blk[rb * blocks4 + kb], kb < blocks ? src[rb * blocks + kb] : 0.0f) << rb << ", " << kb;
}

TEST(CudaGemmProblem, DescribeNamesTheProblem) {
  CudaGemmProblem p = fp8_problem();
  p.a.scale_mode = GemmScaleMode::kBlock1x128;
  p.b.scale_mode = GemmScaleMode::kBlock128x128;
  EXPECT_EQ(describe(p), "fp8 gemm M=16 N=208 K=336 batch=1 a=e4m3/1x128 b=e4m3/128x128 out=bf16");
}

}  // namespace
}  // namespace llmq
