// llmq bench serve: the serving engine in-process (as trtllm-bench throughput runs it), on a seeded
// workload (llmq/serve_workload.hpp) with requests arriving at their times, measured per
// request as users measure an engine: TTFT, TPOT, ITL, E2E and throughput (serve_metrics.hpp).
// --device cpu: the engine's CPU backend (the reference forward behind the paged KV cache);
// --device cuda: the GPU runtime in its paged mode (engine_gpu.hpp), one GPU or --tp of them, its KV
// blocks sized from --gpu-memory-utilization unless --kv-blocks says.
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
#include "bench_serve_url.hpp"
#include "engine_setup.hpp"
#include "llmq/engine_cpu.hpp"
#include "llmq/engine_gpu.hpp"
#include "llmq/engine.hpp"
#include "llmq/serve_metrics.hpp"
#include "llmq/serve_workload.hpp"
#include "llmq/device.hpp"
#include "llmq/model_io.hpp"
#include "llmq/safetensors.hpp"
#include "llmq/tensor_parallel.hpp"
#include "serve_report.hpp"

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
  bool no_preemption = false;
  uint64_t seed = 1;
  std::string json_path;
  // --device cuda
  std::string precision = "bf16";
  std::string kv_cache = "bf16";
  int tp = 1;
  int gpu = 0;
  double gpu_memory_utilization = 0.9;
  int64_t max_model_len = 0;
  bool no_graphs = false;
  int gemm_autotune = 1;
  bool fp8_fast_accum = false;
  GpuLaunchFlags launch;
  BenchServeUrlArgs url;  // --url: a server measured over HTTP instead
};

