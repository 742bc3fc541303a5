// `llmq bench serve --url`: the serving benchmark sent to a running OpenAI-compatible server (llmq
// serve, vLLM, ...) over HTTP by the load generator (llmq/load_generator.hpp), reported as the
// in-process benchmark reports (serve_report.hpp) plus the URL and the failed requests.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "llmq/status.hpp"

namespace llmq::cli {

struct BenchServeUrlArgs {
  std::string url;
  std::string model;  // the served model's name; empty: the first GET /v1/models lists
  std::string api_key;
  double timeout_s = 600;
  int64_t max_concurrency = 0;
  int64_t vocab_size = 512;
  bool per_request = false;
  // The workload and report, shared with the in-process benchmark's options.
  std::string dataset;
  int64_t requests = 0;
  double rate = 0;
  uint64_t seed = 1;
  std::string json_path;
};

// Registers --url and the options only it takes on `bench serve`.
void add_bench_serve_url_options(CLI::App* serve, BenchServeUrlArgs* args);
// Refuses, by name, an option of the other mode: an engine option with --url (the server's engine
// was set up by whoever started it), or one of --url's options without it.
Status check_bench_serve_mode(const CLI::App& serve, bool url);
int run_bench_serve_url(const BenchServeUrlArgs& args);

}  // namespace llmq::cli
