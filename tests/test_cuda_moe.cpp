// The dense MoE path on the GPU: one strided-batched cuBLASLt FP8 GEMM over every expert with the
// activations shared and unit scales, then cuda_moe_post_scale. Checked against (1) one GEMM per
// expert with the scales in cuBLASLt's epilogue, the note's precision claim, and (2) the CPU
// reference of the same products. Skips visibly without a GPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "cuda_support.hpp"
#include "llmq/cuda_gemm.hpp"
#include "llmq/cuda_moe.hpp"
#include "llmq/format.hpp"
#include "llmq/quantize_tensor.hpp"
#include "llmq/synthetic.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using testing::DeviceBuffer;

float bf16_value(uint16_t bits) { return bf16_bits_to_float(bits); }

// Activations quantized per token, each expert's weights per channel (or per tensor): FP8 E4M3
// codes and scales from the CPU reference quantizer.
struct MoeOperands {
  int64_t experts, tokens, k, n;
  std::vector<uint8_t> x_codes;       // [tokens, k]
  std::vector<float> x_scales;        // [tokens]
  std::vector<uint8_t> w_codes;       // [experts, n, k]
  std::vector<float> w_scales;        // [experts, n] or [experts]
  bool per_channel;
};

MoeOperands make_operands(int64_t experts, int64_t tokens, int64_t k, int64_t n, bool per_channel, uint64_t seed) {
  MoeOperands o{experts, tokens, k, n, {}, {}, {}, {}, per_channel};
  std::vector<float> x = synthetic_activations(tokens, k, seed);
  QuantizedTensor qx;
  EXPECT_TRUE(quantize(TensorView{x.data(), DType::kF32, {tokens, k}}, QuantSpec::per_token(DType::kE4M3), &qx).ok());
  o.x_codes.assign(qx.data.data_as<uint8_t>(), qx.data.data_as<uint8_t>() + tokens * k);
  o.x_scales.assign(qx.scales.scales.data_as<float>(), qx.scales.scales.data_as<float>() + tokens);
  for (int64_t e = 0; e < experts; ++e) {
    std::vector<float> w = synthetic_weights(n, k, seed + 100 + static_cast<uint64_t>(e));
    // Experts of different magnitude: the per-expert scale must matter.
    for (float& v : w) v *= static_cast<float>(1 << e);
    QuantizedTensor qw;
    const QuantSpec spec = per_channel ? QuantSpec::per_channel(DType::kE4M3) : QuantSpec::per_tensor(DType::kE4M3);
    EXPECT_TRUE(quantize(TensorView{w.data(), DType::kF32, {n, k}}, spec, &qw).ok());
    o.w_codes.insert(o.w_codes.end(), qw.data.data_as<uint8_t>(), qw.data.data_as<uint8_t>() + n * k);
    const float* s = qw.scales.scales.data_as<float>();
    o.w_scales.insert(o.w_scales.end(), s, s + (per_channel ? n : 1));
  }
  return o;
}

// The CPU reference of expert e's output row t, column j, in double.
double reference(const MoeOperands& o, int64_t e, int64_t t, int64_t j, double* magnitude) {
  double acc = 0, mag = 0;
  for (int64_t i = 0; i < o.k; ++i) {
    const double p = static_cast<double>(fp8_to_float(o.x_codes[t * o.k + i], DType::kE4M3)) *
                     fp8_to_float(o.w_codes[(e * o.n + j) * o.k + i], DType::kE4M3);
    acc += p;
    mag += std::fabs(p);
  }
  const double s = static_cast<double>(o.x_scales[t]) * o.w_scales[o.per_channel ? e * o.n + j : e];
  *magnitude = mag * s;
  return acc * s;
}

// The operands in device memory (ok() is false when an allocation or a copy failed).
struct DeviceOperands {
  DeviceBuffer<uint8_t> x, w;
  DeviceBuffer<float> xs, ws;
  bool uploaded;
  explicit DeviceOperands(const MoeOperands& o)
      : x(o.x_codes.size()), w(o.w_codes.size()), xs(o.x_scales.size()), ws(o.w_scales.size()),
        uploaded(x.ok() && w.ok() && xs.ok() && ws.ok() && x.upload(o.x_codes) == cudaSuccess &&
                 w.upload(o.w_codes) == cudaSuccess && xs.upload(o.x_scales) == cudaSuccess &&
                 ws.upload(o.w_scales) == cudaSuccess) {}
  bool ok() const { return uploaded; }
};

