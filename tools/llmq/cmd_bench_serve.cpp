// llmq bench serve: the serving engine in-process (as trtllm-bench throughput runs it), on a seeded
// workload (llmq/serve_workload.hpp) with requests arriving at their times, measured per
// request as users measure an engine: TTFT, TPOT, ITL, E2E and throughput (serve_metrics.hpp).
// The engine runs on its CPU backend (the reference forward behind the paged KV cache); the GPU
// backend is the rest of the serving-engine issue, and --device cuda says so.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "commands.hpp"
#include "llmq/engine_cpu.hpp"
#include "llmq/engine.hpp"
#include "llmq/serve_metrics.hpp"
#include "llmq/serve_workload.hpp"
#include "llmq/model_io.hpp"

namespace llmq::cli {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct ServeArgs {
  std::string model = "default";
  std::string device = "cpu";
  std::string dataset = "fixed:32/16";
  int64_t requests = 16;
  double rate = 0;
  int64_t max_batched_tokens = 512;
  int64_t max_running = 64;
  int64_t block_size = 16;
  int64_t kv_blocks = 0;
  bool no_prefix_cache = false;
  uint64_t seed = 1;
  std::string json_path;
};

json summary_json(const engine::LatencySummary& s) {
  return {{"count", s.count}, {"mean_ms", s.mean * 1e3}, {"median_ms", s.median * 1e3}, {"p90_ms", s.p90 * 1e3},
          {"p99_ms", s.p99 * 1e3}, {"max_ms", s.max * 1e3}};
}

std::string summary_line(const char* name, const engine::LatencySummary& s) {
  return fmt::format("  {:<5} mean {:9.2f}  median {:9.2f}  p90 {:9.2f}  p99 {:9.2f} ms", name, s.mean * 1e3,
                     s.median * 1e3, s.p90 * 1e3, s.p99 * 1e3);
}

int run_serve(const ServeArgs& a) {
  if (a.device != "cpu")
    return fail(unsupported("--device " + a.device +
                            ": the serving engine's GPU backend is not written yet; --device cpu runs the engine on the "
                            "CPU reference"));
  ModelWeights w;
  std::string description;
  if (Status st = load_model(a.model, &w, &description); !st.ok()) return fail(st);
  engine::WorkloadOptions wo;
  wo.dataset = a.dataset;
  wo.requests = a.requests;
  wo.rate = a.rate;
  wo.vocab_size = w.config.vocab_size;
  wo.max_model_len = w.config.max_seq_len;
  wo.seed = a.seed;
  std::vector<engine::WorkloadRequest> work;
  if (Status st = engine::make_workload(wo, &work); !st.ok())  // its options are this command's
    return fail(st.message().rfind("vocab_size", 0) == 0 ? st : invalid_argument("--" + st.message()));
  // KV blocks: as asked, or enough for every request at once (no preemption), at most what
  // --max-running sequences of the whole context take.
  int64_t blocks = a.kv_blocks;
  if (blocks == 0) {
    for (const auto& r : work)
      blocks += (static_cast<int64_t>(r.prompt.size()) + r.output_tokens + a.block_size - 1) / a.block_size;
    blocks = std::min(blocks, a.max_running * ((w.config.max_seq_len + a.block_size - 1) / a.block_size));
  }
  engine::KvBlockPool pool;
  if (Status st = engine::KvBlockPool::create(blocks + 1, a.block_size, &pool); !st.ok()) return fail(st);
  std::unique_ptr<engine::CpuBackend> backend;
  if (Status st = engine::CpuBackend::create(w, blocks + 1, a.block_size, &backend); !st.ok()) return fail(st);
  engine::SchedulerOptions so;
  so.max_batched_tokens = a.max_batched_tokens;
  so.max_running = a.max_running;
  so.max_waiting = a.requests;
  so.max_model_len = w.config.max_seq_len;
  so.prefix_caching = !a.no_prefix_cache;
  std::unique_ptr<engine::Engine> eng;
  if (Status st = engine::Engine::create(backend.get(), &pool, so, &eng); !st.ok()) return fail(st);

  std::vector<engine::RequestTimeline> timeline(work.size());
  std::map<int64_t, size_t> index;  // engine id -> request
  int64_t peak_blocks = 0;
  const Clock::time_point t0 = Clock::now();
  const auto now_s = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  size_t next = 0;
  while (next < work.size() || !eng->idle()) {
    if (eng->idle() && next < work.size() && work[next].arrival_s > now_s())  // nothing to do until it arrives
      std::this_thread::sleep_for(std::chrono::duration<double>(work[next].arrival_s - now_s()));
    for (; next < work.size() && work[next].arrival_s <= now_s(); ++next) {
      engine::RequestSpec spec;
      spec.prompt = work[next].prompt;
      spec.max_new_tokens = work[next].output_tokens;
      int64_t id = 0;
      if (Status st = eng->add(std::move(spec), {}, &id); !st.ok()) return fail(st);
      index[id] = next;
      timeline[next].arrival_s = work[next].arrival_s;
      timeline[next].prompt_tokens = static_cast<int64_t>(work[next].prompt.size());
    }
    std::vector<engine::TokenEvent> events;
    if (Status st = eng->step(&events); !st.ok()) return fail(st);
    peak_blocks = std::max(peak_blocks, pool.usable_blocks() - pool.free_blocks());
    const double t = now_s();
    for (const auto& e : events) timeline[index.at(e.request)].token_s.push_back(t);
  }
  engine::ServeMetrics m;
  if (Status st = engine::serve_metrics(timeline, &m); !st.ok()) return fail(st);
  const engine::SchedulerStats& stats = eng->scheduler().stats();
  const double hit_rate = stats.prompt_tokens > 0 ? static_cast<double>(stats.prefix_hit_tokens) / static_cast<double>(stats.prompt_tokens) : 0.0;

  fmt::print("llmq bench serve: {} on the CPU engine, {} x {}, {}\n", description, a.requests, a.dataset,
             a.rate > 0 ? fmt::format("Poisson {:g} requests/s", a.rate) : std::string("all at once"));
  fmt::print("  {} requests in {:.2f} s: {:.1f} output tok/s, {:.1f} total tok/s, {:.2f} requests/s\n", m.requests,
             m.duration_s, m.output_tokens_per_s, m.total_tokens_per_s, m.requests_per_s);
  for (const auto& [name, s] : {std::pair<const char*, const engine::LatencySummary&>{"TTFT", m.ttft_s}, {"TPOT", m.tpot_s},
                                {"ITL", m.itl_s}, {"E2E", m.e2e_s}})
    fmt::print("{}\n", summary_line(name, s));
  fmt::print("  KV blocks {} of {} at most ({} tokens each), {} preemptions, prefix hits {:.1f}% of prompt tokens\n",
             peak_blocks, pool.usable_blocks(), a.block_size, stats.preemptions, 100.0 * hit_rate);
  if (!a.json_path.empty()) {
    std::ofstream out(a.json_path, std::ios::app);
    if (!out) return fail(Status(StatusCode::kIoError, "--json: cannot open " + a.json_path));
    const json j = {{"kind", "serve"}, {"device", "cpu"}, {"date", today()}, {"commit", kBuildCommit},
                    {"model", a.model}, {"dataset", a.dataset}, {"requests", m.requests}, {"rate", a.rate},
                    {"duration_s", m.duration_s}, {"prompt_tokens", m.prompt_tokens}, {"output_tokens", m.output_tokens},
                    {"output_tokens_per_s", m.output_tokens_per_s}, {"total_tokens_per_s", m.total_tokens_per_s},
                    {"requests_per_s", m.requests_per_s}, {"ttft", summary_json(m.ttft_s)}, {"tpot", summary_json(m.tpot_s)},
                    {"itl", summary_json(m.itl_s)}, {"e2e", summary_json(m.e2e_s)}, {"kv_blocks_peak", peak_blocks},
                    {"kv_blocks", pool.usable_blocks()}, {"block_size", a.block_size}, {"preemptions", stats.preemptions},
                    {"prefix_hit_rate", hit_rate}, {"max_batched_tokens", a.max_batched_tokens}, {"max_running", a.max_running}};
    out << j.dump() << "\n";
  }
  return 0;
}

}  // namespace

