// llmq bench e2e: end-to-end speed of the GPU runtime on a model (synthetic weights with the
// shapes of a real model, or a checkpoint): decode time per output token (median and p90 of CUDA-
// event-timed steps, each one CUDA-graph replay) at several batch sizes and context lengths, time
// to first token of prefills, MFU, peak GPU memory, and each decode figure against its floor
// (bytes one step must read / the copy bandwidth measured in the same run). A table, and JSON
// lines with --json (device, date and commit in every line).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.hpp"
#include "engine_setup.hpp"
#include "llmq/device.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/model_io.hpp"
#include "llmq/output_dir.hpp"
#include "llmq/quantized_model.hpp"

namespace llmq::cli {
namespace {

using json = nlohmann::json;

struct BenchArgs {
  std::string model = "synthetic:llama3-8b";
  std::vector<std::string> precisions = {"bf16", "fp8-dynamic"};
  std::vector<int64_t> batches = {1, 8, 64};
  std::vector<int64_t> contexts = {512, 8192};
  std::vector<int64_t> prefills = {512, 2048, 8192};
  std::vector<std::string> attentions = {"bf16"};  // prefill attention variants
  int64_t steps = 64;
  int64_t warmup = 8;
  int prefill_runs = 3;
  uint64_t seed = 1;
  int device = 0;
  std::string json_path;
  bool no_graphs = false;
  std::vector<std::string> kv_caches = {"bf16"};
  bool fit = false;
  std::vector<int> tps = {1};       // tensor-parallel sizes (devices device .. device + tp - 1)
  bool allreduce_share = false;     // time TP decode steps again without their all-reduces
  bool ep = false;                  // MoE: whole experts per rank (expert parallelism)
  std::string skip_stages;          // stages left out of every step (timing by difference)
  int gemm_autotune = 1;            // cuBLASLt candidates timed per GEMM shape class (1: heuristic's first)
  bool fp8_fast_accum = false;      // CudaGemmOptions::fp8_fast_accumulation
  GpuLaunchFlags launch;
};

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

// Parameters of the linear layers (the matmul FLOPs per token are twice this, lm_head included).
double matmul_params(const ModelConfig& c) {
  const double q = static_cast<double>(c.n_heads * c.head_dim), kv = static_cast<double>(c.n_kv_heads * c.head_dim);
  const double d = static_cast<double>(c.dim), h = static_cast<double>(c.hidden_dim);
  return static_cast<double>(c.n_layers) * (d * (q + 2 * kv) + q * d + 3 * d * h) + d * static_cast<double>(c.vocab_size);
}

// Dense tensor-core peaks (NVIDIA datasheets, SXM): MFU's denominator.
double peak_flops(const std::string& device, bool eight_bit) {
  const bool hopper = device.find("H100") != std::string::npos || device.find("H200") != std::string::npos;
  if (!hopper) return 0.0;
  const bool pcie = device.find("PCIe") != std::string::npos;
  const double bf16 = pcie ? 756e12 : 989e12;
  return eight_bit ? 2 * bf16 : bf16;
}

// The model under `precision`, split over `tp` GPUs (GpuModel::load picks the route; a host model
// is loaded or quantized once and shared by the ranks).
Status load_gpu_model(const BenchArgs& a, const std::string& precision, int tp, std::unique_ptr<TensorParallelRuntime>* out) {
  GpuPrecision p;
  LLMQ_RETURN_IF_ERROR(parse_gpu_precision(precision, &p));
  ModelWeights host;
  GpuModelSource source;
  LLMQ_RETURN_IF_ERROR(gpu_model_source(a.model, a.seed, &source, &host));
  TensorParallelLoadOptions o;
  o.expert_parallel = a.ep;
  o.group = apply_gpu_launch_flags(a.launch);
  return load_on_gpus(tp, a.device, source, p, a.model + " " + precision + (tp > 1 ? " over " + std::to_string(tp) + " GPUs" : ""),
                      o, out);
}

// --fit: the longest context that `batch` sequences can have with this model and KV-cache format
// in the memory that is free, found by creating the runtime (which refuses, with the numbers, what
// does not fit), rounded down to 256 tokens; then a short timed decode at that size shows it runs.
template <typename Emit>
void fit_row(const BenchArgs& a, TensorParallelRuntime& tpr, const std::string& precision, const std::string& kv_cache,
             int64_t batch, Emit& emit, std::vector<std::string>* table) {
  const GpuModel& model = tpr.model(0);
  auto options = [&](int64_t context) {
    GpuRuntimeOptions o;
    o.max_batch = batch;
    o.max_context = context;
    o.max_step_tokens = batch;
    o.cuda_graphs = !a.no_graphs;
    o.skip_stages = a.skip_stages;
    o.gemm_autotune = a.gemm_autotune;
    o.gemm_tile_search_max_m = a.launch.gemm_tile_search;
    o.fp8_fast_accumulation = a.fp8_fast_accum;
    o.kv_cache_dtype = kv_cache == "e4m3" ? DType::kE4M3 : DType::kBF16;
    return o;
  };
  auto fits = [&](int64_t context) { return tpr.start(options(context)).ok(); };
  const int64_t model_context = std::max<int64_t>(model.config().max_seq_len, 256);
  int64_t lo = 0, hi = model_context / 256;  // in units of 256 tokens; lo fits (0: nothing does)
  if (fits(hi * 256)) lo = hi;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (fits(mid * 256) ? lo : hi) = mid;
  }
  const int64_t context = lo * 256;
  const int64_t steps = std::min<int64_t>(a.steps, 16), warmup = 2;
  std::vector<double> ms;
  Status st = context > warmup + steps + 1 ? tpr.start(options(context)) : unsupported("not even 256 tokens per sequence fit");
  if (st.ok()) st = tpr.fill_context_for_benchmark(batch, context - warmup - steps - 1, a.seed);
  if (st.ok()) st = tpr.time_decode(batch, warmup, steps, &ms);
  int64_t used = 0, total = 0;
  if (st.ok()) st = gpu_memory_in_use(a.device, &used, &total);
  if (!st.ok()) {
    emit({{"kind", "fit"}, {"precision", precision}, {"kv_cache", kv_cache}, {"batch", batch}, {"max_context", context},
          {"skipped", st.to_string()}});
    table->push_back(fmt::format("{:<20} | fit b={:<3} kv={} | longest context {} (model {}): {}", precision, batch, kv_cache,
                                 context, model_context, st.message()));
    return;
  }
  const double med = percentile(ms, 0.5);
  emit({{"kind", "fit"}, {"precision", precision}, {"kv_cache", kv_cache}, {"batch", batch}, {"max_context", context},
        {"model_context", model_context}, {"tokens", batch * context}, {"tpot_ms_median", med},
        {"gpu_memory_used", used}, {"gpu_memory_total", total}, {"step_ms", ms}});
  table->push_back(fmt::format("{:<20} | fit b={:<3} kv={} | longest context {:6} (model {}) = {:7} tokens | {:8.3f} ms/step at the end | {:5.1f} of {:5.1f} GB",
                               precision, batch, kv_cache, context, model_context, batch * context, med,
                               static_cast<double>(used) / 1e9, static_cast<double>(total) / 1e9));
  fmt::print(stderr, "{}\n", table->back());
}

std::string describe_group(TensorParallelRuntime& tpr) {
  std::string d;
  for (int r = 0; r < tpr.size(); ++r) {
    const ModelConfig& lc = tpr.model(r).local_config();
    d += fmt::format("{}rank {} on GPU {}: {} q heads, {} kv heads, FFN {} ({:.1f} GB)", r ? "; " : "", r, tpr.model(r).device(),
                     lc.n_heads, lc.n_kv_heads, lc.hidden_dim, static_cast<double>(tpr.model(r).weight_bytes()) / 1e9);
  }
  return d;
}

int run_e2e(const BenchArgs& a) {
  CudaDeviceInfo info;
  if (Status st = query_cuda_device(a.device, &info); !st.ok()) return fail(st);
  if (!a.skip_stages.empty())
    fmt::print(stderr, "llmq: --skip-stages {}: those stages are left out, outputs are meaningless\n", a.skip_stages);
  const char* commit_env = std::getenv("LLMQ_COMMIT");
  const std::string commit = commit_env != nullptr ? commit_env : "unknown";
  std::ofstream json_out;
  if (!a.json_path.empty()) {
    // Appended to: never an input, never through a link, only a file of JSON lines (output_dir.hpp).
    OutputRules rules;
    rules.kind = OutputKind::kJsonLines;
    rules.option = "--json";
    rules.inputs = std::vector<std::string>{a.model};
    if (Status st = check_output_path(a.json_path, rules); !st.ok()) return fail(st);
    json_out.open(a.json_path, std::ios::app);
    if (!json_out) return fail(Status(StatusCode::kIoError, "--json: cannot open " + a.json_path));
  }
  auto emit = [&](json j) {
    j["device"] = info.name;
    j["date"] = today();
    j["commit"] = commit;
    j["model"] = a.model;
    j["fp8_fast_accumulation"] = a.fp8_fast_accum;
    if (json_out) json_out << j.dump() << "\n" << std::flush;
  };
  double copy_bw = 0.0;
  if (Status st = measure_copy_bandwidth(a.device, int64_t{1} << 30, &copy_bw); !st.ok()) return fail(st);
  fmt::print("llmq bench e2e: {} on {} (copy {:.0f} GB/s, commit {})\n", a.model, info.name, copy_bw / 1e9, commit);
  emit({{"kind", "copy"}, {"bytes_per_s", copy_bw}});
  std::vector<std::string> table;
  for (const int tp : a.tps)
  for (const std::string& asked : a.precisions) {
    std::unique_ptr<TensorParallelRuntime> tpr;
    if (Status st = load_gpu_model(a, asked, tp, &tpr); !st.ok()) {
      fmt::print(stderr, "llmq: {} {} tp={}: {}\n", a.model, asked, tp, st.to_string());
      emit({{"kind", "skipped"}, {"precision", asked}, {"tp", tp}, {"reason", st.to_string()}});
      table.push_back(fmt::format("{:<20} | tp={} {}", asked, tp, st.to_string()));
      continue;
    }
    const GpuModel* model = &tpr->model(0);
    // "checkpoint" becomes the stored scheme; a split shows its size.
    const std::string precision = model->precision() + (tp > 1 ? " tp" + std::to_string(tp) + (a.ep ? " ep" : "") : "");
    const ModelConfig& c = model->config();
    const ModelConfig& lc = model->local_config();  // one rank's share
    // Per rank: each rank reads its own slice of the weights and its own KV heads, in parallel.
    const int64_t kv_elements_per_token = 2 * lc.n_layers * lc.n_kv_heads * lc.head_dim;
    // Weight bytes a decode step reads: everything but the embedding table (one row per token), and
    // of an MoE model's experts only those a step can route to: batch x top_k of them at most.
    const bool eight_bit = model->precision() != "bf16" && model->precision() != "f32";
    const double all_weight_bytes = static_cast<double>(model->weight_bytes() - c.vocab_size * c.dim * 2);
    // Each rank holds 1/tp of the expert weights, split by FFN columns or (--ep) by whole experts.
    const double expert_bytes = c.is_moe() ? static_cast<double>(c.n_layers * c.n_experts * 3 * c.hidden_dim * c.dim) / tp *
                                                 (eight_bit ? 1.0 : 2.0)
                                           : 0.0;
    // How the ranks' partial sums are added: "auto" (the one-shot peer exchange, folded into the
    // norms, for decode-sized messages; NCCL above), or NCCL alone (--allreduce nccl, or GPUs
    // without peer access).
    const std::string allreduce = tpr->group() == nullptr ? "none" : tpr->group()->one_shot() ? "auto" : "nccl";
    if (tp > 1) fmt::print("tp={} ({} all-reduce): {}\n", tp, allreduce, describe_group(*tpr));
    for (const std::string& kv_cache : a.kv_caches) {
      const int64_t kv_per_token = kv_elements_per_token * (kv_cache == "e4m3" ? 1 : 2);
      for (int64_t batch : a.batches) {
        for (int64_t ctx : a.contexts) {
          GpuRuntimeOptions o;
          o.max_batch = batch;
          o.max_context = ctx + a.warmup + a.steps + 1;
          o.max_step_tokens = batch;
          o.cuda_graphs = !a.no_graphs;
          o.skip_stages = a.skip_stages;
          o.gemm_autotune = a.gemm_autotune;
          o.gemm_tile_search_max_m = a.launch.gemm_tile_search;
          o.fp8_fast_accumulation = a.fp8_fast_accum;
          o.kv_cache_dtype = kv_cache == "e4m3" ? DType::kE4M3 : DType::kBF16;
          Status st = tpr->start(o);
          std::vector<double> ms;
          if (st.ok()) st = tpr->fill_context_for_benchmark(batch, ctx, a.seed);
          if (st.ok()) st = tpr->time_decode(batch, a.warmup, a.steps, &ms);
          int64_t used = 0, total = 0;
          if (st.ok()) st = gpu_memory_in_use(a.device, &used, &total);
          // The all-reduces' share of a step: the same steps timed with them left out (the ranks then
          // run unsynchronised and their outputs are meaningless; only the time is kept).
          std::vector<double> ms_without;
          if (st.ok() && tp > 1 && a.allreduce_share) {
            GpuRuntimeOptions without = o;
            without.skip_stages = o.skip_stages.empty() ? "allreduce" : o.skip_stages + ",allreduce";
            st = tpr->start(without);
            if (st.ok()) st = tpr->fill_context_for_benchmark(batch, ctx, a.seed);
            if (st.ok()) st = tpr->time_decode(batch, a.warmup, a.steps, &ms_without);
          }
          if (!st.ok()) {
            emit({{"kind", "decode"}, {"precision", precision}, {"batch", batch}, {"context", ctx}, {"skipped", st.to_string()}});
            table.push_back(fmt::format("{:<20} | decode b={:<3} ctx={:<5} | skipped: {}", precision, batch, ctx, st.message()));
            continue;
          }
          const double med = percentile(ms, 0.5), p90 = percentile(ms, 0.9);
          const double without = ms_without.empty() ? 0.0 : percentile(ms_without, 0.5);
          const double kv_bytes = static_cast<double>(batch) * static_cast<double>(ctx + a.warmup + a.steps / 2) *
                                  static_cast<double>(kv_per_token);
          const double active_experts =
              c.is_moe() ? static_cast<double>(std::min(c.n_experts, batch * c.n_experts_per_token)) / static_cast<double>(c.n_experts) : 1.0;
          const double step_weight_bytes = all_weight_bytes - expert_bytes * (1.0 - active_experts);
          const double floor_ms = (step_weight_bytes + kv_bytes) / copy_bw * 1e3;
          json row = {{"kind", "decode"}, {"precision", precision}, {"batch", batch}, {"context", ctx}, {"steps", a.steps},
                {"tpot_ms_median", med}, {"tpot_ms_p90", p90}, {"tokens_per_s", static_cast<double>(batch) / med * 1e3},
                {"active_expert_fraction", active_experts},
                {"floor_ms", floor_ms}, {"weight_bytes", step_weight_bytes}, {"kv_bytes", kv_bytes},
                {"gpu_memory_used", used}, {"cuda_graphs", !a.no_graphs}, {"gemm_autotune", a.gemm_autotune}, {"gemm_tile_search", a.launch.gemm_tile_search}, {"kv_cache", kv_cache}, {"step_ms", ms}, {"tp", tp},
                {"allreduce", allreduce}, {"expert_parallel", tp > 1 && a.ep}};
          if (without > 0) {
            row["tpot_ms_without_allreduce"] = without;
            row["allreduce_share"] = (med - without) / med;
          }
          emit(row);
          table.push_back(fmt::format("{:<20} | decode b={:<3} ctx={:<5} kv={} | {:8.3f} ms/step (p90 {:7.3f}) | {:8.0f} tok/s | floor {:6.3f} ms ({:4.2f}x) | {:5.1f} GB{}",
                                      precision, batch, ctx, kv_cache, med, p90, static_cast<double>(batch) / med * 1e3, floor_ms,
                                      med / floor_ms, static_cast<double>(used) / 1e9,
                                      without > 0 ? fmt::format(" | all-reduce {:4.1f}% ({:.3f} ms)", 100 * (med - without) / med, med - without) : ""));
          fmt::print(stderr, "{}\n", table.back());
        }
      }
      if (a.fit)
        for (int64_t batch : a.batches) fit_row(a, *tpr, precision, kv_cache, batch, emit, &table);
    }  // kv_cache
    for (int64_t n : a.prefills)
      for (const std::string& attention_name : a.attentions) {
      if (n <= 0) continue;  // --prefill 0: none
      GpuRuntimeOptions o;
      o.max_batch = 1;
      o.max_context = n;
      o.max_step_tokens = n;
      o.skip_stages = a.skip_stages;
      o.gemm_autotune = a.gemm_autotune;
      o.gemm_tile_search_max_m = a.launch.gemm_tile_search;
      o.fp8_fast_accumulation = a.fp8_fast_accum;
      AttentionVariant attention = AttentionVariant::kBf16;
      Status parsed = parse_attention_variant(attention_name, &attention);
      o.prefill_attention = attention;
      const std::string label = attention == AttentionVariant::kBf16 ? precision : precision + " attn " + attention_name;
      Status st = parsed.ok() ? tpr->start(o) : parsed;
      std::vector<double> ms;
      for (int r = 0; r <= a.prefill_runs && st.ok(); ++r) {  // run 0 warms up
        double t = 0.0;
        st = tpr->time_prefill(n, a.seed + static_cast<uint64_t>(r), &t);
        if (r > 0) ms.push_back(t);
      }
      int64_t used = 0, total = 0;
      if (st.ok()) st = gpu_memory_in_use(a.device, &used, &total);
      if (!st.ok()) {
        emit({{"kind", "prefill"}, {"precision", precision}, {"attention", attention_name}, {"tokens", n}, {"skipped", st.to_string()}});
        table.push_back(fmt::format("{:<20} | prefill {:<5} | skipped: {}", label, n, st.message()));
        continue;
      }
      const double med = percentile(ms, 0.5);
      const double flops = 2.0 * matmul_params(c) * static_cast<double>(n) -
                           2.0 * static_cast<double>(c.dim * c.vocab_size) * static_cast<double>(n - 1);  // lm_head: last row only
      const double attn = 2.0 * 2.0 * static_cast<double>(c.n_layers * c.n_heads * c.head_dim) * static_cast<double>(n) *
                          static_cast<double>(n) / 2.0;  // QK^T and PV, causal half
      const double peak = peak_flops(info.name, eight_bit) * tp;
      emit({{"kind", "prefill"}, {"precision", precision}, {"attention", attention_name}, {"tokens", n}, {"ttft_ms_median", med}, {"ttft_ms", ms},
            {"tokens_per_s", static_cast<double>(n) / med * 1e3}, {"matmul_flops", flops}, {"attention_flops", attn},
            {"peak_flops", peak}, {"mfu", peak > 0 ? flops / (med * 1e-3) / peak : 0.0},
            {"mfu_with_attention", peak > 0 ? (flops + attn) / (med * 1e-3) / peak : 0.0}, {"gpu_memory_used", used}, {"tp", tp},
            {"allreduce", allreduce}, {"expert_parallel", tp > 1 && a.ep}});
      table.push_back(fmt::format("{:<20} | prefill {:<5} | TTFT {:8.2f} ms | {:8.0f} tok/s | MFU {:4.1f}% (+attn {:4.1f}%) | {:5.1f} GB",
                                  label, n, med, static_cast<double>(n) / med * 1e3,
                                  peak > 0 ? 100 * flops / (med * 1e-3) / peak : 0.0,
                                  peak > 0 ? 100 * (flops + attn) / (med * 1e-3) / peak : 0.0, static_cast<double>(used) / 1e9));
      fmt::print(stderr, "{}\n", table.back());
      }
  }
  fmt::print("\n");
  for (const std::string& line : table) fmt::print("{}\n", line);
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, std::vector<Command>* commands) {
  CLI::App* bench = app.add_subcommand("bench", "benchmarks: end to end on the GPU, the serving engine");
  bench->require_subcommand(1);
  auto args = std::make_shared<BenchArgs>();
  CLI::App* e2e = bench->add_subcommand("e2e", "end to end: decode TPOT, prefill TTFT, memory, per precision");
  e2e->add_option("--model", args->model, "synthetic:NAME (llama3-8b, llama3-70b, ...), a checkpoint, or 'default'");
  e2e->add_option("--precision", args->precisions, "bf16, f32, scheme names, or checkpoint (a quantized directory as stored); comma separated")->delimiter(',');
  e2e->add_option("--batch", args->batches, "decode batch sizes")->delimiter(',')->check(CLI::Range(1, 1024));
  e2e->add_option("--context", args->contexts, "decode context lengths")->delimiter(',')->check(CLI::Range(1, 1 << 20));
  e2e->add_option("--prefill", args->prefills, "prefill lengths (0: none)")->delimiter(',')->check(CLI::Range(0, 1 << 20));
  e2e->add_option("--steps", args->steps, "timed decode steps")->check(CLI::Range(1, 100000));
  e2e->add_option("--warmup", args->warmup, "untimed decode steps first")->check(CLI::Range(1, 100000));
  e2e->add_option("--prefill-runs", args->prefill_runs, "timed prefills (after one warm-up)")->check(CLI::Range(1, 100));
  e2e->add_option("--seed", args->seed, "seed of synthetic weights and inputs");
  e2e->add_option("--gpu", args->device, "CUDA device ordinal");
  e2e->add_option("--json", args->json_path, "append JSON lines here");
  e2e->add_flag("--no-graphs", args->no_graphs, "decode without CUDA graphs (one launch per kernel)");
  e2e->add_option("--attention", args->attentions, "prefill attention: bf16, half-int8, int8, fp8 (comma separated)")
      ->delimiter(',')
      ->check(CLI::IsMember({"bf16", "half-int8", "int8", "fp8"}));
  e2e->add_option("--kv-cache", args->kv_caches, "KV cache elements: bf16 and/or e4m3 (comma separated)")
      ->delimiter(',')
      ->check(CLI::IsMember({"bf16", "e4m3"}));
  e2e->add_option("--tp", args->tps, "tensor-parallel sizes, comma separated (GPUs --gpu .. --gpu + tp - 1; NCCL)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  e2e->add_flag("--ep", args->ep, "tp > 1 on an MoE model: whole experts per GPU (expert parallelism) instead of every expert's columns");
  e2e->add_flag("--allreduce-share", args->allreduce_share,
                "tp > 1: time every decode row again without its all-reduces, to give their share of a step");
  e2e->add_option("--skip-stages", args->skip_stages,
                  "leave these stages out of every step (norm,qkv,rope,attention,oquant,o,gateup,silu,down,lmhead,"
                  "allreduce): a stage's time by difference; outputs meaningless");
  e2e->add_option("--gemm-autotune", args->gemm_autotune,
                  "cuBLASLt GEMMs: time the heuristic's first N algorithms per shape class and keep the fastest (1: its first)")
      ->check(CLI::Range(1, 32));
  add_fp8_fast_accum_flag(e2e, &args->fp8_fast_accum);
  add_gpu_launch_flags(e2e, &args->launch);
  e2e->add_flag("--fit", args->fit,
                "per --batch and KV-cache format: the longest context that fits in free memory, and a decode at it");
  commands->push_back({e2e, [args] { return run_e2e(*args); }});
  add_bench_serve_command(bench, commands);
}

}  // namespace llmq::cli
