// llmq recipe: the cheapest per-layer mix of schemes that meets an accuracy budget (issue 27). Each
// layer's attention and MLP is quantized alone under each candidate scheme to measure its
// sensitivity; a chain of assignments from cheapest to everything kept, merged by cost with one
// uniform assignment per scheme, is walked in order, each point a full evaluation, and the first
// that meets the budget is written as a mixed checkpoint (just that scheme's when it is uniform)
// with its recipe.json, then reloaded and evaluated afresh beside every uniform scheme.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>

#include "commands.hpp"
#include "eval_data.hpp"
#include "export_source.hpp"
#include "llmq/atomic_io.hpp"
#include "llmq/evaluate.hpp"
#include "llmq/export.hpp"
#include "llmq/model_io.hpp"
#include "llmq/output_dir.hpp"
#include "llmq/quant_recipe.hpp"
#include "llmq/quant_report.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/device.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/recipe_search.hpp"
#include "llmq/tokenizer.hpp"
#include "llmq/version.hpp"
#include "recipe_output.hpp"

namespace llmq::cli {
namespace {

// Schemes whose weights have the same bytes (per-channel 8-bit): the bytes model cannot tell them
// apart, so each unit takes the most accurate of them. None needs calibration statistics.
constexpr const char* kDefaultRecipeSchemes = "fp8-dynamic,int8-w8a8,fp8-weight-only";

struct RecipeArgs {
  std::string model = "default";  // an explicit --model "" is refused by load_model
  std::string budget;
  std::string objective = "speed";
  std::string schemes = kDefaultRecipeSchemes;
  std::string stats;
  EvalDataArgs data;
  std::string out;
  std::string report;
  int64_t context = 256;
  int64_t max_tokens = 0;
  bool quantize_lm_head = false;
  std::string keep_dtype = "bf16";
  bool force = false;
  bool json = false;
  int threads = 0;
  std::string device = "cpu";  // cuda: the final table's decode times measured on GPU `gpu`
  int gpu = 0;
  bool gpu_given = false;
};

// Models evaluated against the float model on the same windows; a null model is the float model.
class ModelEvaluator {
 public:
  ModelEvaluator(const ModelWeights& model, const std::vector<std::vector<int32_t>>& sequences, EvalOptions options)
      : model_(model), base_(model), sequences_(sequences), options_(std::move(options)) {}

  Status run(const std::vector<const QuantizedModel*>& models, std::vector<EvalAccumulator::Summary>* out) {
    std::vector<std::unique_ptr<QuantizedLinearBackend>> backends;
    std::vector<std::unique_ptr<Transformer>> transformers;
    std::vector<Transformer*> candidates;
    for (const QuantizedModel* m : models) {
      if (m == nullptr) {
        transformers.push_back(std::make_unique<Transformer>(model_));
      } else {
        backends.push_back(std::make_unique<QuantizedLinearBackend>(*m));
        transformers.push_back(std::make_unique<Transformer>(m->weights, backends.back().get()));
      }
      candidates.push_back(transformers.back().get());
    }
    std::vector<EvalAccumulator> results;
    LLMQ_RETURN_IF_ERROR(evaluate(&base_, candidates, sequences_, options_, &results));
    out->clear();
    for (const EvalAccumulator& r : results) out->push_back(r.summarize());
    return {};
  }

