// cuda_quantize against the CPU reference (llmq::quantize on the same host data), bit for bit:
// codes, scales and the clip count, for every granularity x format x input dtype x rounding mode
// on odd shapes with outliers, plus special values (NaN, Inf, zeros, every rounding boundary),
// static scales, the SmoothQuant divisor, padded rows, scale options, determinism and bad
// arguments. Every run poisons its outputs first (0xAA, then 0x55 on a second run that must agree
// too). GPU tests SKIP visibly without an FP8-capable GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/element.hpp"
#include "cuda/quantize_kernels.cuh"
#include "cuda_support.hpp"
#include "llmq/cuda_quantize.hpp"
#include "llmq/format.hpp"
#include "llmq/quantize.hpp"
#include "llmq/scale.hpp"
#include "support.hpp"

namespace llmq {
namespace {

constexpr DType kFormats[] = {DType::kE4M3,     DType::kE5M2,     DType::kI8,
                              DType::kE4M3Fnuz, DType::kE5M2Fnuz, DType::kE4M3Ieee};
constexpr DType kInputs[] = {DType::kF32, DType::kBF16, DType::kF16};
constexpr uint64_t kStochasticSeed = 0x9E3779B97F4A7C15ull;  // both key words non-zero
// Stop printing after this many failing cases in a sweep (one bug fails hundreds).
constexpr int kMaxReportedFailures = 12;

// ---- Device memory.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) status_ = cudaMalloc(&ptr_, bytes);
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  bool ok() const { return status_ == cudaSuccess; }
  cudaError_t upload(const void* src, size_t n) { return n ? cudaMemcpy(ptr_, src, n, cudaMemcpyHostToDevice) : cudaSuccess; }
  cudaError_t download(void* dst, size_t n) const { return n ? cudaMemcpy(dst, ptr_, n, cudaMemcpyDeviceToHost) : cudaSuccess; }
  cudaError_t fill(int byte) { return bytes_ ? cudaMemset(ptr_, byte, bytes_) : cudaSuccess; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  cudaError_t status_ = cudaSuccess;
};

std::string cuda_error(const char* what, cudaError_t e) { return std::string(what) + ": " + cudaGetErrorString(e); }

int element_bytes(DType d) { return d == DType::kF32 ? 4 : 2; }

uint16_t to_half_bits(float v, DType d) { return d == DType::kBF16 ? float_to_bf16_bits(v) : float_to_fp16_bits(v); }

// One problem: logical values [rows, cols] stored as `in` with `row_stride` elements per row.
struct Problem {
  std::vector<float> values;
  int64_t rows = 0, cols = 0;
  int64_t row_stride = 0;  // 0: cols
  DType in = DType::kF32;
  std::vector<float> smooth;                // empty: none
  const ScaleSet* static_scales = nullptr;  // for static specs
  int64_t stride() const { return row_stride > 0 ? row_stride : cols; }
};

// The input as the stored bytes; padding holds a large value that would change any absmax read.
std::vector<uint8_t> input_bytes(const Problem& p) {
  const int eb = element_bytes(p.in);
  std::vector<uint8_t> bytes(static_cast<size_t>(p.rows * p.stride() * eb));
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t c = 0; c < p.stride(); ++c) {
      const float v = c < p.cols ? p.values[static_cast<size_t>(r * p.cols + c)] : 30000.0f;
      uint8_t* dst = bytes.data() + (r * p.stride() + c) * eb;
      if (p.in == DType::kF32) std::memcpy(dst, &v, 4);
      else {
        const uint16_t h = to_half_bits(v, p.in);
        std::memcpy(dst, &h, 2);
      }
    }
  return bytes;
}

// The value element i holds once stored as p.in (what both implementations read).
float stored_value(const Problem& p, size_t i) {
  const float v = p.values[i];
  if (p.in == DType::kBF16) return bf16_bits_to_float(float_to_bf16_bits(v));
  if (p.in == DType::kF16) return fp16_bits_to_float(float_to_fp16_bits(v));
  return v;
}

TensorView input_view(const Problem& p, void* data, Device device) {
  TensorView v;
  v.data = data;
  v.dtype = p.in;
  v.shape = {p.rows, p.cols};
  if (p.row_stride > 0) v.strides = {p.row_stride, 1};
  v.device = device;
  return v;
}

std::string hex2(uint32_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", b & 0xFFu);
  return buf;
}
std::string float_text(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g (0x%08x)", static_cast<double>(f), u);
  return buf;
}

// Output of one GPU run.
struct GpuResult {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  unsigned long long clips = 0;
};

// Runs cuda_quantize `runs` times on fresh poison (0xAA, then 0x55, ...) with a scale tensor of
// [scale_rows, scale_cols] (uploaded from p.static_scales when set); "" or what went wrong.
std::string run_gpu(const Problem& p, const QuantSpec& spec, int64_t scale_rows, int64_t scale_cols, int runs,
                    std::vector<GpuResult>* out) {
  const int64_t scale_count = scale_rows * scale_cols;
  const std::vector<uint8_t> xb = input_bytes(p);
  DeviceBuffer dx(xb.size()), dq(static_cast<size_t>(p.rows * p.cols)), ds(static_cast<size_t>(scale_count) * 4),
      dsmooth(p.smooth.size() * 4), dclip(8);
  const size_t ws_bytes = cuda_quantize_workspace_bytes(p.rows, p.cols, spec);
  DeviceBuffer dws(ws_bytes);
  if (!dx.ok() || !dq.ok() || !ds.ok() || !dsmooth.ok() || !dclip.ok() || !dws.ok()) return "cudaMalloc failed";
  if (auto e = dx.upload(xb.data(), xb.size()); e != cudaSuccess) return cuda_error("upload x", e);
  if (auto e = dsmooth.upload(p.smooth.data(), p.smooth.size() * 4); e != cudaSuccess) return cuda_error("upload smooth", e);
  if (auto e = dclip.fill(0); e != cudaSuccess) return cuda_error("zero clip", e);
  if (auto e = dws.fill(0x7F); e != cudaSuccess) return cuda_error("poison workspace", e);

  TensorView x = input_view(p, dx.get(), Device::kCuda);
  TensorView q;
  q.data = dq.get();
  q.dtype = spec.format;
  q.shape = {p.rows, p.cols};
  q.device = Device::kCuda;
  TensorView scales;
  scales.data = ds.get();
  scales.dtype = DType::kF32;
  scales.shape = {scale_rows, scale_cols};
  scales.device = Device::kCuda;
  CudaQuantizeOptions options;
  options.smooth_divisor = p.smooth.empty() ? nullptr : static_cast<const float*>(dsmooth.get());
  options.clip_count = static_cast<unsigned long long*>(dclip.get());
  options.workspace = dws.get();
  options.workspace_bytes = ws_bytes;

  const int poison[] = {0xAA, 0x55, 0xC3, 0x3C};
  for (int run = 0; run < runs; ++run) {
    if (auto e = dq.fill(poison[run % 4]); e != cudaSuccess) return cuda_error("poison q", e);
    if (p.static_scales != nullptr) {
      if (auto e = ds.upload(p.static_scales->scales.data(), static_cast<size_t>(scale_count) * 4); e != cudaSuccess)
        return cuda_error("upload scales", e);
    } else if (auto e = ds.fill(poison[run % 4]); e != cudaSuccess) {
      return cuda_error("poison scales", e);
    }
    const Status st = cuda_quantize(x, spec, q, scales, options);
    if (!st.ok()) return "cuda_quantize: " + st.to_string();
    if (auto e = cudaDeviceSynchronize(); e != cudaSuccess) return cuda_error("kernel", e);
    GpuResult r;
    r.codes.resize(static_cast<size_t>(p.rows * p.cols));
    r.scales.resize(static_cast<size_t>(scale_count));
    if (auto e = dq.download(r.codes.data(), r.codes.size()); e != cudaSuccess) return cuda_error("download q", e);
    if (auto e = ds.download(r.scales.data(), r.scales.size() * 4); e != cudaSuccess) return cuda_error("download scales", e);
    if (auto e = dclip.download(&r.clips, 8); e != cudaSuccess) return cuda_error("download clip count", e);
    out->push_back(std::move(r));
  }
  return "";
}

// "" when the GPU (run twice) agrees with the CPU reference bit for bit; else the first difference.
std::string compare_with_reference(const Problem& p, const QuantSpec& spec) {
  const std::vector<uint8_t> xb = input_bytes(p);
  QuantizedTensor ref;
  const Status st = quantize(input_view(p, const_cast<uint8_t*>(xb.data()), Device::kCpu), spec, &ref,
                             p.static_scales, p.smooth.empty() ? nullptr : p.smooth.data());
  if (!st.ok()) return "CPU reference failed: " + st.to_string();
  const int64_t scale_count = ref.scales.scales.numel();
  std::vector<GpuResult> runs;
  const std::string err = run_gpu(p, spec, ref.scales.scale_rows(), ref.scales.scale_cols(), 2, &runs);
  if (!err.empty()) return err;
  const auto* ref_codes = static_cast<const uint8_t*>(ref.data.data());
  const float* ref_scales = ref.scales.scales.data_as<float>();
  for (size_t run = 0; run < runs.size(); ++run) {
    const GpuResult& g = runs[run];
    for (int64_t r = 0; r < p.rows; ++r)
      for (int64_t c = 0; c < p.cols; ++c) {
        const size_t i = static_cast<size_t>(r * p.cols + c);
        if (g.codes[i] != ref_codes[i]) {
          std::ostringstream os;
          os << "run " << run << ": first code difference at (" << r << ", " << c << "): ours " << hex2(g.codes[i])
             << ", reference " << hex2(ref_codes[i]) << ", x " << float_text(stored_value(p, i)) << ", scale "
             << float_text(ref.scales.scale(r, c));
          return os.str();
        }
      }
    for (int64_t i = 0; i < scale_count; ++i)
      if (std::memcmp(&g.scales[static_cast<size_t>(i)], &ref_scales[i], 4) != 0) {
        std::ostringstream os;
        os << "run " << run << ": first scale difference at block (" << i / ref.scales.scale_cols() << ", "
           << i % ref.scales.scale_cols() << "): ours " << float_text(g.scales[static_cast<size_t>(i)]) << ", reference "
           << float_text(ref_scales[i]);
        return os.str();
      }
    // The counter accumulates across calls: after run k it holds (k + 1) x the reference's count.
    const unsigned long long want = static_cast<unsigned long long>(ref.clipped) * (run + 1);
    if (g.clips != want) {
      std::ostringstream os;
      os << "run " << run << ": clip count " << g.clips << ", reference " << want << " (" << ref.clipped << " per call)";
      return os.str();
    }
  }
  return "";
}

std::string case_name(const Problem& p, const QuantSpec& spec, uint64_t seed) {
  std::ostringstream os;
  os << describe(spec) << " in=" << dtype_name(p.in);
  if (p.row_stride > 0) os << " row_stride=" << p.row_stride;
  if (!p.smooth.empty()) os << " smooth";
  return testing::repro(seed, p.rows, p.cols, os.str());
}

// Sweep helper: counts failures, prints the first few with their REPRO line.
struct Sweep {
  int failures = 0;
  int cases = 0;
  void check(const Problem& p, const QuantSpec& spec, uint64_t seed) {
    ++cases;
    const std::string diff = compare_with_reference(p, spec);
    if (diff.empty()) return;
    if (++failures <= kMaxReportedFailures) ADD_FAILURE() << case_name(p, spec, seed) << "\n  " << diff;
  }
  void finish() {
    EXPECT_EQ(failures, 0) << failures << " of " << cases << " cases differ (first " << kMaxReportedFailures << " shown)";
  }
};

// A group size that divides cols (per-group needs cols % g == 0): 128, else the largest divisor <= 64.
int64_t group_for(int64_t cols) {
  if (cols % 128 == 0) return 128;
  for (int64_t g = std::min<int64_t>(cols, 64); g > 1; --g)
    if (cols % g == 0) return g;
  return cols;
}

std::vector<QuantSpec> dynamic_specs(int64_t cols, DType format) {
  std::vector<QuantSpec> s = {QuantSpec::per_tensor(format), QuantSpec::per_token(format),
                              QuantSpec::per_channel(format), QuantSpec::per_block(format, 1, 128),
                              QuantSpec::per_block(format, 128, 128), QuantSpec::per_group(format, group_for(cols))};
  QuantSpec ic = QuantSpec::per_tensor(format);
  ic.granularity = Granularity::kPerInputChannel;
  s.push_back(ic);
  return s;
}

Problem outlier_problem(int64_t rows, int64_t cols, DType in, uint64_t seed) {
  Problem p;
  p.rows = rows;
  p.cols = cols;
  p.in = in;
  p.values = testing::outlier_matrix(rows, cols, seed);
  return p;
}

// ---- The main sweep: every granularity x format x input dtype x rounding mode, per shape.
struct Shape {
  int64_t rows, cols;
};
// Odd shapes (scalar kernels) and aligned ones that reach each vectorised path: 7x272 (sub-warp
// teams, a 16-wide edge block), 5x2048 (a warp per row), 33x4112 (CTA team with 3 packs per
// thread), 2x40000 (the 1024-thread team for 2-byte inputs, two passes for f32), 300x4096.
const Shape kShapes[] = {{1, 1}, {1, 19}, {19, 99}, {3, 989}, {129, 257}, {7, 272}, {5, 2048}, {33, 4112}, {2, 40000}, {300, 4096}};

class CudaQuantizeSweep : public ::testing::TestWithParam<Shape> {};

TEST_P(CudaQuantizeSweep, DynamicMatchesReferenceBitForBit) {
  LLMQ_REQUIRE_GPU();
  const Shape shape = GetParam();
  const bool large = shape.rows * shape.cols > 200000;
  Sweep sweep;
  for (DType in : kInputs) {
    const uint64_t seed = static_cast<uint64_t>(shape.rows * 7919 + shape.cols) + static_cast<uint64_t>(in);
    const Problem p = outlier_problem(shape.rows, shape.cols, in, seed);
    for (DType format : kFormats)
      for (QuantSpec spec : dynamic_specs(shape.cols, format))
        for (Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
          // Large shapes: stochastic rounding for one input dtype keeps the CPU reference quick.
          if (large && rounding == Rounding::kStochastic && in != DType::kBF16) continue;
          spec.rounding = rounding;
          spec.seed = kStochasticSeed;
          sweep.check(p, spec, seed);
        }
  }
  sweep.finish();
}

TEST_P(CudaQuantizeSweep, StaticScalesMatchReference) {
  LLMQ_REQUIRE_GPU();
  const Shape shape = GetParam();
  if (shape.rows * shape.cols > 200000) GTEST_SKIP() << "covered by the smaller shapes";
  Sweep sweep;
  std::mt19937 rng(static_cast<uint32_t>(shape.rows * 31 + shape.cols));
  std::uniform_real_distribution<float> factor(0.25f, 2.0f);  // < 1 clips: exercises the counter
  for (DType in : kInputs) {
    const uint64_t seed = static_cast<uint64_t>(shape.rows * 131 + shape.cols);
    const Problem base = outlier_problem(shape.rows, shape.cols, in, seed);
    for (DType format : kFormats)
      for (QuantSpec spec : dynamic_specs(shape.cols, format)) {
        if (spec.granularity == Granularity::kPerToken) continue;  // static per-token is invalid
        ScaleSet s;
        const std::vector<uint8_t> xb = input_bytes(base);
        ASSERT_TRUE(compute_scale(input_view(base, const_cast<uint8_t*>(xb.data()), Device::kCpu), spec, &s).ok());
        for (int64_t i = 0; i < s.scales.numel(); ++i) s.scales.data_as<float>()[i] *= factor(rng);
        spec.source = ScaleSource::kStatic;
        Problem p = base;
        p.static_scales = &s;
        for (Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
          spec.rounding = rounding;
          spec.seed = kStochasticSeed + 1;
          sweep.check(p, spec, seed);
        }
      }
  }
  sweep.finish();
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaQuantizeSweep, ::testing::ValuesIn(kShapes), [](const auto& info) {
  return std::to_string(info.param.rows) + "x" + std::to_string(info.param.cols);
});

// ---- Special values.

// Every code's value, the midpoints between neighbours and the floats just around them, both
// signs, and the specials, for one format: with a static scale of 1, v = x exactly, so this
// checks the element encoder (hardware cvt or integer path) and the clip test at every boundary.
std::vector<float> boundary_values(DType format) {
  std::vector<float> v = {0.0f, -0.0f, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min(), 1e-40f, -1e-40f, 3e9f, -3e9f, 2147483648.0f};
  const auto around = [&](float x) {
    for (float s : {1.0f, -1.0f}) {
      v.push_back(s * x);
      v.push_back(s * std::nextafter(x, 0.0f));
      v.push_back(s * std::nextafter(x, std::numeric_limits<float>::infinity()));
    }
  };
  if (format == DType::kI8) {
    for (int k = -140; k <= 140; ++k) {
      around(static_cast<float>(k) + 0.5f);
      around(static_cast<float>(k) + 0.25f);
    }
    return v;
  }
  std::vector<float> grid;
  for (uint32_t code = 0; code < 128; ++code) {
    const float d = fp8_to_float(static_cast<uint8_t>(code), format);
    if (std::isfinite(d)) grid.push_back(d);
  }
  std::sort(grid.begin(), grid.end());
  grid.erase(std::unique(grid.begin(), grid.end()), grid.end());
  const double top = format_info(format).max_finite;
  for (size_t i = 0; i < grid.size(); ++i) {
    around(grid[i]);
    const double next = i + 1 < grid.size() ? grid[i + 1] : 2.0 * top - grid[i - 1];  // the would-be next code
    around(static_cast<float>((grid[i] + next) / 2.0));
    around(static_cast<float>(grid[i] + (next - grid[i]) / 4.0));
  }
  return v;
}

TEST(CudaQuantizeSpecial, EveryRoundingBoundaryStaticUnitScale) {
  LLMQ_REQUIRE_GPU();
  Sweep sweep;
  for (DType format : kFormats) {
    std::vector<float> v = boundary_values(format);
    for (int aligned = 0; aligned < 2; ++aligned) {
      // Aligned: a multiple of 16 columns (pack kernel); otherwise odd (scalar kernel).
      std::vector<float> row = v;
      if (aligned) row.resize((row.size() + 15) / 16 * 16, 1.0f);
      else if (row.size() % 2 == 0) row.push_back(0.75f);
      Problem p;
      p.rows = 1;
      p.cols = static_cast<int64_t>(row.size());
      p.values = row;
      p.in = DType::kF32;
      ScaleSet s;
      s.block = {1, p.cols};
      s.scales = Tensor(DType::kF32, {1, 1});
      s.scales.data_as<float>()[0] = 1.0f;
      p.static_scales = &s;
      QuantSpec spec = QuantSpec::per_tensor(format);
      spec.source = ScaleSource::kStatic;
      for (Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic})
        for (uint64_t seed : {uint64_t{1}, uint64_t{0xFFFFFFFF00000001ull}}) {
          spec.rounding = rounding;
          spec.seed = seed;
          sweep.check(p, spec, seed);
          if (rounding == Rounding::kNearestEven) break;
        }
    }
  }
  sweep.finish();
}

