// llmq demo: the main job, end to end, on the built-in model (no download) in under a minute:
// quantize it under the recommended schemes, measure each against the unquantized model, time
// decode on the GPU when there is one, write the best scheme's checkpoint, and say what to run
// next on a real model. `scripts/run` with no arguments runs it.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>

#include "commands.hpp"
#include "eval_table.hpp"
#include "llmq/device.hpp"
#include "llmq/evaluate.hpp"
#include "llmq/export.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/model_io.hpp"
#include "llmq/quantized_model.hpp"

namespace llmq::cli {
namespace {

struct DemoArgs {
  std::string out = "llmq-demo";
  // What serving engines run today: vLLM's FP8 default, INT8 W8A8, DeepSeek's blocks, and one
  // calibrated (static) scheme to show calibration.
  std::string schemes = "fp8-dynamic,int8-w8a8,fp8-block,fp8-tensor-static";
  int64_t samples = 16;
  int threads = 0;
  std::string device = "auto";
  std::string llmq = "llmq";  // how the printed commands spell the binary
};

// One candidate: its scheme, its quantized weights, what it measured.
struct Candidate {
  Scheme scheme;
  QuantizedModel model;
  int64_t bytes = 0;          // checkpoint size
  double decode_ms = -1;      // GPU batch-1 decode step, < 0 when not measured
  std::string gpu_error;      // why it was not
};

// `text` broken at spaces into lines of at most `width` columns, the later ones indented.
std::string wrapped(const std::string& text, size_t width, size_t indent) {
  std::string out, line;
  std::stringstream words(text);
  std::string word;
  while (words >> word) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line = std::string(indent, ' ');
    } else if (!line.empty() && line.back() != ' ') {
      line += ' ';
    }
    line += word;
  }
  return out + line + "\n";
}

std::string megabytes(int64_t bytes) { return fmt::format("{:.2f} MB", static_cast<double>(bytes) / 1e6); }

// Bytes of the checkpoint `scheme` writes (a dry run: nothing is written).
Status checkpoint_bytes(const ModelWeights& model, const Scheme& scheme, bool unquantized,
                        const CalibrationStats* stats, int64_t* bytes) {
  ExportOptions o;
  o.dry_run = true;
  o.unquantized = unquantized;
  ExportSummary summary;
  LLMQ_RETURN_IF_ERROR(export_quantized(*memory_weight_source(model), scheme, stats, "llmq-demo-dry-run", o, &summary));
  *bytes = summary.bytes;
  return {};
}

// Whether the demo times decode on the GPU: --device cuda insists, auto asks the machine.
Status use_gpu(const std::string& device, bool* gpu, std::string* why_not) {
  *gpu = false;
  if (device == "cpu") {
    *why_not = "--device cpu";
    return {};
  }
  CudaDeviceInfo info;
  const Status st = query_cuda_device(0, &info);
  if (!st.ok()) {
    if (device == "cuda") return st;
    *why_not = st.message();
    return {};
  }
  *gpu = true;
  return {};
}

