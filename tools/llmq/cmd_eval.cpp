// llmq eval: accuracy of quantized models against the unquantized one (llama.cpp's
// --kl-divergence statistics), one row per scheme or quantized checkpoint, like Tables 2-4 of the
// FP8 paper.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.hpp"
#include "eval_command.hpp"
#include "eval_data.hpp"
#include "eval_table.hpp"
#include "llmq/device.hpp"
#include "llmq/evaluate.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/export.hpp"
#include "llmq/model_io.hpp"
#include "llmq/quant_recipe.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/safetensors.hpp"

namespace llmq::cli {

Status eval_schemes(const EvalArgs& a, bool have_other_candidates, std::vector<Scheme>* out) {
  std::vector<std::string> scheme_names = split_commas(a.schemes);
  if (scheme_names.size() == 1 && scheme_names[0] == "all") {
    scheme_names.clear();
    for (const Scheme& s : all_schemes()) scheme_names.push_back(s.name);
  }
  if (!a.flags.recipe.empty() && !scheme_names.empty())
    return invalid_argument("--recipe and --scheme: give one of them (each run evaluates one recipe)");
  if (scheme_names.empty() && !have_other_candidates) scheme_names.push_back(kDefaultScheme);
  out->assign(scheme_names.size(), Scheme());
  bool smoothing = false;
  for (size_t i = 0; i < scheme_names.size(); ++i) {
    Scheme& s = (*out)[i];
    LLMQ_RETURN_IF_ERROR(find_scheme(scheme_names[i], &s));
    smoothing = smoothing || s.smooth_alpha >= 0.0f;
    const float alpha = s.smooth_alpha >= 0.0f ? a.flags.smooth_alpha : -1.0f;  // for the schemes that smooth
    LLMQ_RETURN_IF_ERROR(apply_overrides(s, alpha, a.flags.backoff, &s));
  }
  if (a.flags.smooth_alpha >= 0.0f && !smoothing && a.flags.recipe.empty())
    return invalid_argument("--smooth-alpha: none of the schemes smooths (fp8-smoothquant, int8-smoothquant do)");
  return {};
}

namespace {

int run(const EvalArgs& a) {
  if (Status st = check_fp8_fast_accum(a.fp8_fast_accum, a.device); !st.ok()) return fail(st);
  if (a.reference != "cpu" && a.device != "cuda")
    return fail(invalid_argument("--reference " + a.reference +
                                 ": the unquantized model runs on the GPU runtime then, beside the candidates (--device cuda)"));
  if (eval_on_gpus_only(a)) return run_eval_on_gpus(a);
  if (a.tp != 1)
    return fail(invalid_argument("--tp: with the model on the GPUs alone (--device cuda, --reference bf16 or f32, --model a "
                                 "checkpoint directory or synthetic:NAME, no --recipe)"));
  const auto started = std::chrono::steady_clock::now();
  ModelWeights model;
  std::string description;
  {
    SlowStep step("loading " + a.model);
    if (Status st = load_model(a.model, &model, &description); !st.ok()) return fail(st);
    step.done();
  }

  std::vector<Scheme> schemes;
  if (Status st = eval_schemes(a, !a.quantized.empty() || !a.flags.recipe.empty(), &schemes); !st.ok()) return fail(st);
  bool need_stats = false;
  for (const Scheme& s : schemes) need_stats = need_stats || s.needs_statistics();
  // --kv-cache: every candidate once per KV cache (empty: float). e4m3 keeps unit scales (vLLM's and
  // the runtime's default); e4m3-static takes each layer and KV head's calibrated absmax / 448.
  std::vector<std::string> kv_caches = split_commas(a.kv_cache);
  for (const std::string& k : kv_caches) {
    if (k != "float" && k != "e4m3" && k != "e4m3-static")
      return fail(invalid_argument("--kv-cache: '" + k + "' (float, e4m3 or e4m3-static)"));
    if (k != "float" && a.device == "cuda")
      return fail(invalid_argument("--kv-cache " + k + ": the CPU reference's cache (--device cpu); on the GPU, llmq run "
                                   "/ bench / serve --kv-cache e4m3"));
    need_stats = need_stats || k == "e4m3-static";
  }
  const bool per_kv_cache = !kv_caches.empty();
  if (!per_kv_cache) kv_caches.push_back("float");
  QuantRecipe recipe;
  if (!a.flags.recipe.empty()) {
    if (Status st = load_recipe_flags(a.flags, &recipe); !st.ok()) return fail(st);
    ResolvedRecipe resolved;
    if (Status st = resolve_recipe(recipe, model.config, &resolved); !st.ok()) return fail(st);
    for (const auto& [module, s] : resolved.scheme_of) need_stats = need_stats || s.needs_statistics();
  }

  // Evaluation data: a token file, or the model's own samples (seeds from --seed).
  std::vector<std::vector<int32_t>> sequences;
  std::string data_name;
  if (Status st = load_eval_data(a.model, model, a.data, &sequences, &data_name); !st.ok()) return fail(st);

  // Calibration on other samples than the evaluation data (seeds 1000+), as the paper advises.
  CalibrationStats stats;
  bool have_stats = false;
  if (Status st = eval_stats(model, a.stats, need_stats, a.context, &stats, &have_stats); !st.ok()) return fail(st);
  // The E4M3 caches' scales per layer and KV head: unit, or static ones: a --quantized checkpoint's
  // own when it declares them, else what `llmq quantize --kv-cache-scales` would write from the
  // statistics (KvCacheStats::static_e4m3_scales), so the row measures the cache an engine runs.
  const size_t kv_entries = static_cast<size_t>(model.config.n_layers * model.config.n_kv_heads);
  const std::vector<float> unit_scales(kv_entries, 1.0f);
  std::vector<float> k_static, v_static;
  if (std::find(kv_caches.begin(), kv_caches.end(), "e4m3-static") != kv_caches.end()) {
    if (stats.kv_cache.empty())
      return fail(invalid_argument("--kv-cache e4m3-static: --stats " + a.stats +
                                   " holds no KV cache statistics (files from before them); run llmq calibrate again"));
    if (Status st = stats.check_matches(model.config); !st.ok()) return fail(st);
    if (Status st = stats.kv_cache.static_e4m3_scales(&k_static, &v_static); !st.ok())
      return fail(Status(st.code(), "--kv-cache e4m3-static: " + st.message()));
  }
  // --attention: every candidate once per attention variant (empty: the default attention only).
  std::vector<AttentionVariant> attentions;
  for (const std::string& name : split_commas(a.attention)) {
    AttentionVariant v;
    if (Status st = parse_attention_variant(name, &v); !st.ok())
      return fail(invalid_argument("--attention: " + st.message()));
    if (v == AttentionVariant::kFloat && a.device == "cuda")
      return fail(invalid_argument("--attention float: CPU only (--device cpu); the GPU runtime's are bf16, half-int8, int8, fp8"));
    attentions.push_back(v);
  }
  const bool per_attention = !attentions.empty();
  if (!per_attention) attentions.push_back(a.device == "cuda" ? AttentionVariant::kBf16 : AttentionVariant::kFloat);
  // The arguments above are checked first; then a machine without a GPU is told so, before any
  // quantizing.
  if (a.device == "cuda") {
    CudaDeviceInfo device;
    if (Status st = query_cuda_device(a.gpu, &device); !st.ok()) return fail(st);
  }

  std::vector<std::string> labels;
  std::vector<std::unique_ptr<QuantizedModel>> qmodels;
  std::vector<WeightError> weight_errors;  // per scheme (not --quantized directories)
  Progress quantizing("quantizing");
  for (const Scheme& s : schemes) {
    auto qm = std::make_unique<QuantizedModel>();
    if (Status st = quantize_model(model, s, have_stats ? &stats : nullptr, {}, qm.get()); !st.ok()) return fail(st);
    weight_errors.emplace_back();
    if (Status st = weight_error(*qm, &weight_errors.back()); !st.ok()) return fail(st);
    labels.push_back(s.name);
    qmodels.push_back(std::move(qm));
    quantizing.update(static_cast<int64_t>(qmodels.size()), static_cast<int64_t>(schemes.size()));
  }
  if (!a.flags.recipe.empty()) {
    auto qm = std::make_unique<QuantizedModel>();
    if (Status st = quantize_model(model, recipe, have_stats ? &stats : nullptr, {}, qm.get()); !st.ok()) return fail(st);
    weight_errors.emplace_back();
    if (Status st = weight_error(*qm, &weight_errors.back()); !st.ok()) return fail(st);
    labels.push_back("recipe " + a.flags.recipe + " (" + qm->scheme.description + ")");
    qmodels.push_back(std::move(qm));
  }
  quantizing.finish();
  const size_t built = qmodels.size();  // quantized here; the rest are --quantized directories
  for (const std::string& dir : a.quantized) {
    auto qm = std::make_unique<QuantizedModel>();
    if (Status st = load_quantized_checkpoint(dir, qm.get()); !st.ok()) return fail(st);
    labels.push_back(dir + " (" + qm->scheme.name + ")");
    qmodels.push_back(std::move(qm));
  }
  std::vector<std::unique_ptr<QuantizedLinearBackend>> backends;
  std::vector<std::unique_ptr<Transformer>> transformers;
  std::vector<WindowLogitsFn> candidates;
  GpuWindowModels on_gpu;
  EvalOptions options;
  options.context = std::min(a.context, model.config.max_seq_len);
  GpuRuntimeOptions window;  // a GPU model's runtime: one window at a time, prefill only
  window.max_context = options.context;
  window.max_step_tokens = options.context;
  window.cuda_graphs = false;
  window.gemm_tile_search_max_m = a.launch.gemm_tile_search;
  std::vector<std::string> candidate_labels;
  std::vector<const WeightError*> candidate_weight_errors;
  // The static KV scales each candidate runs with: a --quantized checkpoint's declared ones, read
  // once per directory; the statistics' otherwise.
  std::vector<std::pair<std::vector<float>, std::vector<float>>> static_scales(qmodels.size(), {k_static, v_static});
  if (!k_static.empty())
    for (size_t i = built; i < qmodels.size(); ++i) {
      std::unique_ptr<Checkpoint> ckpt;
      bool declared = false;
      std::vector<float> ck, cv;
      if (Status st = Checkpoint::open(a.quantized[i - built], &ckpt); !st.ok()) return fail(st);
      if (Status st = read_kv_cache_scales(*ckpt, model.config, &declared, &ck, &cv); !st.ok()) return fail(st);
      if (declared) static_scales[i] = {std::move(ck), std::move(cv)};
    }
  std::vector<std::string> candidate_kv;
  for (size_t i = 0; i < qmodels.size(); ++i)
    for (AttentionVariant attention : attentions)
      for (const std::string& kv : kv_caches) {
    const auto& qm = qmodels[i];
    candidate_labels.push_back((per_attention ? labels[i] + " + " + attention_variant_name(attention) + " attention" : labels[i]) +
                               (per_kv_cache ? " + " + kv + " KV" : ""));
    candidate_kv.push_back(kv);
    candidate_weight_errors.push_back(i < weight_errors.size() ? &weight_errors[i] : nullptr);
    if (a.device == "cuda") {
      // The candidate runs on the GPU runtime; the base stays the CPU float reference. A
      // --quantized directory streams to the device as `llmq run/bench` load it.
      GpuModelSource source;
      if (i >= built) {
        source.kind = GpuModelSource::Kind::kCheckpoint;
        source.dir = a.quantized[i - built];
      } else {
        source.kind = GpuModelSource::Kind::kHostQuantized;
        source.quantized = &*qm;
      }
      GpuRuntimeOptions o = window;
      o.prefill_attention = attention;
      o.fp8_fast_accumulation = a.fp8_fast_accum;
      candidates.emplace_back();
      if (Status st = on_gpu.add(a, source, gpu_precision(GpuPrecision::Kind::kAsStored), nullptr, o, candidate_labels.back(),
                                 &candidates.back());
          !st.ok())
        return fail(st);
      continue;
    }
    backends.push_back(std::make_unique<QuantizedLinearBackend>(*qm));
    transformers.push_back(std::make_unique<Transformer>(qm->weights, backends.back().get()));
    Transformer* t = transformers.back().get();
    t->set_attention_options(kernel_attention_options(attention));
    if (kv == "e4m3") {
      if (Status st = t->set_kv_cache_e4m3(unit_scales, unit_scales); !st.ok()) return fail(st);
    } else if (kv == "e4m3-static") {
      if (Status st = t->set_kv_cache_e4m3(static_scales[i].first, static_scales[i].second); !st.ok()) return fail(st);
    }
    candidates.push_back(transformer_window_logits(t));
      }
  // The base: the float32 CPU reference, or the unquantized model on the GPU runtime (issue 27:
  // a reference that a large model's host cannot compute in float32 in reasonable time).
  Transformer base(model);
  WindowLogitsFn base_fn;
  std::string reference_name = "the CPU reference, float32";
  if (a.reference != "cpu") {
    GpuModelSource source;
    source.kind = GpuModelSource::Kind::kHost;
    source.weights = &model;
    const GpuPrecision precision = gpu_precision(a.reference == "f32" ? GpuPrecision::Kind::kF32 : GpuPrecision::Kind::kBF16);
    if (Status st = on_gpu.add(a, source, precision, nullptr, window, "the reference (" + a.reference + ")", &base_fn); !st.ok())
      return fail(Status(st.code(), "--reference " + a.reference + ": " + st.message()));
    reference_name = "the GPU runtime, " + a.reference + " weights";
  }
  options.max_tokens = a.max_tokens;
  // GPU candidates stay on this thread (a runtime is bound to the device this thread selected).
  options.threads = a.device == "cuda" ? 1 : cpu_threads(a.threads);
  options.scoring_threads = cpu_threads(a.threads);
  Progress progress(fmt::format("evaluating {} candidate(s) against the unquantized model", candidates.size()));
  options.progress = [&progress](int64_t done, int64_t total) { progress.update(done, total); };
  std::vector<EvalAccumulator> results;
  const auto evaluating = std::chrono::steady_clock::now();
  const Status evaluated = base_fn ? evaluate_windows(model.config, base_fn, candidates, sequences, options, &results)
                                   : evaluate_windows(&base, candidates, sequences, options, &results);
  if (!evaluated.ok()) return fail(evaluated);
  progress.finish();

  EvalReport report;
  const auto now = std::chrono::steady_clock::now();
  report.seconds = std::chrono::duration<double>(now - evaluating).count();
  report.total_seconds = std::chrono::duration<double>(now - started).count();
  report.model = description;
  report.data = data_name;
  report.reference = reference_name;
  report.context = options.context;
  report.moe = model.config.is_moe();
  report.fp8_fast_accum = a.device == "cuda" && a.fp8_fast_accum;
  report.labels = candidate_labels;
  report.kv_caches = candidate_kv;
  report.weight_errors = candidate_weight_errors;
  for (const auto& r : results) report.sums.push_back(r.summarize());
  report.memory = memory_text(a.gpu, a.device == "cuda" ? 1 : 0);
  return print_eval_report(a, report);
}

}  // namespace

void add_eval_command(CLI::App& app, std::vector<Command>* commands) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "compare quantized schemes / checkpoints with the unquantized model");
  cmd->add_option("--model", args->model, "llama2.c .bin, Hugging Face directory, or 'default'");
  cmd->add_option("--quantized", args->quantized, "quantized checkpoint directory (repeatable)");
  cmd->add_option("--scheme", args->schemes, "comma-separated schemes, or 'all' (default: fp8-dynamic)");
  add_recipe_flags(cmd, &args->flags, "evaluated instead of --scheme");
  add_eval_data_options(cmd, &args->data);
  cmd->add_option("--stats", args->stats, "calibration statistics; default: calibrate on other samples");
  cmd->add_option("--context", args->context, "window length (BOS included, when the model has one)")->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--max-tokens", args->max_tokens, "stop after this many scored tokens (0: no limit)")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
  cmd->add_flag("--json", args->json, "machine-readable output (every statistic, in the order given)");
  cmd->add_option("--threads", args->threads, "CPU threads (0: every core); models of a window run side by side")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--device", args->device, "where the quantized candidates run: cpu (reference) or cuda (GPU runtime)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--reference", args->reference,
                  "the unquantized model: cpu (float32 reference) or, with --device cuda, f32 / bf16 on the GPU runtime")
      ->check(CLI::IsMember({"cpu", "f32", "bf16"}));
  cmd->add_option("--gpu", args->gpu, "CUDA device ordinal (the first of --tp)");
  cmd->add_option("--tp", args->tp,
                  "GPUs each model is split over, with the model on the GPUs alone: --device cuda, --reference bf16\n"
                  "or f32 and --model a checkpoint directory or synthetic:NAME (the models then load, quantize and\n"
                  "run on the devices; an f32 reference and SmoothQuant / MSE schemes still pass through the host)")
      ->check(CLI::Range(1, 8));
  add_gpu_launch_flags(cmd, &args->launch);
  add_fp8_fast_accum_flag(cmd, &args->fp8_fast_accum);
  cmd->add_option("--attention", args->attention,
                  "comma-separated attention variants, each candidate run once per variant: float (CPU), bf16, "
                  "half-int8, int8, fp8 (the 8-bit kernels' arithmetic; on cuda the kernels themselves)");
  cmd->add_option("--kv-cache", args->kv_cache,
                  "comma-separated KV caches of the CPU reference, each candidate run once per cache: float (default), "
                  "e4m3 (unit scales, the engines' default), e4m3-static (a --quantized checkpoint's declared scales, "
                  "else per layer the calibrated absmax / 448, as quantize --kv-cache-scales writes them)");
  commands->push_back({cmd, [args] { return run(*args); }});
}

void add_schemes_command(CLI::App& app, std::vector<Command>* commands) {
  CLI::App* cmd = app.add_subcommand("schemes", "list the quantization schemes");
  commands->push_back({cmd, [] {
                         std::printf("%-20s %-19s %s\n", "scheme", "format", "what it quantizes, and how");
                         for (const Scheme& s : all_schemes())
                           std::printf("%-20s %-19s %s\n", s.name.c_str(), export_format_name(s.export_format),
                                       s.description.c_str());
                         return 0;
                       }});
}

}  // namespace llmq::cli