// Rows of zeros, negative zeros, NaN, denormals and mixtures: the floor scale, signed zero codes,
// NaN codes, and NaN ignored by the absmax.
Problem special_rows(int64_t cols, DType in) {
  Problem p;
  p.rows = 8;
  p.cols = cols;
  p.in = in;
  p.values.assign(static_cast<size_t>(p.rows * cols), 0.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto normal = testing::normal_vector(p.rows * cols, 77, 3.0f);
  for (int64_t c = 0; c < cols; ++c) {
    const auto at = [&](int64_t r) -> float& { return p.values[static_cast<size_t>(r * cols + c)]; };
    at(0) = 0.0f;
    at(1) = -0.0f;
    at(2) = nan;
    at(3) = c % 3 == 0 ? nan : normal[static_cast<size_t>(3 * cols + c)];
    at(4) = (c % 2 ? -1.0f : 1.0f) * std::numeric_limits<float>::denorm_min() * static_cast<float>(c + 1);
    at(5) = normal[static_cast<size_t>(5 * cols + c)];
    at(6) = c < cols / 2 ? nan : 0.0f;
    at(7) = c % 4 == 0 ? -0.0f : normal[static_cast<size_t>(7 * cols + c)] * 1e-3f;
  }
  return p;
}

TEST(CudaQuantizeSpecial, ZeroNanAndDenormalRows) {
  LLMQ_REQUIRE_GPU();
  Sweep sweep;
  for (int64_t cols : {256, 250, 4096})
    for (DType in : kInputs) {
      const Problem p = special_rows(cols, in);
      for (DType format : kFormats)
        for (QuantSpec spec : dynamic_specs(cols, format)) {
          sweep.check(p, spec, 77);
          spec.rounding = Rounding::kStochastic;
          sweep.check(p, spec, 77);
        }
    }
  sweep.finish();
}

// Dynamic scales of a block holding +-Inf: the CPU reference reports an error; the kernel writes
// scale +Inf for that block and the codes of x * 0 (signed zeros; NaN for the Inf elements), and
// every other block exactly as the reference computes it.
TEST(CudaQuantizeSpecial, InfBlockGetsInfScaleOthersMatch) {
  LLMQ_REQUIRE_GPU();
  for (int64_t cols : {256, 250}) {
    for (DType format : {DType::kE4M3, DType::kE5M2, DType::kI8, DType::kE4M3Fnuz}) {
      Problem p = outlier_problem(6, cols, DType::kBF16, 5);
      const int64_t inf_row = 2;
      p.values[static_cast<size_t>(inf_row * cols + 7)] = std::numeric_limits<float>::infinity();
      p.values[static_cast<size_t>(inf_row * cols + 9)] = -std::numeric_limits<float>::infinity();
      const QuantSpec spec = QuantSpec::per_token(format);
      // Reference for the other rows: the same data with the Inf row zeroed.
      Problem finite = p;
      for (int64_t c = 0; c < cols; ++c) finite.values[static_cast<size_t>(inf_row * cols + c)] = 0.0f;
      const std::vector<uint8_t> fb = input_bytes(finite);
      QuantizedTensor ref;
      ASSERT_TRUE(quantize(input_view(finite, const_cast<uint8_t*>(fb.data()), Device::kCpu), spec, &ref).ok());
      std::vector<GpuResult> runs;
      const std::string err = run_gpu(p, spec, p.rows, 1, 1, &runs);
      ASSERT_EQ(err, "");
      const GpuResult& g = runs[0];
      const std::string what = case_name(p, spec, 5);
      EXPECT_TRUE(std::isinf(g.scales[inf_row]) && g.scales[inf_row] > 0) << what << " scale " << g.scales[inf_row];
      for (int64_t r = 0; r < p.rows; ++r) {
        if (r != inf_row) {
          EXPECT_EQ(std::memcmp(&g.scales[r], ref.scales.scales.data_as<float>() + r, 4), 0) << what << " row " << r;
        }
        for (int64_t c = 0; c < cols; ++c) {
          const size_t i = static_cast<size_t>(r * cols + c);
          uint8_t want = static_cast<const uint8_t*>(ref.data.data())[i];
          if (r == inf_row) {
            const float v = stored_value(p, i) * 0.0f;  // x * (1 / Inf)
            want = format == DType::kI8 ? static_cast<uint8_t>(encode_int(v, DType::kI8))
                                        : float_to_fp8(v, format);
          }
          ASSERT_EQ(g.codes[i], want) << what << " at (" << r << ", " << c << ")";
        }
      }
    }
  }
}

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

// ---- The kernels' numerics run on the host against the CPU reference (no GPU needed): the same
// __host__ __device__ functions the kernels inline, with the same parameters cuda_quantize builds.

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ~1M float bit patterns spread over the whole range, every format's boundaries, and dense
// random values around the FP8 / INT8 ranges.
const std::vector<float>& sample_floats() {
  static const std::vector<float> v = [] {
    std::vector<float> out;
    for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 4093) out.push_back(float_of(static_cast<uint32_t>(b)));
    for (DType d : kFormats) {
      const auto more = boundary_values(d);
      out.insert(out.end(), more.begin(), more.end());
    }
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> wide(-70000.0f, 70000.0f), narrow(-600.0f, 600.0f), tiny(-0.02f, 0.02f);
    for (int i = 0; i < 100000; ++i) {
      out.push_back(wide(rng));
      out.push_back(narrow(rng));
      out.push_back(tiny(rng));
    }
    return out;
  }();
  return v;
}

