// The runtime's decoding kernels (row_kernels.hpp): greedy argmax (split over CTAs with a 64-bit
// atomicMax for long vocabularies), temperature + top-p sampling, advancing the device-side decode
// state, and the seeded random fills of synthetic weights and benchmark KV caches.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "cuda/cuda_check.cuh"
#include "cuda/pdl.cuh"
#include "runtime/row_kernels.hpp"
#include "runtime/row_sampling.hpp"
#include "runtime/row_math.cuh"

namespace llmq::runtime {
namespace {

constexpr int kArgmaxThreads = 1024;

__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* logits, int64_t vocab, int32_t* tokens) {
  detail::pdl_wait();
  detail::pdl_launch_dependents();
  __shared__ float best_v[32];
  __shared__ int32_t best_i[32];
  const float* row = logits + blockIdx.x * vocab;
  float bv = -FLT_MAX;
  int32_t bi = 0x7FFFFFFF;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = row[i];
    if (v > bv) {  // NaN never wins; ascending i keeps the lowest id among equals
      bv = v;
      bi = static_cast<int32_t>(i);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, o);
    const int32_t oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) {
      bv = ov;
      bi = oi;
    }
  }
  if (threadIdx.x % 32 == 0) {
    best_v[threadIdx.x / 32] = bv;
    best_i[threadIdx.x / 32] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w)
      if (best_v[w] > bv || (best_v[w] == bv && best_i[w] < bi)) {
        bv = best_v[w];
        bi = best_i[w];
      }
    tokens[blockIdx.x] = bi == 0x7FFFFFFF ? 0 : bi;
  }
}

// *flag = 1 when a row of logits holds a NaN or Inf or is constant (vocab > 1): what check_logits
// refuses on the host, for the rows sampled on the device (argmax would return token 0 for both).
// kVec4 (vocab % 4 == 0, 16-byte aligned rows): 16-byte loads, four in flight per thread; the
// scalar form read 256 rows of a 128k vocabulary at 0.7 TB/s (ncu, H200: 188 us a decode step).
constexpr int kFlagThreads = 1024;
template <bool kVec4>
__global__ void __launch_bounds__(kFlagThreads) flag_unusable_rows_kernel(const float* logits, int64_t vocab,
                                                                           int32_t* flag, const int32_t* valid_rows) {
  detail::pdl_wait();
  detail::pdl_launch_dependents();
  if (valid_rows != nullptr && static_cast<int>(blockIdx.x) >= *valid_rows) return;
  const float* row = logits + blockIdx.x * vocab;
  const float first = row[0];
  int bad = 0, differs = 0;
  if constexpr (kVec4) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    const int64_t n4 = vocab / 4;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
      const float4 v = row4[i];
      bad |= !isfinite(v.x) | !isfinite(v.y) | !isfinite(v.z) | !isfinite(v.w);
      differs |= (v.x != first) | (v.y != first) | (v.z != first) | (v.w != first);
    }
  } else {
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float v = row[i];
      bad |= !isfinite(v);
      differs |= v != first;
    }
  }
  bad = __syncthreads_or(bad);
  differs = __syncthreads_or(differs);
  if (threadIdx.x == 0 && (bad || (!differs && vocab > 1))) *flag = 1;
}

// One slice of a row per CTA; the CTAs of a row meet in keys[row] (value bits made orderable as
// unsigned, in the high word; the complement of the index in the low word, so equal values keep
// the lowest index) and the last CTA to finish writes the token and zeroes the workspace again.
constexpr int kArgmaxSliceThreads = 256;
constexpr int64_t kArgmaxSlice = 4096;

