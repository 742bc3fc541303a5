// cuda_quantize's options against the CPU reference, bit for bit: the SmoothQuant divisor, padded
// rows, backoff, floor, scale rounding and unit scales, seeded stochastic rounding, empty tensors;
// and bad arguments, which are errors naming what is wrong, never crashes; the workspace size.
// GPU tests SKIP visibly without an FP8-capable GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
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

// ---- Options: smooth divisor, padded rows, scale variants.

TEST(CudaQuantizeOptions, SmoothDivisorMatchesReference) {
  LLMQ_REQUIRE_GPU();
  Sweep sweep;
  for (Shape shape : {Shape{19, 99}, Shape{7, 272}, Shape{33, 4112}, Shape{64, 4096}}) {
    for (DType in : {DType::kF32, DType::kBF16}) {
      Problem p = outlier_problem(shape.rows, shape.cols, in, 11);
      std::mt19937 rng(3);
      std::uniform_real_distribution<float> d(0.1f, 10.0f);
      p.smooth.resize(static_cast<size_t>(shape.cols));
      for (float& s : p.smooth) s = d(rng);
      for (DType format : {DType::kE4M3, DType::kI8, DType::kE5M2Fnuz})
        for (QuantSpec spec : dynamic_specs(shape.cols, format)) sweep.check(p, spec, 11);
      // Static per-channel with smoothing.
      QuantSpec spec = QuantSpec::per_channel(DType::kE4M3);
      ScaleSet s;
      s.block = {1, shape.cols};
      s.scales = Tensor(DType::kF32, {shape.rows, 1});
      for (int64_t r = 0; r < shape.rows; ++r) s.scales.data_as<float>()[r] = 0.01f * static_cast<float>(r + 1);
      spec.source = ScaleSource::kStatic;
      Problem ps = p;
      ps.static_scales = &s;
      sweep.check(ps, spec, 11);
    }
  }
  sweep.finish();
}

TEST(CudaQuantizeOptions, PaddedRowsMatchReference) {
  LLMQ_REQUIRE_GPU();
  Sweep sweep;
  for (Shape shape : {Shape{19, 99}, Shape{7, 272}, Shape{300, 4096}}) {
    for (int64_t pad : {16, 3}) {  // 16 keeps 16-byte alignment (vector paths); 3 breaks it
      for (DType in : kInputs) {
        Problem p = outlier_problem(shape.rows, shape.cols, in, 13);
        p.row_stride = shape.cols + pad;
        for (DType format : {DType::kE4M3, DType::kI8})
          for (QuantSpec spec : dynamic_specs(shape.cols, format)) sweep.check(p, spec, 13);
      }
    }
  }
  sweep.finish();
}

TEST(CudaQuantizeOptions, BackoffFloorScaleRoundingAndUnit) {
  LLMQ_REQUIRE_GPU();
  std::vector<std::pair<std::string, std::function<void(QuantSpec*)>>> variants = {
      {"backoff 0.8 (double division)", [](QuantSpec* s) { s->backoff = 0.8f; }},
      {"backoff 0.5 (exact in float)", [](QuantSpec* s) { s->backoff = 0.5f; }},
      {"min_scale 0.25", [](QuantSpec* s) { s->min_scale = 0.25f; }},
      {"pow2", [](QuantSpec* s) { s->scale_rounding = ScaleRounding::kPowerOfTwo; }},
      {"pow2 gaudi range", [](QuantSpec* s) {
         s->scale_rounding = ScaleRounding::kPowerOfTwo;
         s->pow2_min_exp = -3;
         s->pow2_max_exp = 2;
       }},
      {"hardware set", [](QuantSpec* s) {
         s->scale_rounding = ScaleRounding::kHardwareSet;
         s->hardware_scales = {1.0f / 256, 1.0f / 16, 1.0f, 16.0f};
       }},
      {"unit", [](QuantSpec* s) { s->method = ScaleMethod::kUnit; }},
  };
  Sweep sweep;
  for (Shape shape : {Shape{19, 99}, Shape{7, 272}, Shape{64, 4096}})
    for (DType in : {DType::kBF16, DType::kF32}) {
      const Problem p = outlier_problem(shape.rows, shape.cols, in, 17);
      const Problem z = special_rows(shape.cols, in);
      for (const auto& variant : variants)
        for (DType format : {DType::kE4M3, DType::kE5M2, DType::kI8})
          for (QuantSpec spec : dynamic_specs(shape.cols, format)) {
            variant.second(&spec);
            sweep.check(p, spec, 17);
            sweep.check(z, spec, 17);
          }
    }
  sweep.finish();
}

