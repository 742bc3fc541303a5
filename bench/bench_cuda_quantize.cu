// Timing of cuda_quantize against a device-to-device copy measured in the same run (the memory
// ceiling), CUTLASS style: warm-up, CUDA events, 4 rotating input buffers (so the working set is
// far beyond L2), median of 50 runs, each timed alone (host-side argument checks included), plus
// the mean of 200 back-to-back calls. Bandwidth counts the useful bytes: x read once, codes and
// scales written once (the two-pass per-tensor path reads x twice; that is not counted).
// Prints a table; `--csv` prints CSV instead. Exit status 1 if any call fails.
// Usage: bench_cuda_quantize [--csv] (--json FILE and --quick, which scripts pass to every
// benchmark, are accepted and change nothing: this one writes no JSON and has one length)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_bench_support.cuh"
#include "llmq/cuda_quantize.hpp"
#include "llmq/format.hpp"

namespace {

constexpr int kWarmup = 5;
constexpr int kRuns = 50;
constexpr int kBuffers = 4;

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median milliseconds of `fn(i)` (i = run index, for buffer rotation), each run timed alone.
template <typename F>
float time_runs(cudaStream_t stream, F&& fn) {
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < kWarmup; ++i) fn(i);
  BENCH_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> ms;
  for (int i = 0; i < kRuns; ++i) {
    BENCH_CHECK(cudaEventRecord(start, stream));
    fn(i);
    BENCH_CHECK(cudaEventRecord(stop, stream));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    BENCH_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  BENCH_CHECK(cudaEventDestroy(start));
  BENCH_CHECK(cudaEventDestroy(stop));
  return median(ms);
}

// Mean milliseconds per call of `n` back-to-back calls (launch overhead hidden by queueing).
template <typename F>
float time_back_to_back(cudaStream_t stream, int n, F&& fn) {
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < kWarmup; ++i) fn(i);
  BENCH_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < n; ++i) fn(i);
  BENCH_CHECK(cudaEventRecord(stop, stream));
  BENCH_CHECK(cudaEventSynchronize(stop));
  float t = 0;
  BENCH_CHECK(cudaEventElapsedTime(&t, start, stop));
  BENCH_CHECK(cudaEventDestroy(start));
  BENCH_CHECK(cudaEventDestroy(stop));
  return t / static_cast<float>(n);
}

struct Case {
  const char* name;
  int64_t rows, cols;
  llmq::DType in;
  llmq::QuantSpec spec;
};

