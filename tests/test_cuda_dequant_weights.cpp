// The W8A16 dequantized GEMM's two kernels against the host. dequantize_weights_bf16
// (src/runtime/dequant_weights.hpp): every E4M3 and INT8 code, an odd row count; each output's
// bits equal the code's value (exact in BF16), NaN codes give NaN.
// scale_columns_to_bf16 (scale_columns.hpp): bf16(0 + sum * scale[column]) bit for bit, -0 sums to
// +0, an output row stride wider than the row, odd sizes. Argument errors name the problem (host only).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda_support.hpp"
#include "llmq/format.hpp"
#include "runtime/dequant_weights.hpp"
#include "runtime/scale_columns.hpp"

namespace llmq {
namespace {

using testing::DeviceBuffer;

TEST(DequantWeights, EveryCodeIsItsValueExactly) {
  LLMQ_REQUIRE_GPU();
  constexpr int64_t kRows = 37, kCols = 272;
  std::mt19937 rng(5);
  std::vector<uint8_t> codes(static_cast<size_t>(kRows * kCols));
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i < 256 ? i : rng() & 0xFF);
  DeviceBuffer<uint8_t> d_codes(codes.size());
  DeviceBuffer<uint16_t> d_out(codes.size());
  ASSERT_TRUE(d_codes.ok() && d_out.ok());
  CUDA_ASSERT(d_codes.upload(codes));
  for (DType dt : {DType::kE4M3, DType::kI8}) {
    CUDA_ASSERT(d_out.fill_bytes(0xAB));
    const Status st = runtime::dequantize_weights_bf16(d_codes.get(), dt, kRows, kCols, d_out.get(), nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<uint16_t> out;
    CUDA_ASSERT(d_out.download(&out));
    int64_t nan_codes = 0;
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t c = 0; c < kCols; ++c) {
        const size_t i = static_cast<size_t>(r * kCols + c);
        const float value = dt == DType::kI8 ? static_cast<float>(static_cast<int8_t>(codes[i])) : fp8_to_float(codes[i], dt);
        if (std::isnan(value)) {
          ++nan_codes;
          ASSERT_TRUE(std::isnan(bf16_bits_to_float(out[i]))) << "code " << int{codes[i]} << " at (" << r << ", " << c << ")";
          continue;
        }
        ASSERT_EQ(out[i], float_to_bf16_bits(value)) << dtype_name(dt) << " code " << int{codes[i]} << " at (" << r << ", "
                                                     << c << ")";
        ASSERT_EQ(bf16_bits_to_float(out[i]), value) << "BF16 holds every 8-bit code's value";
      }
    if (dt == DType::kE4M3) EXPECT_GE(nan_codes, 2) << "the case holds both E4M3 NaN codes";
  }
}

TEST(DequantWeights, ColumnScalesRoundEachSumOnce) {
  LLMQ_REQUIRE_GPU();
  constexpr int64_t kRows = 19, kCols = 203, kLdOut = 211;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 30.0f);
  std::vector<float> sums(static_cast<size_t>(kRows * kCols)), scales(kCols);
  for (float& v : sums) v = normal(rng) * (rng() % 17 == 0 ? 1e4f : 1.0f);
  sums[3] = -0.0f;
  sums[7] = 0.0f;
  for (float& s : scales) s = std::exp2(static_cast<float>(static_cast<int>(rng() % 25) - 12)) * (1.0f + static_cast<float>(rng() % 100) / 101.0f);
  DeviceBuffer<float> d_sums(sums.size()), d_scales(scales.size());
  DeviceBuffer<uint16_t> d_out(static_cast<size_t>(kRows * kLdOut));
  ASSERT_TRUE(d_sums.ok() && d_scales.ok() && d_out.ok());
  CUDA_ASSERT(d_sums.upload(sums));
  CUDA_ASSERT(d_scales.upload(scales));
  CUDA_ASSERT(d_out.fill_bytes(0xAB));
  const Status st = runtime::scale_columns_to_bf16(d_sums.get(), kRows, kCols, d_scales.get(), d_out.get(), kLdOut, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<uint16_t> out;
  CUDA_ASSERT(d_out.download(&out));
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kLdOut; ++c) {
      const uint16_t got = out[static_cast<size_t>(r * kLdOut + c)];
      if (c >= kCols) {
        ASSERT_EQ(got, 0xABAB) << "wrote past the row at (" << r << ", " << c << ")";
        continue;
      }
      const float want = 0.0f + sums[static_cast<size_t>(r * kCols + c)] * scales[static_cast<size_t>(c)];
      ASSERT_EQ(got, float_to_bf16_bits(want)) << "(" << r << ", " << c << ")";
    }
  EXPECT_EQ(out[3], 0x0000) << "a -0 sum gives +0";
}

TEST(DequantWeights, ArgumentErrorsNameTheProblem) {
  alignas(16) static uint8_t codes[64];
  alignas(16) static uint16_t out[64];
  float scale = 1.0f;
  Status st = runtime::dequantize_weights_bf16(codes, DType::kBF16, 1, 16, out, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("e4m3 or int8"), std::string::npos) << st.to_string();
  st = runtime::dequantize_weights_bf16(codes, DType::kE4M3, 1, 24, out, nullptr);
  EXPECT_NE(st.message().find("multiple of 16"), std::string::npos) << st.to_string();
  st = runtime::dequantize_weights_bf16(codes + 1, DType::kE4M3, 1, 16, out, nullptr);
  EXPECT_NE(st.message().find("16-byte aligned"), std::string::npos) << st.to_string();
  EXPECT_TRUE(runtime::dequantize_weights_bf16(codes, DType::kE4M3, 0, 16, out, nullptr).ok()) << "no rows: nothing";
  st = runtime::scale_columns_to_bf16(nullptr, 2, 8, &scale, out, 7, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << "output rows narrower than the row";
}

}  // namespace
}  // namespace llmq
