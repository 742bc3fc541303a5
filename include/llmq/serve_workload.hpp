// What `llmq bench serve` sends the engine: request lengths from a dataset and arrival times.
//   fixed:I/O         every request I prompt tokens and O output tokens (stops ignored), as the
//                     throughput tables of TensorRT-LLM and vLLM are measured (128/128, 2048/2048, ...)
//   sharegpt-like     lengths drawn from log-normal distributions fitted to chat traffic the way
//                     ShareGPT is usually summarised: prompt median 120 tokens (sigma 1.0, mean
//                     about 198), output median 110 (sigma 0.9, mean about 165), both clamped to
//                     [4, 1024]. A stand-in for the dataset, which cannot be fetched here: its
//                     parameters are stated, not measured from the real file.
// Arrivals: all at time 0 (offline, rate infinity) or a Poisson process at `rate` requests per
// second (exponential gaps). Everything is seeded: the same arguments give the same workload.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llmq/status.hpp"

namespace llmq::engine {

struct WorkloadRequest {
  std::vector<int32_t> prompt;
  int64_t output_tokens = 0;  // max_new_tokens, generated in full (no stop ids)
  double arrival_s = 0;       // seconds after the benchmark starts
};

struct WorkloadOptions {
  std::string dataset = "fixed:128/128";  // or "sharegpt-like"
  int64_t requests = 100;
  double rate = 0;              // requests per second; 0 or infinity: all at once (offline)
  int64_t vocab_size = 0;       // prompt tokens are drawn from [first_token, vocab_size)
  int32_t first_token = 3;      // skip BOS/EOS-like low ids
  int64_t max_model_len = 0;    // a request's prompt + output is clamped to fit (0: no clamp)
  uint64_t seed = 1;
};

// Errors name the option: an unknown dataset, I or O < 1, requests < 1 or past 10^7, prompts of
// more than 2^28 tokens in all, a negative or non-finite rate, a vocabulary with no token past
// first_token.
Status make_workload(const WorkloadOptions& options, std::vector<WorkloadRequest>* out);

}  // namespace llmq::engine
