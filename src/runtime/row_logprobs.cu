// Log-probabilities of sampled rows on the device (row_logprobs.hpp holds the definition): one CTA
// of 512 threads per row that asked, one read of the row.
//
// Each thread walks its strided share of the row keeping (a) a running maximum and the sum of
// exp(l - maximum) over the non-NaN logits, rescaled when the maximum grows (exp in float, the sum
// in double), and (b) its 20 best tokens by the order, as 64-bit keys (a monotone image of the
// logit above, the id's complement below: larger key, earlier in the order; distinct for every
// token), sorted in registers: a token enters only past the thread's 20th, which after the first
// few hundred tokens is rare. The CTA then combines the (maximum, sum) pairs and merges the lists:
// each warp takes its 32 lists' K best by K rounds of a warp maximum over the list heads (the
// winning lane shifts its list), and warp 0 does the same over the warps' results.
// Cost per asking row: one read of the row (a vocabulary of 151936 is 600 KB) and a few microseconds
// of merging; rows that did not ask return at once, and a step where no row asks launches nothing.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/cuda_check.cuh"
#include "runtime/row_logprobs.hpp"

namespace llmq::runtime {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kSlots = kMaxTopLogprobs;  // each thread's list: the most any row can ask for
static_assert(kSlots <= 32 && kWarps <= 32, "one lane per result, one lane per warp's list");

// A token's place in the order as one integer, larger first: the logit's bits made monotone (-0 as
// +0, NaN below -Inf) in the high word, the id's complement in the low word (equal logits: lower id
// first). Never 0 for a token (ids < 2^31 have complements >= 2^31), so 0 marks an empty slot.
__device__ __forceinline__ uint64_t order_rank(float v, int64_t id) {
  uint32_t bits = __float_as_uint(v + 0.0f);  // -0 + 0 is +0
  bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  if (v != v) bits = 0;
  return (static_cast<uint64_t>(bits) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(id));
}
__device__ __forceinline__ int32_t rank_id(uint64_t rank) { return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(rank)); }

// (maximum, sum of exp(l - maximum)) of two parts of a row; an empty part has maximum -Inf, sum 0.
__device__ __forceinline__ void combine(float* m, double* s, float m2, double s2) {
  if (m2 > *m) {
    *s = *s * exp(static_cast<double>(*m) - static_cast<double>(m2)) + s2;  // exp(-Inf) = 0 for an empty part
    *m = m2;
  } else if (m2 > -INFINITY) {
    *s += s2 * exp(static_cast<double>(m2) - static_cast<double>(*m));
  }
}

__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t other = __shfl_xor_sync(0xFFFFFFFFu, v, o);
    v = other > v ? other : v;
  }
  return v;
}

// The warp's k best of its lanes' sorted lists (each lane's list[0] its best; 0 empty): lane r
// returns the r-th best, or 0 past the end. The lists are consumed.
__device__ __forceinline__ uint64_t warp_best(uint64_t (&list)[kSlots], int k) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  uint64_t mine = 0;
  for (int r = 0; r < k; ++r) {
    const uint64_t best = warp_max_u64(list[0]);
    if (best == 0) break;  // every list is empty (the same for the whole warp)
    if (list[0] == best) {  // keys are distinct: exactly one lane holds it
#pragma unroll
      for (int j = 0; j + 1 < kSlots; ++j) list[j] = list[j + 1];
      list[kSlots - 1] = 0;
    }
    if (lane == r) mine = best;
  }
  return mine;
}

__global__ void __launch_bounds__(kThreads, 1)
    row_logprobs_kernel(const float* logits, int64_t vocab, const int32_t* top_k, const int32_t* tokens, RowLogprobs* out) {
  __shared__ float warp_m[kWarps];
  __shared__ double warp_s[kWarps];
  __shared__ uint64_t warp_top[kWarps][kSlots];
  __shared__ double lse_shared;
  const int64_t row = blockIdx.x;
  const int k_asked = top_k[row];
  if (k_asked < 0) return;  // the same for the whole CTA
  const int k = k_asked < kSlots ? k_asked : kSlots;
  const float* x = logits + row * vocab;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);

  float m = -INFINITY;
  double s = 0.0;
  uint64_t list[kSlots];
#pragma unroll
  for (int j = 0; j < kSlots; ++j) list[j] = 0;
#pragma unroll 4
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = __ldg(x + i);
    if (v > m) {  // NaN never is, and adds nothing; nor does -Inf (below, where m may still be -Inf)
      s = s * exp(static_cast<double>(m) - static_cast<double>(v)) + 1.0;
      m = v;
    } else if (v > -INFINITY) {
      s += static_cast<double>(expf(v - m));
    }
    uint64_t key = order_rank(v, i);
    if (key > list[kSlots - 1]) {  // insert, keeping the list sorted (static indices: registers)
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const uint64_t held = list[j];
        const bool here = key > held;
        list[j] = here ? key : held;
        key = here ? held : key;
      }
    }
  }

  // The row's (maximum, sum): warps by shuffles, then thread 0 over the warps.
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xFFFFFFFFu, m, o);
    const double s2 = __shfl_xor_sync(0xFFFFFFFFu, s, o);
    combine(&m, &s, m2, s2);
  }
  if (lane == 0) {
    warp_m[warp] = m;
    warp_s[warp] = s;
  }
  // The top k: each warp's, then warp 0's over the warps'.
  const uint64_t warp_result = warp_best(list, k);
  if (lane < kSlots) warp_top[warp][lane] = lane < k ? warp_result : 0;
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int j = 0; j < kSlots; ++j) list[j] = lane < kWarps ? warp_top[lane][j] : 0;
    const uint64_t best = warp_best(list, k);
    if (lane == 0) {
      float mm = warp_m[0];
      double ss = warp_s[0];
      for (int w = 1; w < kWarps; ++w) combine(&mm, &ss, warp_m[w], warp_s[w]);
      lse_shared = isfinite(mm) ? static_cast<double>(mm) + log(ss) : nan("");
    }
    __syncwarp();
    const double lse = lse_shared;
    RowLogprobs* o = out + row;
    if (lane < k && best != 0) {
      const int32_t id = rank_id(best);
      o->top_ids[lane] = id;
      o->top[lane] = static_cast<float>(static_cast<double>(__ldg(x + id)) - lse);
    }
    if (lane == 0) {
      const int32_t t = tokens[row];
      o->token = t >= 0 && t < vocab ? static_cast<float>(static_cast<double>(__ldg(x + t)) - lse) : nanf("");
      o->count = static_cast<int32_t>(k < vocab ? k : vocab);
    }
  }
}

}  // namespace

Status row_logprobs(const float* logits, int64_t rows, int64_t vocab, const int32_t* top_k, const int32_t* tokens,
                    RowLogprobs* out, CudaStream stream) {
  if (rows < 0 || rows > INT32_MAX) return invalid_argument("row_logprobs: rows " + std::to_string(rows) + " outside [0, 2^31)");
  if (vocab < 1 || vocab > INT32_MAX) return invalid_argument("row_logprobs: vocab " + std::to_string(vocab) + " outside [1, 2^31)");
  if (rows == 0) return {};
  if (logits == nullptr || top_k == nullptr || tokens == nullptr || out == nullptr)
    return invalid_argument("row_logprobs: null logits, top_k, tokens or out");
  row_logprobs_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, vocab, top_k, tokens, out);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("row_logprobs_kernel");
  return {};
}

}  // namespace llmq::runtime
