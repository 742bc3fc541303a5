// llmq run: generate from a model, text in and text out (llama2.c's sampling, token for token).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <filesystem>
#include <sstream>

#include "commands.hpp"
#include "llmq/export.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/model_io.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/sampler.hpp"
#include "llmq/tokenizer.hpp"

namespace llmq::cli {
namespace {

struct RunArgs {
  std::string model = "default";  // an explicit --model "" is refused by load_model
  std::string prompt;  // text, through the model's tokenizer
  std::string prompt_ids;
  bool ignore_eos = false;
  int64_t steps = 256;
  float temperature = 1.0f;
  float topp = 0.9f;
  uint64_t seed = 0;
  bool ids = false;
  std::string scheme;
  std::string stats;
  std::string device = "cpu";
  std::string precision = "checkpoint";
  int gpu = 0;
  std::string kv_cache = "bf16";
  std::string attention = "bf16";
  int tp = 1;  // GPUs --gpu .. --gpu + tp - 1, tensor parallel
  bool ep = false;  // MoE: whole experts per GPU
  bool fp8_fast_accum = false;  // CudaGemmOptions::fp8_fast_accumulation (as llmq serve --fp8-fast-accum)
  GpuLaunchFlags launch;
};

// The model on the GPU under --scheme or --precision (GpuModel::load picks the route: a Hugging Face
// directory streams from its memory map; f32, calibrated schemes and llama2.c files go through the
// host, quantized there once for every rank). *host keeps a host-loaded model alive.
Status load_on_gpu(const RunArgs& a, ModelWeights* host, std::unique_ptr<TensorParallelRuntime>* out) {
  GpuPrecision p;
  LLMQ_RETURN_IF_ERROR(parse_gpu_precision(a.scheme.empty() ? a.precision : a.scheme, &p));
  CalibrationStats stats;
  if (!a.stats.empty()) LLMQ_RETURN_IF_ERROR(CalibrationStats::load(a.stats, &stats));
  GpuModelSource source;
  LLMQ_RETURN_IF_ERROR(gpu_model_source(a.model, 1, &source, host));
  TensorParallelLoadOptions o;
  o.expert_parallel = a.ep;
  o.stats = a.stats.empty() ? nullptr : &stats;
  o.group = apply_gpu_launch_flags(a.launch);
  Progress progress("loading " + a.model + " onto the GPU");
  o.progress = [&progress](int64_t done, int64_t total, const std::string&) { progress.update(done, total); };
  LLMQ_RETURN_IF_ERROR(TensorParallelRuntime::load(a.tp, a.gpu, source, p, out, o));
  progress.finish();
  return {};
}

// "12 tokens in 0.100 s (120.0 tokens/s)"; the count alone when nothing ran.
std::string rate_text(int64_t tokens, double seconds) {
  const char* unit = tokens == 1 ? "token" : "tokens";
  if (tokens <= 0 || seconds <= 0) return fmt::format("{} {}", tokens, unit);
  return fmt::format("{} {} in {:.3f} s ({:.1f} tokens/s)", tokens, unit, seconds, static_cast<double>(tokens) / seconds);
}

// The GPU runtime: prefill the prompt but its last token, then decode from that token, sampled on
// the device (the same positions the CPU path runs). Greedy decoding goes in chunks so that a
// stop token ends the work early; sampling runs in one call, since the runtime's random stream
// (and its CUDA graph) restarts with each call, and is cut at the stop token afterwards.
Status run_on_gpu(const RunArgs& a, uint64_t seed, TensorParallelRuntime& rt, const std::vector<int32_t>& prompt,
                  const std::vector<int32_t>& stop, const std::function<void(int32_t)>& on_token,
                  std::vector<int32_t>* out, GenerateStats* stats) {
  const int64_t generated = a.steps - static_cast<int64_t>(prompt.size()) + 1;
  if (generated < 1) return invalid_argument("--steps: " + std::to_string(a.steps) + " leaves no room after the prompt");
  GpuRuntimeOptions o;
  o.max_context = a.steps;
  o.max_step_tokens = std::max<int64_t>(1, static_cast<int64_t>(prompt.size()));
  o.kv_cache_dtype = a.kv_cache == "e4m3" ? DType::kE4M3 : DType::kBF16;
  o.fp8_fast_accumulation = a.fp8_fast_accum;
  o.gemm_tile_search_max_m = a.launch.gemm_tile_search;
  LLMQ_RETURN_IF_ERROR(parse_attention_variant(a.attention, &o.prefill_attention));
  LLMQ_RETURN_IF_ERROR(rt.start(o));
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  if (prompt.size() > 1) {
    std::vector<float> logits;
    LLMQ_RETURN_IF_ERROR(rt.prefill({std::vector<int32_t>(prompt.begin(), prompt.end() - 1)}, false, &logits));
  }
  const auto prefilled = Clock::now();
  stats->prompt_tokens = static_cast<int64_t>(prompt.size()) - 1;
  stats->prompt_seconds = std::chrono::duration<double>(prefilled - start).count();
  const int64_t chunk = a.temperature == 0.0f ? 64 : generated;
  SamplingOptions s;
  s.temperature = a.temperature;
  s.top_p = a.topp;
  s.seed = seed;
  out->clear();
  int32_t last = prompt.back();
  for (int64_t done = 0; done < generated && stats->stop_token < 0; done += chunk) {
    std::vector<std::vector<int32_t>> tokens;
    LLMQ_RETURN_IF_ERROR(rt.generate({last}, std::min(chunk, generated - done), s, &tokens));
    for (int32_t t : tokens[0]) {
      if (std::find(stop.begin(), stop.end(), t) != stop.end()) {
        stats->stop_token = t;
        break;
      }
      out->push_back(t);
      on_token(t);
    }
    last = tokens[0].back();
  }
  stats->generated_tokens = static_cast<int64_t>(out->size());
  stats->decode_seconds = std::chrono::duration<double>(Clock::now() - prefilled).count();
  return {};
}

// The prompt as token ids: --prompt through the tokenizer (its BOS when it has one), else BOS (when
// the model has one) and --prompt-ids; no prompt at all starts from the model's text_start_token.
Status prompt_tokens(const RunArgs& a, const ModelConfig& config, const Tokenizer* tokenizer, std::vector<int32_t>* out) {
  if (!a.prompt.empty() && !a.prompt_ids.empty()) return invalid_argument("--prompt and --prompt-ids: give one of them");
  if (!a.prompt.empty()) {
    if (tokenizer == nullptr)
      return invalid_argument("--prompt: the model has no tokenizer (" + a.model +
                              ": no tokenizer.json, tokenizer.model or llama2.c tokenizer beside it); give --prompt-ids");
    LLMQ_RETURN_IF_ERROR(tokenizer->encode(a.prompt, tokenizer->bos() >= 0, out));
    if (tokenizer->bos() < 0 && out->empty()) return invalid_argument("--prompt: the text gives no tokens");
    for (int32_t t : *out)
      if (t < 0 || t >= config.vocab_size)
        return invalid_argument("--prompt: the tokenizer gave token " + std::to_string(t) + ", outside the model's " +
                                std::to_string(config.vocab_size) + "-token vocabulary (" + tokenizer->description() + ")");
    return {};
  }
  out->clear();
  std::vector<int32_t> ids;
  LLMQ_RETURN_IF_ERROR(parse_token_ids("--prompt-ids", a.prompt_ids, config.vocab_size, &ids));
  if (ids.empty()) {
    // No prompt: a new text, after BOS (or the EOS between documents of a model without BOS).
    if (config.text_start_token() < 0)
      return invalid_argument("the model has no BOS and no EOS to start a text from (its config names neither): give "
                              "--prompt or --prompt-ids");
    out->push_back(config.text_start_token());
    return {};
  }
  if (config.bos_token >= 0) out->push_back(config.bos_token);
  out->insert(out->end(), ids.begin(), ids.end());
  return {};
}

int run(const RunArgs& a) {
  if (a.tp > 1 && a.device != "cuda") return fail(invalid_argument("--tp: tensor parallelism runs on the GPU (--device cuda)"));
  if (Status st = check_fp8_fast_accum(a.fp8_fast_accum, a.device); !st.ok()) return fail(st);
  std::unique_ptr<Tokenizer> tokenizer;
  if ((!a.ids || !a.prompt.empty()) && !is_builtin_model(a.model) && !Tokenizer::find(a.model).empty())
    if (Status st = Tokenizer::load(a.model, &tokenizer); !st.ok()) return fail(st);
  const bool text_out = tokenizer != nullptr && !a.ids;
  std::unique_ptr<TensorParallelRuntime> gpu_model;
  ModelWeights model;
  if (a.device == "cuda") {
    if (Status st = load_on_gpu(a, &model, &gpu_model); !st.ok()) return fail(st);  // with its progress bar
  } else {
    SlowStep step("loading " + a.model);
    if (Status st = load_model(a.model, &model); !st.ok()) return fail(st);
    step.done();
  }
  const ModelConfig& config = gpu_model != nullptr ? gpu_model->config() : model.config;
  std::vector<int32_t> prompt;
  if (Status st = prompt_tokens(a, config, tokenizer.get(), &prompt); !st.ok()) return fail(st);
  if (static_cast<int64_t>(prompt.size()) > a.steps)
    return fail(invalid_argument("--steps: " + std::to_string(a.steps) + " positions do not hold the " +
                                 std::to_string(prompt.size()) + "-token prompt (BOS included) and a new token"));
  uint64_t seed = a.seed;
  if (a.temperature > 0.0f && seed == 0) {
    std::random_device rd;
    seed = (static_cast<uint64_t>(rd()) << 32 | rd()) | 1;  // never 0 (the sampler's state must not be)
    std::fprintf(stderr, "llmq: sampling with seed %llu (--seed %llu repeats this output)\n",
                 static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  }
  // BOS ends generation as in run.c (a new text would begin); EOS unless --ignore-eos.
  std::vector<int32_t> stop;
  if (config.bos_token >= 0) stop.push_back(config.bos_token);
  if (!a.ignore_eos)
    for (int32_t id : generation_end_ids(config, tokenizer.get()))
      if (std::find(stop.begin(), stop.end(), id) == stop.end()) stop.push_back(id);
  QuantizedModel qm;
  std::unique_ptr<LinearBackend> backend;
  const ModelWeights* weights = &model;
  if (!a.scheme.empty() && a.device != "cuda") {
    SlowStep step("quantizing under " + a.scheme);
    Scheme scheme;
    if (Status st = find_scheme(a.scheme, &scheme); !st.ok()) return fail(st);
    CalibrationStats stats;
    if (!a.stats.empty())
      if (Status st = CalibrationStats::load(a.stats, &stats); !st.ok()) return fail(st);
    if (Status st = quantize_model(model, scheme, a.stats.empty() ? nullptr : &stats, {}, &qm); !st.ok()) return fail(st);
    backend = std::make_unique<QuantizedLinearBackend>(qm);
    weights = &qm.weights;
    step.done();
  }

  // Text streams as it is generated: the prompt first, then each token's piece. Without a
  // tokenizer (or with --ids) the generated ids are printed at the end.
  int32_t prev = -1;
  Status decode_error;
  auto print_piece = [&](int32_t t) {
    std::string piece;
    if (Status st = tokenizer->decode_token(prev, t, &piece); !st.ok()) {
      if (decode_error.ok()) decode_error = st;
      return;
    }
    std::fputs(piece.c_str(), stdout);
    std::fflush(stdout);
    prev = t;
  };
  std::function<void(int32_t)> on_token = [](int32_t) {};
  if (text_out) {
    for (int32_t t : prompt) print_piece(t);
    on_token = print_piece;
  }
  std::vector<int32_t> out;
  GenerateStats stats;
  if (a.device == "cuda") {
    if (Status st = run_on_gpu(a, seed, *gpu_model, prompt, stop, on_token, &out, &stats); !st.ok()) return fail(st);
  } else {
    Transformer transformer(*weights, backend.get());
    GenerateOptions g;
    g.steps = a.steps;
    g.temperature = a.temperature;
    g.topp = a.topp;
    g.seed = seed;
    g.stop_tokens = stop;
    g.on_token = on_token;
    if (Status st = generate(&transformer, prompt, g, &out, &stats); !st.ok()) return fail(st);
  }
  if (!decode_error.ok()) return fail(decode_error);
  if (!text_out) {
    if (!a.ids) std::fprintf(stderr, "llmq: no tokenizer beside the model; printing token ids\n");
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? " " : "", out[i]);
  }
  std::printf("\n");
  std::fflush(stdout);
  const std::string ended = stats.stop_token < 0 ? "--steps reached"
                            : stats.stop_token == config.bos_token && stats.stop_token != config.eos_token
                                ? "stopped at BOS (token " + std::to_string(stats.stop_token) + ")"
                                : "stopped at EOS (token " + std::to_string(stats.stop_token) + ")";
  // The GPU's first forward pass also makes its cuBLASLt plans: the prompt's time includes that.
  std::fprintf(stderr, "llmq: prompt %s%s; generated %s; %s\n", rate_text(stats.prompt_tokens, stats.prompt_seconds).c_str(),
               a.device == "cuda" ? " (with the GPU's one-time setup)" : "",
               rate_text(stats.generated_tokens, stats.decode_seconds).c_str(), ended.c_str());
  return 0;
}

}  // namespace

void add_run_command(CLI::App& app, std::vector<Command>* commands) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand("run", "generate text from a model: the CPU reference (llama2.c's run.c token for token) or --device cuda");
  cmd->add_option("--model", args->model, "llama2.c .bin, Hugging Face directory, or 'default'");
  cmd->add_option("--prompt", args->prompt, "prompt text, encoded with the model's tokenizer");
  cmd->add_option("--prompt-ids", args->prompt_ids, "prompt as space-separated token ids (after BOS, when the model has one)");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "keep generating past EOS (to --steps)");
  cmd->add_option("-n,--steps", args->steps, "positions to run, the prompt included (run.c's -n)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("-t,--temperature", args->temperature, "0 = greedy")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("-p,--topp", args->topp, "nucleus sampling threshold")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("-s,--seed", args->seed, "sampler seed (0: a random one, printed)");
  cmd->add_flag("--ids", args->ids, "print generated token ids instead of text");
  cmd->add_option("--scheme", args->scheme, "run with every linear layer quantized under this scheme");
  cmd->add_option("--stats", args->stats, "calibration statistics for static schemes");
  cmd->add_option("--device", args->device, "cpu (the float32 reference) or cuda (the GPU runtime)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--precision", args->precision,
                  "--device cuda without --scheme: checkpoint (as stored: a quantized checkpoint's codes, else BF16), bf16 or f32");
  cmd->add_option("--gpu", args->gpu, "CUDA device ordinal");
  cmd->add_option("--attention", args->attention, "--device cuda: prefill attention, bf16, half-int8, int8 or fp8")
      ->check(CLI::IsMember({"bf16", "half-int8", "int8", "fp8"}));
  cmd->add_option("--tp", args->tp, "--device cuda: split the model over this many GPUs (tensor parallel, NCCL)")
      ->check(CLI::Range(1, 64));
  cmd->add_flag("--ep", args->ep, "--tp > 1 on an MoE model: whole experts per GPU (expert parallelism)");
  cmd->add_option("--kv-cache", args->kv_cache, "--device cuda: KV cache elements, bf16 or e4m3")
      ->check(CLI::IsMember({"bf16", "e4m3"}));
  add_fp8_fast_accum_flag(cmd, &args->fp8_fast_accum);
  add_gpu_launch_flags(cmd, &args->launch);
  commands->push_back({cmd, [args] { return run(*args); }});
}

}  // namespace llmq::cli
