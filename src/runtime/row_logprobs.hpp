// Log-probabilities of sampled rows for the serving engine (OpenAI's logprobs / top_logprobs), on
// the device (row_logprobs.cu) and, as the specification, on the host (row_logprobs_reference.cpp,
// double precision, a full ordering). Internal header; no CUDA headers.
//
// The definition, for one row of float logits l[0 .. vocab-1], its sampled token t and K >= 0:
//   * The distribution is the model's, before temperature, top-k and top-p (vLLM's default "raw"
//     logprobs): logprob_i = l_i - lse, lse = m + log(sum_j exp(l_j - m)), m the largest non-NaN
//     logit, the sum over the non-NaN logits. A NaN logit's logprob is NaN, a -Inf logit's -Inf.
//     A row whose m is not finite (a +Inf logit, or nothing but -Inf and NaN) has no distribution:
//     every logprob is NaN (GpuRuntime::step refuses such rows anyway: its unusable-logits flag).
//   * token = logprob_t (NaN when t is outside [0, vocab)).
//   * The top K are the first min(K, vocab) tokens of row_sampling.hpp's order: larger logit first,
//     equal logits by id (lowest first), -0 equal to +0, NaN last. So ties at the K-th logit keep
//     the lowest ids, and top-K here is the set top-k sampling keeps.
//
// What the device adds: each thread keeps a running maximum and sum over its share of the row (one
// read of it), exp in float (expf, 2 ulp) summed in double, the shares combined in double. The GPU
// test (tests/test_cuda_row_logprobs.cpp) holds the device to the reference within
// |device - reference| <= 1e-5 + 1e-6 |reference| and requires the top ids to be identical (the
// order involves no arithmetic).
#pragma once

#include <cstdint>
#include <vector>

#include "llmq/cuda_stream.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/status.hpp"

namespace llmq::runtime {

// out[r] = row r's RowLogprobs by the definition above, for each row r < rows with top_k[r] >= 0
// (rows with top_k[r] < 0 are left as they are); token r is tokens[r], K is top_k[r] (at most
// kMaxTopLogprobs). logits [rows, vocab] float32, top_k, tokens and out are device memory. One
// CTA per row; no allocation, no host synchronisation; ordered after the work before it on
// `stream` (an ordinary launch). Refused: rows < 0, vocab < 1 or > INT32_MAX, null pointers.
Status row_logprobs(const float* logits, int64_t rows, int64_t vocab, const int32_t* top_k, const int32_t* tokens,
                    RowLogprobs* out, CudaStream stream);

// ---- The host reference (row_logprobs_reference.cpp; built with or without CUDA).

struct RowLogprobsReference {
  double lse = 0.0;              // m + log(sum exp(l - m)); NaN when the row has no distribution
  double token = 0.0;            // the sampled token's logprob
  std::vector<int32_t> top_ids;  // the first min(k, vocab) tokens of the order
  std::vector<double> top;       // their logprobs
};
// The definition in double with a full ordering (k < 0 is taken as 0).
RowLogprobsReference row_logprobs_reference(const float* logits, int64_t vocab, int32_t token, int32_t k);

}  // namespace llmq::runtime