TEST(CudaQuantizeNumerics, PhiloxMatchesReference) {
  std::mt19937_64 rng(3);
  for (int i = 0; i < 100000; ++i) {
    const uint64_t seed = i < 10 ? static_cast<uint64_t>(i) : rng(), index = i < 10 ? ~uint64_t{0} - i : rng() >> (i % 64);
    ASSERT_EQ(quant_kernels::philox_u32(seed, index), philox_random_u32(seed, index)) << "seed=" << seed << " index=" << index;
  }
}

TEST(CudaQuantizeNumerics, ElementEncodersMatchReference) {
  const std::vector<float>& xs = sample_floats();
  for (DType format : kFormats)
    for (Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
      QuantSpec spec = QuantSpec::per_tensor(format);
      spec.rounding = rounding;
      spec.seed = kStochasticSeed;
      const quant_kernels::EncodeParams p = quant_kernels::encode_params(spec);
      int64_t differ = 0;
      for (size_t i = 0; i < xs.size(); ++i) {
        const float v = xs[i];
        const uint32_t bits = rounding == Rounding::kStochastic ? philox_random_u32(spec.seed, i) : 0u;
        bool clipped = false;
        const uint32_t want = static_cast<uint32_t>(detail::encode_scaled(v, format, 0, rounding, bits, &clipped)) & 0xFFu;
        uint32_t clips = 0, got = 0;
        if (format == DType::kI8) {
          got = quant_kernels::encode_int8(v, p, bits, clips);
        } else {
          got = quant_kernels::encode_fp8_soft(v, p, bits);
          clips = quant_kernels::fp8_clips(v, p);
        }
        if (got != want || (clips != 0) != clipped) {
          if (++differ <= 5)
            ADD_FAILURE() << dtype_name(format) << (rounding == Rounding::kStochastic ? " stochastic" : " rne") << " x="
                          << float_text(v) << " bits=" << bits << ": ours " << hex2(got) << " clip " << clips
                          << ", reference " << hex2(want) << " clip " << clipped;
        }
      }
      EXPECT_EQ(differ, 0) << dtype_name(format) << " over " << xs.size() << " values";
    }
}

