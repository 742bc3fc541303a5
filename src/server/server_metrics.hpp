// What `llmq serve` answers on GET /metrics: Prometheus' text exposition format (version 0.0.4),
// every metric named `llmq:` and labelled with the served model's name, as vLLM names the same
// quantities `vllm:` (so a vLLM dashboard's queries carry over by changing the prefix):
//   gauges     num_requests_running, num_requests_waiting, kv_cache_blocks_used, kv_cache_blocks_total,
//              kv_cache_usage_perc (0..1): read from the engine when /metrics is asked;
//   counters   prompt_tokens_total, generation_tokens_total, request_success_total{finished_reason},
//              num_preemptions_total, prefix_cache_queries_total / prefix_cache_hits_total (tokens),
//              computed_tokens_total, http_requests_total{status="2xx"...};
//   histograms time_to_first_token_seconds, inter_token_latency_seconds,
//              request_time_per_output_token_seconds, e2e_request_latency_seconds,
//              request_prompt_tokens, request_generation_tokens.
// Request timings are taken on one steady clock in this process: arrival is when the HTTP handler
// took the request (before it was parsed and tokenized, as vLLM counts from tokenization), a token's
// time is when the engine's thread handed it over. Internal header of the server (src/server/).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "llmq/engine_loop.hpp"

namespace llmq::server {

using SteadyTime = std::chrono::steady_clock::time_point;

// Observations counted under fixed upper bounds (Prometheus' `le`: a value equal to a bound is in
// that bucket). counts[i] holds the observations in (bounds[i-1], bounds[i]]; the last count is
// past every bound (+Inf). Rendering makes them cumulative.
struct Histogram {
  std::vector<double> bounds;  // ascending, finite
  std::vector<int64_t> counts;  // bounds.size() + 1
  double sum = 0;
  int64_t count = 0;
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
};

// How a request ended, as request_success_total's finished_reason label says it: stop (EOS, a
// stop id or a stop string), length (max_tokens or the context), abort (the client went away),
// error (the engine failed or a hard shutdown ended it).
enum class RequestEnd { kStop, kLength, kAbort, kError };
inline constexpr int kRequestEnds = 4;

class ServerMetrics {
 public:
  // max_model_len bounds the token-count histograms' buckets (1, 2, 5, 10, 20, 50, ... up to it).
  ServerMetrics(std::string model_name, int64_t max_model_len);

  void count_http_response(int status);  // any response of any endpoint, by status class
  // One request's figures, from RequestTimer.
  void count_prefill_done(int64_t prompt_tokens);
  void count_generated_token();
  void observe_ttft(double seconds);
  void observe_inter_token(double seconds);
  // A request's end: completed requests (stop, length) go into the per-request histograms
  // (tpot_s < 0: fewer than two tokens, not observed); every end is counted by its reason.
  void count_end(RequestEnd end, int64_t prompt_tokens, int64_t completion_tokens, double e2e_s, double tpot_s);

  // The exposition text: this registry and the engine's gauges and counters as `engine` says them.
  std::string render(const engine::EngineLoop::Snapshot& engine) const;

 private:
  const std::string model_label_;  // {model_name="..."}, escaped
  mutable std::mutex mu_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  std::array<int64_t, kRequestEnds> ends_{};
  std::array<int64_t, 5> http_{};  // 1xx .. 5xx
  Histogram ttft_, itl_, tpot_, e2e_, prompt_len_, generation_len_;
};

// One request's timing, between the engine's thread (each token, on_token) and the HTTP handler's
// (the end, finish). Thread-safe; only the first finish() counts (the response's own end, then the
// release of its connection, which reports abort for a request that never ended).
class RequestTimer {
 public:
  RequestTimer(std::shared_ptr<ServerMetrics> metrics, int64_t prompt_tokens, SteadyTime arrival);
  void on_token(SteadyTime now);
  // completion_tokens: what the response reported (fewer than the engine produced when a stop
  // string cut it); < 0: the tokens seen so far.
  void finish(RequestEnd end, int64_t completion_tokens, SteadyTime now);

 private:
  std::shared_ptr<ServerMetrics> metrics_;
  const int64_t prompt_tokens_;
  const SteadyTime arrival_;
  std::mutex mu_;
  int64_t tokens_ = 0;
  SteadyTime first_, last_;
  bool finished_ = false;
};

// Label values escaped as the exposition format asks (backslash, double quote, line feed).
std::string escape_label_value(const std::string& value);

}  // namespace llmq::server
