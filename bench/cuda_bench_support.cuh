// Helpers shared by the CUDA benchmarks (bench_cuda_gemm, bench_cuda_decode_gemm,
// bench_cuda_int8_gemm): a fatal CUDA check, device fills from a counter-based hash (every operand
// set differs and nothing is zero), a spin kernel that holds the GPU while the host queues the
// timed runs, an owning device buffer, the operand-set count that defeats the L2, and the median of
// a set of timings. Each benchmark is a single translation unit, so the kernels live here.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>
#include <sstream>
#include <string>

#include "llmq/status.hpp"

// Exits with status 2 when a CUDA call fails.
#define BENCH_CUDA(call)                                                                         \
  do {                                                                                           \
    const cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)

namespace llmq::bench {

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
  explicit DeviceMem(size_t bytes) { BENCH_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 256))); }
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
  BENCH_CUDA(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(static_cast<size_t>(runs) + 1);
  for (auto& e : ev) BENCH_CUDA(cudaEventCreate(&e));
  spin<<<1, 1>>>(2'000'000);
  BENCH_CUDA(cudaEventRecord(ev[0]));
  for (int i = 0; i < runs; ++i) {
    f();
    BENCH_CUDA(cudaEventRecord(ev[static_cast<size_t>(i) + 1]));
  }
  BENCH_CUDA(cudaDeviceSynchronize());
  std::vector<float> ms(static_cast<size_t>(runs));
  for (int i = 0; i < runs; ++i) BENCH_CUDA(cudaEventElapsedTime(&ms[static_cast<size_t>(i)], ev[i], ev[i + 1]));
  for (auto& e : ev) BENCH_CUDA(cudaEventDestroy(e));
  return median(ms) * 1e3;
}

// ---- command line and errors

// Exits with status 2, naming `what`, when a library call failed.
inline void check_status(const llmq::Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, st.to_string().c_str());
    std::exit(2);
  }
}

// "1,16,64" -> {1, 16, 64}.
inline std::vector<int64_t> parse_int_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) v.push_back(std::stoll(item));
  return v;
}

}  // namespace llmq::bench
