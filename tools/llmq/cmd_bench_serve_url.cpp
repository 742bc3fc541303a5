// llmq bench serve --url (bench_serve_url.hpp): the workload of the in-process benchmark sent to a
// server, measured per request on arrival of each streamed token, failures counted apart.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "bench_serve_url.hpp"
#include "commands.hpp"
#include "llmq/load_generator.hpp"
#include "llmq/serve_metrics.hpp"
#include "llmq/serve_workload.hpp"
#include "serve_report.hpp"

namespace llmq::cli {

namespace {

using json = nlohmann::json;

// Options of the in-process engine, which a server's URL leaves to whoever started the server.
constexpr const char* kEngineOptions[] = {"--device",   "--precision",  "--kv-cache", "--tp",  "--gpu",
                                          "--gpu-memory-utilization", "--max-model-len", "--no-graphs",
                                          "--nccl-library", "--allreduce", "--pdl", "--max-batched-tokens",
                                          "--max-running", "--block-size", "--kv-blocks", "--no-prefix-cache",
                                          "--gemm-autotune", "--fp8-fast-accum", "--gemm-tile-search"};
constexpr const char* kUrlOptions[] = {"--api-key", "--timeout", "--max-concurrency", "--vocab-size", "--per-request"};

// Distinct failure reasons, most frequent first (ties in the order first seen).
std::vector<std::pair<std::string, int64_t>> failure_counts(const loadgen::LoadResult& r) {
  std::map<std::string, std::pair<int64_t, size_t>> by_reason;  // reason -> (count, first seen)
  for (size_t i = 0; i < r.requests.size(); ++i)
    if (!r.requests[i].ok) by_reason.emplace(r.requests[i].error, std::make_pair(int64_t{0}, i)).first->second.first++;
  std::vector<std::tuple<int64_t, size_t, std::string>> order;
  for (const auto& [reason, v] : by_reason) order.emplace_back(-v.first, v.second, reason);
  std::sort(order.begin(), order.end());
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& [neg, first, reason] : order) out.emplace_back(reason, -neg);
  return out;
}

json per_request_json(const loadgen::LoadResult& r) {
  json out = json::array();
  for (const loadgen::RequestOutcome& q : r.requests) {
    if (!q.ok) {
      out.push_back({{"error", q.error}});
      continue;
    }
    const engine::RequestTimeline& t = q.timeline;
    out.push_back({{"arrival_s", t.arrival_s}, {"prompt_tokens", t.prompt_tokens},
                   {"output_tokens", t.output_tokens != 0 ? t.output_tokens : static_cast<int64_t>(t.token_s.size())},
                   {"token_s", t.token_s}});
  }
  return out;
}

}  // namespace

void add_bench_serve_url_options(CLI::App* s, BenchServeUrlArgs* a) {
  s->add_option("--url", a->url,
                "a running OpenAI-compatible server, http://HOST:PORT (llmq serve, vLLM, ...): the workload goes to its "
                "POST /v1/completions as token-id prompts, max_tokens with ignore_eos, temperature 0, streamed; "
                "engine options are then refused");
  s->add_option("--api-key", a->api_key, "--url: sent as 'Authorization: Bearer KEY'");
  s->add_option("--timeout", a->timeout_s, "--url: seconds a request may take, connecting to its last byte (then it fails)")
      ->check(CLI::Range(0.001, 1e6));
  s->add_option("--max-concurrency", a->max_concurrency,
                "--url: requests in flight at most (0: all of them, up to 1024; each holds a thread and a connection)")
      ->check(CLI::Range(int64_t{0}, loadgen::kMaxInFlight));
  s->add_option("--vocab-size", a->vocab_size,
                "--url: prompt token ids are drawn from [3, N); the served model's vocabulary size gives the prompts of "
                "the in-process benchmark with the same --seed (512: the built-in model's)")
      ->check(CLI::Range(int64_t{4}, int64_t{1} << 30));
  s->add_flag("--per-request", a->per_request, "--url: --json also holds each request's send time and token times, or its error");
}

Status check_bench_serve_mode(const CLI::App& s, bool url) {
  if (url) {
    for (const char* name : kEngineOptions)
      if (s.count(name) > 0)
        return invalid_argument(std::string(name) + ": not used with --url (the server's engine is set up where it is started)");
  } else {
    for (const char* name : kUrlOptions)
      if (s.count(name) > 0) return invalid_argument(std::string(name) + ": only used with --url");
  }
  return {};
}