TEST(CudaQuantizeNumerics, PhiloxPackMatchesPhilox) {
  std::mt19937_64 rng(5);
  std::vector<uint64_t> bases = {0, 16, 0xFFFFFFF0ull, 0x100000000ull, 0xFFFFFFFFFFFFFFF0ull, 0x7FFFFFFFFFFFFFF0ull};
  for (int i = 0; i < 4000; ++i) bases.push_back((rng() >> (i % 64)) & ~uint64_t{15});
  for (size_t i = 0; i < bases.size(); ++i) {
    const uint64_t seed = i < 6 ? (i % 2 ? ~uint64_t{0} : 0) : rng();
    const quant_kernels::PhiloxPack pack(seed, bases[i]);
    for (uint32_t j = 0; j < 16; ++j)
      ASSERT_EQ(pack.word(j), philox_random_u32(seed, bases[i] + j)) << "seed=" << seed << " flat0=" << bases[i] << " j=" << j;
  }
}

// The INT8 RNE pack path (clamp, then the 1.5 * 2^23 add) and its clip test, on the host.
TEST(CudaQuantizeNumerics, Int8RoundNearestFastPathMatchesReference) {
  const std::vector<float>& xs = sample_floats();
  int64_t differ = 0;
  for (float v : xs) {
    bool clipped = false;
    const uint32_t want = static_cast<uint32_t>(detail::encode_scaled(v, DType::kI8, 0, Rounding::kNearestEven, 0, &clipped)) & 0xFFu;
    const uint32_t got = quant_kernels::int8_rne_bits(v) & 0xFFu;
    const uint32_t clips = quant_kernels::int8_rne_clips(v);
    if (got != want || (clips != 0) != clipped) {
      if (++differ <= 5)
        ADD_FAILURE() << "x=" << float_text(v) << ": ours " << hex2(got) << " clip " << clips << ", reference " << hex2(want)
                      << " clip " << clipped;
    }
  }
  EXPECT_EQ(differ, 0) << "over " << xs.size() << " values";
}