int run_serve(const ServeArgs& a) {
  if (a.device != "cpu" && a.device != "cuda") return fail(invalid_argument("--device: cpu or cuda, got " + a.device));
  const bool gpu = a.device == "cuda";
  if (Status st = check_fp8_fast_accum(a.fp8_fast_accum, a.device); !st.ok()) return fail(st);
  ModelWeights w;
  std::string description;
  ModelConfig config;
  GpuModelSource source;
  if (gpu) {
    // The model's shape first (the workload needs its vocabulary); the weights after.
    if (Status st = model_shape(a.model, a.seed, &source, &w, &config); !st.ok()) return fail(st);
  } else {
    if (Status st = load_model(a.model, &w, &description); !st.ok()) return fail(st);
    config = w.config;
  }
  engine::WorkloadOptions wo;
  wo.dataset = a.dataset;
  wo.requests = a.requests;
  wo.rate = a.rate;
  wo.vocab_size = config.vocab_size;
  wo.max_model_len = config.max_seq_len;
  wo.seed = a.seed;
  std::vector<engine::WorkloadRequest> work;
  if (Status st = engine::make_workload(wo, &work); !st.ok())  // its options are this command's
    return fail(st.message().rfind("vocab_size", 0) == 0 ? st : invalid_argument("--" + st.message()));
  // Positions per sequence: --max-model-len, or on the GPU the workload's longest request (the
  // decode graphs' attention split is sized by it, as trtllm-bench sizes its engine by the dataset).
  if (a.max_model_len > config.max_seq_len)
    return fail(invalid_argument("--max-model-len: " + std::to_string(a.max_model_len) + " positions, the model's context is " +
                                 std::to_string(config.max_seq_len)));
  int64_t max_model_len = a.max_model_len > 0 ? a.max_model_len : config.max_seq_len;
  if (gpu && a.max_model_len == 0) {
    max_model_len = 0;
    for (const auto& r : work) max_model_len = std::max(max_model_len, static_cast<int64_t>(r.prompt.size()) + r.output_tokens);
    max_model_len = std::min(config.max_seq_len, (max_model_len + a.block_size - 1) / a.block_size * a.block_size);
  }
  engine::EngineBackend* backend = nullptr;
  std::unique_ptr<engine::CpuBackend> cpu_backend;
  GpuEngine g;
  int64_t blocks = a.kv_blocks;
  if (gpu) {
    GpuEngineFlags f;
    f.model = a.model;
    f.precision = a.precision;
    f.kv_cache = a.kv_cache;
    f.tp = a.tp;
    f.gpu = a.gpu;
    f.gpu_memory_utilization = a.gpu_memory_utilization;
    f.max_running = a.max_running;
    f.max_batched_tokens = a.max_batched_tokens;
    f.block_size = a.block_size;
    f.kv_blocks = a.kv_blocks;
    f.no_graphs = a.no_graphs;
    f.gemm_autotune = a.gemm_autotune;
    f.fp8_fast_accum = a.fp8_fast_accum;
    f.launch = a.launch;
    if (Status st = start_gpu_engine(f, source, max_model_len, &g); !st.ok()) return fail(st);
    description = g.description;
    backend = g.backend.get();
    blocks = backend->blocks() - 1;
  } else {
    // KV blocks: as asked, or enough for every request at once (no preemption), at most what
    // --max-running sequences of the whole context take.
    if (blocks == 0) {
      for (const auto& r : work)
        blocks += (static_cast<int64_t>(r.prompt.size()) + r.output_tokens + a.block_size - 1) / a.block_size;
      blocks = std::min(blocks, a.max_running * ((max_model_len + a.block_size - 1) / a.block_size));
    }
    if (Status st = engine::CpuBackend::create(w, blocks + 1, a.block_size, &cpu_backend); !st.ok()) return fail(st);
    backend = cpu_backend.get();
  }
  engine::KvBlockPool pool;
  if (Status st = engine::KvBlockPool::create(blocks + 1, a.block_size, &pool); !st.ok()) return fail(st);
  engine::SchedulerOptions so;
  so.max_batched_tokens = a.max_batched_tokens;
  so.max_running = a.max_running;
  so.max_waiting = a.requests;
  so.max_model_len = max_model_len;
  so.prefix_caching = !a.no_prefix_cache;
  so.no_preemption = a.no_preemption;
  std::unique_ptr<engine::Engine> eng;
  if (Status st = engine::Engine::create(backend, &pool, so, &eng); !st.ok()) return fail(st);

  std::vector<engine::RequestTimeline> timeline(work.size());
  std::map<int64_t, size_t> index;  // engine id -> request
  // Where the wall time goes, step by step: a step that computed one position per sampled token is
  // decode-only (a CUDA graph on the GPU); any other carries prefill chunks (run eagerly).
  struct StepKind {
    int64_t steps = 0, positions = 0;
    double seconds = 0.0;
    json to_json() const {
      return {{"steps", steps}, {"ms_mean", steps > 0 ? 1e3 * seconds / static_cast<double>(steps) : 0.0},
              {"positions_mean", steps > 0 ? static_cast<double>(positions) / static_cast<double>(steps) : 0.0},
              {"seconds", seconds}};
    }
  } decode_steps, prefill_steps;
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
    const int64_t computed_before = eng->scheduler().stats().computed_tokens;
    const Clock::time_point step_start = Clock::now();
    if (Status st = eng->step(&events); !st.ok()) return fail(st);
    const int64_t positions = eng->scheduler().stats().computed_tokens - computed_before;
    StepKind& kind = positions == static_cast<int64_t>(events.size()) ? decode_steps : prefill_steps;
    kind.steps += 1;
    kind.positions += positions;
    kind.seconds += std::chrono::duration<double>(Clock::now() - step_start).count();
    const double t = now_s();
    for (const auto& e : events) timeline[index.at(e.request)].token_s.push_back(t);
  }
  engine::ServeMetrics m;
  if (Status st = engine::serve_metrics(timeline, &m); !st.ok()) return fail(st);
  const engine::SchedulerStats& stats = eng->scheduler().stats();
  const double hit_rate = stats.prompt_tokens > 0 ? static_cast<double>(stats.prefix_hit_tokens) / static_cast<double>(stats.prompt_tokens) : 0.0;

  fmt::print("llmq bench serve: {} on the {} engine, {} x {}, {}\n", description, gpu ? "GPU" : "CPU", a.requests, a.dataset,
             a.rate > 0 ? fmt::format("Poisson {:g} requests/s", a.rate) : std::string("all at once"));
  print_serve_metrics(m);
  fmt::print("  KV blocks {} of {} at most ({} tokens each), {} preemptions, prefix hits {:.1f}% of prompt tokens\n",
             stats.peak_blocks, pool.usable_blocks(), a.block_size, stats.preemptions, 100.0 * hit_rate);
  const auto step_line = [](const char* what, const StepKind& k) {
    return k.steps == 0 ? fmt::format("0 {}", what)
                        : fmt::format("{} {} ({:.2f} ms, {:.0f} positions each, {:.2f} s)", k.steps, what,
                                      1e3 * k.seconds / static_cast<double>(k.steps),
                                      static_cast<double>(k.positions) / static_cast<double>(k.steps), k.seconds);
  };
  fmt::print("  steps: {}; {}\n", step_line("decode-only", decode_steps), step_line("with prefill", prefill_steps));
  if (!a.json_path.empty()) {
    std::ofstream out(a.json_path, std::ios::app);
    if (!out) return fail(Status(StatusCode::kIoError, "--json: cannot open " + a.json_path));
    std::string device = "cpu";
    if (gpu) {
      CudaDeviceInfo info;
      device = query_cuda_device(a.gpu, &info).ok() ? info.name : "cuda";
    }
    json j = {{"kind", "serve"}, {"device", device}, {"date", today()}, {"commit", kBuildCommit},
              {"model", a.model}, {"precision", gpu ? a.precision : "f32"}, {"kv_cache", gpu ? a.kv_cache : "f32"},
              {"tp", a.tp}, {"graphs", gpu && !a.no_graphs}, {"gemm_autotune", a.gemm_autotune}, {"gemm_tile_search", a.launch.gemm_tile_search}, {"fp8_fast_accumulation", gpu && a.fp8_fast_accum}, {"max_model_len", max_model_len}, {"dataset", a.dataset}, {"rate", a.rate},
              {"kv_blocks_peak", stats.peak_blocks}, {"kv_blocks", pool.usable_blocks()}, {"block_size", a.block_size},
              {"preemptions", stats.preemptions}, {"prefix_hit_rate", hit_rate}, {"max_batched_tokens", a.max_batched_tokens},
              {"max_running", a.max_running}, {"no_preemption", a.no_preemption}, {"decode_steps", decode_steps.to_json()},
              {"prefill_steps", prefill_steps.to_json()}};
    j.update(serve_metrics_json(m));
    out << j.dump() << "\n";
  }
  return 0;
}

}  // namespace

