// Helpers shared by the cuda_quantize tests (test_cuda_quantize.cu: the shape sweep and special
// values; test_cuda_quantize_options.cu: options and bad arguments; test_cuda_quantize_numerics.cu:
// the kernels' element math on the host): device buffers, problems stored in every input dtype,
// GPU runs on poisoned outputs compared with the CPU reference bit for bit, sweeps that report
// their first failures, and the special inputs (rounding boundaries, zero / NaN / denormal rows).
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/element.hpp"
#include "cuda_support.hpp"
#include "llmq/cuda_quantize.hpp"
#include "llmq/format.hpp"
#include "llmq/quantize_tensor.hpp"
#include "llmq/scale.hpp"
#include "support.hpp"

namespace llmq {
namespace cuda_quantize_test {

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

inline std::string cuda_error(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

inline int element_bytes(DType d) { return d == DType::kF32 ? 4 : 2; }

inline uint16_t to_half_bits(float v, DType d) {
  return d == DType::kBF16 ? float_to_bf16_bits(v) : float_to_fp16_bits(v);
}

struct Shape {
  int64_t rows, cols;
};

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
inline std::vector<uint8_t> input_bytes(const Problem& p) {
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
inline float stored_value(const Problem& p, size_t i) {
  const float v = p.values[i];
  if (p.in == DType::kBF16) return bf16_bits_to_float(float_to_bf16_bits(v));
  if (p.in == DType::kF16) return fp16_bits_to_float(float_to_fp16_bits(v));
  return v;
}

inline TensorView input_view(const Problem& p, void* data, Device device) {
  TensorView v;
  v.data = data;
  v.dtype = p.in;
  v.shape = {p.rows, p.cols};
  if (p.row_stride > 0) v.strides = {p.row_stride, 1};
  v.device = device;
  return v;
}

inline std::string hex2(uint32_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", b & 0xFFu);
  return buf;
}
inline std::string float_text(float f) {
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
inline std::string run_gpu(const Problem& p, const QuantSpec& spec, int64_t scale_rows, int64_t scale_cols, int runs,
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
inline std::string compare_with_reference(const Problem& p, const QuantSpec& spec) {
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

inline std::string case_name(const Problem& p, const QuantSpec& spec, uint64_t seed) {
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
inline int64_t group_for(int64_t cols) {
  if (cols % 128 == 0) return 128;
  for (int64_t g = std::min<int64_t>(cols, 64); g > 1; --g)
    if (cols % g == 0) return g;
  return cols;
}

inline std::vector<QuantSpec> dynamic_specs(int64_t cols, DType format) {
  std::vector<QuantSpec> s = {QuantSpec::per_tensor(format), QuantSpec::per_token(format),
                              QuantSpec::per_channel(format), QuantSpec::per_block(format, 1, 128),
                              QuantSpec::per_block(format, 128, 128), QuantSpec::per_group(format, group_for(cols))};
  QuantSpec ic = QuantSpec::per_tensor(format);
  ic.granularity = Granularity::kPerInputChannel;
  s.push_back(ic);
  return s;
}

inline Problem outlier_problem(int64_t rows, int64_t cols, DType in, uint64_t seed) {
  Problem p;
  p.rows = rows;
  p.cols = cols;
  p.in = in;
  p.values = testing::outlier_matrix(rows, cols, seed);
  return p;
}

// ---- Special values.

// Every code's value, the midpoints between neighbours and the floats just around them, both
// signs, and the specials, for one format: with a static scale of 1, v = x exactly, so this
// checks the element encoder (hardware cvt or integer path) and the clip test at every boundary.
inline std::vector<float> boundary_values(DType format) {
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

// Rows of zeros, negative zeros, NaN, denormals and mixtures: the floor scale, signed zero codes,
// NaN codes, and NaN ignored by the absmax.
inline Problem special_rows(int64_t cols, DType in) {
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

}  // namespace cuda_quantize_test
}  // namespace llmq
