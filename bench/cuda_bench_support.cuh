// Helpers shared by the CUDA benchmarks (bench/bench_cuda_*.cu): the one fatal check (BENCH_CHECK,
// for a cudaError_t or an llmq::Status), the command line (CLI11: parse or exit, lists, bounds),
// device fills from a counter-based hash (every operand set differs and nothing is zero), a spin
// kernel that holds the GPU while the host queues the timed runs, an owning device buffer, the
// operand-set count that defeats the L2, and the median of a set of timings. Each benchmark is a
// single translation unit, so the kernels live here.
#pragma once

#include <CLI/CLI.hpp>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "llmq/status.hpp"

// Exits with status 1, printing file:line, the expression and the error, when `expr` (a
// cudaError_t or an llmq::Status) is a failure.
#define BENCH_CHECK(...) ::llmq::bench::check_result((__VA_ARGS__), #__VA_ARGS__, __FILE__, __LINE__)

namespace llmq::bench {

// ---- errors

[[noreturn]] inline void check_failed(const char* expr, const char* file, int line, const std::string& message) {
  std::fprintf(stderr, "%s:%d: %s: %s\n", file, line, expr, message.c_str());
  std::exit(1);
}
inline void check_result(cudaError_t e, const char* expr, const char* file, int line) {
  if (e != cudaSuccess) check_failed(expr, file, line, cudaGetErrorString(e));
}
inline void check_result(const llmq::Status& st, const char* expr, const char* file, int line) {
  if (!st.ok()) check_failed(expr, file, line, st.to_string());
}

// ---- device fills: a counter-based hash, so every set differs and nothing is zero.

inline __device__ uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline __device__ float uniform(uint64_t seed, int64_t i) {  // [-1, 1)
  return static_cast<float>(mix(seed * 0x100000001B3ull + static_cast<uint64_t>(i)) >> 40) *
             (2.0f / 16777216.0f) - 1.0f;
}

// E4M3 codes of values in [-300, 300], never +-0 or NaN; read as INT8 they are any non-zero byte.
__global__ void fill_e4m3(uint8_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint8_t code = __nv_cvt_float_to_fp8(uniform(seed, i) * 300.0f, __NV_SATFINITE, __NV_E4M3);
    if ((code & 0x7F) == 0) code = 0x38;  // 1.0 instead of +-0
    p[i] = code;
  }
}

__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = uniform(seed, i);
    if (v == 0.0f) v = 0.5f;
    p[i] = __float2bfloat16(v);
  }
}

// Positive scales in [0.005, 0.015).
__global__ void fill_scales(float* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = (1.0f + 0.5f * uniform(seed, i)) * 1e-2f;
}

// Holds the GPU for `ns` nanoseconds so that the runs queued behind it start back to back.
__global__ void spin(uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// Blocks of 256 threads for a grid-stride fill of n elements (at most 4096 blocks).
inline int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + 255) / 256, 4096)); }

// ---- device memory

// An owning device buffer (at least 256 bytes; empty when default-constructed).
struct DeviceMem {
  void* p = nullptr;
  DeviceMem() = default;
  explicit DeviceMem(size_t bytes) { BENCH_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256))); }
  ~DeviceMem() {
    if (p != nullptr) (void)cudaFree(p);
  }
  DeviceMem(DeviceMem&& o) noexcept : p(o.p) { o.p = nullptr; }
  DeviceMem& operator=(DeviceMem&& o) noexcept {
    std::swap(p, o.p);
    return *this;
  }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  template <typename T> T* as() const { return static_cast<T*>(p); }
};

// ---- operand-set rotation

// Enough operand sets of `set_bytes` each that one pass over them moves more than 2x the L2: the
// S - 1 other sets between two uses of one set hold (S - 1) * set_bytes >= 2 * L2 bytes; at least
// `min_sets`.
inline int sets_for(int64_t set_bytes, int64_t l2_bytes, int64_t min_sets) {
  return static_cast<int>(std::max<int64_t>(min_sets, (2 * l2_bytes + set_bytes - 1) / set_bytes + 1));
}

// ---- timing statistics

// Median of sorted, non-empty timings (the mean of the two middle ones for an even count).
template <typename T> double median_of_sorted(const std::vector<T>& v) {
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median of non-empty timings, in any order.
template <typename T> double median(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  return median_of_sorted(v);
}

// ---- timing

// Median microseconds of `runs` calls of f() queued back to back behind a spin kernel (so launch
// gaps do not count), after 3 warm-up calls; each call is bracketed by events.
template <typename F> double queued_median_us(F&& f, int runs = 20) {
  for (int i = 0; i < 3; ++i) f();
  BENCH_CHECK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(static_cast<size_t>(runs) + 1);
  for (auto& e : ev) BENCH_CHECK(cudaEventCreate(&e));
  spin<<<1, 1>>>(2'000'000);
  BENCH_CHECK(cudaEventRecord(ev[0]));
  for (int i = 0; i < runs; ++i) {
    f();
    BENCH_CHECK(cudaEventRecord(ev[static_cast<size_t>(i) + 1]));
  }
  BENCH_CHECK(cudaDeviceSynchronize());
  std::vector<float> ms(static_cast<size_t>(runs));
  for (int i = 0; i < runs; ++i) BENCH_CHECK(cudaEventElapsedTime(&ms[static_cast<size_t>(i)], ev[i], ev[i + 1]));
  for (auto& e : ev) BENCH_CHECK(cudaEventDestroy(e));
  return median(ms) * 1e3;
}

// ---- command line

// Call before adding options: an option given twice keeps its last value, as the hand-written
// parsers did (a list option still takes every value of every occurrence).
inline void last_value_wins(CLI::App& app) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

// Parses the command line into `app`'s options: --help prints them and exits 0; an unknown option,
// a missing or malformed value prints CLI11's message and exits 2.
inline void parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
}

// A comma-separated list value ("1,16,64"), one value per occurrence of the option.
inline CLI::Option* comma_list(CLI::Option* o) { return o->delimiter(',')->allow_extra_args(false); }

// An integer option's (or each list element's) lower bound; the message says `why`.
inline CLI::Validator at_least(int64_t min, const std::string& why) {
  return CLI::Validator(
      [min, why](std::string& s) -> std::string {
        char* end = nullptr;
        const long long v = std::strtoll(s.c_str(), &end, 10);
        if (!s.empty() && *end == '\0' && v >= min) return {};
        return "'" + s + "' is not an integer >= " + std::to_string(min) + " (" + why + ")";
      },
      ">=" + std::to_string(min));
}

}  // namespace llmq::bench
