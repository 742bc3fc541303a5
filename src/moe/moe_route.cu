// cuda_moe_route: top-k routing and the expert-major permutation in one launch, with no host
// sync. The whole batch's slots (tokens x top_k, at most a prefill chunk's worth) are ranked by one
// CTA (the last of the grid to arrive, when the router GEMM or the top-k is spread over CTAs),
// which needs no grid-wide scan: counts, offsets and ranks are computed in shared memory.
//   0. (decode sizes, router_w given) the router GEMM over a grid of CTAs, each expert row split
//      over a few warps and read once for every token (at most 8), the logits written to `logits`;
//      the last CTA to finish routes. The weights do not depend on earlier kernels, so they are
//      prefetched into L2 before the programmatic-launch wait;
//   1. a warp per token (given an arrival counter, larger batches over CTAs of a token per warp;
//      the fused router's tokens in the last CTA): the max by warp reduction (exact in any order); the softmax's sum in expert
//      order by one lane (as the CPU reference sums, so the weights do not depend on the warp
//      layout); the top_k by k passes of "next largest after the previous pick" in (key
//      descending, id ascending) order, each a lane-strided scan and a warp arg-max (ties to the
//      lower id); non-finite logits give defined, valid picks; ids sorted ascending and weights
//      renormalised when asked, by lane 0;
//   2. counts per expert (shared atomics over topk_ids), a warp's shuffle scan -> expert_offsets;
//   3. ranks: slots are taken in chunks of the CTA's thread count in ascending order; inside a
//      warp a slot's rank among same-expert slots comes from __match_any_sync, across the chunk's
//      warps from per-warp counts, across chunks from a running count. So the permuted order is
//      ascending slot order within each expert, the same on every run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/cuda_check.cuh"
#include "cuda/pdl.cuh"
#include "llmq/cuda_moe.hpp"

namespace llmq {
namespace {

constexpr int kMaxThreads = 1024;  // a CTA: 256 threads at decode sizes, 1024 for larger batches
constexpr int kMaxWarps = kMaxThreads / 32;
constexpr int kMaxExperts = 1024;
constexpr int kMaxTopK = 16;
constexpr int kWeightBufferExperts = 256;  // up to here each warp keeps a token's softmax terms in shared memory
constexpr int kFusedTokens = static_cast<int>(kMoeRouteFusedMaxTokens);

__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xFFFF0000u); }

