// How `llmq bench serve` reports a run, in-process or against a server's URL (bench_serve_url.hpp):
// the same lines on the terminal and the same JSON fields for the same figures.
#pragma once

#include <nlohmann/json.hpp>

#include "llmq/serve_metrics.hpp"

namespace llmq::cli {

// "  16 requests in 0.52 s: ... output tok/s ...", then TTFT, TPOT, ITL and E2E, one line each (ms).
void print_serve_metrics(const engine::ServeMetrics& m);

// The figures as JSON: requests, duration_s, prompt_tokens, output_tokens, output / total tok/s,
// requests_per_s, and ttft / tpot / itl / e2e each as {count, mean_ms, median_ms, p90_ms, p99_ms, max_ms}.
nlohmann::json serve_metrics_json(const engine::ServeMetrics& m);

}  // namespace llmq::cli