void add_bench_serve_command(CLI::App* bench, std::vector<Command>* commands) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* s = bench->add_subcommand("serve", "the serving engine in-process: TTFT, TPOT, ITL, throughput per request");
  s->add_option("--model", args->model, "llama2.c .bin, Hugging Face directory, or 'default'");
  s->add_option("--device", args->device, "cpu (the engine on the CPU reference)");
  s->add_option("--dataset", args->dataset, "fixed:INPUT/OUTPUT or sharegpt-like (docs/engine.md states its lengths)");
  s->add_option("--requests", args->requests, "requests to send")->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  s->add_option("--rate", args->rate, "Poisson arrivals per second (0: all at once)")->check(CLI::Range(0.0, 1e9));
  s->add_option("--max-batched-tokens", args->max_batched_tokens, "positions computed per step")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  s->add_option("--max-running", args->max_running, "sequences per step")->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  s->add_option("--block-size", args->block_size, "KV block size in tokens")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  s->add_option("--kv-blocks", args->kv_blocks, "KV blocks (0: enough for every request at once)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  s->add_flag("--no-prefix-cache", args->no_prefix_cache, "turn prefix caching off");
  s->add_option("--seed", args->seed, "seed of the workload");
  s->add_option("--json", args->json_path, "append a JSON line here");
  commands->push_back({s, [args] { return run_serve(*args); }});
}

}  // namespace llmq::cli
