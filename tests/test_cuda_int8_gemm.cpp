// GPU tests of the INT8 GEMM (include/llmq/cuda_int8_gemm.hpp), every kernel and tile width:
//  * Exact: random int8 codes over the full range [-128, 127] (plus rows of -128 and 127, so the
//    largest |sum| K * 2^14 occurs); the INT32 accumulators must equal an int64 host product
//    exactly (whole output for small shapes, sampled rows and columns for large ones) and every
//    kernel must agree with every other over the whole output.
//  * BF16: the descaled output equals the same float32 arithmetic applied on the host to the
//    verified accumulators (bit for bit), and the CPU reference llmq::quantized_gemm on per-token x
//    per-channel INT8 tensors made by llmq::quantize (within one BF16 ulp; expected exact).
//  * Each run writes over a different poison (NaN / sentinel), so unwritten elements fail, and
//    the two runs must agree byte for byte (determinism).
// Without a GPU every test here SKIPS with the reason.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_support.hpp"
#include "llmq/cuda_int8_gemm.hpp"
#include "llmq/format.hpp"
#include "llmq/gemm.hpp"
#include "llmq/quantize_tensor.hpp"
#include "support.hpp"

namespace llmq {
namespace {

// ---------------------------------------------------------------------------------------------
// Helpers

using ::llmq::testing::DeviceBuffer;

struct Shape {
  int64_t m, n, k;
};

std::string shape_text(const Shape& s) {
  return "M=" + std::to_string(s.m) + " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k);
}

Int8GemmConfig wgmma_config(int block_m, int block_n) {
  Int8GemmConfig c;
  c.kernel = Int8GemmKernel::kWgmma;
  c.block_m = block_m;
  c.block_n = block_n;
  return c;
}

// The kernels under test. A wgmma entry is skipped on GPUs other than sm_90 (kUnsupported). The
// 64-row tiles (both consumer warpgroups on the same rows, half the columns each) must give the
// 128-row tiles' bits.
struct KernelCase {
  const char* name;
  Int8GemmConfig config;
};
std::vector<KernelCase> kernel_cases() {
  return {
      {"mma_sync", {Int8GemmKernel::kMmaSync, 0}},
      {"wgmma_bm128_bn64", wgmma_config(128, 64)},
      {"wgmma_bm128_bn128", wgmma_config(128, 128)},
      {"wgmma_bm128_bn256", wgmma_config(128, 256)},
      {"wgmma_bm64_bn128", wgmma_config(64, 128)},
      {"wgmma_bm64_bn256", wgmma_config(64, 256)},
      {"auto", {Int8GemmKernel::kAuto, 0}},
  };
}

// Uniform codes over [-128, 127]; row 0 of every operand is all -128 and row 1 all 127, so the
// product of rows 0 reaches +K * 2^14 and rows 0 x 1 reach -K * 127 * 128.
std::vector<int8_t> random_codes(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> code(-128, 127);
  std::vector<int8_t> v(static_cast<size_t>(rows * cols));
  for (auto& x : v) x = static_cast<int8_t>(code(rng));
  for (int64_t c = 0; c < cols; ++c) {
    if (rows > 0) v[static_cast<size_t>(c)] = -128;
    if (rows > 1) v[static_cast<size_t>(cols + c)] = 127;
  }
  return v;
}

int64_t dot_int64(const int8_t* a, const int8_t* b, int64_t k) {
  int64_t sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += static_cast<int64_t>(a[i]) * b[i];
  return sum;
}

// Rows (or columns) to check against the host product: all of them when the full product is
// cheap, else the first two, the last, and `samples` random ones.
std::vector<int64_t> sample_indices(int64_t extent, bool all, int samples, uint64_t seed) {
  std::vector<int64_t> idx;
  if (all) {
    for (int64_t i = 0; i < extent; ++i) idx.push_back(i);
    return idx;
  }
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, extent - 1);
  idx = {0, std::min<int64_t>(1, extent - 1), extent - 1};
  for (int i = 0; i < samples; ++i) idx.push_back(pick(rng));
  std::sort(idx.begin(), idx.end());
  idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
  return idx;
}

// The epilogue of the CPU reference (src/ref/gemm.cpp, one K segment) on one accumulator; this
// file is compiled without FMA contraction, like the reference.
uint16_t reference_bf16(int32_t acc, float sa, float sb, const float* bias, int64_t n) {
  const float descale = sa * sb;
  float v = 0.0f;
  v += static_cast<float>(acc) * descale;
  if (bias != nullptr) v += bias[n];
  return float_to_bf16_bits(v);
}

// Distance in BF16 ulps between two finite values of the same sign class (monotone bit order).
int64_t bf16_ulp_distance(uint16_t x, uint16_t y) {
  auto ordered = [](uint16_t b) -> int64_t {
    return (b & 0x8000u) ? -static_cast<int64_t>(b & 0x7FFFu) : static_cast<int64_t>(b);
  };
  return std::llabs(ordered(x) - ordered(y));
}

bool is_wgmma_unsupported(const Status& st, const KernelCase& kc) {
  return !st.ok() && st.code() == StatusCode::kUnsupported &&
         kc.config.kernel == Int8GemmKernel::kWgmma;
}

// ---------------------------------------------------------------------------------------------
// Argument checks (host only; no GPU needed)

TEST(CudaInt8Gemm, CanImplementNamesTheReason) {
  EXPECT_TRUE(cuda_int8_gemm_can_implement(1, 16, 16).ok());
  EXPECT_TRUE(cuda_int8_gemm_can_implement(0, 0, 16).ok());
  EXPECT_TRUE(cuda_int8_gemm_can_implement(333, 515, kMaxInt8SegmentK - kMaxInt8SegmentK % 16).ok());
  const Status not16 = cuda_int8_gemm_can_implement(16, 16, 24);
  EXPECT_FALSE(not16.ok());
  EXPECT_NE(not16.message().find("k: must be a positive multiple of 16"), std::string::npos)
      << not16.to_string();
  EXPECT_FALSE(cuda_int8_gemm_can_implement(16, 16, 0).ok());
  EXPECT_FALSE(cuda_int8_gemm_can_implement(-1, 16, 16).ok());
  EXPECT_FALSE(cuda_int8_gemm_can_implement(16, -1, 16).ok());
  const Status too_long = cuda_int8_gemm_can_implement(16, 16, 131072);
  EXPECT_EQ(too_long.code(), StatusCode::kUnsupported) << too_long.to_string();
  EXPECT_NE(too_long.message().find("kMaxInt8SegmentK"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Exact INT32 accumulators

class CudaInt8GemmExact : public ::testing::TestWithParam<Shape> {};

TEST_P(CudaInt8GemmExact, Int32MatchesHostProductAndEveryKernel) {
  LLMQ_REQUIRE_GPU();
  const Shape s = GetParam();
  const uint64_t seed = static_cast<uint64_t>(s.m * 1000003 + s.n * 1009 + s.k);
  const std::vector<int8_t> a = random_codes(s.m, s.k, seed);
  const std::vector<int8_t> b = random_codes(s.n, s.k, seed + 1);
  DeviceBuffer<int8_t> da(a.size()), db(b.size());
  DeviceBuffer<int32_t> dd(static_cast<size_t>(s.m * s.n));
  ASSERT_TRUE(da.ok() && db.ok() && dd.ok());
  CUDA_ASSERT(da.upload(a));
  CUDA_ASSERT(db.upload(b));

  // Host int64 product on the checked rows (all columns) and checked columns (all rows).
  const bool full = s.m * s.n * s.k <= (int64_t{1} << 31);
  const std::vector<int64_t> rows = sample_indices(s.m, full, 24, seed + 2);
  const std::vector<int64_t> cols = sample_indices(s.n, full, 24, seed + 3);
  std::vector<int64_t> ref_rows(rows.size() * static_cast<size_t>(s.n));
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t n = 0; n < s.n; ++n)
      ref_rows[i * s.n + n] = dot_int64(&a[rows[i] * s.k], &b[n * s.k], s.k);
  std::vector<int64_t> ref_cols(cols.size() * static_cast<size_t>(s.m));
  if (!full)
    for (size_t j = 0; j < cols.size(); ++j)
      for (int64_t m = 0; m < s.m; ++m)
        ref_cols[j * s.m + m] = dot_int64(&a[m * s.k], &b[cols[j] * s.k], s.k);
  if (s.m > 0 && s.n > 0) {
    // Row 0 x column 0 is the extreme sum +K * 128 * 128.
    ASSERT_EQ(ref_rows[0], s.k * 128 * 128) << shape_text(s);
  }

  std::vector<int32_t> first;  // the first kernel's output: every other kernel must equal it
  std::string first_name;
  for (const KernelCase& kc : kernel_cases()) {
    std::vector<int32_t> out[2];
    bool skipped = false;
    for (int run = 0; run < 2; ++run) {
      CUDA_ASSERT(dd.fill_bytes(run == 0 ? 0xFF : 0x7F));  // -1, then 0x7F7F7F7F
      const Status st = cuda_int8_gemm_s32(da.get(), db.get(), dd.get(), s.m, s.n, s.k, nullptr, kc.config);
      if (is_wgmma_unsupported(st, kc)) {
        skipped = true;
        break;
      }
      ASSERT_TRUE(st.ok()) << kc.name << " " << shape_text(s) << ": " << st.to_string();
      CUDA_ASSERT(cudaDeviceSynchronize());
      CUDA_ASSERT(dd.download(&out[run]));
    }
    if (skipped) {
      std::printf("  %s: not on this GPU (sm_90 only)\n", kc.name);
      continue;
    }
    const std::string what = std::string(kc.name) + " " + shape_text(s) + " seed=" + std::to_string(seed);
    ASSERT_EQ(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(int32_t)), 0)
        << what << ": two runs over different poison differ (unwritten elements or a race)";
    int64_t bad = 0;
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t n = 0; n < s.n; ++n) {
        const int64_t got = out[0][rows[i] * s.n + n];
        const int64_t want = ref_rows[i * s.n + n];
        if (got != want && bad++ < 5)
          ADD_FAILURE() << what << ": acc[" << rows[i] << ", " << n << "] = " << got << ", want " << want;
      }
    if (!full)
      for (size_t j = 0; j < cols.size(); ++j)
        for (int64_t m = 0; m < s.m; ++m) {
          const int64_t got = out[0][m * s.n + cols[j]];
          const int64_t want = ref_cols[j * s.m + m];
          if (got != want && bad++ < 10)
            ADD_FAILURE() << what << ": acc[" << m << ", " << cols[j] << "] = " << got << ", want " << want;
        }
    EXPECT_EQ(bad, 0) << what << ": accumulators differ from the int64 host product";
    if (first.empty()) {
      first = out[0];
      first_name = kc.name;
    } else {
      int64_t diff = 0;
      size_t first_bad = 0;
      for (size_t i = 0; i < first.size(); ++i)
        if (first[i] != out[0][i] && diff++ == 0) first_bad = i;
      EXPECT_EQ(diff, 0) << what << ": differs from " << first_name << " in " << diff
                         << " elements, first at (" << first_bad / s.n << ", " << first_bad % s.n << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaInt8GemmExact,
                         ::testing::Values(Shape{1, 16, 16}, Shape{7, 100, 64}, Shape{128, 256, 128},
                                           Shape{129, 257, 144}, Shape{255, 63, 272},
                                           Shape{333, 515, 4096}, Shape{1100, 300, 256}, Shape{2048, 2048, 2048},
                                           Shape{4096, 4096, 8192}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return "M" + std::to_string(info.param.m) + "_N" + std::to_string(info.param.n) +
                                  "_K" + std::to_string(info.param.k);
                         });

// ---------------------------------------------------------------------------------------------
// BF16 output: descale epilogue and the CPU reference

struct QuantizedProblem {
  QuantizedTensor qa, qb;
  std::vector<float> bias;
};

// Activations with outlier channels per token, Gaussian weights per channel, both INT8 absmax.
void make_problem(const Shape& s, uint64_t seed, QuantizedProblem* p) {
  const std::vector<float> xa = testing::outlier_matrix(s.m, s.k, seed);
  const std::vector<float> xb = testing::normal_vector(s.n * s.k, seed + 1, 0.05f);
  ASSERT_TRUE(quantize(matrix_view(xa.data(), s.m, s.k), QuantSpec::per_token(DType::kI8), &p->qa).ok());
  ASSERT_TRUE(quantize(matrix_view(xb.data(), s.n, s.k), QuantSpec::per_channel(DType::kI8), &p->qb).ok());
  p->bias = testing::normal_vector(s.n, seed + 2, 0.5f);
}

class CudaInt8GemmBf16 : public ::testing::TestWithParam<Shape> {};

TEST_P(CudaInt8GemmBf16, MatchesEpilogueOfAccumulatorsAndCpuReference) {
  LLMQ_REQUIRE_GPU();
  const Shape s = GetParam();
  const uint64_t seed = static_cast<uint64_t>(7 * s.m + 13 * s.n + s.k);
  QuantizedProblem prob;
  ASSERT_NO_FATAL_FAILURE(make_problem(s, seed, &prob));
  const int8_t* ha = prob.qa.data.data_as<int8_t>();
  const int8_t* hb = prob.qb.data.data_as<int8_t>();
  const std::vector<int8_t> a(ha, ha + s.m * s.k);
  const std::vector<int8_t> b(hb, hb + s.n * s.k);
  const float* sa_ptr = prob.qa.scales.scales.data_as<float>();
  const float* sb_ptr = prob.qb.scales.scales.data_as<float>();
  const std::vector<float> scale_a(sa_ptr, sa_ptr + s.m);
  const std::vector<float> scale_b(sb_ptr, sb_ptr + s.n);

  DeviceBuffer<int8_t> da(a.size()), db(b.size());
  DeviceBuffer<float> dsa(scale_a.size()), dsb(scale_b.size()), dbias(prob.bias.size());
  DeviceBuffer<uint16_t> dd(static_cast<size_t>(s.m * s.n));
  DeviceBuffer<int32_t> dacc(static_cast<size_t>(s.m * s.n));
  ASSERT_TRUE(da.ok() && db.ok() && dsa.ok() && dsb.ok() && dbias.ok() && dd.ok() && dacc.ok());
  CUDA_ASSERT(da.upload(a));
  CUDA_ASSERT(db.upload(b));
  CUDA_ASSERT(dsa.upload(scale_a));
  CUDA_ASSERT(dsb.upload(scale_b));
  CUDA_ASSERT(dbias.upload(prob.bias));

  // The CPU reference (scalar; affordable up to a few 10^9 multiply-adds).
  const bool with_cpu_reference = s.m * s.n * s.k <= (int64_t{1} << 30);
  Tensor ref_plain(DType::kBF16, {s.m, s.n}), ref_bias(DType::kBF16, {s.m, s.n});
  if (with_cpu_reference) {
    ASSERT_TRUE(quantized_gemm(GemmOperand::of(prob.qa), GemmOperand::of(prob.qb), ref_plain.view()).ok());
    GemmOptions opts;
    opts.bias = prob.bias.data();
    ASSERT_TRUE(quantized_gemm(GemmOperand::of(prob.qa), GemmOperand::of(prob.qb), ref_bias.view(), opts).ok());
  }

  for (const KernelCase& kc : kernel_cases()) {
    // The accumulators first (checked exactly by the test above), as the epilogue's input.
    const Status st_acc = cuda_int8_gemm_s32(da.get(), db.get(), dacc.get(), s.m, s.n, s.k, nullptr, kc.config);
    if (is_wgmma_unsupported(st_acc, kc)) continue;
    ASSERT_TRUE(st_acc.ok()) << st_acc.to_string();
    std::vector<int32_t> acc;
    CUDA_ASSERT(cudaDeviceSynchronize());
    CUDA_ASSERT(dacc.download(&acc));

    for (int with_bias = 0; with_bias < 2; ++with_bias) {
      const float* bias = with_bias ? prob.bias.data() : nullptr;
      const std::string what = std::string(kc.name) + " " + shape_text(s) + (with_bias ? " bias" : " no-bias") +
                               " seed=" + std::to_string(seed);
      std::vector<uint16_t> out[2];
      for (int run = 0; run < 2; ++run) {
        CUDA_ASSERT(dd.fill_bytes(run == 0 ? 0xFF : 0x7F));  // NaN, then 0x7F7F (a finite value)
        const Status st = cuda_int8_gemm(da.get(), db.get(), dsa.get(), dsb.get(),
                                         with_bias ? dbias.get() : nullptr, dd.get(), s.m, s.n, s.k,
                                         nullptr, kc.config);
        ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
        CUDA_ASSERT(cudaDeviceSynchronize());
        CUDA_ASSERT(dd.download(&out[run]));
      }
      ASSERT_EQ(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(uint16_t)), 0)
          << what << ": two runs over different poison differ";

      int64_t epilogue_bad = 0, ref_exact_diff = 0, ref_far = 0;
      const Tensor& ref = with_bias ? ref_bias : ref_plain;
      const uint16_t* ref_bits = ref.data_as<uint16_t>();
      for (int64_t m = 0; m < s.m; ++m)
        for (int64_t n = 0; n < s.n; ++n) {
          const size_t i = static_cast<size_t>(m * s.n + n);
          const uint16_t want = reference_bf16(acc[i], scale_a[m], scale_b[n], bias, n);
          if (out[0][i] != want && epilogue_bad++ < 5)
            ADD_FAILURE() << what << ": d[" << m << ", " << n << "] = 0x" << std::hex << out[0][i]
                          << ", epilogue of acc " << std::dec << acc[i] << " gives 0x" << std::hex << want;
          if (with_cpu_reference && out[0][i] != ref_bits[i]) {
            ++ref_exact_diff;
            if (bf16_ulp_distance(out[0][i], ref_bits[i]) > 1 && ref_far++ < 5)
              ADD_FAILURE() << what << ": d[" << m << ", " << n << "] = 0x" << std::hex << out[0][i]
                            << ", quantized_gemm gives 0x" << ref_bits[i];
          }
        }
      EXPECT_EQ(epilogue_bad, 0) << what << ": BF16 output differs from the descaled accumulators";
      EXPECT_EQ(ref_far, 0) << what << ": more than one BF16 ulp from quantized_gemm";
      if (with_cpu_reference)
        std::printf("  %s: %lld of %lld elements differ from quantized_gemm (all within 1 ulp: %s)\n",
                    what.c_str(), static_cast<long long>(ref_exact_diff),
                    static_cast<long long>(s.m * s.n), ref_far == 0 ? "yes" : "NO");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaInt8GemmBf16,
                         ::testing::Values(Shape{1, 16, 16}, Shape{7, 100, 64}, Shape{128, 256, 128},
                                           Shape{129, 257, 144}, Shape{333, 515, 4096},
                                           Shape{2048, 2048, 2048}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return "M" + std::to_string(info.param.m) + "_N" + std::to_string(info.param.n) +
                                  "_K" + std::to_string(info.param.k);
                         });

// ---------------------------------------------------------------------------------------------
// Layout corners and errors

// An output that is not 4-byte aligned (d + 1) and an odd N take the element-by-element stores.
TEST(CudaInt8Gemm, UnalignedOutputAndOddN) {
  LLMQ_REQUIRE_GPU();
  const Shape s{37, 101, 96};
  const std::vector<int8_t> a = random_codes(s.m, s.k, 11);
  const std::vector<int8_t> b = random_codes(s.n, s.k, 12);
  std::vector<float> scale_a(static_cast<size_t>(s.m)), scale_b(static_cast<size_t>(s.n));
  for (int64_t i = 0; i < s.m; ++i) scale_a[i] = 0.001f * static_cast<float>(i + 1);
  for (int64_t i = 0; i < s.n; ++i) scale_b[i] = 0.5f / static_cast<float>(i + 3);
  DeviceBuffer<int8_t> da(a.size()), db(b.size());
  DeviceBuffer<float> dsa(scale_a.size()), dsb(scale_b.size());
  DeviceBuffer<uint16_t> dd(static_cast<size_t>(s.m * s.n) + 1);
  DeviceBuffer<int32_t> dacc(static_cast<size_t>(s.m * s.n) + 1);
  ASSERT_TRUE(da.ok() && db.ok() && dsa.ok() && dsb.ok() && dd.ok() && dacc.ok());
  CUDA_ASSERT(da.upload(a));
  CUDA_ASSERT(db.upload(b));
  CUDA_ASSERT(dsa.upload(scale_a));
  CUDA_ASSERT(dsb.upload(scale_b));
  for (const KernelCase& kc : kernel_cases()) {
    CUDA_ASSERT(dd.fill_bytes(0xFF));
    CUDA_ASSERT(dacc.fill_bytes(0xFF));
    const Status st_acc = cuda_int8_gemm_s32(da.get(), db.get(), dacc.get() + 1, s.m, s.n, s.k, nullptr, kc.config);
    if (is_wgmma_unsupported(st_acc, kc)) continue;
    ASSERT_TRUE(st_acc.ok()) << st_acc.to_string();
    const Status st = cuda_int8_gemm(da.get(), db.get(), dsa.get(), dsb.get(), nullptr, dd.get() + 1, s.m,
                                     s.n, s.k, nullptr, kc.config);
    ASSERT_TRUE(st.ok()) << st.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<uint16_t> out;
    std::vector<int32_t> acc;
    CUDA_ASSERT(dd.download(&out));
    CUDA_ASSERT(dacc.download(&acc));
    EXPECT_EQ(out[0], 0xFFFF) << kc.name << ": wrote before the output";
    EXPECT_EQ(acc[0], -1) << kc.name << ": wrote before the output";
    int64_t bad = 0;
    for (int64_t m = 0; m < s.m; ++m)
      for (int64_t n = 0; n < s.n; ++n) {
        const int64_t want = dot_int64(&a[m * s.k], &b[n * s.k], s.k);
        const size_t i = static_cast<size_t>(m * s.n + n) + 1;
        if (acc[i] != want && bad++ < 5) ADD_FAILURE() << kc.name << ": acc[" << m << ", " << n << "]";
        const uint16_t want_bf16 = reference_bf16(static_cast<int32_t>(want), scale_a[m], scale_b[n], nullptr, n);
        if (out[i] != want_bf16 && bad++ < 5) ADD_FAILURE() << kc.name << ": d[" << m << ", " << n << "]";
      }
    EXPECT_EQ(bad, 0) << kc.name;
  }
}

TEST(CudaInt8Gemm, ArgumentErrors) {
  LLMQ_REQUIRE_GPU();
  DeviceBuffer<int8_t> da(64 * 64 + 16), db(64 * 64);
  DeviceBuffer<float> ds(64);
  DeviceBuffer<uint16_t> dd(64 * 64);
  ASSERT_TRUE(da.ok() && db.ok() && ds.ok() && dd.ok());
  const Status misaligned = cuda_int8_gemm(da.get() + 1, db.get(), ds.get(), ds.get(), nullptr, dd.get(), 64, 64,
                                           64, nullptr);
  EXPECT_EQ(misaligned.code(), StatusCode::kInvalidArgument) << misaligned.to_string();
  EXPECT_NE(misaligned.message().find("a: must be 16-byte aligned"), std::string::npos) << misaligned.to_string();
  const Status null_scale = cuda_int8_gemm(da.get(), db.get(), nullptr, ds.get(), nullptr, dd.get(), 64, 64, 64, nullptr);
  EXPECT_EQ(null_scale.code(), StatusCode::kInvalidArgument) << null_scale.to_string();
  const Status bad_k = cuda_int8_gemm(da.get(), db.get(), ds.get(), ds.get(), nullptr, dd.get(), 64, 64, 40, nullptr);
  EXPECT_EQ(bad_k.code(), StatusCode::kInvalidArgument) << bad_k.to_string();
  Int8GemmConfig bad_tile;
  bad_tile.kernel = Int8GemmKernel::kMmaSync;
  bad_tile.block_n = 96;
  const Status st = cuda_int8_gemm(da.get(), db.get(), ds.get(), ds.get(), nullptr, dd.get(), 64, 64, 64, nullptr,
                                   bad_tile);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  // Empty problems are a no-op.
  EXPECT_TRUE(cuda_int8_gemm(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 64, 64, nullptr).ok());
}

TEST(CudaInt8Gemm, PlanPicksTheHopperKernelOnSm90) {
  LLMQ_REQUIRE_GPU();
  CudaDeviceInfo info;
  ASSERT_TRUE(query_cuda_device(0, &info).ok());
  Int8GemmPlan plan;
  ASSERT_TRUE(cuda_int8_gemm_plan(8192, 8192, 8192, {}, &plan).ok());
  std::printf("  8192^3 on %s: %s, tile %dx%dx%d, %d stages, grid %d, %zu B smem\n", info.name.c_str(),
              int8_gemm_kernel_name(plan.kernel), plan.block_m, plan.block_n, plan.block_k, plan.stages,
              plan.grid, plan.smem_bytes);
  if (info.major == 9 && info.minor == 0) {
    EXPECT_EQ(plan.kernel, Int8GemmKernel::kWgmma);
    EXPECT_EQ(plan.grid, info.multiprocessors);
  } else {
    EXPECT_EQ(plan.kernel, Int8GemmKernel::kMmaSync);
  }
}

// The chooser (sm_90): 128-row tiles where they fill the SMs; 64-row tiles for the few-token GEMMs
// of decode, where a 128-row tile of 64 tokens is half padding and 16-64 tiles leave SMs idle; and
// the tile sizes a config names, refusing the one it lacks.
TEST(CudaInt8Gemm, ChooserTakesSixtyFourRowTilesForFewTokens) {
  LLMQ_REQUIRE_GPU();
  CudaDeviceInfo info;
  ASSERT_TRUE(query_cuda_device(0, &info).ok());
  if (!(info.major == 9 && info.minor == 0)) GTEST_SKIP() << "the wgmma kernel is sm_90 only";
  // With 64 SMs or fewer, 64 tiles of 128 x 64 fill the GPU (or the waves favour other tiles): the
  // expectations below are for the 66-132 SM parts (H100 PCIe / SXM, H200).
  if (info.multiprocessors <= 64) GTEST_SKIP() << info.multiprocessors << " SMs: a partitioned GPU";
  Int8GemmPlan plan;
  for (int64_t m : {1, 16, 64}) {
    ASSERT_TRUE(cuda_int8_gemm_plan(m, 4096, 4096, {}, &plan).ok());
    EXPECT_EQ(plan.block_m, 64) << "m " << m;
    EXPECT_EQ(plan.block_n, 128) << "m " << m;
    EXPECT_EQ(plan.grid, 32) << "m " << m;
  }
  ASSERT_TRUE(cuda_int8_gemm_plan(4096, 4096, 4096, {}, &plan).ok());
  EXPECT_EQ(plan.block_m, 128);
  EXPECT_GE(plan.tiles, info.multiprocessors);
  ASSERT_TRUE(cuda_int8_gemm_plan(8192, 64, 4096, {}, &plan).ok());  // tall and narrow: not few tokens
  EXPECT_EQ(plan.block_m, 128);
  ASSERT_TRUE(cuda_int8_gemm_plan(64, 4096, 4096, wgmma_config(128, 0), &plan).ok());
  EXPECT_EQ(plan.block_m, 128);
  ASSERT_TRUE(cuda_int8_gemm_plan(4096, 4096, 4096, wgmma_config(64, 0), &plan).ok());
  EXPECT_EQ(plan.block_m, 64);
  EXPECT_GE(plan.block_n, 128);
  EXPECT_EQ(plan.stages, plan.block_n == 128 ? 8 : 4);
  const Status narrow = cuda_int8_gemm_plan(64, 4096, 4096, wgmma_config(64, 64), &plan);
  EXPECT_EQ(narrow.code(), StatusCode::kInvalidArgument) << narrow.to_string();
  const Status tall = cuda_int8_gemm_plan(64, 4096, 4096, wgmma_config(96, 128), &plan);
  EXPECT_EQ(tall.code(), StatusCode::kInvalidArgument) << tall.to_string();
  Int8GemmConfig mma = wgmma_config(64, 128);
  mma.kernel = Int8GemmKernel::kMmaSync;
  EXPECT_EQ(cuda_int8_gemm_plan(64, 4096, 4096, mma, &plan).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace llmq