int run(const DemoArgs& a) {
  ModelWeights model;
  std::string description;
  if (Status st = load_model("default", &model, &description); !st.ok()) return fail(st);
  std::vector<Candidate> candidates;
  bool need_stats = false;
  for (const std::string& name : split_commas(a.schemes)) {
    Candidate c;
    if (Status st = find_scheme(name, &c.scheme); !st.ok()) return fail(st);
    need_stats = need_stats || c.scheme.needs_statistics();
    candidates.push_back(std::move(c));
  }
  if (candidates.empty()) return fail(invalid_argument("--schemes: no scheme given"));
  bool gpu = false;
  std::string no_gpu;
  if (Status st = use_gpu(a.device, &gpu, &no_gpu); !st.ok()) return fail(st);
  std::printf("llmq demo: %s\n", description.c_str());
  std::printf("  %lld layers, hidden size %lld, vocabulary %lld; every linear layer is quantized, lm_head kept\n\n",
              static_cast<long long>(model.config.n_layers), static_cast<long long>(model.config.dim),
              static_cast<long long>(model.config.vocab_size));
  std::fflush(stdout);

  // Calibration (static schemes) on other samples than the evaluation's, as the FP8 paper advises.
  CalibrationStats stats;
  if (need_stats) {
    if (Status st = calibrate_on_samples(model, 16, 128, 256, &stats); !st.ok()) return fail(st);
  }
  int64_t bf16_bytes = 0;
  {
    Scheme none;
    none.name = "none";
    none.export_format = ExportFormat::kNone;
    if (Status st = checkpoint_bytes(model, none, true, nullptr, &bf16_bytes); !st.ok()) return fail(st);
  }
  for (Candidate& c : candidates) {
    const CalibrationStats* s = c.scheme.needs_statistics() ? &stats : nullptr;
    if (Status st = quantize_model(model, c.scheme, s, {}, &c.model); !st.ok()) return fail(st);
    if (c.scheme.export_format == ExportFormat::kNone) continue;  // no checkpoint format: no size
    if (Status st = checkpoint_bytes(model, c.scheme, false, s, &c.bytes); !st.ok()) return fail(st);
  }

  // Accuracy: the float32 model against each quantized one, on the model's own samples.
  std::vector<std::vector<int32_t>> data;
  if (Status st = sample_token_sequences(model, a.samples, 128, 1, &data); !st.ok()) return fail(st);
  Transformer base(model);
  std::vector<std::unique_ptr<QuantizedLinearBackend>> backends;
  std::vector<std::unique_ptr<Transformer>> transformers;
  std::vector<Transformer*> views;
  for (const Candidate& c : candidates) {
    backends.push_back(std::make_unique<QuantizedLinearBackend>(c.model));
    transformers.push_back(std::make_unique<Transformer>(c.model.weights, backends.back().get()));
    views.push_back(transformers.back().get());
  }
  EvalOptions eval;
  eval.context = 256;
  eval.threads = cpu_threads(a.threads);
  Progress progress(fmt::format("measuring {} schemes against the unquantized model", candidates.size()));
  eval.progress = [&progress](int64_t done, int64_t total) { progress.update(done, total); };
  std::vector<EvalAccumulator> results;
  if (Status st = evaluate(&base, views, data, eval, &results); !st.ok()) return fail(st);
  progress.finish();

  // Speed: batch-1 decode on the GPU, the unquantized model in BF16 first.
  double bf16_ms = -1;
  if (gpu) {
    SlowStep step("timing decode on the GPU");
    GpuModelSource host;
    host.kind = GpuModelSource::Kind::kHost;
    host.weights = &model;
    // --device auto: a GPU that cannot run the model (too old, out of memory) drops the speed
    // column with the reason, and the demo goes on; --device cuda insists.
    if (Status st = gpu_decode_ms(host, gpu_precision(GpuPrecision::Kind::kBF16), 0, &bf16_ms); !st.ok()) {
      if (a.device == "cuda") return fail(st);
      gpu = false;
      no_gpu = "the GPU could not run the BF16 model: " + st.message();
    }
    for (Candidate& c : candidates) {
      if (!gpu) break;
      GpuModelSource source;
      source.kind = GpuModelSource::Kind::kHostQuantized;
      source.quantized = &c.model;
      const Status st = gpu_decode_ms(source, gpu_precision(GpuPrecision::Kind::kAsStored), 0, &c.decode_ms);
      if (!st.ok()) c.gpu_error = st.message();
    }
    step.done();
  }

  std::vector<EvalRow> rows;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    EvalRow row{c.scheme.name, results[i].summarize(), {c.bytes > 0 ? megabytes(c.bytes) : "-"}};
    if (gpu) row.extra.push_back(c.decode_ms > 0 ? fmt::format("{:.0f}", 1000.0 / c.decode_ms) : "failed");
    rows.push_back(std::move(row));
  }
  sort_by_kl(&rows);
  EvalTableOptions table;
  table.kl_p99 = false;
  table.delta_p = false;
  table.extra_headers = {"checkpoint"};
  table.extra_notes = {fmt::format("checkpoint the size of its safetensors (BF16, unquantized: {})", megabytes(bf16_bytes))};
  if (gpu) {
    table.extra_headers.push_back("tokens/s");
    table.extra_notes.push_back(fmt::format("tokens/s   batch-1 decode on GPU 0 at 128 positions of context (BF16: {:.0f})",
                                            1000.0 / bf16_ms));
  }
  std::printf("%lld tokens of the model's own samples, %lld sequences:\n\n",
              static_cast<long long>(results.empty() ? 0 : results[0].count()), static_cast<long long>(a.samples));
  std::printf("%s", eval_table_text(rows, table).c_str());
  for (const Candidate& c : candidates)
    if (!c.gpu_error.empty()) std::printf("%s on the GPU: %s\n", c.scheme.name.c_str(), c.gpu_error.c_str());
  if (!gpu) std::printf("(no decode speed: %s)\n", no_gpu.c_str());

  // The verdict, and the best scheme's checkpoint.
  const EvalRow& best = rows[0];
  const Candidate* chosen = nullptr;
  for (const Candidate& c : candidates)
    if (c.scheme.name == best.label) chosen = &c;
  std::string why = fmt::format("the lowest mean KL of the {} schemes ({:.4f}), {:.1f}% top-1 agreement, perplexity x{:.3f}",
                                candidates.size(), best.summary.kl.mean, 100 * best.summary.top1_agreement.mean,
                                best.summary.ppl_ratio);
  if (chosen->bytes > 0) why += fmt::format("; {:.2f}x smaller than BF16", static_cast<double>(bf16_bytes) / static_cast<double>(chosen->bytes));
  if (chosen->decode_ms > 0) why += fmt::format(", decode {:.2f}x BF16's speed", bf16_ms / chosen->decode_ms);
  std::printf("\n%s", wrapped("verdict: " + best.label + ": " + why + ".", 100, 9).c_str());
  std::printf("The built-in model is random with outlier channels: its numbers show the procedure, not what a\n"
              "trained model loses. Measure yours with the commands below.\n");
  if (chosen->scheme.export_format != ExportFormat::kNone) {
    ExportOptions o;
    o.overwrite = true;  // a previous demo's output (export_quantized replaces only llmq's own)
    ExportSummary summary;
    const Status st = export_quantized(*memory_weight_source(model), chosen->scheme,
                                       chosen->scheme.needs_statistics() ? &stats : nullptr, a.out, o, &summary);
    if (!st.ok()) return fail(st);
    std::printf("\n%s", wrapped(fmt::format("wrote {}: the {} checkpoint ({} format, {}), as vLLM and transformers load it",
                                            a.out, chosen->scheme.name, export_format_name(chosen->scheme.export_format),
                                            megabytes(summary.bytes)),
                                100, 2)
                            .c_str());
    std::printf("  %s run --model %s --ids -n 32 -t 0%s\n", a.llmq.c_str(), a.out.c_str(),
                gpu ? " --device cuda" : "");
  }
  const std::string& L = a.llmq;
  // The eval suggestion: the two best schemes here (the whole list makes a line too long to read).
  const std::string top_two = rows.size() > 1 ? rows[0].label + "," + rows[1].label : rows[0].label;
  std::printf(
      "\nnext, on a real model: a Hugging Face directory (config.json, *.safetensors, tokenizer.json), e.g.\n"
      "`hf download Qwen/Qwen2.5-0.5B --local-dir qwen` (docs/workflow.md lists what loads):\n"
      "  %s run --model qwen --prompt \"The capital of France is\" -n 64%s\n"
      "  %s eval --model qwen --scheme %s --data text.txt\n"
      "  %s quantize --model qwen --scheme %s -o qwen-%s\n",
      L.c_str(), gpu ? " --device cuda" : "", L.c_str(), top_two.c_str(), L.c_str(), best.label.c_str(),
      best.label.c_str());
  return 0;
}

}  // namespace

void add_demo_command(CLI::App& app, std::vector<Command>* commands) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "the main job on the built-in model: quantize, measure, time, write the best checkpoint (< 1 min)");
  cmd->add_option("-o,--out", args->out, "where the best scheme's checkpoint goes (a previous demo's is replaced)");
  cmd->add_option("--schemes", args->schemes, "comma-separated schemes to compare (llmq schemes lists them)");
  cmd->add_option("--samples", args->samples, "sequences of 128 tokens sampled from the model to measure on")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--threads", args->threads, "CPU threads (0: every core)")->check(CLI::Range(0, 4096));
  cmd->add_option("--device", args->device, "auto (time decode on the GPU when there is one), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--llmq", args->llmq, "how the suggested commands spell the llmq binary");
  commands->push_back({cmd, [args] { return run(*args); }});
}

}  // namespace llmq::cli