int run_bench_serve_url(const BenchServeUrlArgs& a) {
  loadgen::LoadOptions lo;
  if (Status st = loadgen::parse_server_url(a.url, &lo.client.url); !st.ok()) return fail(st);
  lo.client.api_key = a.api_key;
  lo.client.timeout_s = a.timeout_s;
  lo.max_concurrency = a.max_concurrency;
  // The model list first: the name to send, the context to fit the workload to, and whether the
  // server answers at all (an error now rather than a run of failed requests).
  loadgen::ServedModel served;
  int http_status = 0;
  if (Status st = loadgen::query_served_model(lo.client, &served, &http_status); !st.ok()) {
    if (a.model.empty() || http_status != 404) return fail(st);  // without /v1/models, --model is enough
  } else if (!a.model.empty() && std::find(served.all.begin(), served.all.end(), a.model) == served.all.end()) {
    std::string listed;
    for (const std::string& name : served.all) listed += (listed.empty() ? "" : ", ") + name;
    return fail(invalid_argument("--model: '" + a.model + "' is not served at " + a.url + " (it lists: " + listed + ")"));
  }
  lo.model = a.model.empty() ? served.name : a.model;

  engine::WorkloadOptions wo;
  wo.dataset = a.dataset;
  wo.requests = a.requests;
  wo.rate = a.rate;
  wo.vocab_size = a.vocab_size;
  wo.max_model_len = served.max_model_len;  // 0 where the server does not say: no clamp
  wo.seed = a.seed;
  std::vector<engine::WorkloadRequest> work;
  if (Status st = engine::make_workload(wo, &work); !st.ok()) {
    const std::string& msg = st.message();
    return fail(invalid_argument("--" + (msg.rfind("vocab_size", 0) == 0 ? "vocab-size" + msg.substr(10) : msg)));
  }

  loadgen::LoadResult r;
  if (Status st = loadgen::run_load(lo, work, &r); !st.ok()) return fail(st);
  std::vector<engine::RequestTimeline> done;
  int64_t per_chunk = 0;
  for (const loadgen::RequestOutcome& q : r.requests) {
    if (!q.ok) continue;
    done.push_back(q.timeline);
    per_chunk += q.per_token_times ? 0 : 1;
  }
  const auto failures = failure_counts(r);
  if (done.empty())
    return fail(Status(StatusCode::kIoError, fmt::format("all {} requests to {} failed: {}{}", r.requests.size(), a.url,
                                                         failures.front().first,
                                                         failures.size() > 1 ? " (and other reasons)" : "")));
  engine::ServeMetrics m;
  if (Status st = engine::serve_metrics(done, &m); !st.ok()) return fail(st);

  fmt::print("llmq bench serve: {} serving \"{}\", {} x {}, {}, at most {} in flight\n", a.url, lo.model, a.requests,
             a.dataset, a.rate > 0 ? fmt::format("Poisson {:g} requests/s", a.rate) : std::string("all at once"), r.concurrency);
  print_serve_metrics(m);
  if (per_chunk > 0)
    fmt::print("  {} of {} streams carried text without token ids: TTFT, ITL and E2E are their chunks' times, the token "
               "counts their usage's\n", per_chunk, m.requests);
  if (r.failed > 0) {
    fmt::print("  {} of {} requests failed (not in the figures above):\n", r.failed, r.requests.size());
    constexpr size_t kShown = 5;
    for (size_t i = 0; i < std::min(failures.size(), kShown); ++i)
      fmt::print("    {} x {}\n", failures[i].second, failures[i].first);
    if (failures.size() > kShown) fmt::print("    ... and {} other reasons\n", failures.size() - kShown);
  }
  if (!a.json_path.empty()) {
    std::ofstream out(a.json_path, std::ios::app);
    if (!out) return fail(Status(StatusCode::kIoError, "--json: cannot open " + a.json_path));
    json errors = json::array();
    for (size_t i = 0; i < std::min<size_t>(failures.size(), 10); ++i)
      errors.push_back({{"error", failures[i].first}, {"count", failures[i].second}});
    json j = {{"kind", "serve"}, {"url", a.url}, {"date", today()}, {"commit", kBuildCommit}, {"model", lo.model},
              {"dataset", a.dataset}, {"rate", a.rate}, {"seed", a.seed}, {"vocab_size", a.vocab_size},
              {"max_model_len", served.max_model_len}, {"max_concurrency", r.concurrency},
              {"requests_sent", static_cast<int64_t>(r.requests.size())}, {"failed", r.failed}, {"errors", errors},
              {"token_times", per_chunk == 0 ? "per token" : "per chunk"}};
    j.update(serve_metrics_json(m));
    if (a.per_request) j["per_request"] = per_request_json(r);
    out << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    if (!out.flush()) return fail(Status(StatusCode::kIoError, "--json: cannot write " + a.json_path));
  }
  return 0;
}

}  // namespace llmq::cli
