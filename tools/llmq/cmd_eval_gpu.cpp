// `llmq eval` with the model on the GPUs alone (eval_command.hpp): for models the host cannot hold
// or compute in float32 (Llama-3-8B and 70B shapes). The reference (BF16 or F32) and every candidate
// are loaded by GpuModel::load over the same --tp GPUs: a checkpoint directory streams from its
// memory map, synthetic:NAME is generated there, dynamic schemes are quantized on the device (the
// codes equal the CPU's), static-activation ones too with statistics (--stats, else calibrated here
// on the reference), a --quantized directory runs as stored. What still goes through the host: an F32
// reference and SmoothQuant / MSE schemes (GpuModel::load reads the float model there). Every window is one prefill on each; the metrics are
// evaluate_windows', as on the host route.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>

#include "engine_setup.hpp"
#include "eval_command.hpp"
#include "llmq/device.hpp"
#include "llmq/evaluate.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/model_io.hpp"
#include "llmq/tensor_parallel.hpp"

namespace llmq::cli {
namespace {

// Sequences per generate call when the evaluation text is sampled on the reference.
constexpr int64_t kSampleBatch = 64;

}  // namespace

Status GpuWindowModels::add(const EvalArgs& a, const GpuModelSource& source, const GpuPrecision& precision,
                            const CalibrationStats* stats, const GpuRuntimeOptions& options, const std::string& what,
                            WindowLogitsFn* out) {
  TensorParallelLoadOptions lo;
  lo.group = apply_gpu_launch_flags(a.launch);
  lo.stats = stats;
  std::unique_ptr<TensorParallelRuntime> rt;
  if (Status st = load_on_gpus(a.tp, a.gpu, source, precision, what, lo, &rt); !st.ok())
    return Status(st.code(), what + ": " + st.message());
  LLMQ_RETURN_IF_ERROR(rt->start(options));
  TensorParallelRuntime* raw = rt.get();
  runtimes.push_back(std::move(rt));
  *out = [raw](const std::vector<int32_t>& tokens, std::vector<float>* logits) {
    raw->reset();
    return raw->prefill({tokens}, true, logits);
  };
  return {};
}

bool eval_on_gpus_only(const EvalArgs& a) {
  if (a.device != "cuda" || a.reference == "cpu" || !a.flags.recipe.empty()) return false;
  if (a.model.rfind("synthetic:", 0) == 0) return true;
  std::error_code ec;
  return std::filesystem::is_directory(a.model, ec);
}

int run_eval_on_gpus(const EvalArgs& a) {
  const auto started = std::chrono::steady_clock::now();
  for (const std::string& k : split_commas(a.kv_cache))
    if (k != "float")
      return fail(invalid_argument("--kv-cache " + k + ": the CPU reference's cache (--device cpu); on the GPU, llmq run "
                                   "/ bench / serve --kv-cache e4m3"));
  std::vector<Scheme> schemes;
  if (Status st = eval_schemes(a, !a.quantized.empty(), &schemes); !st.ok()) return fail(st);
  CalibrationStats stats;
  bool need_stats = false;
  for (const Scheme& s : schemes) need_stats = need_stats || s.needs_statistics();
  if (!a.stats.empty())
    if (Status st = CalibrationStats::load(a.stats, &stats); !st.ok()) return fail(st);
  std::vector<AttentionVariant> attentions;
  for (const std::string& name : split_commas(a.attention)) {
    AttentionVariant v;
    if (Status st = parse_attention_variant(name, &v); !st.ok()) return fail(invalid_argument("--attention: " + st.message()));
    if (v == AttentionVariant::kFloat)
      return fail(invalid_argument("--attention float: CPU only (--device cpu); the GPU runtime's are bf16, half-int8, int8, fp8"));
    attentions.push_back(v);
  }
  const bool per_attention = !attentions.empty();
  if (!per_attention) attentions.push_back(AttentionVariant::kBf16);

  ModelWeights shape_only;  // the config (and, for a llama2.c file, never reached: not this route)
  GpuModelSource source;
  if (Status st = model_shape(a.model, /*seed=*/1, &source, &shape_only, &shape_only.config); !st.ok()) return fail(st);
  if (!stats.linears.empty())
    if (Status st = stats.check_matches(shape_only.config); !st.ok()) return fail(st);
  const ModelConfig& config = shape_only.config;
  const int64_t context = std::min(a.context, config.max_seq_len);
  const int64_t sample_length = std::min(a.data.length, config.max_seq_len - 1);
  // Synthetic weights take fixed static scales (8/448, GpuModel::synthetic): statistics would not reach them.
  if (need_stats && source.kind == GpuModelSource::Kind::kSynthetic)
    return fail(invalid_argument("--scheme: a calibrated scheme on synthetic weights (their static scales are fixed, not "
                                 "calibrated); evaluate it on a checkpoint (llmq make-checkpoint writes one)"));
  // Without --stats a calibrated scheme is calibrated here, on the reference, on other text than the
  // evaluation's (as the host route does: 32 sampled sequences, from seed 1000).
  const bool calibrate_here = need_stats && a.stats.empty();
  const int64_t calibration_length = std::min<int64_t>(128, config.max_seq_len - 1);
  const bool samples = a.data.data.empty() || calibrate_here;
  if (samples && config.text_start_token() < 0)
    return fail(invalid_argument(std::string(a.data.data.empty() ? "sampling evaluation text" : "--stats: sampling calibration text") +
                                 " from the model: its config names neither bos_token_id nor eos_token_id to start from; "
                                 "give the text (--data) and the statistics (--stats)"));
  GpuPrecision reference_precision;
  if (Status st = parse_gpu_precision(a.reference, &reference_precision); !st.ok()) return fail(st);
  // The arguments above are checked first; then a machine without a GPU is told so, before any work.
  CudaDeviceInfo device;
  if (Status st = query_cuda_device(a.gpu, &device); !st.ok()) return fail(st);

  GpuWindowModels devices;
  // The reference first: it samples the evaluation text when no --data is given, and the
  // calibration text when statistics are needed and not given.
  // Its runtime is sized for sampling first (then started again for one window at a time).
  WindowLogitsFn base_fn;
  GpuRuntimeOptions window;
  window.max_context = context;
  window.max_step_tokens = context;
  window.cuda_graphs = false;  // prefill only
  window.gemm_tile_search_max_m = a.launch.gemm_tile_search;
  {
    GpuRuntimeOptions o = window;
    if (samples) {
      o.max_context = std::max(a.data.data.empty() ? sample_length + 1 : int64_t{0}, calibration_length + 1);
      o.max_context = std::max(o.max_context, calibrate_here ? context : int64_t{0});
      o.max_step_tokens = o.max_context;
      o.max_batch = kSampleBatch;
      o.cuda_graphs = true;  // sampling's decode steps
    }
    if (Status st = devices.add(a, source, reference_precision, nullptr, o, "the reference (" + a.reference + ")", &base_fn);
        !st.ok())
      return fail(Status(st.code(), "--reference " + a.reference + ": " + st.message()));
  }
  std::vector<std::vector<int32_t>> sequences;
  std::string data_name;
  if (a.data.data.empty()) {
    SlowStep step("sampling evaluation text from the reference on the GPU");
    const int32_t start = config.text_start_token();
    if (Status st = sample_sequences_on_gpu(*devices.runtimes[0], kSampleBatch, start, a.data.samples, sample_length,
                                            a.data.seed, &sequences);
        !st.ok())
      return fail(st);
    // A model without BOS keeps its start token first (context, not scored), as on the host route.
    if (config.bos_token < 0)
      for (auto& s : sequences) s.insert(s.begin(), start);
    step.done();
    data_name = fmt::format("{} sequences sampled from the {} reference on the GPU (T=1, top-p 0.9, seeds {}..)",
                            a.data.samples, a.reference, a.data.seed);
  } else if (Status st = load_eval_data(a.model, shape_only, a.data, &sequences, &data_name); !st.ok()) {
    return fail(st);
  }

  if (calibrate_here) {
    const int32_t start = config.text_start_token();
    SlowStep step("calibrating on the reference (32 sequences it samples, seed 1000)");
    std::vector<std::vector<int32_t>> text;
    TensorParallelRuntime& reference = *devices.runtimes[0];
    if (Status st = sample_sequences_on_gpu(reference, kSampleBatch, start, 32, calibration_length, 1000, &text); !st.ok())
      return fail(st);
    for (auto& t : text) t.insert(t.begin(), start);  // from the token it was sampled after, as llmq calibrate feeds it
    if (Status st = calibrate_on_gpu(reference, text, std::min(context, reference.runtime(0).options().max_context), &stats);
        !st.ok())
      return fail(Status(st.code(), "calibrating on the reference: " + st.message()));
    step.done();
    std::fprintf(stderr, "llmq: no --stats: calibrated on the %s reference, 32 sequences sampled on the GPU (seed 1000), "
                 "%lld tokens\n", a.reference.c_str(), static_cast<long long>(stats.tokens));
  }
  // The reference now evaluates one window at a time: its sampling-sized cache goes.
  if (samples)
    if (Status st = devices.runtimes[0]->start(window); !st.ok()) return fail(st);

  EvalReport report;
  std::vector<WindowLogitsFn> candidates;
  GpuRuntimeOptions o;
  o.max_context = context;
  o.max_step_tokens = context;
  o.fp8_fast_accumulation = a.fp8_fast_accum;
  o.gemm_tile_search_max_m = a.launch.gemm_tile_search;
  o.cuda_graphs = false;  // prefill only
  for (AttentionVariant attention : attentions) {
    o.prefill_attention = attention;
    const std::string with = per_attention ? std::string(" + ") + attention_variant_name(attention) + " attention" : "";
    for (const Scheme& s : schemes) {
      GpuPrecision p;
      p.kind = GpuPrecision::Kind::kScheme;
      p.scheme = s;  // with --smooth-alpha / --backoff applied
      candidates.emplace_back();
      if (Status st = devices.add(a, source, p, s.needs_statistics() ? &stats : nullptr, o, s.name, &candidates.back()); !st.ok())
        return fail(st);
      report.labels.push_back(s.name + with);
    }
    for (const std::string& dir : a.quantized) {
      GpuModelSource q;
      q.kind = GpuModelSource::Kind::kCheckpoint;
      q.dir = dir;
      candidates.emplace_back();
      if (Status st = devices.add(a, q, gpu_precision(GpuPrecision::Kind::kAsStored), nullptr, o, dir, &candidates.back());
          !st.ok())
        return fail(st);
      if (devices.runtimes.back()->config().vocab_size != config.vocab_size)
        return fail(invalid_argument("--quantized " + dir + ": a vocabulary of " +
                                     std::to_string(devices.runtimes.back()->config().vocab_size) + ", the model's is " +
                                     std::to_string(config.vocab_size)));
      report.labels.push_back(dir + " (" + devices.runtimes.back()->model(0).precision() + ")" + with);
    }
  }
  EvalOptions options;
  options.context = context;
  options.max_tokens = a.max_tokens;
  options.threads = 1;  // the models one after another (two splits' all-reduces must not interleave)
  options.scoring_threads = cpu_threads(a.threads);
  Progress progress(fmt::format("evaluating {} candidate(s) against the {} reference on the GPU", candidates.size(), a.reference));
  options.progress = [&progress](int64_t done, int64_t total) { progress.update(done, total); };
  std::vector<EvalAccumulator> results;
  const auto evaluating = std::chrono::steady_clock::now();
  if (Status st = evaluate_windows(config, base_fn, candidates, sequences, options, &results); !st.ok()) return fail(st);
  progress.finish();
  const auto now = std::chrono::steady_clock::now();
  report.seconds = std::chrono::duration<double>(now - evaluating).count();
  report.total_seconds = std::chrono::duration<double>(now - started).count();
  report.model = a.model;
  report.data = data_name;
  report.reference = "the GPU runtime, " + a.reference + " weights" +
                     (a.tp > 1 ? fmt::format(" (every model over {} GPUs)", a.tp) : std::string());
  report.context = context;
  report.moe = config.is_moe();
  report.fp8_fast_accum = a.fp8_fast_accum;
  report.kv_caches.assign(candidates.size(), "float");
  report.weight_errors.assign(candidates.size(), nullptr);
  for (const auto& r : results) report.sums.push_back(r.summarize());
  report.memory = memory_text(a.gpu, a.tp);
  return print_eval_report(a, report);
}

}  // namespace llmq::cli