// Runs the dense path: batched GEMM into `y_dtype`, then the post-scale into BF16.
void run_dense_path(const MoeOperands& o, DType y_dtype, std::vector<uint16_t>* out) {
  const int64_t e = o.experts, t = o.tokens, k = o.k, n = o.n;
  DeviceOperands d(o);
  ASSERT_TRUE(d.ok());
  DeviceBuffer<uint8_t>& x = d.x;
  DeviceBuffer<uint8_t>& w = d.w;
  DeviceBuffer<float>& xs = d.xs;
  DeviceBuffer<float>& ws = d.ws;
  DeviceBuffer<float> y32(static_cast<size_t>(e * t * n));
  DeviceBuffer<uint16_t> y16(static_cast<size_t>(e * t * n)), res(static_cast<size_t>(e * t * n));
  ASSERT_TRUE(y32.ok() && y16.ok() && res.ok());
  CUDA_ASSERT(res.fill_bytes(0xFF));  // poisoned: BF16 NaN wherever the pass does not write

  std::unique_ptr<CudaGemmRunner> runner;
  ASSERT_TRUE(CudaGemmRunner::create(0, &runner).ok());
  CudaGemmProblem p;
  p.m = t;
  p.n = n;
  p.k = k;
  p.batch = e;
  p.a = {x.get(), DType::kE4M3};
  p.a.shared_across_batch = true;  // every expert multiplies the same tokens
  p.b = {w.get(), DType::kE4M3};   // [experts, n, k]: batch stride n * k by default
  p.d = y_dtype == DType::kF32 ? static_cast<void*>(y32.get()) : static_cast<void*>(y16.get());
  p.d_dtype = y_dtype;
  const Status can = runner->can_implement(p);
  ASSERT_TRUE(can.ok()) << can.to_string() << " " << describe(p);
  DeviceBuffer<uint8_t> ws_buf(static_cast<size_t>(runner->workspace_size(p)));
  ASSERT_TRUE(ws_buf.ok());
  const Status st = runner->run(p, ws_buf.get(), runner->workspace_size(p), nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();

  MoePostScale ps;
  ps.experts = e;
  ps.tokens = t;
  ps.n_cols = n;
  ps.y = p.d;
  ps.y_dtype = y_dtype;
  ps.token_scales = xs.get();
  ps.expert_scales = ws.get();
  ps.per_channel = o.per_channel;
  ps.out = res.get();
  const Status post = cuda_moe_post_scale(ps, nullptr);
  ASSERT_TRUE(post.ok()) << post.to_string();
  CUDA_ASSERT(cudaDeviceSynchronize());
  CUDA_ASSERT(res.download(out));
}

// One GEMM per expert, per-token x per-channel scales in cuBLASLt's epilogue: what the strided call
// cannot do, and what the post-scale must equal.
void run_per_expert_in_epilogue(const MoeOperands& o, std::vector<uint16_t>* out) {
  const int64_t e = o.experts, t = o.tokens, k = o.k, n = o.n;
  DeviceOperands d(o);
  ASSERT_TRUE(d.ok());
  DeviceBuffer<uint8_t>& x = d.x;
  DeviceBuffer<uint8_t>& w = d.w;
  DeviceBuffer<float>& xs = d.xs;
  DeviceBuffer<float>& ws = d.ws;
  DeviceBuffer<uint16_t> res(static_cast<size_t>(e * t * n));
  ASSERT_TRUE(res.ok());
  std::unique_ptr<CudaGemmRunner> runner;
  ASSERT_TRUE(CudaGemmRunner::create(0, &runner).ok());
  for (int64_t i = 0; i < e; ++i) {
    CudaGemmProblem p;
    p.m = t;
    p.n = n;
    p.k = k;
    p.a = {x.get(), DType::kE4M3, 0, 0, GemmScaleMode::kOuterVector, ScaleLayout::kRowMajor, xs.get()};
    p.b = {w.get() + i * n * k, DType::kE4M3, 0, 0, GemmScaleMode::kOuterVector, ScaleLayout::kRowMajor,
           ws.get() + i * n};
    p.d = res.get() + i * t * n;
    p.d_dtype = DType::kBF16;
    DeviceBuffer<uint8_t> ws_buf(static_cast<size_t>(runner->workspace_size(p)));
    const Status st = runner->run(p, ws_buf.get(), runner->workspace_size(p), nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string() << " " << describe(p);
  }
  CUDA_ASSERT(cudaDeviceSynchronize());
  CUDA_ASSERT(res.download(out));
}

struct Shape {
  int64_t experts, tokens, k, n;
};

// Mixtral-like proportions, small: 8 experts, odd token counts, K and N multiples of 16 (cuBLASLt
// FP8 rows must be 16-byte aligned).
const Shape kShapes[] = {{8, 1, 256, 512}, {8, 37, 512, 208}, {4, 129, 256, 144}};

TEST(CudaMoe, DensePathPostScaleEqualsScalesInTheEpilogue) {
  LLMQ_REQUIRE_GPU();
  for (const Shape& s : kShapes) {
    const MoeOperands o = make_operands(s.experts, s.tokens, s.k, s.n, /*per_channel=*/true, 7);
    std::vector<uint16_t> epilogue;
    run_per_expert_in_epilogue(o, &epilogue);
    for (DType y : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(testing::repro(7, s.tokens, s.k, "experts=" + std::to_string(s.experts) + " n=" +
                                                        std::to_string(s.n) + " y=" + dtype_name(y)));
      std::vector<uint16_t> dense;
      run_dense_path(o, y, &dense);
      ASSERT_EQ(dense.size(), epilogue.size());
      // F32 y: both round the same FP32 product once, up to FP32 association: at most 1 BF16 ulp.
      // BF16 y: one more rounding before the scale, at most 2 ulps (2^-7 relative).
      const double ulps = y == DType::kF32 ? 1.0 : 2.0;
      int64_t bad = 0, exact = 0;
      for (size_t i = 0; i < dense.size(); ++i) {
        const double a = bf16_value(dense[i]), b = bf16_value(epilogue[i]);
        ASSERT_FALSE(std::isnan(a)) << "element " << i << " not written";
        if (a == b) ++exact;
        const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(b), 1e-30)) - 7);
        if (std::fabs(a - b) > ulps * ulp + 1e-30) ++bad;
      }
      EXPECT_EQ(bad, 0) << bad << " of " << dense.size() << " elements beyond " << ulps << " BF16 ulp";
      std::printf("  experts %lld tokens %lld k %lld n %lld, y %s: %.1f%% equal to the epilogue-scaled GEMM\n",
                  static_cast<long long>(s.experts), static_cast<long long>(s.tokens), static_cast<long long>(s.k),
                  static_cast<long long>(s.n), dtype_name(y), 100.0 * exact / dense.size());
    }
  }
}