__global__ void __launch_bounds__(kArgmaxSliceThreads)
    argmax_slices_kernel(const float* logits, int64_t vocab, int32_t* tokens, unsigned long long* keys,
                         unsigned int* arrived) {
  detail::pdl_wait();
  detail::pdl_launch_dependents();
  __shared__ unsigned long long best[kArgmaxSliceThreads / 32];
  __shared__ bool last;
  const int64_t row = blockIdx.y;
  const float* x = logits + row * vocab;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kArgmaxSlice;
  const int64_t end = begin + kArgmaxSlice < vocab ? begin + kArgmaxSlice : vocab;
  unsigned long long key = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float v = x[i];
    if (v != v) continue;
    const uint32_t b = __float_as_uint(v);
    const uint32_t ordered = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    const unsigned long long k = (static_cast<unsigned long long>(ordered) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
    key = k > key ? k : key;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xFFFFFFFFu, key, o);
    key = other > key ? other : key;
  }
  if (threadIdx.x % 32 == 0) best[threadIdx.x / 32] = key;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxSliceThreads / 32; ++w) key = best[w] > key ? best[w] : key;
    atomicMax(keys + row, key);
    __threadfence();
    last = atomicAdd(arrived + row, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (last && threadIdx.x == 0) {
    const unsigned long long k = atomicExch(keys + row, 0ull);  // read and re-arm for the next call
    arrived[row] = 0;
    tokens[row] = k == 0 ? 0 : static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(k & 0xFFFFFFFFull));
  }
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Temperature + top-p: p_i = exp((l_i - max) / T); the nucleus is every i with p_i >= t for the
// largest t whose kept mass reaches top_p of the total (found by bisection on t, each step one pass
// over the row); then u * kept mass is located by a prefix sum over contiguous index chunks.
__global__ void __launch_bounds__(kArgmaxThreads) sample_kernel(const float* logits, int64_t vocab, float temperature,
                                                               float top_p, uint64_t seed, const int32_t* step,
                                                               int32_t* tokens) {
  __shared__ float red[32];
  __shared__ float chunk_mass[kArgmaxThreads];
  detail::pdl_wait();
  detail::pdl_launch_dependents();
  const float* row = logits + blockIdx.x * vocab;
  float m = -FLT_MAX;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) m = fmaxf(m, row[i]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = m;
  __syncthreads();
  m = red[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) m = fmaxf(m, red[w]);
  const float inv_t = 1.0f / temperature;
  auto prob = [&](int64_t i) { return expf((row[i] - m) * inv_t); };
  auto mass_at_least = [&](float t) {
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float p = prob(i);
      if (p >= t) s += p;
    }
    return cta_sum(s, red);
  };
  const float total = mass_at_least(0.0f);
  float lo = 0.0f, hi = 1.0f;  // mass(lo) >= top_p * total always; the max element has p = 1
  if (top_p < 1.0f) {
    for (int it = 0; it < 24; ++it) {
      const float mid = 0.5f * (lo + hi);
      if (mass_at_least(mid) >= top_p * total) lo = mid;
      else hi = mid;
    }
  }
  const float t = lo;
  const int64_t chunk = (vocab + blockDim.x - 1) / blockDim.x;
  const int64_t begin = threadIdx.x * chunk;
  const int64_t end = begin + chunk < vocab ? begin + chunk : vocab;
  float mine = 0.0f;
  for (int64_t i = begin; i < end; ++i) {
    const float p = prob(i);
    if (p >= t) mine += p;
  }
  chunk_mass[threadIdx.x] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    float kept = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x); ++w) kept += chunk_mass[w];
    // The per-row sampler's uniform (row_sampling.hpp), drawn at step * 65536 + row.
    float u = sampling_uniform01(seed, static_cast<int64_t>(*step) * 65536 + blockIdx.x) * kept;
    int32_t choice = -1;
    for (int w = 0; w < static_cast<int>(blockDim.x) && choice < 0; ++w) {
      if (u < chunk_mass[w] || w == static_cast<int>(blockDim.x) - 1) {
        const int64_t b = w * chunk, e = b + chunk < vocab ? b + chunk : vocab;
        int32_t last = -1;
        for (int64_t i = b; i < e; ++i) {
          const float p = prob(i);
          if (p < t) continue;
          last = static_cast<int32_t>(i);
          if (u < p) break;
          u -= p;
        }
        if (last >= 0) choice = last;
      } else {
        u -= chunk_mass[w];
      }
    }
    tokens[blockIdx.x] = choice < 0 ? 0 : choice;
  }
}

__global__ void advance_kernel(const int32_t* next, int64_t rows, int32_t* tokens, int32_t* position, int32_t* kv_len,
                               int32_t* step, int32_t* history, int64_t history_rows) {
  detail::pdl_wait();
  detail::pdl_launch_dependents();
  const int32_t s = *step;
  for (int64_t b = threadIdx.x; b < rows; b += blockDim.x) {
    const int32_t t = next[b];
    if (s < history_rows) history[static_cast<int64_t>(s) * rows + b] = t;
    tokens[b] = t;
    position[b] += 1;
    kv_len[b] += 1;
  }
  __syncthreads();
  if (threadIdx.x == 0) *step = s + 1;
}

__device__ __forceinline__ float random_normal_like(uint64_t seed, int64_t i) {
  // Irwin-Hall: the sum of 4 uniforms, centred (variance 1/3), scaled to variance 1.
  const uint64_t h = mix64(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i));
  const float u0 = static_cast<float>(h & 0xFFFF), u1 = static_cast<float>((h >> 16) & 0xFFFF);
  const float u2 = static_cast<float>((h >> 32) & 0xFFFF), u3 = static_cast<float>(h >> 48);
  const float v = ((u0 + u1 + u2 + u3 + 2.0f) * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
  return v;  // 0 only when the four draws sum to exactly 131070; the callers replace that 0
}