// Step 0, in each of the grid's CTAs: the logits of experts [first, first + per_cta) into
// a.logits (global, [tokens, experts]). Each expert row is split over `split` warps (a power of two
// dividing 32), each warp's piece of the row read once for every token (at most 8); the warps'
// partial sums meet in shared memory and are added in warp order (deterministic).
__device__ void router_logits(const MoeRouteArgs& a, float* partial, int split, int warps, int warp, int lane) {
  const int E = static_cast<int>(a.experts), T = static_cast<int>(a.tokens);
  const int per_cta = warps / split;
  const int e = static_cast<int>(blockIdx.x) * per_cta + warp / split, part = warp % split;
  const int64_t vecs = a.dim / 8;  // 16-byte vectors of eight BF16 per row
  const int64_t piece = (vecs + split - 1) / split;
  const int64_t v_begin = part * piece, v_end = min(vecs, v_begin + piece);
  float acc[kFusedTokens];
#pragma unroll
  for (int t = 0; t < kFusedTokens; ++t) acc[t] = 0.0f;
  if (e < E) {
    const uint4* x = static_cast<const uint4*>(a.router_x);
    const uint4* w = static_cast<const uint4*>(a.router_w) + e * vecs;
#pragma unroll 2
    for (int64_t c = v_begin + lane; c < v_end; c += 32) {
      const uint4 wv = __ldg(w + c);
#pragma unroll
      for (int t = 0; t < kFusedTokens; ++t) {
        if (t >= T) break;
        const uint4 xv = x[t * vecs + c];
        float s = acc[t];
        s = fmaf(bf16_lo(wv.x), bf16_lo(xv.x), s);
        s = fmaf(bf16_hi(wv.x), bf16_hi(xv.x), s);
        s = fmaf(bf16_lo(wv.y), bf16_lo(xv.y), s);
        s = fmaf(bf16_hi(wv.y), bf16_hi(xv.y), s);
        s = fmaf(bf16_lo(wv.z), bf16_lo(xv.z), s);
        s = fmaf(bf16_hi(wv.z), bf16_hi(xv.z), s);
        s = fmaf(bf16_lo(wv.w), bf16_lo(xv.w), s);
        s = fmaf(bf16_hi(wv.w), bf16_hi(xv.w), s);
        acc[t] = s;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kFusedTokens; ++t) {
    if (t >= T) break;
    float v = acc[t];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    if (lane == 0) partial[warp * kFusedTokens + t] = v;
  }
  __syncthreads();
  const int tid = warp * 32 + lane;
  if (tid < per_cta * T) {
    const int local = tid / T, t = tid % T, ex = static_cast<int>(blockIdx.x) * per_cta + local;
    if (ex < E) {
      float v = 0.0f;
      for (int w = 0; w < split; ++w) v += partial[(local * split + w) * kFusedTokens + t];
      a.logits[t * a.experts + ex] = v;
    }
  }
}

// Step 1 for token t, by one warp: its picks in topk_ids / topk_weights.
// `terms` is the warp's [E] scratch for the softmax terms, or null (E > kWeightBufferExperts).
// ids / probs: the warp's scratch for its k picks. kSlots > 0 (E <= 32 kSlots, terms given): lane i's experts lane + 32 j live in registers, read
// once; the k passes then touch no memory. kSlots == 0: any E, each pass reads the logits again.
template <int kSlots>
__device__ void route_token(const MoeRouteArgs& a, const float* l, int64_t t, float* terms, int* ids, float* probs,
                            int lane, bool coherent) {
  const int E = static_cast<int>(a.experts), K = static_cast<int>(a.top_k);
  // Finite logits behave as the CPU reference. Non-finite rows still give k distinct valid experts
  // (an overflowed hidden state must not turn into out-of-bounds writes): NaN counts as -inf; a
  // +inf logit takes all the probability (shared among the +inf ones); a row with no finite logit
  // and no +inf is uniform.
  const auto logit = [&](int e) {
    const float raw = coherent ? __ldcg(l + e) : l[e];
    const float v = a.logit_bias != nullptr ? raw + a.logit_bias[e] : raw;
    return isnan(v) ? -INFINITY : v;
  };
  // exp(v - mx) with the non-finite cases above.
  const auto weight = [](float v, float mx) {
    if (isinf(mx)) return mx > 0.0f ? (v == mx ? 1.0f : 0.0f) : 1.0f;
    return expf(v - mx);
  };
  constexpr int kHeld = kSlots > 0 ? kSlots : 1;
  const int slots = kSlots > 0 ? kSlots : (E + 31) / 32;  // lane's experts: lane + 32 j, j < slots
  float held[kHeld];  // kSlots > 0: the logits, then the ranking keys
  if constexpr (kSlots > 0) {
#pragma unroll
    for (int j = 0; j < kSlots; ++j) held[j] = lane + 32 * j < E ? logit(lane + 32 * j) : -INFINITY;
  }
  const auto logit_of = [&](int j, int e) {
    if constexpr (kSlots > 0) return held[j];
    return logit(e);
  };
  float mx = -INFINITY, sum = 0.0f;
  if (!a.topk_softmax) {
#pragma unroll
    for (int j = 0; j < slots; ++j)
      if (lane + 32 * j < E) mx = fmaxf(mx, logit_of(j, lane + 32 * j));
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
    // The sum in expert order by lane 0, as the CPU reference sums (the weights then do not depend
    // on the warp layout).
    if (terms != nullptr) {
#pragma unroll
      for (int j = 0; j < slots; ++j)
        if (lane + 32 * j < E) terms[lane + 32 * j] = weight(logit_of(j, lane + 32 * j), mx);
      __syncwarp();
      // Unrolled, the loads run ahead of the adds, which stay in expert order (the same sum).
      if (lane == 0) {
#pragma unroll 8
        for (int e = 0; e < E; ++e) sum += terms[e];
      }
    } else if (lane == 0) {
      for (int e = 0; e < E; ++e) sum += weight(logit(e), mx);
    }
    sum = __shfl_sync(0xFFFFFFFFu, sum, 0);
  }
  // The key experts are ranked by: the probability, or (topk_softmax) the logit itself.
  if constexpr (kSlots > 0) {
    if (!a.topk_softmax)
#pragma unroll
      for (int j = 0; j < kSlots; ++j)
        if (lane + 32 * j < E) held[j] = terms[lane + 32 * j] / sum;
  }
  const auto key = [&](int j, int e) {
    if constexpr (kSlots > 0) return held[j];
    if (a.topk_softmax) return logit(e);
    return (terms != nullptr ? terms[e] : weight(logit(e), mx)) / sum;
  };
  // ids / probs: the warp's [kMaxTopK] picks in shared memory (written by lane 0; no local memory).
  float prev_p = 0.0f;
  int prev_id = -1;
  for (int s = 0; s < K; ++s) {
    // The next expert in (key descending, id ascending) order after (prev_p, prev_id): each lane's
    // best among its experts (ascending, strict >: the lower id wins a tie), then the warp's.
    float best_p = 0.0f;
    int best = -1;
#pragma unroll
    for (int j = 0; j < slots; ++j) {
      const int e = lane + 32 * j;
      if (e >= E) break;
      const float p = key(j, e);
      const bool after = prev_id < 0 || p < prev_p || (p == prev_p && e > prev_id);
      if (after && (best < 0 || p > best_p)) {
        best_p = p;
        best = e;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float op = __shfl_xor_sync(0xFFFFFFFFu, best_p, o);
      const int ob = __shfl_xor_sync(0xFFFFFFFFu, best, o);
      if (ob >= 0 && (best < 0 || op > best_p || (op == best_p && ob < best))) {
        best_p = op;
        best = ob;
      }
    }
    if (best < 0) {  // unreachable with the keys above; kept so that an id is always valid
      best = 0;
      for (bool taken = true; taken && best < E; ) {
        taken = false;
        for (int i = 0; i < s; ++i) taken = taken || ids[i] == best;
        if (taken) ++best;
      }
      best_p = a.topk_softmax ? -INFINITY : 0.0f;
    }
    if (lane == 0) {
      ids[s] = best;
      probs[s] = best_p;
    }
    __syncwarp();
    prev_p = best_p;
    prev_id = best;
  }
  if (lane != 0) return;
  if (a.topk_softmax) {  // softmax over the k logits in rank order (the first is the largest)
    const float top = probs[0];
    float total = 0.0f;
    for (int s = 0; s < K; ++s) {
      probs[s] = weight(probs[s], top);
      total += probs[s];
    }
    for (int s = 0; s < K; ++s) probs[s] = probs[s] / total;
  } else if (a.renormalize) {  // divided by their sum, summed in rank order as torch sums them
    float total = 0.0f;
    for (int s = 0; s < K; ++s) total += probs[s];
    for (int s = 0; s < K; ++s) probs[s] = total > 0.0f ? probs[s] / total : 1.0f / static_cast<float>(K);
  }
  // Ascending expert id (insertion sort of <= 16).
  for (int i = 1; i < K; ++i)
    for (int j = i; j > 0 && ids[j - 1] > ids[j]; --j) {
      const int ti = ids[j]; ids[j] = ids[j - 1]; ids[j - 1] = ti;
      const float tp = probs[j]; probs[j] = probs[j - 1]; probs[j - 1] = tp;
    }
  for (int s = 0; s < K; ++s) {
    a.topk_ids[t * K + s] = ids[s];
    a.topk_weights[t * K + s] = probs[s];
  }
}

// Shared memory: counts and running offsets per expert, per-warp counts of one chunk
// ([warps][experts]), then the softmax scratch ([warps][experts], E <= kWeightBufferExperts).
// With the router fused, the grid's CTAs each compute some experts' logits (router_split warps per
// expert row) and the last CTA to finish (an arrival counter, reset by that CTA for the next
// launch) routes; otherwise the grid is one CTA.
// kBound: the CTA's threads (256 at decode sizes, where registers then hold a lane's logits without
// spilling; 1024 for larger batches).
template <int kBound>
__global__ void __launch_bounds__(kBound) moe_route_kernel(MoeRouteArgs a, int router_split, int64_t tokens_per_cta) {
  extern __shared__ int32_t smem[];
  const int threads = static_cast<int>(blockDim.x), warps = threads / 32;
  const int E = static_cast<int>(a.experts), K = static_cast<int>(a.top_k);
  int32_t* count = smem;                    // [experts]
  int32_t* next = smem + E;                 // [experts]: first free permuted row of each expert
  int32_t* warp_count = smem + 2 * E;       // [warps][experts]
  float* terms = E <= kWeightBufferExperts ? reinterpret_cast<float*>(smem + (2 + warps) * E) : nullptr;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const bool fused = a.router_w != nullptr;
  if (fused) {  // this CTA's router rows into L2 while the kernel before this one finishes
    const int per_cta = warps / router_split;
    const int64_t row_bytes = a.dim * 2, first = static_cast<int64_t>(blockIdx.x) * per_cta;
    const int64_t rows = min(static_cast<int64_t>(per_cta), a.experts - first);
    const char* w = static_cast<const char*>(a.router_w) + first * row_bytes;
    for (int64_t off = static_cast<int64_t>(tid) * 128; off < rows * row_bytes; off += static_cast<int64_t>(threads) * 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(w + off));
  }
  llmq::detail::pdl_wait();  // the logits or the router's input come from the kernels before this one
  llmq::detail::pdl_launch_dependents();
  __shared__ int pick_ids[kMaxWarps][kMaxTopK];
  __shared__ float pick_probs[kMaxWarps][kMaxTopK];
  // 1. Top-k of tokens [begin, end), a warp each (the fused logits, written by other CTAs, are read
  // past L1).
  const int64_t ld = a.logits_stride == 0 || fused ? a.experts : a.logits_stride;
  const auto route_tokens = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin + warp; t < end; t += warps) {
      const float* row = a.logits + t * ld;
      int* ids = pick_ids[warp];
      float* probs = pick_probs[warp];
      if (E <= 64)
        route_token<2>(a, row, t, terms + warp * E, ids, probs, lane, fused);
      else if (E <= kWeightBufferExperts)
        route_token<kWeightBufferExperts / 32>(a, row, t, terms + warp * E, ids, probs, lane, fused);
      else
        route_token<0>(a, row, t, nullptr, ids, probs, lane, fused);
    }
  };
  if (fused) {
    __shared__ float partial[kMaxWarps * kFusedTokens];
    router_logits(a, partial, router_split, warps, warp, lane);
    if (gridDim.x == 1) {  // the routing below reads logits other warps wrote (several CTAs: the arrival orders them)
      __threadfence_block();
      __syncthreads();
    }
  } else {
    const int64_t begin = static_cast<int64_t>(blockIdx.x) * tokens_per_cta;
    route_tokens(begin, min(a.tokens, begin + tokens_per_cta));
  }
  if (gridDim.x > 1) {  // the last CTA to arrive goes on
    __shared__ bool last;
    __threadfence();  // this CTA's logits or picks visible to that CTA
    __syncthreads();
    if (tid == 0) last = atomicAdd(a.arrivals, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (tid == 0) *a.arrivals = 0u;  // every CTA has arrived: ready for the next launch
  }
  if (fused) route_tokens(0, a.tokens);
  for (int e = tid; e < E; e += threads) count[e] = 0;
  __syncthreads();
  // Counts per expert; topk_ids may come from other CTAs (read from L2).
  const int64_t slots = a.tokens * a.top_k;
  for (int64_t slot = tid; slot < slots; slot += threads) atomicAdd(&count[__ldcg(a.topk_ids + slot)], 1);
  __syncthreads();

  // 2. Offsets: an exclusive scan of the counts by warp 0, 32 experts at a time.
  if (warp == 0) {
    int32_t carry = 0;
    for (int base = 0; base < E; base += 32) {
      const int e = base + lane;
      const int32_t c = e < E ? count[e] : 0;
      int32_t incl = c;
      for (int o = 1; o < 32; o <<= 1) {
        const int32_t up = __shfl_up_sync(0xFFFFFFFFu, incl, o);
        if (lane >= o) incl += up;
      }
      if (e < E) {
        a.expert_offsets[e] = carry + incl - c;
        next[e] = carry + incl - c;
      }
      carry += __shfl_sync(0xFFFFFFFFu, incl, 31);
    }
    if (lane == 0) a.expert_offsets[E] = carry;
  }
  __syncthreads();

  // 3. Ranks, chunk by chunk.
  for (int64_t base = 0; base < slots; base += threads) {
    // Warps past the chunk's last slot hold none: their counts are neither zeroed nor added.
    const int active = static_cast<int>(min(static_cast<int64_t>(warps), (slots - base + 31) / 32));
    for (int i = tid; i < active * E; i += threads) warp_count[i] = 0;
    __syncthreads();
    const int64_t slot = base + tid;
    const bool valid = slot < slots;
    const int e = valid ? __ldcg(a.topk_ids + slot) : -1 - lane;  // invalid lanes match nobody
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const int rank_in_warp = __popc(same & ((1u << lane) - 1u));
    if (valid && rank_in_warp == 0) warp_count[warp * E + e] = __popc(same);
    __syncthreads();
    if (valid) {
      int row = next[e] + rank_in_warp;
      for (int w = 0; w < warp; ++w) row += warp_count[w * E + e];
      a.sorted_slots[row] = static_cast<int32_t>(slot);
      a.slot_rows[slot] = row;
      if (a.row_tokens != nullptr) a.row_tokens[row] = static_cast<int32_t>(slot / K);
      if (a.row_experts != nullptr) a.row_experts[row] = e;
    }
    __syncthreads();
    for (int x = tid; x < E; x += threads) {
      int32_t c = 0;
      for (int w = 0; w < active; ++w) c += warp_count[w * E + x];
      next[x] += c;
    }
    __syncthreads();
  }
}

}  // namespace

Status cuda_moe_route(const MoeRouteArgs& a, CudaStream stream) {
  if (a.tokens < 0) return invalid_argument("tokens: must be >= 0, got " + std::to_string(a.tokens));
  if (a.experts < 1 || a.experts > kMaxExperts)
    return invalid_argument("experts: must be in [1, " + std::to_string(kMaxExperts) + "], got " +
                            std::to_string(a.experts));
  if (a.top_k < 1 || a.top_k > a.experts || a.top_k > kMaxTopK)
    return invalid_argument("top_k: must be in [1, min(experts, " + std::to_string(kMaxTopK) + ")], got " +
                            std::to_string(a.top_k));
  if (a.tokens * a.top_k > (int64_t{1} << 30))
    return invalid_argument("tokens: " + std::to_string(a.tokens) + " x top_k overflows the int32 row indices");
  if (a.logits_stride != 0 && a.logits_stride < a.experts)
    return invalid_argument("logits_stride: must be 0 or >= experts, got " + std::to_string(a.logits_stride));
  if (a.expert_offsets == nullptr) return invalid_argument("expert_offsets: null device pointer");
  if (a.tokens > 0) {
    if (a.logits == nullptr && a.router_w == nullptr) return invalid_argument("logits: null device pointer");
    if (a.topk_ids == nullptr) return invalid_argument("topk_ids: null device pointer");
    if (a.topk_weights == nullptr) return invalid_argument("topk_weights: null device pointer");
    if (a.sorted_slots == nullptr) return invalid_argument("sorted_slots: null device pointer");
    if (a.slot_rows == nullptr) return invalid_argument("slot_rows: null device pointer");
  }
  if (a.router_w != nullptr) {
    if (!moe_route_computes_logits(a.tokens, a.experts, a.dim))
      return invalid_argument("router_w: the routing kernel takes the router GEMM only at 1.." +
                              std::to_string(kMoeRouteFusedMaxTokens) + " tokens, <= 256 experts, dim % 8 == 0 (tokens " +
                              std::to_string(a.tokens) + ", experts " + std::to_string(a.experts) + ", dim " +
                              std::to_string(a.dim) + ")");
    if (a.router_x == nullptr) return invalid_argument("router_x: null device pointer");
    if (a.logits == nullptr) return invalid_argument("logits: null device pointer (the fused router writes them)");
    if (a.arrivals == nullptr) return invalid_argument("arrivals: null device pointer (the fused router's counter)");
    if (reinterpret_cast<uintptr_t>(a.router_x) % 16 != 0 || reinterpret_cast<uintptr_t>(a.router_w) % 16 != 0)
      return invalid_argument("router_x / router_w: must be 16-byte aligned");
  }
  // Decode sizes take CTAs of 8 warps (no register spills: a lane's logits stay in registers; the
  // fused router then spreads over more CTAs); larger batches CTAs of 32 warps, a token a warp
  // (one CTA for every token when there is no arrival counter).
  const int threads = a.tokens <= 64 ? 256 : kMaxThreads, warps = threads / 32;
  const int64_t words = (2 + warps + (a.experts <= kWeightBufferExperts ? warps : 0)) * a.experts;
  const size_t smem = sizeof(int32_t) * static_cast<size_t>(words);
  // The fused router: warps per expert row so that each lane has about two 16-byte loads per
  // token (one memory round trip), a power of two up to 32; the grid covers the experts.
  // Otherwise, with a counter, the top-k is spread over CTAs of a token per warp and the last CTA
  // ranks; without one, one CTA does everything.
  int split = 1;
  unsigned grid = 1;
  int64_t tokens_per_cta = a.tokens;
  if (a.router_w != nullptr) {
    while (split < 32 && split * 32 * 2 < a.dim / 8) split *= 2;
    split = std::min(split, warps);
    grid = static_cast<unsigned>((a.experts + warps / split - 1) / (warps / split));
  } else if (a.arrivals != nullptr && a.tokens > 0) {
    tokens_per_cta = warps;
    grid = static_cast<unsigned>((a.tokens + tokens_per_cta - 1) / tokens_per_cta);
  }
  auto kernel = threads == kMaxThreads ? moe_route_kernel<kMaxThreads> : moe_route_kernel<256>;
  // The opt-in counts dynamic shared memory beside the kernel's static arrays (about 5 KB).
  if (smem + 8 * 1024 > 48 * 1024)
    LLMQ_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  LLMQ_CUDA_RETURN_IF_ERROR(
      detail::launch_pdl(kernel, dim3(grid), dim3(threads), smem, static_cast<cudaStream_t>(stream), a, split,
                         tokens_per_cta));
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("moe_route_kernel");
  return {};
}

}  // namespace llmq