// The stochastic OCP FP8 pack path: noise added to the float bits, truncated to the FP8 grid, then
// the exact conversion (emulated here by the RNE integer encoder, exact on grid values), for every
// magnitude it covers; the rest take the integer path, which ElementEncodersMatchReference checks.
template <int M>
void check_fp8_stochastic_grid(DType format) {
  const std::vector<float>& xs = sample_floats();
  QuantSpec spec = QuantSpec::per_tensor(format);
  spec.rounding = Rounding::kStochastic;
  spec.seed = kStochasticSeed;
  const quant_kernels::EncodeParams p = quant_kernels::encode_params(spec);
  ASSERT_EQ(p.mantissa_bits, M);
  const uint32_t min_normal = quant_kernels::fp8_min_normal_bits(p);
  int64_t differ = 0, covered = 0;
  std::mt19937 rng(11);
  for (size_t i = 0; i < xs.size(); ++i) {
    const float v = xs[i];
    for (int k = 0; k < 3; ++k) {
      // Random bits, and the extremes (never / always round up).
      const uint32_t bits = k == 0 ? philox_random_u32(spec.seed, i) : (k == 1 ? 0u : 0xFFFFFFFFu) ^ (rng() & 1u);
      if (quant_kernels::fp8_sr_needs_soft(bits_of(v), min_normal)) continue;
      ++covered;
      bool clipped = false;
      const uint32_t want = static_cast<uint32_t>(detail::encode_scaled(v, format, 0, Rounding::kStochastic, bits, &clipped)) & 0xFFu;
      const float grid = float_of(quant_kernels::fp8_sr_grid_bits<M>(bits_of(v), p.max_bits, bits));
      const uint32_t got = quant_kernels::encode_fp8_soft_t<false>(grid, p, 0u);
      if (got != want) {
        if (++differ <= 5)
          ADD_FAILURE() << dtype_name(format) << " x=" << float_text(v) << " bits=" << bits << ": ours " << hex2(got)
                        << " (grid " << float_text(grid) << "), reference " << hex2(want);
      }
    }
  }
  EXPECT_GT(covered, static_cast<int64_t>(xs.size()));
  EXPECT_EQ(differ, 0) << dtype_name(format) << " over " << covered << " values";
}

