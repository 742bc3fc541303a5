// llmq calibrate: the MEASURE phase. Runs calibration tokens through the model and saves the
// absmax statistics of every linear layer's input and weight.
#include <algorithm>
#include <cstdio>

#include "commands.hpp"
#include "llmq/calibration.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/model_io.hpp"
#include "llmq/output_dir.hpp"
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
};

int run(const CalibrateArgs& a) {
  if (a.gpu_given && a.device != "cuda") return fail(invalid_argument("--gpu: only with --device cuda"));
  // The output rules before any work (output_dir.hpp; save() decides again as it writes): never the
  // model, its tokenizer or the data, nor a file inside them; an existing file only when it is
  // llmq statistics.
  OutputRules out_rules;
  out_rules.kind = OutputKind::kStatsFile;
  out_rules.inputs = {a.model, a.data, Tokenizer::find(a.model)};
  out_rules.overwrite = true;
  if (Status st = check_output_path(a.out, out_rules); !st.ok()) return fail(st);
  ModelWeights model;
  std::string description;
  {
    SlowStep step("loading " + a.model);
    if (Status st = load_model(a.model, &model, &description); !st.ok()) return fail(st);
    step.done();
  }
  const int64_t chunk = std::min(a.context, model.config.max_seq_len);
  // --device cuda, set up before any sampling so that a machine without a GPU fails at once: the
  // model's linears in BF16 on the GPU runtime, observed as the CPU path is (calibrate_on_gpu).
  std::unique_ptr<GpuModel> gpu_model;
  std::unique_ptr<GpuRuntime> runtime;
  if (a.device == "cuda") {
    SlowStep step("loading " + a.model + " onto GPU " + std::to_string(a.gpu) + " (bf16)");
    GpuModelSource source;
    source.kind = GpuModelSource::Kind::kHost;
    source.weights = &model;
    if (Status st = GpuModel::load(source, gpu_precision(GpuPrecision::Kind::kBF16), a.gpu, &gpu_model); !st.ok())
      return fail(st);
    GpuRuntimeOptions o;
    o.max_context = chunk;
    o.max_step_tokens = chunk;
    o.cuda_graphs = false;  // prefill only
    if (Status st = GpuRuntime::create(*gpu_model, o, &runtime); !st.ok()) return fail(st);
    step.done();
  }
  std::vector<std::vector<int32_t>> sequences;
  std::string data_name = a.data;
  if (a.data.empty()) {
    SlowStep step("sampling calibration text from the model");
    if (Status st = sample_token_sequences(model, a.samples, std::min(a.length, model.config.max_seq_len), a.seed, &sequences);
        !st.ok())
      return fail(st);
    step.done();
    data_name = "sampled from the model: " + std::to_string(a.samples) + " x " + std::to_string(a.length) +
                " tokens, seeds from " + std::to_string(a.seed);
  } else {
    std::unique_ptr<Tokenizer> tokenizer;  // text data needs one; token-id files do not
    if (!is_builtin_model(a.model) && !Tokenizer::find(a.model).empty())
      if (Status st = Tokenizer::load(a.model, &tokenizer); !st.ok()) return fail(st);
    if (Status st = read_token_sequences(a.data, model.config.vocab_size, &sequences, tokenizer.get()); !st.ok())
      return fail(st);
  }
  CalibrationStats stats;
  stats.model = a.model;
  stats.data = data_name;
  Progress progress("calibrating");
  int64_t total = 0, done = 0;
  // Each sequence from where its text starts: a sampled one after the token it was sampled from
  // (text_start_token: BOS, or EOS for a model without one, as calibrate_on_samples feeds it); data
  // after BOS unless it begins with it already (text is encoded with the tokenizer's BOS), or as it
  // is for a model without BOS.
  const bool sampled = a.data.empty();
  const int32_t start = sampled ? model.config.text_start_token() : model.config.bos_token;
  auto needs_start = [&](const std::vector<int32_t>& s) {
    return start >= 0 && (sampled || s.empty() || s[0] != start);
  };
  for (const auto& s : sequences) total += static_cast<int64_t>(s.size()) + (needs_start(s) ? 1 : 0);
  for (const auto& s : sequences) {
    std::vector<int32_t> tokens;
    if (needs_start(s)) tokens.push_back(start);
    tokens.insert(tokens.end(), s.begin(), s.end());
    if (tokens.empty()) continue;
    const Status st = runtime ? calibrate_on_gpu(*runtime, tokens, chunk, &stats) : calibrate(model, tokens, chunk, &stats);
    if (!st.ok()) return fail(st);
    done += static_cast<int64_t>(tokens.size());
    progress.update(done, total);
  }
  progress.finish();
  if (Status st = stats.save(a.out); !st.ok()) return fail(st);
  std::printf("calibrated %s on %lld tokens (%s, %s): %zu linear layers -> %s\n", description.c_str(),
              static_cast<long long>(stats.tokens), data_name.c_str(),
              runtime ? "GPU runtime, bf16" : "CPU reference, f32", stats.linears.size(), a.out.c_str());
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
                  "(dense models; statistics within BF16 rounding of the CPU's)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--gpu", args->gpu, "with --device cuda: CUDA device ordinal")
      ->check(CLI::Range(0, 1023))
      ->each([args](const std::string&) { args->gpu_given = true; });
  commands->push_back({cmd, [args] { return run(*args); }});
}

}  // namespace llmq::cli
