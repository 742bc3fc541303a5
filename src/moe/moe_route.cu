// cuda_moe_route: top-k routing and the expert-major permutation, in one CTA and one launch, with
// no host sync. The whole batch's slots (tokens x top_k, at most a prefill chunk's worth) fit one
// CTA's work comfortably, and one CTA needs no grid-wide scan: counts, offsets and ranks are
// computed in shared memory.
//   1. thread per token: softmax over the experts (as the CPU reference: max, exp, sum, divide;
//      non-finite logits get defined, valid picks) and the top_k by probability, or (topk_softmax)
//      the top_k by logit and a softmax over them; ties to the lower id, found by k passes of
//      "next largest"; their ids sorted ascending and weights renormalised when asked;
//   2. counts per expert (shared atomics), exclusive scan -> expert_offsets;
//   3. ranks: slots are taken in chunks of 1024 in ascending order; inside a warp a slot's rank
//      among same-expert slots comes from __match_any_sync, across the chunk's warps from per-warp
//      counts, across chunks from a running count. So the permuted order is ascending slot order
//      within each expert, the same on every run.
#include <cuda_runtime.h>

#include <string>

#include "cuda/cuda_check.cuh"
#include "llmq/cuda_moe.hpp"

namespace llmq {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxExperts = 1024;
constexpr int kMaxTopK = 16;

// Shared memory: counts and running offsets per expert, and per-warp counts of one chunk
// ([kWarps][experts], dynamic).
__global__ void __launch_bounds__(kThreads) moe_route_kernel(MoeRouteArgs a) {
  extern __shared__ int32_t smem[];
  int32_t* count = smem;                    // [experts]
  int32_t* next = smem + a.experts;         // [experts]: first free permuted row of each expert
  int32_t* warp_count = smem + 2 * a.experts;  // [kWarps][experts]
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int E = static_cast<int>(a.experts), K = static_cast<int>(a.top_k);
  const int64_t ld = a.logits_stride == 0 ? a.experts : a.logits_stride;
  for (int e = tid; e < E; e += kThreads) count[e] = 0;
  __syncthreads();

  // 1. Top-k per token.
  for (int64_t t = tid; t < a.tokens; t += kThreads) {
    const float* l = a.logits + t * ld;
    // Finite logits behave as the CPU reference. Non-finite rows still give k distinct valid
    // experts (an overflowed hidden state must not turn into out-of-bounds writes): NaN counts as
    // -inf; a +inf logit takes all the probability (shared among the +inf ones); a row with no
    // finite logit and no +inf is uniform.
    const auto logit = [&](int e) {
      const float v = a.logit_bias != nullptr ? l[e] + a.logit_bias[e] : l[e];
      return isnan(v) ? -INFINITY : v;
    };
    // exp(v - mx) with the non-finite cases above.
    const auto weight = [](float v, float mx) {
      if (isinf(mx)) return mx > 0.0f ? (v == mx ? 1.0f : 0.0f) : 1.0f;
      return expf(v - mx);
    };
    float mx = -INFINITY, sum = 0.0f;
    if (!a.topk_softmax) {
      for (int e = 0; e < E; ++e) mx = fmaxf(mx, logit(e));
      for (int e = 0; e < E; ++e) sum += weight(logit(e), mx);
    }
    // The key experts are ranked by: the probability, or (topk_softmax) the logit itself.
    const auto key = [&](int e) { return a.topk_softmax ? logit(e) : weight(logit(e), mx) / sum; };
    int ids[kMaxTopK];
    float probs[kMaxTopK];
    float prev_p = 0.0f;
    int prev_id = -1;
    for (int s = 0; s < K; ++s) {
      // The next expert in (key descending, id ascending) order after (prev_p, prev_id).
      float best_p = 0.0f;
      int best = -1;
      for (int e = 0; e < E; ++e) {
        const float p = key(e);
        const bool after = prev_id < 0 || p < prev_p || (p == prev_p && e > prev_id);
        if (after && (best < 0 || p > best_p)) {  // strict >: the lower id wins a tie
          best_p = p;
          best = e;
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
      ids[s] = best;
      probs[s] = best_p;
      prev_p = best_p;
      prev_id = best;
    }
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
      atomicAdd(&count[ids[s]], 1);
    }
  }
  __syncthreads();

  // 2. Offsets (E <= 1024: a serial scan by one thread is ~1 us and keeps this simple).
  if (tid == 0) {
    int32_t run = 0;
    for (int e = 0; e < E; ++e) {
      a.expert_offsets[e] = run;
      next[e] = run;
      run += count[e];
    }
    a.expert_offsets[E] = run;
  }
  __syncthreads();

  // 3. Ranks, chunk by chunk. topk_ids written by other threads above: visible after the barrier.
  const int64_t slots = a.tokens * a.top_k;
  for (int64_t base = 0; base < slots; base += kThreads) {
    for (int i = tid; i < kWarps * E; i += kThreads) warp_count[i] = 0;
    __syncthreads();
    const int64_t slot = base + tid;
    const bool valid = slot < slots;
    const int e = valid ? a.topk_ids[slot] : -1 - lane;  // invalid lanes match nobody
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
    for (int x = tid; x < E; x += kThreads) {
      int32_t c = 0;
      for (int w = 0; w < kWarps; ++w) c += warp_count[w * E + x];
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
    if (a.logits == nullptr) return invalid_argument("logits: null device pointer");
    if (a.topk_ids == nullptr) return invalid_argument("topk_ids: null device pointer");
    if (a.topk_weights == nullptr) return invalid_argument("topk_weights: null device pointer");
    if (a.sorted_slots == nullptr) return invalid_argument("sorted_slots: null device pointer");
    if (a.slot_rows == nullptr) return invalid_argument("slot_rows: null device pointer");
  }
  const size_t smem = sizeof(int32_t) * static_cast<size_t>((2 + kWarps) * a.experts);
  auto kernel = moe_route_kernel;
  if (smem > 48 * 1024)
    LLMQ_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<1, kThreads, smem, static_cast<cudaStream_t>(stream)>>>(a);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("moe_route_kernel");
  return {};
}

}  // namespace llmq