__global__ void fill_bf16_kernel(uint16_t* d, int64_t count, float std, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = random_normal_like(seed, i) * std;
    if (v == 0.0f) v = std * 1e-3f;
    d[i] = to_bf16(v);
  }
}
__global__ void fill_e4m3_kernel(uint8_t* d, int64_t count, float std, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = random_normal_like(seed, i) * std;
    d[i] = encode(v == 0.0f ? std * 1e-2f : v, false);
  }
}
__global__ void fill_f32_kernel(float* d, int64_t count, float mean, float std, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    d[i] = mean + random_normal_like(seed, i) * std;
}

}  // namespace

int64_t argmax_workspace_bytes(int64_t rows) { return rows * 16; }

Status argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* tokens, void* workspace, CudaStream stream) {
  if (rows == 0) return {};
  if (workspace != nullptr && vocab < (int64_t{1} << 32)) {
    auto* keys = static_cast<unsigned long long*>(workspace);
    auto* arrived = reinterpret_cast<unsigned int*>(keys + rows);
    const unsigned slices = static_cast<unsigned>((vocab + kArgmaxSlice - 1) / kArgmaxSlice);
    LLMQ_CUDA_RETURN_IF_ERROR(detail::launch_pdl(argmax_slices_kernel, dim3(slices, static_cast<unsigned>(rows)),
                                                  dim3(kArgmaxSliceThreads), 0, stream, logits, vocab, tokens, keys,
                                                  arrived));
    return {};
  }
  LLMQ_CUDA_RETURN_IF_ERROR(detail::launch_pdl(argmax_kernel, dim3(static_cast<unsigned>(rows)), dim3(kArgmaxThreads), 0, stream,
                                                logits, vocab, tokens));
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("argmax_kernel");
  return {};
}

Status flag_unusable_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* flag, CudaStream stream,
                          const int32_t* valid_rows) {
  if (rows == 0) return {};
  const bool vec4 = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  LLMQ_CUDA_RETURN_IF_ERROR(detail::launch_pdl(vec4 ? flag_unusable_rows_kernel<true> : flag_unusable_rows_kernel<false>,
                                                dim3(static_cast<unsigned>(rows)), dim3(kFlagThreads), 0, stream, logits,
                                                vocab, flag, valid_rows));
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("flag_unusable_rows_kernel");
  return {};
}

Status sample_rows(const float* logits, int64_t rows, int64_t vocab, float temperature, float top_p, uint64_t seed,
                   const int32_t* step, int32_t* tokens, void* argmax_workspace, CudaStream stream) {
  if (rows == 0) return {};
  if (!(temperature > 0.0f)) return argmax_rows(logits, rows, vocab, tokens, argmax_workspace, stream);
  if (!(top_p > 0.0f && top_p <= 1.0f)) return invalid_argument("top_p: " + std::to_string(top_p) + " outside (0, 1]");
  LLMQ_CUDA_RETURN_IF_ERROR(detail::launch_pdl(sample_kernel, dim3(static_cast<unsigned>(rows)), dim3(kArgmaxThreads), 0, stream,
                                                logits, vocab, temperature, top_p, seed, step, tokens));
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("sample_kernel");
  return {};
}

Status advance_decode(const int32_t* next, int64_t rows, int32_t* tokens, int32_t* position, int32_t* kv_len,
                      int32_t* step, int32_t* history, int64_t history_rows, CudaStream stream) {
  LLMQ_CUDA_RETURN_IF_ERROR(detail::launch_pdl(advance_kernel, dim3(1), dim3(1024), 0, stream, next, rows, tokens, position,
                                                kv_len, step, history, history_rows));
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("advance_kernel");
  return {};
}

Status fill_random_bf16(uint16_t* data, int64_t count, float std, uint64_t seed, CudaStream stream) {
  if (count == 0) return {};
  fill_bf16_kernel<<<grid_for(count), 256, 0, stream>>>(data, count, std, seed);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("fill_bf16_kernel");
  return {};
}

Status fill_random_e4m3(uint8_t* data, int64_t count, float std, uint64_t seed, CudaStream stream) {
  if (count == 0) return {};
  fill_e4m3_kernel<<<grid_for(count), 256, 0, stream>>>(data, count, std, seed);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("fill_e4m3_kernel");
  return {};
}

Status fill_random_f32(float* data, int64_t count, float mean, float std, uint64_t seed, CudaStream stream) {
  if (count == 0) return {};
  fill_f32_kernel<<<grid_for(count), 256, 0, stream>>>(data, count, mean, std, seed);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("fill_f32_kernel");
  return {};
}

}  // namespace llmq::runtime
