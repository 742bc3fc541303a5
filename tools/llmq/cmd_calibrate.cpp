// llmq calibrate: the MEASURE phase. Runs calibration tokens through the model and saves the
// absmax statistics of every linear layer's input and weight.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "commands.hpp"
#include "engine_setup.hpp"
#include "eval_data.hpp"
#include "llmq/calibration.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/model_io.hpp"
#include "llmq/output_dir.hpp"
#include "llmq/tensor_parallel.hpp"
#include "llmq/tokenizer.hpp"

namespace llmq::cli {
namespace {

struct CalibrateArgs {
  std::string model = "default";  // an explicit --model "" is refused by load_model
  std::string data;
  std::string out = "llmq-stats.json";
  int64_t context = 256;
  int64_t samples = 64;  // without --data: sequences sampled from the model itself
  int64_t length = 128;
  uint64_t seed = 1000;
  std::string device = "cpu";  // cpu: the float32 reference; cuda: the BF16 GPU runtime
  int gpu = 0;
  bool gpu_given = false;
  int tp = 1;
  GpuLaunchFlags launch;
};

// Positions per prefill step on the GPU: windows are batched up to this many tokens (the weights
// are read once per step, so small windows alone would leave a large model memory-bound).
constexpr int64_t kGpuStepTokens = 8192;

int run(const CalibrateArgs& a) {
  if (Status st = check_gpu_option(a.gpu_given, a.device); !st.ok()) return fail(st);
  if (a.tp != 1 && a.device != "cuda") return fail(invalid_argument("--tp: only with --device cuda"));
  // The output rules before any work (output_dir.hpp; save() decides again as it writes): never the
  // model, its tokenizer or the data, nor a file inside them; an existing file only when it is
  // llmq statistics.
  OutputRules out_rules;
  out_rules.kind = OutputKind::kStatsFile;
  out_rules.inputs = {a.model, a.data, Tokenizer::find(a.model)};
  out_rules.overwrite = true;
  if (Status st = check_output_path(a.out, out_rules); !st.ok()) return fail(st);
  const auto started = std::chrono::steady_clock::now();
  // The model: on the CPU loaded whole in float32; on the GPU a checkpoint directory streams to the
  // devices and synthetic:NAME is generated there (the host never holds them), the rest (llama2.c
  // files, the default models) is loaded on the host first.
  ModelWeights model;
  ModelConfig config;
  std::string description = a.model;
  GpuModelSource source;
  if (a.device == "cuda") {
    if (Status st = model_shape(a.model, /*seed=*/1, &source, &model, &config); !st.ok()) return fail(st);
  } else {
    if (a.model.rfind("synthetic:", 0) == 0)
      return fail(invalid_argument("--model synthetic:*: weights generated on the GPU; use --device cuda"));
    SlowStep step("loading " + a.model);
    if (Status st = load_model(a.model, &model, &description); !st.ok()) return fail(st);
    step.done();
    config = model.config;
  }
  const bool on_host = a.device == "cpu" || source.kind == GpuModelSource::Kind::kHost;
  const int64_t chunk = std::min(a.context, config.max_seq_len);
  // Sampled text: `length` tokens after the start token (the GPU's runtime then holds one more).
  const int64_t sample_length = std::min(a.length, on_host ? config.max_seq_len : config.max_seq_len - 1);
  // --device cuda, set up before any sampling so that a machine without a GPU fails at once: the
  // model's linears in BF16 over --tp GPUs, observed as the CPU path is (calibrate_on_gpu).
  std::unique_ptr<TensorParallelRuntime> tpr;
  int64_t max_batch = 1;
  if (a.device == "cuda") {
    TensorParallelLoadOptions lo;
    lo.group = apply_gpu_launch_flags(a.launch);
    const std::string onto = a.tp > 1 ? std::to_string(a.tp) + " GPUs" : "GPU " + std::to_string(a.gpu);
    if (Status st = load_on_gpus(a.tp, a.gpu, source, gpu_precision(GpuPrecision::Kind::kBF16), a.model + " onto " + onto + " (bf16)",
                                 lo, &tpr);
        !st.ok())
      return fail(st);
    GpuRuntimeOptions o;
    o.gemm_tile_search_max_m = a.launch.gemm_tile_search;
    // Windows of `chunk` positions (and, sampling on the GPU, sequences of the start token and
    // sample_length more), batched up to kGpuStepTokens positions per step.
    o.max_context = on_host || !a.data.empty() ? chunk : std::max(chunk, sample_length + 1);
    max_batch = std::clamp<int64_t>(kGpuStepTokens / o.max_context, 1, 64);
    o.max_batch = max_batch;
    o.max_step_tokens = std::max(o.max_context, std::min<int64_t>(kGpuStepTokens, max_batch * o.max_context));
    o.cuda_graphs = false;  // prefill, and sampling once
    if (Status st = tpr->start(o); !st.ok()) return fail(st);
  }
  std::vector<std::vector<int32_t>> sequences;
  std::string data_name = a.data;
  if (a.data.empty()) {
    const int32_t start = config.text_start_token();
    SlowStep step(std::string("sampling calibration text from the model") + (on_host ? "" : " on the GPU"));
    const Status st = on_host ? sample_token_sequences(model, a.samples, sample_length, a.seed, &sequences)
                      : start < 0
                          ? invalid_argument("sampling text from the model: its config names neither bos_token_id nor "
                                             "eos_token_id to start from; give the text (--data)")
                          : sample_sequences_on_gpu(*tpr, max_batch, start, a.samples, sample_length, a.seed, &sequences);
    if (!st.ok()) return fail(st);
    step.done();
    data_name = "sampled from the model" + std::string(on_host ? "" : " on the GPU") + ": " + std::to_string(a.samples) +
                " x " + std::to_string(a.length) + " tokens, seeds from " + std::to_string(a.seed);
  } else {
    std::unique_ptr<Tokenizer> tokenizer;  // text data needs one; token-id files do not
    if (!is_builtin_model(a.model) && !Tokenizer::find(a.model).empty())
      if (Status st = Tokenizer::load(a.model, &tokenizer); !st.ok()) return fail(st);
    if (Status st = read_token_sequences(a.data, config.vocab_size, &sequences, tokenizer.get()); !st.ok())
      return fail(st);
  }
  CalibrationStats stats;
  stats.model = a.model;
  stats.data = data_name;
  // Each sequence from where its text starts: a sampled one after the token it was sampled from
  // (text_start_token: BOS, or EOS for a model without one, as calibrate_on_samples feeds it); data
  // after BOS unless it begins with it already (text is encoded with the tokenizer's BOS), or as it
  // is for a model without BOS.
  const bool sampled = a.data.empty();
  const int32_t start = sampled ? config.text_start_token() : config.bos_token;
  auto needs_start = [&](const std::vector<int32_t>& s) {
    return start >= 0 && (sampled || s.empty() || s[0] != start);
  };
  std::vector<std::vector<int32_t>> feeds;
  int64_t total = 0;
  for (const auto& s : sequences) {
    std::vector<int32_t> tokens;
    if (needs_start(s)) tokens.push_back(start);
    tokens.insert(tokens.end(), s.begin(), s.end());
    if (tokens.empty()) continue;
    total += static_cast<int64_t>(tokens.size());
    feeds.push_back(std::move(tokens));
  }
  sequences.clear();
  const auto measuring = std::chrono::steady_clock::now();
  Progress progress("calibrating");
  if (tpr) {
    if (Status st = calibrate_on_gpu(*tpr, feeds, chunk, &stats, [&](int64_t d, int64_t t) { progress.update(d, t); });
        !st.ok())
      return fail(st);
  } else {
    int64_t done = 0;
    for (const auto& tokens : feeds) {
      if (Status st = calibrate(model, tokens, chunk, &stats); !st.ok()) return fail(st);
      done += static_cast<int64_t>(tokens.size());
      progress.update(done, total);
    }
  }
  progress.finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - measuring).count();
  const double all_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (Status st = stats.save(a.out); !st.ok()) return fail(st);
  const std::string where = tpr ? (a.tp > 1 ? "GPU runtime over " + std::to_string(a.tp) + " GPUs, bf16" : "GPU runtime, bf16")
                                : "CPU reference, f32";
  std::printf("calibrated %s on %lld tokens (%s, %s): %zu linear layers -> %s\n", description.c_str(),
              static_cast<long long>(stats.tokens), data_name.c_str(), where.c_str(), stats.linears.size(), a.out.c_str());
  // What it took: the measuring pass, the whole command, and the memory it held.
  const std::string memory = memory_text(a.gpu, tpr ? a.tp : 0);
  std::printf("time: measuring %.2f s (%.0f tokens/s), whole command %.2f s; %s\n", seconds,
              static_cast<double>(stats.tokens) / std::max(seconds, 1e-9), all_seconds, memory.c_str());
  // The KV cache: an E4M3 cache with unit scales (the engines' default) saturates above 448.
  const KvCacheStats& kv = stats.kv_cache;
  if (!kv.empty()) {
    const auto largest = [&kv](const std::vector<float>& m) {
      const auto it = std::max_element(m.begin(), m.end());
      return std::make_pair(*it, static_cast<int64_t>(it - m.begin()) / kv.kv_heads);
    };
    const auto [k, k_layer] = largest(kv.k_absmax);
    const auto [v, v_layer] = largest(kv.v_absmax);
    std::printf("KV cache: |K| up to %.4g (layer %lld), |V| up to %.4g (layer %lld)%s\n", k, static_cast<long long>(k_layer), v,
                static_cast<long long>(v_layer),
                k > 448.0f || v > 448.0f ? ": above E4M3's 448, so a unit-scale E4M3 cache would saturate; quantize with "
                                           "--kv-cache-scales"
                                         : "");
  }
  return 0;
}

}  // namespace

