// llmq run: generate from a model (llama2.c sampling, token for token).
#include <algorithm>
#include <cstdio>
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
  std::string prompt_ids;
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
  return TensorParallelRuntime::load(a.tp, a.gpu, source, p, out, o);
}

// The GPU runtime: prefill the prompt but its last token, then `steps` - (prompt - 1) decode
// steps from that token, sampled on the device (the same positions the CPU path runs).
Status run_on_gpu(const RunArgs& a, TensorParallelRuntime& rt, const std::vector<int32_t>& prompt, std::vector<int32_t>* out) {
  const int64_t generated = a.steps - static_cast<int64_t>(prompt.size()) + 1;
  if (generated < 1) return invalid_argument("--steps: " + std::to_string(a.steps) + " leaves no room after the prompt");
  GpuRuntimeOptions o;
  o.max_context = a.steps;
  o.max_step_tokens = std::max<int64_t>(1, static_cast<int64_t>(prompt.size()));
  o.kv_cache_dtype = a.kv_cache == "e4m3" ? DType::kE4M3 : DType::kBF16;
  LLMQ_RETURN_IF_ERROR(parse_attention_variant(a.attention, &o.prefill_attention));
  LLMQ_RETURN_IF_ERROR(rt.start(o));
  if (prompt.size() > 1) {
    std::vector<float> logits;
    LLMQ_RETURN_IF_ERROR(rt.prefill({std::vector<int32_t>(prompt.begin(), prompt.end() - 1)}, false, &logits));
  }
  SamplingOptions s;
  s.temperature = a.temperature;
  s.top_p = a.topp;
  s.seed = a.seed;
  std::vector<std::vector<int32_t>> tokens;
  LLMQ_RETURN_IF_ERROR(rt.generate({prompt.back()}, generated, s, &tokens));
  *out = tokens[0];
  return {};
}

int run(const RunArgs& a) {
  if (a.tp > 1 && a.device != "cuda") return fail(invalid_argument("--tp: tensor parallelism runs on the GPU (--device cuda)"));
  std::unique_ptr<TensorParallelRuntime> gpu_model;
  ModelWeights model;
  if (a.device == "cuda") {
    if (Status st = load_on_gpu(a, &model, &gpu_model); !st.ok()) return fail(st);
  } else if (Status st = load_model(a.model, &model); !st.ok()) {
    return fail(st);
  }
  const ModelConfig& config = gpu_model != nullptr ? gpu_model->config() : model.config;
  std::vector<int32_t> prompt = {config.bos_token};
  {
    std::vector<int32_t> ids;
    if (Status st = parse_token_ids("--prompt-ids", a.prompt_ids, config.vocab_size, &ids); !st.ok()) return fail(st);
    prompt.insert(prompt.end(), ids.begin(), ids.end());
  }
  if (a.temperature > 0.0f && a.seed == 0)
    return fail(invalid_argument("--seed: sampling (temperature > 0) needs an explicit non-zero seed"));
  QuantizedModel qm;
  std::unique_ptr<LinearBackend> backend;
  const ModelWeights* weights = &model;
  if (!a.scheme.empty() && a.device != "cuda") {
    Scheme scheme;
    if (Status st = find_scheme(a.scheme, &scheme); !st.ok()) return fail(st);
    CalibrationStats stats;
    if (!a.stats.empty())
      if (Status st = CalibrationStats::load(a.stats, &stats); !st.ok()) return fail(st);
    if (Status st = quantize_model(model, scheme, a.stats.empty() ? nullptr : &stats, {}, &qm); !st.ok()) return fail(st);
    backend = std::make_unique<QuantizedLinearBackend>(qm);
    weights = &qm.weights;
  }
  std::vector<int32_t> out;
  if (a.device == "cuda") {
    if (Status st = run_on_gpu(a, *gpu_model, prompt, &out); !st.ok()) return fail(st);
  } else {
    Transformer transformer(*weights, backend.get());
    GenerateOptions g;
    g.steps = a.steps;
    g.temperature = a.temperature;
    g.topp = a.topp;
    g.seed = a.seed;
    if (Status st = generate(&transformer, prompt, g, &out); !st.ok()) return fail(st);
  }
  std::unique_ptr<Tokenizer> tokenizer;
  if (!a.ids && !is_builtin_model(a.model) && !Tokenizer::find(a.model).empty())
    if (Status st = Tokenizer::load(a.model, &tokenizer); !st.ok()) return fail(st);
  if (tokenizer == nullptr) {
    if (!a.ids) std::fprintf(stderr, "llmq: no tokenizer beside the model; printing token ids\n");
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? " " : "", out[i]);
    std::printf("\n");
    return 0;
  }
  int32_t prev = prompt.back();
  for (int32_t t : out) {
    std::string piece;
    if (Status st = tokenizer->decode_token(prev, t, &piece); !st.ok()) return fail(st);
    std::fputs(piece.c_str(), stdout);
    prev = t;
  }
  std::printf("\n");
  return 0;
}

}  // namespace

void add_run_command(CLI::App& app, std::vector<Command>* commands) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand("run", "generate tokens (reproduces llama2.c's run.c token for token)");
  cmd->add_option("--model", args->model, "llama2.c .bin, Hugging Face directory, or 'default'");
  cmd->add_option("--prompt-ids", args->prompt_ids, "prompt as space-separated token ids (BOS is added)");
  cmd->add_option("-n,--steps", args->steps, "positions to run, BOS included (run.c's -n)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("-t,--temperature", args->temperature, "0 = greedy")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("-p,--topp", args->topp, "nucleus sampling threshold")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("-s,--seed", args->seed, "sampler seed (required when temperature > 0)");
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
  add_gpu_launch_flags(cmd, &args->launch);
  commands->push_back({cmd, [args] { return run(*args); }});
}

}  // namespace llmq::cli