TEST(CudaQuantizeOptions, StochasticRoundingIsDeterministicAndSeeded) {
  LLMQ_REQUIRE_GPU();
  const Problem p = outlier_problem(64, 4096, DType::kBF16, 19);
  QuantSpec spec = QuantSpec::per_token(DType::kE4M3);
  spec.rounding = Rounding::kStochastic;
  spec.seed = 42;
  std::vector<GpuResult> a, b;
  ASSERT_EQ(run_gpu(p, spec, 64, 1, 3, &a), "");
  EXPECT_EQ(a[0].codes, a[1].codes);
  EXPECT_EQ(a[0].codes, a[2].codes);
  spec.seed = 43;
  ASSERT_EQ(run_gpu(p, spec, 64, 1, 1, &b), "");
  EXPECT_NE(a[0].codes, b[0].codes) << "another seed must round some element differently";
}

TEST(CudaQuantizeOptions, EmptyTensorWritesFloorScale) {
  LLMQ_REQUIRE_GPU();
  DeviceBuffer ds(4);
  ASSERT_TRUE(ds.ok());
  ASSERT_EQ(ds.fill(0xAA), cudaSuccess);
  TensorView x, q, scales;
  x.dtype = DType::kBF16;
  x.shape = {0, 64};
  x.device = Device::kCuda;
  q.dtype = DType::kE4M3;
  q.shape = {0, 64};
  q.device = Device::kCuda;
  scales.data = ds.get();
  scales.dtype = DType::kF32;
  scales.shape = {1, 1};
  scales.device = Device::kCuda;
  const QuantSpec spec = QuantSpec::per_token(DType::kE4M3);
  const Status st = cuda_quantize(x, spec, q, scales);
  ASSERT_TRUE(st.ok()) << st.to_string();
  float s = 0;
  ASSERT_EQ(ds.download(&s, 4), cudaSuccess);
  EXPECT_EQ(s, effective_min_scale(spec));
}

// ---- Bad arguments.

struct BadArgFixture {
  DeviceBuffer dx{64 * 256 * 2}, dq{64 * 256}, ds{64 * 4 * 4}, dws{4096};
  std::vector<uint16_t> host_x = std::vector<uint16_t>(64 * 256, 0x3F80);
  TensorView x, q, scales;
  BadArgFixture() {
    x.data = dx.get();
    x.dtype = DType::kBF16;
    x.shape = {64, 256};
    x.device = Device::kCuda;
    q.data = dq.get();
    q.dtype = DType::kE4M3;
    q.shape = {64, 256};
    q.device = Device::kCuda;
    scales.data = ds.get();
    scales.dtype = DType::kF32;
    scales.shape = {64, 1};
    scales.device = Device::kCuda;
  }
};

void expect_error(const Status& st, StatusCode code, const std::string& needle, const std::string& what) {
  EXPECT_EQ(st.code(), code) << what << ": " << st.to_string();
  EXPECT_NE(st.message().find(needle), std::string::npos) << what << ": message '" << st.message() << "' should name '" << needle << "'";
}

