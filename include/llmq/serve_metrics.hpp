// Per-request latency figures of a serving benchmark, as users measure an engine (and as vLLM's
// benchmark_serving and trtllm-bench define them):
//   TTFT  first token time - arrival
//   TPOT  (last token time - first token time) / (output tokens - 1), per request with >= 2 tokens
//   ITL   every gap between consecutive tokens of a request, over all requests
//   E2E   last token time - arrival
// Throughput over the benchmark's duration (first arrival to last token): output tokens/s, total
// (prompt + output) tokens/s, requests/s. Percentiles interpolate linearly between order statistics
// (numpy's default), so p50 of {1, 2, 3, 4} is 2.5.
#pragma once

#include <cstdint>
#include <vector>

#include "llmq/status.hpp"

namespace llmq::engine {

struct RequestTimeline {
  double arrival_s = 0;
  int64_t prompt_tokens = 0;
  std::vector<double> token_s;  // when each output token was produced, ascending
  // 0: one token per entry of token_s. Else the request's token count where token_s holds fewer
  // times: a streamed text answer without token ids, whose chunks each carry one or more tokens
  // (llmq bench serve --url). TPOT and the token counts use it; TTFT, ITL and E2E the chunk times,
  // as vLLM's benchmark_serving counts such a stream.
  int64_t output_tokens = 0;
};

struct LatencySummary {
  int64_t count = 0;  // samples
  double mean = 0, median = 0, p90 = 0, p99 = 0, max = 0;
};

struct ServeMetrics {
  int64_t requests = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
  double duration_s = 0;
  double output_tokens_per_s = 0, total_tokens_per_s = 0, requests_per_s = 0;
  LatencySummary ttft_s, tpot_s, itl_s, e2e_s;
};

// numpy.percentile(values, q) with linear interpolation; values need not be sorted (q in [0, 100]).
double percentile(std::vector<double> values, double q);
LatencySummary summarize(const std::vector<double>& values);

// Refused: no request, a request with no token, token times before the arrival or not ascending,
// an output_tokens below the times it has.
Status serve_metrics(const std::vector<RequestTimeline>& requests, ServeMetrics* out);

}  // namespace llmq::engine