void add_bench_serve_command(CLI::App* bench, std::vector<Command>* commands) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* s = bench->add_subcommand(
      "serve", "the serving engine in-process, or a server at --url: TTFT, TPOT, ITL, throughput per request");
  s->add_option("--model", args->model,
                "llama2.c .bin, Hugging Face directory, or 'default'; with --url the served model's name "
                "(default: the first one GET /v1/models lists)");
  s->add_option("--device", args->device, "cpu (the engine on the CPU reference) or cuda");
  s->add_option("--precision", args->precision, "cuda: bf16, f32, a scheme name, or checkpoint");
  s->add_option("--kv-cache", args->kv_cache, "cuda: KV elements, bf16 or e4m3");
  s->add_option("--tp", args->tp, "cuda: tensor-parallel GPUs (--gpu .. --gpu + tp - 1)")->check(CLI::Range(1, 8));
  s->add_option("--gpu", args->gpu, "cuda: first CUDA device ordinal")->check(CLI::Range(0, 63));
  s->add_option("--gpu-memory-utilization", args->gpu_memory_utilization,
                "cuda: share of the GPU's memory the model, activations and KV cache may take (--kv-blocks 0)")
      ->check(CLI::Range(0.01, 1.0));
  s->add_option("--max-model-len", args->max_model_len,
                "positions per sequence (0: the model's context; on cuda the workload's longest request)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  s->add_flag("--no-graphs", args->no_graphs, "cuda: decode steps without CUDA graphs");
  s->add_option("--gemm-autotune", args->gemm_autotune,
                "cuda: time cuBLASLt's first N algorithms per GEMM shape class and keep the fastest (1: its first)")
      ->check(CLI::Range(1, 32));
  add_fp8_fast_accum_flag(s, &args->fp8_fast_accum);
  add_gpu_launch_flags(s, &args->launch);
  s->add_option("--dataset", args->dataset, "fixed:INPUT/OUTPUT or sharegpt-like (docs/engine.md states its lengths)");
  s->add_option("--requests", args->requests, "requests to send")->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  s->add_option("--rate,--request-rate", args->rate, "Poisson arrivals per second (0: all at once)")->check(CLI::Range(0.0, 1e9));
  s->add_option("--max-batched-tokens", args->max_batched_tokens, "positions computed per step")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  s->add_option("--max-running", args->max_running, "sequences per step")->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  s->add_option("--block-size", args->block_size, "KV block size in tokens")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  s->add_option("--kv-blocks", args->kv_blocks, "KV blocks (0: enough for every request at once)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  s->add_flag("--no-prefix-cache", args->no_prefix_cache, "turn prefix caching off");
  s->add_flag("--no-preemption", args->no_preemption,
              "admit a request only while the cache holds every running request's longest output too (no step preempts)");
  s->add_option("--seed", args->seed, "seed of the workload");
  s->add_option("--json", args->json_path, "append a JSON line here");
  add_bench_serve_url_options(s, &args->url);
  commands->push_back({s, [args, s] {
    const bool url = !args->url.url.empty();
    if (Status st = check_bench_serve_mode(*s, url); !st.ok()) return fail(st);
    if (!url) return run_serve(*args);
    BenchServeUrlArgs u = args->url;
    u.model = s->count("--model") > 0 ? args->model : "";
    u.dataset = args->dataset;
    u.requests = args->requests;
    u.rate = args->rate;
    u.seed = args->seed;
    u.json_path = args->json_path;
    return run_bench_serve_url(u);
  }});
}

}  // namespace llmq::cli
