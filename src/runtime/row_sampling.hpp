// Per-row token sampling for the serving engine: every logits row drawn with its own temperature,
// top-k, top-p, seed and draw index, on the device (row_sampling.cu) and, as the specification, on
// the host (row_sampling_reference.cpp, double precision, exact sorting). Internal header; no CUDA
// headers (the uniform below is host and device code when nvcc reads this file).
//
// The definition, for one row of float logits l[0 .. vocab-1] and its RowSamplingParams:
//   * Greedy rows: temperature not > 0 (0, negative or NaN), or top_k == 1. The token is the argmax:
//     the largest logit, ties to the lowest id, NaN never chosen (a row of NaN only gives 0).
//   * Order. Tokens are ranked by logit, largest first, equal logits by id, lowest first; -0 equals
//     +0 and NaN ranks last. Top-k and top-p both keep a prefix of this order.
//   * Weights. m = the largest non-NaN logit; w_i = 1 where l_i == m, 0 where l_i is NaN, else
//     exp((l_i - m) / T). So a row whose maximum is +Inf samples uniformly among its +Inf tokens,
//     -Inf tokens have weight 0 unless every non-NaN logit is -Inf, and p_i = w_i / sum(w) is
//     softmax(l / T).
//   * Top-k (top_k > 1 and < vocab): keep the first top_k tokens of the order. Ties at the k-th
//     logit are broken by id: exactly k tokens are kept, the lowest ids among equal logits
//     (top_k = 1 is therefore the argmax). top_k <= 0 or >= vocab keeps every token.
//   * Top-p (top_p < 1), after top-k: keep the shortest prefix of the order, within the top-k set,
//     whose weight reaches top_p times the top-k set's weight (vLLM's and Hugging Face's nucleus:
//     top-k first, then top-p; at least one token, so top_p <= 0 keeps only the argmax). top_p >= 1
//     or NaN keeps the whole top-k set.
//   * Draw. u = sampling_uniform01(seed, draw) in [0, 1); the token is the first kept token, in id
//     order, whose running weight (over kept tokens, id order) exceeds u times the kept weight: the
//     inverse of the renormalised distribution's CDF with the tokens in id order. A request's token
//     depends on its logits, its parameters and (seed, draw) only, never on the rows beside it.
//
// What the device adds to that definition (each difference moves a token only at a near-tie):
//   * Weights are computed in float (ex2.approx, relative error ~2^-22) and held as integers,
//     round(w * 2^31); every sum, comparison and the draw are exact integer arithmetic, so a row's
//     token is the same on every run, in every batch and however many CTAs share the row. A token
//     with w <= 2^-32 (l_i at least 22.2 T below the maximum) weighs 0 there and is never drawn.
//   * The top-p threshold is ceil(top_p * kept weight) in those integers.
// The host reference computes the same definition in double with exp and a full sort; the GPU test
// (tests/test_cuda_row_sampling.cpp) requires the two to agree except where u, or the top-p
// threshold, lies within 1e-4 (relative to the kept weight) of a boundary of the running weights.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "llmq/cuda_stream.hpp"
#include "llmq/status.hpp"

namespace llmq::runtime {

// One per logits row; plain data, uploaded to the device by the caller.
struct RowSamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, ties to the lowest id)
  float top_p = 1.0f;        // (0, 1]; 1: no nucleus cut
  int32_t top_k = 0;         // 0: no limit; else the top_k first tokens of the order (ties by id)
  uint64_t seed = 0;         // the request's seed
  int64_t draw = 0;          // tokens the request sampled before this one: u = uniform(seed, draw)
};
static_assert(std::is_trivially_copyable_v<RowSamplingParams> && std::is_standard_layout_v<RowSamplingParams>,
              "RowSamplingParams is copied to the device byte for byte");
static_assert(sizeof(RowSamplingParams) == 32, "one layout on host and device");

// The uniform of a (seed, draw): splitmix64's finaliser of seed * golden ratio + draw, its top 24
// bits. The same arithmetic as sampling_kernels.cu's uniform01 (which hashes step * 65536 + row in
// place of draw); host and device compute identical bits.
#if defined(__CUDACC__)
#define LLMQ_ROW_SAMPLING_HD __host__ __device__ __forceinline__
#else
#define LLMQ_ROW_SAMPLING_HD inline
#endif
LLMQ_ROW_SAMPLING_HD uint32_t sampling_uniform24(uint64_t seed, int64_t draw) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(draw);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 40);
}
// k / 2^24 for k = sampling_uniform24(seed, draw): exact in float.
LLMQ_ROW_SAMPLING_HD float sampling_uniform01(uint64_t seed, int64_t draw) {
  return static_cast<float>(sampling_uniform24(seed, draw)) * (1.0f / 16777216.0f);
}
#undef LLMQ_ROW_SAMPLING_HD

// tokens[r] = the token the definition above draws from logits row r (float32 [rows, vocab]) with
// params[r]. params, tokens and logits are device memory. Each row is drawn by one CTA of 1024
// threads, or by a cluster of 2-8 when the batch is small (sm_90; row_sampling.cu has the passes
// and timings); the launch depends on rows, vocab and the device only, with no host
// synchronisation and no allocation: safe to capture in a CUDA graph. Refused: rows < 0, vocab < 1 or > INT32_MAX, a
// workspace smaller than sample_rows_each_workspace_bytes. Parameters are not validated on the
// device: each field's out-of-range values behave as the definition says (the engine refuses them
// before they get here). With `unusable` set, the same pass also sets *unusable = 1 when a row
// among the first *valid_rows (every row when valid_rows is null) holds a NaN or Inf or is
// constant (vocab > 1): flag_unusable_rows' test, without a second read of the logits.
Status sample_rows_each(const float* logits, int64_t rows, int64_t vocab, const RowSamplingParams* params,
                        int32_t* tokens, void* workspace, int64_t workspace_bytes, CudaStream stream,
                        int32_t* unusable = nullptr, const int32_t* valid_rows = nullptr);
// The workspace sample_rows_each needs: 0 today (each row's passes keep their state in shared
// memory); callers pass what this returns so that a row-splitting kernel can need one later.
int64_t sample_rows_each_workspace_bytes(int64_t rows, int64_t vocab);

// ---- The host reference (row_sampling_reference.cpp; built with or without CUDA).

// The token the definition draws, computed in double with a full sort.
int32_t sample_row_reference(const float* logits, int64_t vocab, const RowSamplingParams& p);

// The reference's workings, for tests: the kept set and its renormalised probabilities, and how
// close the draw and the top-p cut came to flipping.
struct RowSamplingTrace {
  int32_t token = 0;
  bool greedy = false;
  std::vector<int32_t> kept;         // the kept ids, in id order (greedy: the argmax alone)
  std::vector<double> probability;   // each kept id's renormalised probability, same order
  double u = 0.0;                    // sampling_uniform01(seed, draw)
  // min |running weight - u * kept weight| over the kept tokens' running weights (id order), and
  // |running weight - top_p * top-k weight| at the last token of the nucleus and the one before it
  // (order), both divided by the weight they cut; +inf where there is no such cut.
  double draw_margin = 0.0;
  double nucleus_margin = 0.0;
};
RowSamplingTrace trace_row_sampling(const float* logits, int64_t vocab, const RowSamplingParams& p);

}  // namespace llmq::runtime
