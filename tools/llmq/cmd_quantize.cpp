// llmq quantize: write a quantized checkpoint (vLLM fp8 or compressed-tensors) from a model.
// A Hugging Face input is streamed tensor by tensor from its memory map.

#include <chrono>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "export_source.hpp"
#include "recipe_flags.hpp"
#include "llmq/export.hpp"
#include "llmq/model_io.hpp"
#include "llmq/tokenizer.hpp"

namespace llmq::cli {
namespace {

struct QuantizeArgs {
  std::string model = "default";  // an explicit --model "" is refused by load_model
  std::string scheme = kDefaultScheme;
  bool scheme_given = false;  // --scheme on the command line (it and --recipe exclude each other)
  RecipeFlags flags;           // --recipe, --smooth-alpha, --backoff
  std::string stats;
  std::string out;
  std::string keep_dtype = "bf16";
  std::string format = "auto";
  bool quantize_lm_head = false;
  bool kv_cache_scales = false;
  bool dry_run = false;
  bool force = false;
  bool resume = false;
  std::string nonfinite = "error";
  int64_t shard_mb = 4096;
  bool json = false;
};

int run(const QuantizeArgs& a) {
  const auto start = std::chrono::steady_clock::now();
  Scheme scheme;
  QuantRecipe recipe;
  const bool use_recipe = !a.flags.recipe.empty();
  if (use_recipe && a.scheme_given) return fail(invalid_argument("--recipe and --scheme: give one of them"));
  const bool unquantized = !use_recipe && a.scheme == "none";
  if (use_recipe) {
    if (Status st = load_recipe_flags(a.flags, &recipe); !st.ok()) return fail(st);
    if (a.quantize_lm_head) return fail(invalid_argument("--quantize-lm-head: with --recipe, name lm_head in a group"));
    scheme.name = "recipe " + a.flags.recipe;
  } else if (unquantized) {
    if (a.flags.smooth_alpha >= 0.0f || a.flags.backoff >= 0.0f)
      return fail(invalid_argument("--smooth-alpha / --backoff: --scheme none quantizes nothing"));
    scheme.name = "none";
    scheme.export_format = ExportFormat::kNone;
  } else if (Status st = find_scheme(a.scheme, &scheme); !st.ok()) {
    return fail(st);
  } else if (Status over = apply_overrides(scheme, a.flags.smooth_alpha, a.flags.backoff, &scheme); !over.ok()) {
    return fail(over);
  }
  CalibrationStats stats;
  if (!a.stats.empty())
    if (Status st = CalibrationStats::load(a.stats, &stats); !st.ok()) return fail(st);
  ExportOptions options;
  if (a.format != "auto") {
    ExportFormat f;
    if (Status st = parse_export_format(a.format, &f); !st.ok()) return fail(st);
    options.format = f;
  }
  options.dry_run = a.dry_run;
  options.unquantized = unquantized;
  options.overwrite = a.force;
  options.resume = a.resume;
  options.max_shard_bytes = a.shard_mb << 20;
  if (a.nonfinite == "error") options.nonfinite = NonFinitePolicy::kError;
  else if (a.nonfinite == "zero") options.nonfinite = NonFinitePolicy::kZero;
  else return fail(invalid_argument("--nonfinite: '" + a.nonfinite + "' is not error or zero"));
  options.quantize.quantize_lm_head = a.quantize_lm_head;
  const auto keep = parse_dtype(a.keep_dtype);
  if (!keep) return fail(invalid_argument("--keep-dtype: unknown dtype '" + a.keep_dtype + "'"));
  options.keep_dtype = *keep;
  options.kv_cache_scales = a.kv_cache_scales;

  // What the output must never be, be inside or hold: export_quantized decides (output_dir.hpp),
  // with the Hugging Face directory it reads added by itself.
  options.inputs = {a.model, a.stats, Tokenizer::find(a.model), a.flags.recipe};

  // A Hugging Face directory streams from its memory map; anything else is loaded first.
  std::error_code ec;
  ModelWeights model;
  if (!std::filesystem::is_directory(a.model, ec))
    if (Status st = load_model(a.model, &model); !st.ok()) return fail(st);
  std::unique_ptr<WeightSource> source;
  if (Status st = export_weight_source(a.model, model, &source, &options.side_files); !st.ok()) return fail(st);
  ExportSummary summary;
  {
    Progress progress("quantizing and writing " + a.out);
    options.progress = [&progress](int64_t done, int64_t total) { progress.update(done, total); };
    const CalibrationStats* given = a.stats.empty() ? nullptr : &stats;
    if (Status st = use_recipe ? export_quantized(*source, recipe, given, a.out, options, &summary)
                               : export_quantized(*source, scheme, given, a.out, options, &summary);
        !st.ok())
      return fail(st);
    progress.finish();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The format written: the quant_method of the quantization_config (a recipe's depends on it).
  const nlohmann::ordered_json written = nlohmann::ordered_json::parse(summary.quantization_config, nullptr, false);
  const std::string format = written.is_object() && written.contains("quant_method") && written["quant_method"].is_string()
                                 ? written["quant_method"].get<std::string>()
                                 : std::string(export_format_name(options.format ? *options.format : scheme.export_format));
  if (a.json) {
    nlohmann::ordered_json j;
    j["out"] = a.out;
    j["written"] = !a.dry_run;
    j["scheme"] = scheme.name;
    j["format"] = format;
    if (use_recipe) j["recipe"] = nlohmann::ordered_json::parse(recipe_to_json(recipe));
    j["tensors"] = summary.tensors;
    j["quantized_linears"] = summary.quantized_linears;
    j["bytes"] = summary.bytes;
    j["shards"] = summary.shards;
    j["reused_shards"] = summary.reused_shards;
    j["nonfinite_replaced"] = summary.nonfinite_replaced;
    j["seconds"] = seconds;
    j["peak_rss_bytes"] = peak_rss_bytes();
    if (!unquantized) j["quantization_config"] = nlohmann::ordered_json::parse(summary.quantization_config, nullptr, false);
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s %s: %s, %s format; %lld tensors (%lld linear layers quantized), %.2f MB in %lld shard%s\n",
              a.dry_run ? "would write" : "wrote", a.out.c_str(), scheme.name.c_str(), format.c_str(),
              static_cast<long long>(summary.tensors), static_cast<long long>(summary.quantized_linears),
              static_cast<double>(summary.bytes) / 1e6, static_cast<long long>(summary.shards),
              summary.shards == 1 ? "" : "s");
  if (a.resume) std::printf("resumed: %lld of %lld shard(s) kept from the interrupted run\n",
                            static_cast<long long>(summary.reused_shards), static_cast<long long>(summary.shards));
  if (summary.nonfinite_replaced > 0)
    std::printf("nonfinite: %lld NaN/Inf weight values written as 0 (--nonfinite zero)\n",
                static_cast<long long>(summary.nonfinite_replaced));
  std::printf("time: %.2f s, peak memory %.1f MB\n", seconds, static_cast<double>(peak_rss_bytes()) / 1e6);
  if (!a.dry_run && !unquantized)
    std::printf("next: llmq eval --model %s --quantized %s    (its accuracy against the unquantized model)\n"
                "      llmq run --device cuda --model %s --prompt \"...\"    (run it on the GPU)\n",
                a.model.c_str(), a.out.c_str(), a.out.c_str());
  return 0;
}

}  // namespace

void add_quantize_command(CLI::App& app, std::vector<Command>* commands) {
  auto args = std::make_shared<QuantizeArgs>();
  CLI::App* cmd = app.add_subcommand("quantize", "write a quantized checkpoint that vLLM / transformers load");
  cmd->add_option("--model", args->model, "llama2.c .bin, Hugging Face directory, or 'default'");
  cmd->add_option("--scheme", args->scheme, "quantization scheme (llmq schemes lists them); 'none' writes an unquantized checkpoint");
  add_recipe_flags(cmd, &args->flags, "instead of --scheme");
  cmd->add_option("--stats", args->stats, "calibration statistics (static schemes, SmoothQuant)");
  cmd->add_option("-o,--out", args->out,
                  "output directory (staged in <out>.llmq-partial, then swapped into place). Never an input,\n"
                  "inside one or holding one; an existing path is replaced only when it is an llmq output\n"
                  "directory (it holds the .llmq-output marker) and --force is given")->required();
  cmd->add_option("--keep-dtype", args->keep_dtype, "dtype of tensors not quantized: bf16, f16 or f32");
  cmd->add_option("--format", args->format,
                  "auto (the scheme's own), compressed-tensors or fp8 (each named by the quant_method it writes).\n"
                  "Who loads what:\n"
                  "compressed-tensors (every scheme but fp8-block: per-tensor / per-channel weights, per-token /\n"
                  "  per-tensor activations): vLLM, SGLang; transformers with the compressed-tensors package\n"
                  "  (without it transformers refuses to load it: ImportError).\n"
                  "fp8 (fp8-block: 128x128 weight blocks, weight_scale_inv): vLLM, SGLang, transformers\n"
                  "  (FineGrainedFP8). Per-tensor weights are refused in it (transformers would read them as\n"
                  "  blocks), as are weights not a whole number of 128x128 blocks (engines disagree on edges).");
  cmd->add_flag("--quantize-lm-head", args->quantize_lm_head, "quantize lm_head too (kept by default)");
  cmd->add_flag("--kv-cache-scales", args->kv_cache_scales,
                "write static FP8 KV-cache scales from --stats (its KV absmax / 448 per layer: compressed-tensors' "
                "kv_cache_scheme with each attention's k_scale and v_scale, as vLLM reads them)");
  cmd->add_flag("--dry-run", args->dry_run, "plan and report; write nothing");
  cmd->add_flag("--json", args->json, "print the summary as JSON (with the quantization_config written)");
  cmd->add_flag("--force", args->force,
                "replace a previous llmq output directory (never an input, a symbolic link or anything llmq did "
                "not write)");
  cmd->add_flag("--resume", args->resume,
                "keep the shards an interrupted run (same inputs and options) finished in <out>.llmq-partial");
  cmd->add_option("--nonfinite", args->nonfinite,
                  "NaN / Inf in a weight: error (refuse, naming the tensor; the default) or zero (write them as 0)")
      ->check(CLI::IsMember({"error", "zero"}));
  cmd->add_option("--shard-mb", args->shard_mb, "largest shard in MiB (a larger tensor gets a shard of its own)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  commands->push_back({cmd, [args, cmd] {
                         args->scheme_given = cmd->count("--scheme") > 0;
                         return run(*args);
                       }});
}

}  // namespace llmq::cli