// Per expert, the relative Frobenius error against the CPU reference on the same codes: FP32
// accumulation in another order (and Hopper's FP8 MMA keeping fewer accumulator bits between
// cuBLASLt's promotions) plus one BF16 rounding, the bound test_cuda_fp8_gemm uses. Experts differ in
// magnitude by 2^e, so a scale applied to the wrong expert is off by 2x and up.
TEST(CudaMoe, DensePathMatchesTheCpuReference) {
  LLMQ_REQUIRE_GPU();
  for (bool per_channel : {true, false}) {
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(testing::repro(11, s.tokens, s.k, std::string(per_channel ? "per-channel" : "per-tensor") +
                                                         " experts=" + std::to_string(s.experts)));
      const MoeOperands o = make_operands(s.experts, s.tokens, s.k, s.n, per_channel, 11);
      std::vector<uint16_t> dense;
      run_dense_path(o, DType::kF32, &dense);
      double worst = 0;
      for (int64_t e = 0; e < s.experts; ++e) {
        double diff = 0, norm = 0;
        for (int64_t t = 0; t < s.tokens; ++t)
          for (int64_t j = 0; j < s.n; ++j) {
            double mag = 0;
            const double want = reference(o, e, t, j, &mag);
            const double got = bf16_value(dense[static_cast<size_t>((e * s.tokens + t) * s.n + j)]);
            diff += (got - want) * (got - want);
            norm += want * want;
          }
        const double err = std::sqrt(diff / norm);
        EXPECT_LT(err, 1e-2) << "expert " << e;
        worst = std::max(worst, err);
      }
      std::printf("  %s experts %lld tokens %lld: worst expert rel frobenius %.2e vs the CPU reference\n",
                  per_channel ? "per-channel" : "per-tensor", static_cast<long long>(s.experts),
                  static_cast<long long>(s.tokens), worst);
    }
  }
}

