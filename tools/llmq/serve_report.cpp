// print_serve_metrics and serve_metrics_json (serve_report.hpp).
#include "serve_report.hpp"

#include <fmt/format.h>

#include <utility>

namespace llmq::cli {

namespace {

nlohmann::json summary_json(const engine::LatencySummary& s) {
  return {{"count", s.count}, {"mean_ms", s.mean * 1e3}, {"median_ms", s.median * 1e3}, {"p90_ms", s.p90 * 1e3},
          {"p99_ms", s.p99 * 1e3}, {"max_ms", s.max * 1e3}};
}

}  // namespace

void print_serve_metrics(const engine::ServeMetrics& m) {
  fmt::print("  {} requests in {:.2f} s: {:.1f} output tok/s, {:.1f} total tok/s, {:.2f} requests/s\n", m.requests,
             m.duration_s, m.output_tokens_per_s, m.total_tokens_per_s, m.requests_per_s);
  for (const auto& [name, s] : {std::pair<const char*, const engine::LatencySummary&>{"TTFT", m.ttft_s}, {"TPOT", m.tpot_s},
                                {"ITL", m.itl_s}, {"E2E", m.e2e_s}})
    fmt::print("  {:<5} mean {:9.2f}  median {:9.2f}  p90 {:9.2f}  p99 {:9.2f} ms\n", name, s.mean * 1e3, s.median * 1e3,
               s.p90 * 1e3, s.p99 * 1e3);
}

nlohmann::json serve_metrics_json(const engine::ServeMetrics& m) {
  return {{"requests", m.requests},
          {"duration_s", m.duration_s},
          {"prompt_tokens", m.prompt_tokens},
          {"output_tokens", m.output_tokens},
          {"output_tokens_per_s", m.output_tokens_per_s},
          {"total_tokens_per_s", m.total_tokens_per_s},
          {"requests_per_s", m.requests_per_s},
          {"ttft", summary_json(m.ttft_s)},
          {"tpot", summary_json(m.tpot_s)},
          {"itl", summary_json(m.itl_s)},
          {"e2e", summary_json(m.e2e_s)}};
}

}  // namespace llmq::cli