void add_calibrate_command(CLI::App& app, std::vector<Command>* commands) {
  auto args = std::make_shared<CalibrateArgs>();
  CLI::App* cmd = app.add_subcommand("calibrate", "measure per-tensor and per-channel absmax of every linear input");
  cmd->add_option("--model", args->model, "llama2.c .bin, Hugging Face directory, or 'default'");
  cmd->add_option("--data", args->data, "token-id file (one sequence per line); default: the model's own samples");
  cmd->add_option("-o,--out", args->out,
                  "statistics file (JSON). Never the model, the data or a file inside them; an existing file is\n"
                  "replaced only when it is an llmq calibration file");
  cmd->add_option("--context", args->context, "tokens per forward window")->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--samples", args->samples, "without --data: sequences to sample")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--length", args->length, "without --data: tokens per sampled sequence")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--seed", args->seed, "without --data: first sampling seed");
  cmd->add_option("--device", args->device,
                  "cpu: the float32 reference (default); cuda: the GPU runtime with BF16 weights and activations\n"
                  "(statistics within BF16 rounding of the CPU's); there a checkpoint directory streams to the GPUs\n"
                  "and synthetic:NAME is generated on them, without a copy on the host")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  add_gpu_ordinal_option(cmd, &args->gpu, &args->gpu_given);
  cmd->add_option("--tp", args->tp, "with --device cuda: tensor-parallel GPUs (--gpu and the next ones)")
      ->check(CLI::Range(1, 8));
  add_gpu_launch_flags(cmd, &args->launch);
  commands->push_back({cmd, [args] { return run(*args); }});
}

}  // namespace llmq::cli