 private:
  const ModelWeights& model_;
  Transformer base_;
  const std::vector<std::vector<int32_t>>& sequences_;
  EvalOptions options_;
};

// The markdown summary goes beside the HTML: report.html -> report.md (report -> report.md).
std::string markdown_path(const std::string& html) {
  const std::string ext = ".html";
  if (html.size() > ext.size() && html.compare(html.size() - ext.size(), ext.size(), ext) == 0)
    return html.substr(0, html.size() - ext.size()) + ".md";
  return html + ".md";
}

// Bytes and modelled decode time of every linear layer under an assignment (units as assigned;
// the linears outside every unit, lm_head and routers, in BF16).
Status assignment_cost(const ModelConfig& config, const RecipeRun& run, const std::vector<Scheme>& schemes,
                       const RecipeAssignment& a, int64_t* bytes, double* seconds) {
  *bytes = 0;
  *seconds = 0.0;
  RecipeUnit rest{"rest", RecipeUnitKind::kLmHead, -1, {}, {}};
  std::vector<std::string> unit_modules;
  for (const RecipeUnit& u : run.units) unit_modules.insert(unit_modules.end(), u.modules.begin(), u.modules.end());
  for (const LinearId& id : linear_ids(config))
    if (std::find(unit_modules.begin(), unit_modules.end(), id.hf_name(config)) == unit_modules.end())
      rest.linears.push_back(id);
  UnitCost c;
  LLMQ_RETURN_IF_ERROR(unit_cost(config, rest, nullptr, &c));
  *bytes += c.bytes;
  *seconds += c.decode_seconds;
  for (size_t u = 0; u < run.units.size(); ++u) {
    LLMQ_RETURN_IF_ERROR(
        unit_cost(config, run.units[u], a[u] == kKeptOption ? nullptr : &schemes[static_cast<size_t>(a[u])], &c));
    *bytes += c.bytes;
    *seconds += c.decode_seconds;
  }
  return {};
}

// --device cuda: a batch-1 decode step of every row of the final table and of the BF16 model on the
// GPU (gpu_decode_ms), each loaded as an engine would run it: a uniform scheme's model as quantized
// here, the checkpoint as written (the recipe's search row is the same assignment). A row the GPU
// cannot run (a scheme it lacks) keeps the bytes model's time and says why; the BF16 baseline and
// the device itself must work.
Status measure_on_gpu(const RecipeArgs& a, const ModelWeights& model, const std::vector<const QuantizedModel*>& uniform,
                      RecipeRun* run) {
  CudaDeviceInfo info;
  LLMQ_RETURN_IF_ERROR(query_cuda_device(a.gpu, &info));
  Progress progress("timing decode on GPU " + std::to_string(a.gpu));
  const int64_t total = static_cast<int64_t>(uniform.size()) + 2;
  int64_t done = 0;
  GpuModelSource s;
  auto time = [&](const GpuModelSource& source, RecipeCandidate* c) {
    double ms = -1.0;
    if (const Status st = gpu_decode_ms(source, gpu_precision(GpuPrecision::Kind::kAsStored), a.gpu, &ms); !st.ok()) {
      c->measured_ms = -1.0;
      c->measure_error = st.message();
    } else {
      c->measured_ms = ms;
    }
    progress.update(++done, total);
  };
  for (size_t i = 0; i < uniform.size(); ++i) {
    s.kind = GpuModelSource::Kind::kHostQuantized;
    s.quantized = uniform[i];
    time(s, &run->candidates[i]);
  }
  s = GpuModelSource();
  s.kind = GpuModelSource::Kind::kCheckpoint;
  s.dir = a.out;
  RecipeCandidate checkpoint;
  time(s, &checkpoint);
  for (RecipeCandidate& c : run->candidates)
    if (c.is_recipe || c.is_checkpoint) {
      c.measured_ms = checkpoint.measured_ms;
      c.measure_error = checkpoint.measure_error;
    }
  s = GpuModelSource();
  s.kind = GpuModelSource::Kind::kHost;
  s.weights = &model;
  LLMQ_RETURN_IF_ERROR(gpu_decode_ms(s, gpu_precision(GpuPrecision::Kind::kBF16), a.gpu, &run->kept_measured_ms));
  progress.finish();
  run->measured_on = fmt::format("{} (GPU {}), batch-1 decode step at 128 positions, median of 64, CUDA graphs", info.name,
                                 a.gpu);
  return {};
}

int run(const RecipeArgs& a) {
  RecipeRun run;
  if (a.device != "cpu" && a.device != "cuda") return fail(invalid_argument("--device: cpu or cuda, got " + a.device));
  if (Status st = check_gpu_option(a.gpu_given, a.device); !st.ok()) return fail(st);
  if (a.device == "cuda") {  // a machine without a GPU is told so before the search
    CudaDeviceInfo info;
    if (Status st = query_cuda_device(a.gpu, &info); !st.ok()) return fail(st);
  }
  run.model = a.model;
  if (Status st = parse_accuracy_budget(a.budget, &run.budget); !st.ok()) return fail(st);
  if (Status st = parse_recipe_objective(a.objective, &run.objective); !st.ok()) return fail(st);
  run.scheme_names = split_commas(a.schemes);
  if (run.scheme_names.empty()) return fail(invalid_argument("--schemes: no scheme named"));
  std::vector<Scheme> schemes(run.scheme_names.size());
  bool need_stats = !a.report.empty();  // the report draws each layer's activation outliers
  for (size_t i = 0; i < schemes.size(); ++i) {
    if (Status st = find_scheme(run.scheme_names[i], &schemes[i]); !st.ok())
      return fail(invalid_argument("--schemes: " + st.message()));
    for (size_t j = 0; j < i; ++j)
      if (run.scheme_names[j] == run.scheme_names[i])
        return fail(invalid_argument("--schemes: " + run.scheme_names[i] + " is named twice"));
    need_stats = need_stats || schemes[i].needs_statistics();
  }
  const auto keep = parse_dtype(a.keep_dtype);
  if (!keep) return fail(invalid_argument("--keep-dtype: unknown dtype '" + a.keep_dtype + "'"));

  // Every output is checked before the search spends minutes: never an input, never replacing
  // what llmq did not write (output_dir.hpp).
  const std::vector<std::string> inputs = {a.model, a.stats, a.data.data, Tokenizer::find(a.model)};
  OutputRules out_rules{OutputKind::kDirectory, "--out", "llmq recipe", inputs, a.force};
  if (Status st = check_output_path(a.out, out_rules); !st.ok()) return fail(st);
  OutputRules report_rules{OutputKind::kRawFile, "--report", "llmq recipe", inputs, a.force};
  if (!a.report.empty()) {
    run.report_html = a.report;
    run.report_markdown = markdown_path(a.report);
    for (const std::string& path : {run.report_html, run.report_markdown})
      if (Status st = check_output_path(path, report_rules); !st.ok()) return fail(st);
  }

  ModelWeights model;
  {
    SlowStep step("loading " + a.model);
    if (Status st = load_model(a.model, &model, &run.model_description); !st.ok()) return fail(st);
    step.done();
  }
  const ModelConfig& config = model.config;
  // Refused before the search, not after it: engines read one scheme for every expert of an MoE
  // model, so the mixed checkpoint the search ends in could not be written.
  if (config.is_moe())
    return fail(unsupported("--model " + a.model + ": an MoE model; its mixed checkpoint cannot be written (vLLM's "
                            "FusedMoE reads one scheme for every expert). llmq recipe takes dense models; "
                            "llmq eval --recipe evaluates a hand-written recipe for this one"));
  if (Status st = recipe_units(config, a.quantize_lm_head, &run.units); !st.ok())
    return fail(invalid_argument("--quantize-lm-head: " + st.message()));
  for (const LinearId& id : linear_ids(config))
    if (id.role == LinearRole::kRouter || (id.role == LinearRole::kLmHead && !a.quantize_lm_head))
      run.always_kept.push_back(id.hf_name(config));

  std::vector<std::vector<int32_t>> sequences;
  if (Status st = load_eval_data(a.model, model, a.data, &sequences, &run.data); !st.ok()) return fail(st);
  CalibrationStats stats;
  bool have_stats = false;
  if (Status st = eval_stats(model, a.stats, need_stats, a.context, &stats, &have_stats); !st.ok()) return fail(st);
  const CalibrationStats* stats_ptr = have_stats ? &stats : nullptr;
  run.stats = stats_ptr;

  RecipeSearchProblem problem;
  problem.scheme_names = run.scheme_names;
  for (const RecipeUnit& u : run.units) {
    problem.unit_names.push_back(u.name);
    std::vector<double> costs;
    for (const Scheme& s : schemes) {
      UnitCost c;
      if (Status st = unit_cost(config, u, &s, &c); !st.ok()) return fail(st);
      costs.push_back(c.value(run.objective));
    }
    UnitCost kept;
    if (Status st = unit_cost(config, u, nullptr, &kept); !st.ok()) return fail(st);
    problem.cost.push_back(costs);
    problem.kept_cost.push_back(kept.value(run.objective));
  }

  EvalOptions eval_options;
  eval_options.context = std::min(a.context, config.max_seq_len);
  eval_options.max_tokens = a.max_tokens;
  eval_options.threads = cpu_threads(a.threads);
  run.context = eval_options.context;
  ModelEvaluator evaluator(model, sequences, eval_options);
  // Each candidate of a batch is a quantized copy of the model: a batch per thread count keeps the
  // threads busy with that many copies in memory.
  RecipeSearchOptions search;
  search.budget = run.budget;
  search.batch = eval_options.threads;
  std::unique_ptr<Progress> progress;
  std::string stage;
  search.progress = [&](const std::string& s, int64_t done, int64_t total) {
    if (s != stage) {
      if (progress) progress->finish();
      stage = s;
      progress = std::make_unique<Progress>(s == "sensitivity" ? "measuring each unit alone under each scheme"
                                                               : "evaluating assignments, cheapest first");
    }
    progress->update(done, total);
  };
  auto evaluate_assignments = [&](const std::vector<RecipeAssignment>& batch,
                                  std::vector<EvalAccumulator::Summary>* out) -> Status {
    std::vector<std::unique_ptr<QuantizedModel>> owned;
    std::vector<const QuantizedModel*> models;
    for (const RecipeAssignment& assignment : batch) {
      QuantRecipe recipe;
      LLMQ_RETURN_IF_ERROR(recipe_from_assignment(run.units, run.scheme_names, assignment, &recipe));
      if (recipe.groups.empty()) {  // everything kept: the float model itself
        models.push_back(nullptr);
        continue;
      }
      owned.push_back(std::make_unique<QuantizedModel>());
      LLMQ_RETURN_IF_ERROR(quantize_model(model, recipe, stats_ptr, {}, owned.back().get()));
      models.push_back(owned.back().get());
    }
    return evaluator.run(models, out);
  };
  if (Status st = search_recipe(problem, evaluate_assignments, search, &run.search); !st.ok()) return fail(st);
  if (progress) progress->finish();
  const ChainPoint& chosen = run.search.points[static_cast<size_t>(run.search.chosen)];
  if (Status st = recipe_from_assignment(run.units, run.scheme_names, chosen.assignment, &run.recipe); !st.ok())
    return fail(st);
  if (run.recipe.groups.empty())
    return fail(invalid_argument("--budget '" + run.budget.text +
                                 "': only the unquantized model meets it (every unit kept); no checkpoint written"));

  // The checkpoint, with its recipe, in one transaction (staged, then swapped in).
  {
    std::unique_ptr<WeightSource> source;
    ExportOptions options;
    if (Status st = export_weight_source(a.model, model, &source, &options.side_files); !st.ok()) return fail(st);
    options.side_files.push_back({"recipe.json", recipe_to_json(run.recipe)});
    options.keep_dtype = *keep;
    options.overwrite = a.force;
    options.inputs = inputs;
    Progress writing("writing " + a.out);
    options.progress = [&writing](int64_t done, int64_t total) { writing.update(done, total); };
    ExportSummary summary;
    if (Status st = export_quantized(*source, run.recipe, stats_ptr, a.out, options, &summary); !st.ok())
      return fail(st);
    writing.finish();
    run.out_dir = a.out;
  }

  // Every uniform scheme and the written checkpoint, evaluated afresh on the same windows.
  std::vector<std::unique_ptr<QuantizedModel>> owned;
  std::vector<const QuantizedModel*> models;
  for (const Scheme& s : schemes) {
    owned.push_back(std::make_unique<QuantizedModel>());
    if (Status st = quantize_model(model, s, stats_ptr, {}, owned.back().get()); !st.ok()) return fail(st);
    models.push_back(owned.back().get());
  }
  owned.push_back(std::make_unique<QuantizedModel>());
  if (Status st = load_quantized_checkpoint(a.out, owned.back().get()); !st.ok()) return fail(st);
  models.push_back(owned.back().get());
  std::vector<EvalAccumulator::Summary> sums;
  {
    Progress evaluating(fmt::format("evaluating {} uniform scheme(s) and the written checkpoint", schemes.size()));
    if (Status st = evaluator.run(models, &sums); !st.ok()) return fail(st);
    evaluating.finish();
  }
  // Rows: each uniform scheme, the recipe as the search measured it, the checkpoint as written.
  std::vector<RecipeAssignment> row_assignments;
  for (size_t i = 0; i < schemes.size(); ++i) {
    run.candidates.push_back({run.scheme_names[i], sums[i], 0, 0.0, false, false});
    row_assignments.emplace_back(run.units.size(), static_cast<int>(i));
  }
  run.candidates.push_back({recipe_row_name(run), chosen.summary, 0, 0.0, true, false});
  run.candidates.push_back({"recipe checkpoint", sums.back(), 0, 0.0, false, true});
  row_assignments.push_back(chosen.assignment);
  row_assignments.push_back(chosen.assignment);
  for (size_t i = 0; i < run.candidates.size(); ++i)
    if (Status st = assignment_cost(config, run, schemes, row_assignments[i], &run.candidates[i].bytes,
                                    &run.candidates[i].decode_seconds);
        !st.ok())
      return fail(st);
  const RecipeAssignment all_kept(run.units.size(), kKeptOption);
  if (Status st = assignment_cost(config, run, schemes, all_kept, &run.kept_bytes, &run.kept_decode_seconds); !st.ok())
    return fail(st);
  if (a.device == "cuda")
    if (Status st = measure_on_gpu(a, model, std::vector<const QuantizedModel*>(models.begin(), models.begin() +
                                                                               static_cast<std::ptrdiff_t>(schemes.size())),
                                   &run);
        !st.ok())
      return fail(st);

  if (!a.report.empty()) {
    const QuantReport report = recipe_quant_report(run, today(), library_version());
    std::string html, markdown;
    if (Status st = render_quant_report_html(report, &html); !st.ok()) return fail(st);
    if (Status st = render_quant_report_markdown(report, &markdown); !st.ok()) return fail(st);
    if (Status st = write_output_file(run.report_html, html, report_rules); !st.ok()) return fail(st);
    if (Status st = write_output_file(run.report_markdown, markdown, report_rules); !st.ok()) return fail(st);
  }
  if (a.json) {
    std::printf("%s\n", recipe_json(run).dump(2).c_str());
    return 0;
  }
  std::printf("%s", recipe_text(run).c_str());
  std::printf("next: llmq eval --model %s --recipe %s/recipe.json    (the recipe, quantized afresh)\n"
              "      llmq eval --model %s --quantized %s    (the checkpoint as written)\n",
              a.model.c_str(), a.out.c_str(), a.model.c_str(), a.out.c_str());
  return 0;
}

}  // namespace

void add_recipe_command(CLI::App& app, std::vector<Command>* commands) {
  auto args = std::make_shared<RecipeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "recipe", "choose a scheme per layer (attention, MLP) that meets an accuracy budget at the least cost");
  cmd->add_option("--model", args->model, "llama2.c .bin, Hugging Face directory, or 'default'");
  cmd->add_option("--budget", args->budget,
                  "what the chosen model must keep, measured against the unquantized one on the evaluation data:\n"
                  "kl<=X (mean KL, nats per token), top1>=Y (top-1 agreement, a fraction) or ppl<=Rx (perplexity\n"
                  "ratio); several joined by commas must all hold (kl<=0.01,top1>=0.99)")
      ->required();
  cmd->add_option("--objective", args->objective,
                  "what to minimise: speed (a batch-1 decode step's modelled time: the bytes it reads over an H100's\n"
                  "bandwidth; MoE experts counted as routed) or size (every byte of the linear layers)")
      ->check(CLI::IsMember({"speed", "size"}));
  cmd->add_option("--schemes", args->schemes, "candidate schemes, comma-separated (llmq schemes lists them)");
  cmd->add_option("--stats", args->stats,
                  "calibration statistics (static schemes, SmoothQuant, the report's outliers); default: calibrate "
                  "on other samples when needed");
  add_eval_data_options(cmd, &args->data);
  cmd->add_option("--context", args->context, "evaluation window length (BOS included, when the model has one)")->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--max-tokens", args->max_tokens, "score at most this many tokens per evaluation (0: no limit)")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
  cmd->add_option("-o,--out", args->out,
                  "output directory: the mixed checkpoint and its recipe.json (staged, then swapped into place;\n"
                  "never an input; an existing llmq output is replaced only with --force)")
      ->required();
  cmd->add_option("--report", args->report,
                  "also write the report: this HTML file (self-contained, opens offline) and a Markdown summary\n"
                  "beside it (.md)");
  cmd->add_flag("--quantize-lm-head", args->quantize_lm_head, "let the search quantize lm_head too (kept by default)");
  cmd->add_option("--keep-dtype", args->keep_dtype, "dtype of what the checkpoint keeps: bf16, f16 or f32");
  cmd->add_flag("--force", args->force, "replace previous llmq outputs at --out and --report");
  cmd->add_flag("--json", args->json, "machine-readable output (sensitivities, the points walked, every candidate)");
  cmd->add_option("--threads", args->threads, "CPU threads (0: every core); that many models evaluated side by side")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--device", args->device,
                  "cpu (default): decode times from the bytes model; cuda: the final table's and the report's decode\n"
                  "times measured on the GPU (each uniform scheme, the written checkpoint, BF16); the search's costs\n"
                  "stay the bytes model's")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  add_gpu_ordinal_option(cmd, &args->gpu, &args->gpu_given);
  commands->push_back({cmd, [args] { return run(*args); }});
}

}  // namespace llmq::cli