// The pass alone, both element paths (8 per thread when n_cols allows, else 1), both y types,
// against the same arithmetic on the host: exact.
TEST(CudaMoe, PostScaleAloneIsExact) {
  LLMQ_REQUIRE_GPU();
  for (int64_t n : {int64_t{16}, int64_t{13}}) {
    for (DType yd : {DType::kF32, DType::kBF16}) {
      for (bool per_channel : {true, false}) {
        const int64_t e = 3, t = 5;
        SCOPED_TRACE("n=" + std::to_string(n) + " y=" + dtype_name(yd) + (per_channel ? " per-channel" : " per-tensor"));
        std::vector<float> y = synthetic_activations(e * t, n, 3);
        std::vector<uint16_t> y16(y.size());
        for (size_t i = 0; i < y.size(); ++i) {
          y16[i] = float_to_bf16_bits(y[i]);
          if (yd == DType::kBF16) y[i] = bf16_value(y16[i]);
        }
        std::vector<float> ts(static_cast<size_t>(t)), es(static_cast<size_t>(per_channel ? e * n : e));
        for (size_t i = 0; i < ts.size(); ++i) ts[i] = 0.01f * static_cast<float>(i + 1);
        for (size_t i = 0; i < es.size(); ++i) es[i] = std::ldexp(1.0f, static_cast<int>(i % 7)) * 0.37f;
        DeviceBuffer<float> dy(y.size()), dts(ts.size()), des(es.size());
        DeviceBuffer<uint16_t> dy16(y.size()), out(y.size());
        CUDA_ASSERT(dy.upload(y));
        CUDA_ASSERT(dy16.upload(y16));
        CUDA_ASSERT(dts.upload(ts));
        CUDA_ASSERT(des.upload(es));
        CUDA_ASSERT(out.fill_bytes(0xFF));
        MoePostScale p;
        p.experts = e;
        p.tokens = t;
        p.n_cols = n;
        p.y = yd == DType::kF32 ? static_cast<const void*>(dy.get()) : static_cast<const void*>(dy16.get());
        p.y_dtype = yd;
        p.token_scales = dts.get();
        p.expert_scales = des.get();
        p.per_channel = per_channel;
        p.out = out.get();
        ASSERT_TRUE(cuda_moe_post_scale(p, nullptr).ok());
        std::vector<uint16_t> got;
        CUDA_ASSERT(cudaDeviceSynchronize());
        CUDA_ASSERT(out.download(&got));
        for (int64_t r = 0; r < e * t; ++r)
          for (int64_t j = 0; j < n; ++j) {
            const int64_t ex = r / t, tok = r % t;
            const float want = y[static_cast<size_t>(r * n + j)] * ts[static_cast<size_t>(tok)] *
                               es[static_cast<size_t>(per_channel ? ex * n + j : ex)];
            ASSERT_EQ(got[static_cast<size_t>(r * n + j)], float_to_bf16_bits(want)) << "row " << r << " col " << j;
          }
      }
    }
  }
}

TEST(CudaMoe, PostScaleRefusesBadArguments) {
  MoePostScale p;
  p.experts = 2;
  p.tokens = 3;
  p.n_cols = 8;
  EXPECT_EQ(cuda_moe_post_scale(p, nullptr).code(), StatusCode::kInvalidArgument);  // no pointers
  float dummy[4];
  p.y = dummy;
  p.out = dummy;
  p.expert_scales = dummy;
  const Status in_place_f32 = cuda_moe_post_scale(p, nullptr);
  EXPECT_EQ(in_place_f32.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(in_place_f32.message().find("in place"), std::string::npos) << in_place_f32.to_string();
  p.y_dtype = DType::kE4M3;
  EXPECT_EQ(cuda_moe_post_scale(p, nullptr).code(), StatusCode::kInvalidArgument);
  p.y_dtype = DType::kBF16;
  p.tokens = 0;
  EXPECT_NE(cuda_moe_post_scale(p, nullptr).message().find("positive"), std::string::npos);
}

}  // namespace
}  // namespace llmq