// Fills a buffer with bf16/f16/f32 values of a spread of magnitudes (never zeros).
__global__ void fill_kernel(void* p, int64_t n, int bytes, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float v = (static_cast<float>(h & 0xFFFF) / 65536.0f - 0.5f) * ((h >> 16) % 97 == 0 ? 200.0f : 4.0f) + 1e-3f;
    if (bytes == 4) static_cast<float*>(p)[i] = v;
    else if (bytes == 2) static_cast<unsigned short*>(p)[i] = static_cast<unsigned short>(__float_as_uint(v) >> 16);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_cuda_quantize: cuda_quantize against a device-to-device copy in the same run"};
  llmq::bench::last_value_wins(app);
  bool csv = false, quick = false;
  std::string json_path;
  app.add_flag("--csv", csv, "print CSV instead of the table");
  app.add_option("--json", json_path, "accepted for scripts that pass it to every benchmark; no JSON is written")
      ->type_name("FILE");
  app.add_flag("--quick", quick, "accepted for scripts that pass it to every benchmark; changes nothing");
  llmq::bench::parse_command_line(app, argc, argv);
  using llmq::DType;
  using llmq::QuantSpec;
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  const int64_t kRows = 16384, kCols = 8192;
  std::vector<Case> cases = {
      {"per-token e4m3", kRows, kCols, DType::kBF16, QuantSpec::per_token(DType::kE4M3)},
      {"per-token e4m3 f32-in", kRows, kCols, DType::kF32, QuantSpec::per_token(DType::kE4M3)},
      {"per-token int8", kRows, kCols, DType::kBF16, QuantSpec::per_token(DType::kI8)},
      {"per-token e4m3 stochastic", kRows, kCols, DType::kBF16, [] {
         QuantSpec s = QuantSpec::per_token(DType::kE4M3);
         s.rounding = llmq::Rounding::kStochastic;
         return s;
       }()},
      {"per-tensor e4m3 dynamic", kRows, kCols, DType::kBF16, QuantSpec::per_tensor(DType::kE4M3)},
      {"per-tensor e4m3 static", kRows, kCols, DType::kBF16, [] {
         QuantSpec s = QuantSpec::per_tensor(DType::kE4M3);
         s.source = llmq::ScaleSource::kStatic;
         return s;
       }()},
      {"1x128 e4m3", kRows, kCols, DType::kBF16, QuantSpec::per_block(DType::kE4M3, 1, 128)},
      {"128x128 e4m3", kRows, kCols, DType::kBF16, QuantSpec::per_block(DType::kE4M3, 128, 128)},
      {"per-token e4m3 1x4096", 1, 4096, DType::kBF16, QuantSpec::per_token(DType::kE4M3)},
      {"per-token e4m3 16x4096", 16, 4096, DType::kBF16, QuantSpec::per_token(DType::kE4M3)},
  };

  // Copy ceiling: a D2D copy of the large BF16 input, read + write bytes.
  const size_t big_bytes = static_cast<size_t>(kRows * kCols) * 4;  // room for f32 input
  std::vector<void*> xs(kBuffers);
  for (auto& p : xs) BENCH_CHECK(cudaMalloc(&p, big_bytes));
  void *q = nullptr, *scales = nullptr, *workspace = nullptr, *copy_dst = nullptr;
  BENCH_CHECK(cudaMalloc(&q, static_cast<size_t>(kRows * kCols)));
  BENCH_CHECK(cudaMalloc(&scales, static_cast<size_t>(kRows * kCols) / 16 * 4 + 64));
  BENCH_CHECK(cudaMalloc(&workspace, 1 << 20));
  BENCH_CHECK(cudaMalloc(&copy_dst, big_bytes));
  const size_t copy_bytes = static_cast<size_t>(kRows * kCols) * 2;
  const float copy_ms = time_runs(stream, [&](int i) {
    BENCH_CHECK(cudaMemcpyAsync(copy_dst, xs[i % kBuffers], copy_bytes, cudaMemcpyDeviceToDevice, stream));
  });
  const double copy_gbs = 2.0 * static_cast<double>(copy_bytes) / (copy_ms * 1e-3) / 1e9;

  if (csv) std::printf("case,rows,cols,in,us,gb_per_s,ratio_to_copy,us_back_to_back\n");
  else {
    std::printf("device: %s (%d SMs), copy %.0f GB/s (%zu MiB bf16 D2D, read + write)\n", prop.name,
                prop.multiProcessorCount, copy_gbs, copy_bytes >> 20);
    std::printf("%-28s %13s %5s %10s %9s %8s %14s\n", "case", "shape", "in", "median us", "GB/s", "vs copy", "back-to-back us");
  }
  int failures = 0;
  for (const Case& c : cases) {
    const int eb = c.in == DType::kF32 ? 4 : 2;
    const int64_t n = c.rows * c.cols;
    for (auto& p : xs) fill_kernel<<<1024, 256, 0, stream>>>(p, n, eb, 12345u);
    BENCH_CHECK(cudaGetLastError());
    // Static scale: 1 / 448 of a typical absmax.
    const float static_scale = 2.0f / 448.0f;
    BENCH_CHECK(cudaMemcpyAsync(scales, &static_scale, 4, cudaMemcpyHostToDevice, stream));
    BENCH_CHECK(cudaStreamSynchronize(stream));
    llmq::BlockShape block;
    BENCH_CHECK(llmq::resolve_block_shape(c.spec, c.rows, c.cols, &block));
    const int64_t sr = (c.rows + block.rows - 1) / block.rows, sc = (c.cols + block.cols - 1) / block.cols;
    llmq::TensorView x, qv, sv;
    x.dtype = c.in;
    x.shape = {c.rows, c.cols};
    x.device = llmq::Device::kCuda;
    qv.data = q;
    qv.dtype = c.spec.format;
    qv.shape = {c.rows, c.cols};
    qv.device = llmq::Device::kCuda;
    sv.data = scales;
    sv.dtype = DType::kF32;
    sv.shape = {sr, sc};
    sv.device = llmq::Device::kCuda;
    llmq::CudaQuantizeOptions o;
    o.stream = stream;
    o.workspace = workspace;
    o.workspace_bytes = llmq::cuda_quantize_workspace_bytes(c.rows, c.cols, c.spec);
    bool ok = true;
    const auto call = [&](int i) {
      x.data = xs[i % kBuffers];
      const llmq::Status st = llmq::cuda_quantize(x, c.spec, qv, sv, o);
      if (!st.ok() && ok) {
        std::fprintf(stderr, "%s: %s\n", c.name, st.to_string().c_str());
        ok = false;
      }
    };
    const float ms = time_runs(stream, call);
    const float b2b_ms = time_back_to_back(stream, 200, call);
    BENCH_CHECK(cudaStreamSynchronize(stream));
    if (!ok) {
      ++failures;
      continue;
    }
    const double bytes = static_cast<double>(n) * (eb + 1) + static_cast<double>(sr * sc) * 4;
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    const std::string shape = std::to_string(c.rows) + "x" + std::to_string(c.cols);
    if (csv)
      std::printf("%s,%lld,%lld,%s,%.2f,%.0f,%.3f,%.2f\n", c.name, static_cast<long long>(c.rows),
                  static_cast<long long>(c.cols), llmq::dtype_name(c.in), ms * 1e3, gbs, gbs / copy_gbs, b2b_ms * 1e3);
    else
      std::printf("%-28s %13s %5s %10.2f %9.0f %7.1f%% %14.2f\n", c.name, shape.c_str(), llmq::dtype_name(c.in),
                  ms * 1e3, gbs, 100.0 * gbs / copy_gbs, b2b_ms * 1e3);
  }
  for (auto& p : xs) BENCH_CHECK(cudaFree(p));
  BENCH_CHECK(cudaFree(q));
  BENCH_CHECK(cudaFree(scales));
  BENCH_CHECK(cudaFree(workspace));
  BENCH_CHECK(cudaFree(copy_dst));
  BENCH_CHECK(cudaStreamDestroy(stream));
  return failures == 0 ? 0 : 1;
}