TEST(CudaQuantizeNumerics, Fp8StochasticGridPathMatchesReference) {
  check_fp8_stochastic_grid<3>(DType::kE4M3);
  check_fp8_stochastic_grid<2>(DType::kE5M2);
}

TEST(CudaQuantizeNumerics, ScaleFromAbsmaxMatchesReference) {
  std::vector<float> absmax = {0.0f, std::numeric_limits<float>::denorm_min(), 1e-38f, 1e-30f, 1e-10f, 1e-6f,
                               1.0f, 448.0f, 57344.0f, 3e38f, std::numeric_limits<float>::max()};
  std::mt19937_64 rng(9);
  for (int i = 0; i < 20000; ++i) absmax.push_back(float_of(static_cast<uint32_t>(rng()) & 0x7F7FFFFFu));
  std::vector<std::function<void(QuantSpec*)>> variants = {
      [](QuantSpec*) {},
      [](QuantSpec* s) { s->backoff = 0.8f; },
      [](QuantSpec* s) { s->backoff = 0.3f; },
      [](QuantSpec* s) { s->backoff = 0.5f; },
      [](QuantSpec* s) { s->min_scale = 0.25f; },
      [](QuantSpec* s) { s->min_scale = 1e-30f; },
      [](QuantSpec* s) { s->scale_rounding = ScaleRounding::kPowerOfTwo; },
      [](QuantSpec* s) {
        s->scale_rounding = ScaleRounding::kPowerOfTwo;
        s->pow2_min_exp = -32;
        s->pow2_max_exp = 31;
        s->backoff = 0.9f;
      },
      [](QuantSpec* s) {
        s->scale_rounding = ScaleRounding::kHardwareSet;
        s->hardware_scales = {1.0f / 256, 1.0f / 16, 1.0f, 16.0f};
      },
      [](QuantSpec* s) { s->method = ScaleMethod::kUnit; },
  };
  for (DType format : kFormats)
    for (const auto& variant : variants) {
      QuantSpec spec = QuantSpec::per_token(format);
      variant(&spec);
      const quant_kernels::ScaleParams p = quant_kernels::scale_params(spec);
      for (float a : absmax) {
        const float want = spec.method == ScaleMethod::kUnit ? 1.0f : round_scale(absmax_scale(a, spec), spec);
        const float got = quant_kernels::scale_from_absmax(a, p);
        ASSERT_EQ(bits_of(got), bits_of(want)) << describe(spec) << " absmax=" << float_text(a) << ": ours "
                                               << float_text(got) << ", reference " << float_text(want);
      }
      // Inf in the block: the reference reports an error; the kernel's scale is +Inf.
      if (spec.method != ScaleMethod::kUnit)
        EXPECT_TRUE(std::isinf(quant_kernels::scale_from_absmax(std::numeric_limits<float>::infinity(), p)));
    }
}

// ---- Host-side pieces of the kernels (no GPU needed).

TEST(CudaQuantizeHost, FastDivmodMatchesDivision) {
  std::mt19937_64 rng(1);
  std::vector<uint32_t> divisors = {1, 2, 3, 5, 7, 8, 16, 17, 100, 128, 255, 256, 257, 4096, 65535, 65536, 65537,
                                    1000003, 0x7FFFFFFFu, 0x80000000u, 0x80000001u, 0xFFFFFFFEu, 0xFFFFFFFFu};
  for (int i = 0; i < 200; ++i) divisors.push_back(static_cast<uint32_t>(rng()) >> (rng() % 32));
  for (uint32_t d : divisors) {
    if (d == 0) continue;
    const quant_kernels::FastDivmod f(d);
    std::vector<uint32_t> ns = {0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, 0xFFFFFFFFu, 0xFFFFFFFEu, 0x80000000u};
    for (int k = 0; k < 2000; ++k) ns.push_back(static_cast<uint32_t>(rng()));
    for (uint32_t n : ns) ASSERT_EQ(f.div(n), n / d) << "n=" << n << " d=" << d;
  }
}

}  // namespace
}  // namespace llmq