TEST(CudaQuantizeArgs, BadArgumentsAreErrorsNotCrashes) {
  LLMQ_REQUIRE_GPU();
  BadArgFixture f;
  const QuantSpec spec = QuantSpec::per_token(DType::kE4M3);
  ASSERT_TRUE(cuda_quantize(f.x, spec, f.q, f.scales).ok());
  {
    // Host memory labelled as device memory: cuda_quantize checks the memory type only when asked
    // (options.check_pointers); can_implement always does.
    TensorView x = f.x;
    x.data = f.host_x.data();
    CudaQuantizeOptions checked;
    checked.check_pointers = true;
    expect_error(cuda_quantize(x, spec, f.q, f.scales, checked), StatusCode::kInvalidArgument, "x", "host pointer for x");
    expect_error(cuda_quantize_can_implement(x, spec, f.q, f.scales), StatusCode::kInvalidArgument, "host memory", "can_implement");
    TensorView s = f.scales;
    s.data = nullptr;
    expect_error(cuda_quantize(f.x, spec, f.q, s), StatusCode::kInvalidArgument, "scales", "null scales");
  }
  {
    TensorView x = f.x;
    x.device = Device::kCpu;
    expect_error(cuda_quantize(x, spec, f.q, f.scales), StatusCode::kInvalidArgument, "x", "CPU tensor");
  }
  {
    TensorView q = f.q;
    q.shape = {64, 255};
    expect_error(cuda_quantize(f.x, spec, q, f.scales), StatusCode::kInvalidArgument, "q", "wrong q shape");
    q = f.q;
    q.dtype = DType::kE5M2;
    expect_error(cuda_quantize(f.x, spec, q, f.scales), StatusCode::kInvalidArgument, "q", "wrong q dtype");
  }
  {
    TensorView s = f.scales;
    s.shape = {64, 2};
    expect_error(cuda_quantize(f.x, spec, f.q, s), StatusCode::kInvalidArgument, "scales", "wrong scales shape");
    s = f.scales;
    s.dtype = DType::kF16;
    expect_error(cuda_quantize(f.x, spec, f.q, s), StatusCode::kInvalidArgument, "scales", "wrong scales dtype");
  }
  {
    QuantSpec s = QuantSpec::per_token(DType::kI8);
    s.symmetric = false;
    TensorView q = f.q;
    q.dtype = DType::kI8;
    expect_error(cuda_quantize(f.x, s, q, f.scales), StatusCode::kUnsupported, "symmetric", "asymmetric");
    s = QuantSpec::per_token(DType::kE4M3);
    s.method = ScaleMethod::kMseSearch;
    expect_error(cuda_quantize(f.x, s, f.q, f.scales), StatusCode::kUnsupported, "MSE", "mse search");
    s = QuantSpec::per_token(DType::kI4);
    q.dtype = DType::kI4;
    expect_error(cuda_quantize(f.x, s, q, f.scales), StatusCode::kUnsupported, "int4", "int4");
    s = QuantSpec::per_group(DType::kE4M3, 100);
    expect_error(cuda_quantize(f.x, s, f.q, f.scales), StatusCode::kInvalidArgument, "group_size", "group not dividing");
    s = QuantSpec::per_token(DType::kE4M3);
    s.source = ScaleSource::kStatic;
    expect_error(cuda_quantize(f.x, s, f.q, f.scales), StatusCode::kInvalidArgument, "static", "static per-token");
  }
  {
    TensorView x = f.x;
    x.dtype = DType::kF64;
    x.shape = {64, 128};
    TensorView q = f.q;
    q.shape = {64, 128};
    expect_error(cuda_quantize(x, spec, q, f.scales), StatusCode::kUnsupported, "f64", "f64 input");
  }
  {
    // Dynamic per-tensor on a tensor too big for one CTA needs the workspace.
    QuantSpec s = QuantSpec::per_tensor(DType::kE4M3);
    DeviceBuffer big_x(512 * 4096 * 2), big_q(512 * 4096);
    TensorView x = f.x, q = f.q, sc = f.scales;
    x.data = big_x.get();
    x.shape = {512, 4096};
    q.data = big_q.get();
    q.shape = {512, 4096};
    sc.shape = {1, 1};
    ASSERT_EQ(cudaMemset(big_x.get(), 0, 512 * 4096 * 2), cudaSuccess);
    EXPECT_GT(cuda_quantize_workspace_bytes(512, 4096, s), 0u);
    expect_error(cuda_quantize(x, s, q, sc), StatusCode::kInvalidArgument, "workspace", "missing workspace");
    CudaQuantizeOptions o;
    o.workspace = f.dws.get();
    o.workspace_bytes = cuda_quantize_workspace_bytes(512, 4096, s);
    EXPECT_TRUE(cuda_quantize(x, s, q, sc, o).ok());
  }
  {
    std::vector<float> host_smooth(256, 1.0f);
    CudaQuantizeOptions o;
    o.smooth_divisor = host_smooth.data();
    expect_error(cuda_quantize_can_implement(f.x, spec, f.q, f.scales, o), StatusCode::kInvalidArgument, "smooth",
                 "host smooth divisor (can_implement)");
    o.check_pointers = true;
    expect_error(cuda_quantize(f.x, spec, f.q, f.scales, o), StatusCode::kInvalidArgument, "smooth", "host smooth divisor");
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "no bad argument may reach a kernel";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CudaQuantizeArgs, WorkspaceBytes) {
  EXPECT_GT(cuda_quantize_workspace_bytes(16384, 8192, QuantSpec::per_tensor(DType::kE4M3)), 0u);
  EXPECT_EQ(cuda_quantize_workspace_bytes(16384, 8192, QuantSpec::per_token(DType::kE4M3)), 0u);
  EXPECT_EQ(cuda_quantize_workspace_bytes(16384, 8192, QuantSpec::per_block(DType::kE4M3, 128, 128)), 0u);
  QuantSpec s = QuantSpec::per_tensor(DType::kE4M3);
  s.source = ScaleSource::kStatic;
  EXPECT_EQ(cuda_quantize_workspace_bytes(16384, 8192, s), 0u);
}

}  // namespace
}  // namespace llmq
