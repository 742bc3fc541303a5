// export_quantized: stream a WeightSource into a quantized Hugging Face directory.
//
// Layout written (per quantized linear module M; the names and shapes come from the table in
// checkpoint_names.hpp, which the readers look them up through too):
//   "fp8" (128x128 blocks):  M.weight F8_E4M3 [N, K], M.weight_scale_inv F32 [N/128, K/128]
//   compressed-tensors:      M.weight F8_E4M3 or I8, M.weight_scale F32 [N, 1] (channel) or [1]
//                            (tensor), M.input_scale F32 [1] (static activations only); with
//                            kv_cache_scales, A.k_scale and A.v_scale F32 [1] per attention module A
// Only what every loader reads the same way is written (tests/test_loader_semantics.cpp reads each
// format back by each engine's rules):
// - Per-tensor FP8 is never written as quant_method "fp8": vLLM reads a scalar weight_scale there,
//   but transformers (FineGrainedFP8) takes every "fp8" checkpoint for 128x128 blocks and loads
//   such a model wrong without an error. compressed-tensors says "tensor" in so many words.
// - Blocks only for weights whose dimensions are multiples of 128: at a partial edge block vLLM and
//   DeepSeek use 128-row blocks and a shorter last one, while transformers' dequantizing loader
//   derives the block from the scale grid (172 rows in 2 scale rows: blocks of 86) or refuses.
// Everything else (embeddings, norms, lm_head, routers) is kept in options.keep_dtype (BF16).
// The directory is staged in <out>.llmq-partial and swapped into place at the end (output_dir.hpp):
// a killed run leaves no output or the old one; --resume keeps the shards it had finished. The
// output rules (never an input, replace only an llmq output) and every input the copy reads are
// checked before anything is created.
#include "llmq/export.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <nlohmann/json.hpp>
#include <set>

#include "llmq/atomic_io.hpp"
#include "llmq/nonfinite.hpp"
#include "llmq/output_dir.hpp"
#include "llmq/safetensors.hpp"
#include "llmq/scale.hpp"
#include "model/checkpoint/checkpoint_names.hpp"
#include "model/checkpoint/export_config.hpp"
#include "model/checkpoint/input_file.hpp"

namespace llmq {
namespace {

using export_detail::check_scheme_format;
using export_detail::is_block;

// One quantized module at a time: weight and scale tensors are filled from the same result.
class QuantizeCache {
 public:
  QuantizeCache(const WeightSource& src, const std::map<std::string, Scheme>& scheme_of,
                const std::map<std::string, std::vector<float>>& smooth, NonFinitePolicy policy, int64_t* replaced)
      : src_(src), scheme_of_(scheme_of), smooth_(smooth), policy_(policy), replaced_(replaced) {}
  Status get(const std::string& module, const QuantizedTensor** out) {
    if (module != module_) {
      Tensor w;
      LLMQ_RETURN_IF_ERROR(src_.read(module + ".weight", &w));
      LLMQ_RETURN_IF_ERROR(apply_nonfinite_policy(module + ".weight", policy_, &w, replaced_));
      if (const auto it = smooth_.find(module); it != smooth_.end()) scale_columns(&w, it->second);
      LLMQ_RETURN_IF_ERROR(quantize_weight(w, scheme_of_.at(module), &q_));
      module_ = module;
    }
    *out = &q_;
    return {};
  }
  static void scale_columns(Tensor* w, const std::vector<float>& s) {
    const int64_t rows = w->shape()[0], cols = w->shape()[1];
    float* p = w->data_as<float>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) p[r * cols + c] *= s[static_cast<size_t>(c)];
  }

 private:
  const WeightSource& src_;
  const std::map<std::string, Scheme>& scheme_of_;
  const std::map<std::string, std::vector<float>>& smooth_;
  NonFinitePolicy policy_;
  int64_t* replaced_;
  std::string module_;
  QuantizedTensor q_;
};

void store_float(const Tensor& t, DType dtype, uint8_t* dst) {
  const float* p = t.data_as<float>();
  const int64_t n = t.numel();
  if (dtype == DType::kF32) {
    std::memcpy(dst, p, static_cast<size_t>(n) * 4);
    return;
  }
  auto* d = reinterpret_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = dtype == DType::kBF16 ? float_to_bf16_bits(p[i]) : float_to_fp16_bits(p[i]);
}

// Bump when the bytes llmq writes for the same inputs change, so --resume never mixes versions.
// 2: the plan holds every quantized module's effective scheme (scheme_fingerprint).
constexpr const char* kPlanVersion = "llmq-export-plan-2";

// A float exactly (to_string keeps six decimals: 0.8 and 0.8000001 would read alike).
std::string float_bits(float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  return std::to_string(bits);
}

// Every field of a quantization spec that can change the bytes written. The quantization_config
// does not say them all (SmoothQuant's alpha, the backoff, the scale search), so --resume under
// another --smooth-alpha or --backoff would otherwise keep shards quantized under the old one.
std::string spec_fingerprint(const QuantSpec& q) {
  std::string t = std::string(dtype_name(q.format)) + " " + granularity_name(q.granularity) + " " +
                  std::to_string(q.block_rows) + "x" + std::to_string(q.block_cols) + " g" + std::to_string(q.group_size) +
                  " " + scale_method_name(q.method) + " b" + float_bits(q.backoff) + " m" + float_bits(q.min_scale) +
                  " r" + std::to_string(static_cast<int>(q.scale_rounding)) + " " + std::to_string(q.pow2_min_exp) + ".." +
                  std::to_string(q.pow2_max_exp) + " c" + std::to_string(static_cast<int>(q.candidates)) + " " +
                  std::to_string(q.grid_points) + " " + float_bits(q.grid_min) + " " + std::to_string(q.pow2_search_below) +
                  " s" + std::to_string(q.symmetric) + " src" + std::to_string(static_cast<int>(q.source)) + " rd" +
                  std::to_string(static_cast<int>(q.rounding)) + " seed" + std::to_string(q.seed);
  for (const float h : q.hardware_scales) t += " h" + float_bits(h);
  for (const float e : q.explicit_candidates) t += " e" + float_bits(e);
  return t;
}

std::string scheme_fingerprint(const Scheme& s) {
  return s.name + " w[" + spec_fingerprint(s.weight) + "] a" + std::to_string(s.quantize_activations) + "[" +
         spec_fingerprint(s.activation) + "] alpha" + float_bits(s.smooth_alpha) + " f" +
         std::to_string(static_cast<int>(s.export_format));
}

// The statistics as text: static scales and SmoothQuant factors are computed from them.
std::string stats_fingerprint(const CalibrationStats* stats) {
  if (stats == nullptr) return "no stats";
  Checksum sum;
  for (const auto& [name, l] : stats->linears) {
    sum.update(name.data(), static_cast<int64_t>(name.size()));
    const double scalars[] = {static_cast<double>(l.in_features), static_cast<double>(l.rows_seen), l.input_absmax,
                              l.weight_absmax};
    sum.update(scalars, sizeof scalars);
    sum.update(l.input_channel_absmax.data(), static_cast<int64_t>(l.input_channel_absmax.size() * sizeof(float)));
    sum.update(l.weight_channel_absmax.data(), static_cast<int64_t>(l.weight_channel_absmax.size() * sizeof(float)));
  }
  const KvCacheStats& kv = stats->kv_cache;  // --kv-cache-scales' values
  const int64_t kv_shape[] = {kv.layers, kv.kv_heads};
  sum.update(kv_shape, sizeof kv_shape);
  sum.update(kv.k_absmax.data(), static_cast<int64_t>(kv.k_absmax.size() * sizeof(float)));
  sum.update(kv.v_absmax.data(), static_cast<int64_t>(kv.v_absmax.size() * sizeof(float)));
  return checksum_hex(sum.digest());
}

// Files copied from a Hugging Face input directory beside the weights, when present.
constexpr const char* kSideFiles[] = {"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                                      "special_tokens_map.json", "generation_config.json"};

// The side files of `dir` that exist, each checked to be a regular file (a link to one is fine, as
// Hugging Face's cache makes them): a FIFO or device would hang the copy or never end.
Status find_side_files(const std::string& dir, std::vector<std::string>* files) {
  files->clear();
  if (dir.empty()) return {};
  for (const char* f : kSideFiles) {
    const std::string path = dir + "/" + f;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) continue;  // absent: nothing to copy
    std::string why;  // names what it is instead: a FIFO, a device, a directory, a link loop
    if (!is_input_file(path, &why))
      return invalid_argument("--model: " + (why.empty() ? path + ": cannot read" : why) +
                              "; it is a tokenizer file quantize copies into the output");
    files->push_back(f);
  }
  return {};
}

// options.side_files: plain names (nothing outside the output, no hidden file beside llmq's marker
// and manifest), none twice, none that export writes or copies itself.
Status check_side_files(const std::vector<ExportSideFile>& extra, const std::vector<std::string>& copied) {
  std::set<std::string> seen(copied.begin(), copied.end());
  for (const ExportSideFile& f : extra) {
    const std::string& n = f.name;
    const bool safetensors = n.size() >= 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0;
    if (n.empty() || n[0] == '.' || n.find('/') != std::string::npos || n.find('\0') != std::string::npos)
      return invalid_argument("side file '" + n + "': not a plain file name");
    if (n == "config.json" || n == "model.safetensors.index.json" || safetensors)
      return invalid_argument("side file '" + n + "': export writes that file itself");
    if (!seen.insert(n).second)
      return invalid_argument("side file '" + n + "': given twice, or also copied from the input directory");
  }
  return {};
}

// An error reading or checking the input while a shard is written names the input (the model
// directory when there is one), not the staging file being written.
Status input_error(const WeightSource& source, const Status& st) {
  const std::string dir = source.directory();
  if (dir.empty() || st.message().find(dir) != std::string::npos) return Status(st.code(), "--model: " + st.message());
  return Status(st.code(), "--model: " + dir + ": " + st.message());
}

// Every shard, the index, config.json and the tokenizer files (copied from the input directory, or
// options.side_files) into the staging directory, each fsynced; shards an earlier run finished
// under the same plan are kept as they are.
Status write_staged(const WeightSource& source, const std::vector<std::string>& side_files,
                    const std::vector<std::vector<SafetensorsWriteEntry>>& shards, int64_t total_bytes,
                    const std::string& config_text, const ExportOptions& options, OutputDir* dir) {
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  int64_t done = 0;  // tensor bytes produced so far, for options.progress
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = shard_file_name(i, shards.size());
    for (const auto& e : shards[i]) weight_map[e.name] = file;
    std::vector<SafetensorsWriteEntry> entries = shards[i];
    int64_t shard_bytes = 0;
    for (const auto& e : entries) shard_bytes += safetensors_entry_bytes(e);
    if (dir->reused(file)) {
      done += shard_bytes;
      continue;
    }
    if (options.progress) {
      // Each tensor reports its bytes once filled (row blocks as they go).
      for (auto& e : entries) {
        const int64_t bytes = safetensors_entry_bytes(e);
        const int64_t rows = e.shape.empty() ? 1 : e.shape[0];
        if (e.fill)
          e.fill = [fill = e.fill, bytes, &done, &options, total_bytes](uint8_t* dst) {
            LLMQ_RETURN_IF_ERROR(fill(dst));
            done += bytes;
            options.progress(done, total_bytes);
            return Status();
          };
        if (e.fill_rows)
          e.fill_rows = [fill = e.fill_rows, bytes, rows, &done, &options, total_bytes](int64_t begin, int64_t n,
                                                                                         uint8_t* dst) {
            LLMQ_RETURN_IF_ERROR(fill(begin, n, dst));
            done += rows > 0 ? bytes * n / rows : 0;
            options.progress(done, total_bytes);
            return Status();
          };
      }
    }
    SafetensorsWritten written;
    LLMQ_RETURN_IF_ERROR(write_safetensors(dir->path(file), entries, {{"format", "pt"}}, &written));
    LLMQ_RETURN_IF_ERROR(dir->mark_complete(file, written.bytes, written.checksum));
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    LLMQ_RETURN_IF_ERROR(write_file_atomic(dir->path("model.safetensors.index.json"), index.dump(2) + "\n"));
  }
  LLMQ_RETURN_IF_ERROR(write_file_atomic(dir->path("config.json"), config_text + "\n"));
  for (const std::string& f : side_files)
    LLMQ_RETURN_IF_ERROR(copy_file_synced(source.directory() + "/" + f, dir->path(f)));
  for (const ExportSideFile& f : options.side_files) LLMQ_RETURN_IF_ERROR(write_file_atomic(dir->path(f.name), f.content));
  return fsync_directory(dir->staging());
}

// What one export writes: each quantized module's scheme (kept modules are absent), and the one
// scheme whose quantization_config it is, or null for a mixed one (mixed_quantization_config).
struct ExportPlan {
  std::map<std::string, Scheme> scheme_of;
  const Scheme* uniform = nullptr;
};

// gpt-oss is written back only in its own fused (and MXFP4) layout, which the writer does not
// produce yet: per-expert tensors under gpt-oss's names would be read by no engine.
Status check_exportable_family(const ModelConfig& config) {
  if (config.model_type == "gpt_oss")
    return unsupported("export of a gpt_oss model is not implemented yet (its experts are stored fused); run it "
                       "quantized on load instead: `llmq run --device cuda --scheme <scheme>`");
  return {};
}

Status export_plan(const WeightSource& source, const ExportPlan& plan, const CalibrationStats* stats,
                   const std::string& out_dir, const ExportOptions& options, ExportSummary* summary);

}  // namespace

Status export_quantized(const WeightSource& source, const Scheme& scheme_in, const CalibrationStats* stats,
                        const std::string& out_dir, const ExportOptions& options, ExportSummary* summary) {
  LLMQ_RETURN_IF_ERROR(check_exportable_family(source.config()));
  Scheme scheme = scheme_in;
  if (options.format) scheme.export_format = *options.format;
  if (!options.unquantized) LLMQ_RETURN_IF_ERROR(check_scheme_format(scheme));
  if (!options.unquantized && scheme.needs_statistics() && stats == nullptr)
    return invalid_argument("--stats: scheme " + scheme.name + " needs calibration statistics; run llmq calibrate");
  ExportPlan plan;
  plan.uniform = &scheme;
  const ModelConfig& config = source.config();
  for (const LinearId& id : linear_ids(config)) {
    Linear probe;
    probe.id = id;
    if (!options.unquantized && linear_is_quantized(probe, options.quantize)) plan.scheme_of[id.hf_name(config)] = scheme;
  }
  return export_plan(source, plan, stats, out_dir, options, summary);
}

Status export_quantized(const WeightSource& source, const QuantRecipe& recipe, const CalibrationStats* stats,
                        const std::string& out_dir, const ExportOptions& options, ExportSummary* summary) {
  const ModelConfig& config = source.config();
  LLMQ_RETURN_IF_ERROR(check_exportable_family(config));
  if (options.unquantized) return invalid_argument("--recipe: an unquantized export quantizes nothing");
  if (options.quantize.quantize_lm_head || options.quantize.quantize_router)
    return invalid_argument("--recipe: lm_head and routers are quantized by naming them in a group, not by options");
  ResolvedRecipe r;
  LLMQ_RETURN_IF_ERROR(resolve_recipe(recipe, config, &r));
  if (r.scheme_of.empty()) return invalid_argument("--recipe: quantizes no linear layer of this model (every one is kept)");
  const bool mixed = r.mixed();
  if (mixed && options.format && *options.format != ExportFormat::kCompressedTensors)
    return unsupported(std::string("--format ") + export_format_name(*options.format) +
                       ": a recipe with several schemes is written as compressed-tensors only; the vLLM fp8 format "
                       "describes one quantization for the whole model (no per-module groups)");
  if (config.is_moe()) {
    // vLLM's FusedMoE takes one scheme for every MoE layer's experts, from a "Linear" target (or
    // from targets matched against "re:.*down_proj.*" as a string), and reads an expert-level
    // ignore list no better: a mixed or partly kept MoE checkpoint would be refused or misread.
    int64_t experts = 0, quantized = 0;
    for (const LinearId& id : linear_ids(config))
      if (id.expert >= 0) ++experts, quantized += r.scheme_of.count(id.hf_name(config)) > 0 ? 1 : 0;
    if (mixed || (quantized != 0 && quantized != experts))
      return unsupported("--recipe: an MoE model is exported with one scheme and every expert quantized (vLLM's "
                         "FusedMoE reads one scheme for all experts of the model and would refuse or misread a "
                         "mixed one); evaluate this recipe in memory (llmq eval --recipe) instead");
    // Every expert kept while attention is quantized: the config group would target "Linear" and
    // list each expert in ignore, but some vLLM versions choose FusedMoE's method from the
    // "Linear" group without consulting ignore, and would run the float experts as 8-bit.
    if (quantized == 0 && experts > 0)
      return unsupported("--recipe: an MoE model with every expert kept but other linears quantized is not exported "
                         "(some vLLM versions quantize FusedMoE from the \"Linear\" group without reading ignore); "
                         "quantize the experts too, or evaluate this recipe in memory (llmq eval --recipe)");
  }
  Scheme uniform;
  for (auto& [module, s] : r.scheme_of) {
    if (options.format) s.export_format = *options.format;
    if (mixed) s.export_format = ExportFormat::kCompressedTensors;
    if (Status st = check_scheme_format(s); !st.ok())
      return Status(st.code(), std::string("--recipe") + (mixed ? " (several schemes: each is written as "
                                                                  "compressed-tensors)" : "") + ": " + st.message());
    if (s.needs_statistics() && stats == nullptr)
      return invalid_argument("--stats: scheme " + s.name + " (" + module + ") needs calibration statistics; run llmq calibrate");
    uniform = s;
  }
  ExportPlan plan;
  plan.scheme_of = std::move(r.scheme_of);
  if (!mixed) plan.uniform = &uniform;
  return export_plan(source, plan, stats, out_dir, options, summary);
}

namespace {

Status export_plan(const WeightSource& source, const ExportPlan& plan, const CalibrationStats* stats,
                   const std::string& out_dir, const ExportOptions& options, ExportSummary* summary) {
  if (stats != nullptr) LLMQ_RETURN_IF_ERROR(stats->check_matches(source.config()));
  if (options.keep_dtype != DType::kBF16 && options.keep_dtype != DType::kF16 && options.keep_dtype != DType::kF32)
    return invalid_argument("--keep-dtype: must be bf16, f16 or f32");
  // The output rules and every input, before any work and before anything is created; a dry run
  // says whether the real run could write there (less the --force it may not have been given).
  OutputRules rules;
  rules.writer = "llmq quantize";
  rules.inputs = options.inputs;
  if (!source.directory().empty()) rules.inputs.push_back(source.directory());
  rules.overwrite = options.overwrite;
  OutputRules planned = rules;
  planned.overwrite = options.overwrite || options.dry_run;
  LLMQ_RETURN_IF_ERROR(check_output_path(out_dir, planned));
  std::vector<std::string> side_files;
  LLMQ_RETURN_IF_ERROR(find_side_files(source.directory(), &side_files));
  LLMQ_RETURN_IF_ERROR(check_side_files(options.side_files, side_files));
  // Set when reading or checking the input fails while the shards are written: such a failure
  // leaves no staging directory behind (a failure to write keeps finished shards for --resume).
  bool input_failed = false;

  const ModelConfig& config = source.config();
  std::vector<std::string> ignored;
  for (const LinearId& id : linear_ids(config)) {
    const bool q = plan.scheme_of.count(id.hf_name(config)) > 0;
    // A tied lm_head has no tensor of its own and stays the high-precision embedding: list it, or
    // a loader that quantizes every Linear not ignored (transformers' compressed-tensors) would
    // quantize it (llm-compressor lists it for tied models too).
    const bool tied_head = id.role == LinearRole::kLmHead && config.tie_embeddings;
    if (!q || tied_head) ignored.push_back(id.hf_name(config));
  }

  // SmoothQuant: factors per consumer module and per norm (divided into the norm's gain).
  std::map<std::string, std::vector<float>> smooth_of, norm_divisor;
  std::set<float> alphas;
  for (const auto& [module, s] : plan.scheme_of)
    if (s.smooth_alpha >= 0.0f) alphas.insert(s.smooth_alpha);
  for (const float alpha : alphas) {
    auto columns = [&source](const std::string& module, std::vector<float>* absmax) -> Status {
      Tensor w;
      LLMQ_RETURN_IF_ERROR(source.read(module + ".weight", &w));
      MatrixView m{w.data(), DType::kF32, w.shape()[0], w.shape()[1], w.shape()[1], 1};
      *absmax = column_absmax(m);
      return {};
    };
    std::vector<SmoothingGroup> groups;
    LLMQ_RETURN_IF_ERROR(smoothing_groups(config, *stats, alpha, columns, &groups));
    for (const SmoothingGroup& g : groups) {
      // Only the norms whose quantized consumers smooth with this alpha (resolve_recipe made
      // every quantized consumer of one norm agree; under one scheme that is every norm).
      bool smoothed = false;
      for (const std::string& m : g.members) {
        const auto it = plan.scheme_of.find(m);
        smoothed = smoothed || (it != plan.scheme_of.end() && it->second.smooth_alpha == alpha);
      }
      if (!smoothed) continue;
      norm_divisor[g.norm] = g.factors;
      for (const std::string& m : g.members) smooth_of[m] = g.factors;
    }
  }

  int64_t nonfinite_replaced = 0;
  QuantizeCache cache(source, plan.scheme_of, smooth_of, options.nonfinite, &nonfinite_replaced);
  // The codes (scales false) or scales of a quantized module, quantized once for both.
  auto from_cache = [&source, &cache, &input_failed](const std::string& module, bool scales) {
    return [&source, &cache, module, scales, &input_failed](uint8_t* dst) -> Status {
      const QuantizedTensor* q = nullptr;
      const Status st = cache.get(module, &q);
      input_failed |= !st.ok();
      if (!st.ok()) return input_error(source, st);
      const Tensor& t = scales ? q->scales.scales : q->data;
      std::memcpy(dst, t.data(), static_cast<size_t>(t.nbytes()));
      return {};
    };
  };
  std::vector<SafetensorsWriteEntry> entries;
  ExportSummary sum;
  for (const std::string& name : source.tensor_names()) {
    std::vector<int64_t> shape;
    LLMQ_RETURN_IF_ERROR(source.shape(name, &shape));
    const bool is_weight = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
    const std::string module = is_weight ? name.substr(0, name.size() - 7) : "";
    const auto quantized_as = is_weight ? plan.scheme_of.find(module) : plan.scheme_of.end();
    if (quantized_as != plan.scheme_of.end()) {
      const Scheme& scheme = quantized_as->second;
      const bool act_static = scheme.quantize_activations && scheme.activation.source == ScaleSource::kStatic;
      if (shape.size() != 2) return invalid_argument(source.directory() + ": " + name + " is not a matrix");
      const int64_t n = shape[0], k = shape[1];
      if (is_block(scheme.weight) && (n % scheme.weight.block_rows != 0 || k % scheme.weight.block_cols != 0))
        return invalid_argument(
            "--scheme " + scheme.name + ": " + name + " is [" + std::to_string(n) + ", " + std::to_string(k) +
            "], not a whole number of " + std::to_string(scheme.weight.block_rows) + "x" +
            std::to_string(scheme.weight.block_cols) +
            " blocks; engines disagree on partial edge blocks (vLLM and DeepSeek: full blocks and a shorter "
            "last one; transformers: the block derived from the scale grid), so llmq does not write them. "
            "Use a per-channel scheme (fp8-dynamic) for this model");
      ++sum.quantized_linears;
      // Names, dtypes and shapes from the table the readers use (checkpoint_names.hpp).
      std::vector<DiskTensor> disk;
      LLMQ_RETURN_IF_ERROR(written_linear_tensors(scheme.export_format, scheme.weight, act_static, module, n, k, &disk));
      entries.push_back({disk[0].name, disk[0].dtype, disk[0].shape, from_cache(module, false), nullptr});
      entries.push_back({disk[1].name, disk[1].dtype, disk[1].shape, from_cache(module, true), nullptr});
      if (act_static) {
        float s = 1.0f;
        if (scheme.activation.method != ScaleMethod::kUnit) {
          const LinearStats* st = stats->find(module);
          if (st == nullptr || st->rows_seen == 0)
            return invalid_argument("--stats: no activation statistics for " + module +
                                    " (a static scheme needs every quantized linear calibrated)");
          const auto sm = smooth_of.find(module);
          LLMQ_RETURN_IF_ERROR(static_activation_scale(*st, sm == smooth_of.end() ? nullptr : &sm->second,
                                                       scheme.activation, &s));
        }
        entries.push_back({disk[2].name, disk[2].dtype, disk[2].shape, [s](uint8_t* dst) -> Status {
                             std::memcpy(dst, &s, 4);
                             return {};
                           }, nullptr});
      }
      continue;
    }
    // Kept in high precision; norms of smoothed groups divided by s, smoothed unquantized
    // consumers (MoE routers) multiplied by s.
    const DType keep = options.keep_dtype;
    const std::vector<float>* divide = nullptr;
    const std::vector<float>* multiply = nullptr;
    if (const auto it = norm_divisor.find(name); it != norm_divisor.end()) divide = &it->second;
    if (is_weight)
      if (const auto it = smooth_of.find(module); it != smooth_of.end()) multiply = &it->second;
    const NonFinitePolicy policy = options.nonfinite;
    // Rows [r, r + n) of dimension 0, streamed: a 2 GB embedding never sits in memory whole.
    auto fill_rows = [&source, name, keep, divide, multiply, policy, &nonfinite_replaced, &input_failed](
                         int64_t r, int64_t n, uint8_t* dst) -> Status {
      Tensor t;
      Status st = source.read_rows(name, r, n, &t);
      if (st.ok()) st = apply_nonfinite_policy(name, policy, &t, &nonfinite_replaced, r);
      input_failed |= !st.ok();
      if (!st.ok()) return input_error(source, st);
      if (divide != nullptr) {  // a norm gain [dim]: element i is row r + i
        float* p = t.data_as<float>();
        for (int64_t i = 0; i < t.numel(); ++i) p[i] /= (*divide)[static_cast<size_t>(r + i)];
      }
      if (multiply != nullptr) QuantizeCache::scale_columns(&t, *multiply);
      store_float(t, keep, dst);
      return {};
    };
    SafetensorsWriteEntry entry{name, keep, shape, nullptr, nullptr};
    if (shape.empty()) entry.fill = [fill_rows](uint8_t* dst) { return fill_rows(0, 1, dst); };
    else entry.fill_rows = fill_rows;
    entries.push_back(std::move(entry));
  }
  if (options.kv_cache_scales) {
    if (options.unquantized || (plan.uniform != nullptr && plan.uniform->export_format != ExportFormat::kCompressedTensors))
      return unsupported("--kv-cache-scales: written in compressed-tensors checkpoints only (its kv_cache_scheme); " +
                         std::string(options.unquantized ? "an unquantized export has no quantization_config"
                                                         : "this scheme is written as quant_method fp8"));
    std::vector<std::pair<std::string, float>> kv;
    LLMQ_RETURN_IF_ERROR(export_detail::kv_cache_scales(config, stats, &kv));
    for (const auto& [name, scale] : kv)
      entries.push_back({name, DType::kF32, {1}, [s = scale](uint8_t* dst) -> Status {
                           std::memcpy(dst, &s, 4);
                           return {};
                         }, nullptr});
  }
  for (const auto& e : entries) sum.bytes += safetensors_entry_bytes(e);
  sum.tensors = static_cast<int64_t>(entries.size());

  nlohmann::ordered_json config_json;
  LLMQ_RETURN_IF_ERROR(parse_json_text("config.json", source.config_json(), &config_json));
  config_json["torch_dtype"] = options.keep_dtype == DType::kBF16  ? "bfloat16"
                               : options.keep_dtype == DType::kF16 ? "float16"
                                                                   : "float32";
  if (!options.unquantized) {
    config_json["quantization_config"] =
        plan.uniform != nullptr ? export_detail::quantization_config(*plan.uniform, ignored, options.kv_cache_scales)
                                : export_detail::mixed_quantization_config(plan.scheme_of, ignored, options.kv_cache_scales);
    sum.quantization_config = config_json["quantization_config"].dump(2);
  }

  const std::vector<std::vector<SafetensorsWriteEntry>> shards = split_into_shards(std::move(entries), options.max_shard_bytes);
  sum.shards = static_cast<int64_t>(shards.size());
  if (options.dry_run) {
    *summary = sum;
    return {};
  }

  // The plan: everything that decides the bytes written. --resume reuses shards only under the
  // same plan.
  std::string identity = source.identity();
  if (identity.empty()) identity = "unidentified " + std::to_string(::getpid()) + " " + std::to_string(std::random_device{}());
  std::string plan_text = std::string(kPlanVersion) + "\n" + identity + "\n" + config_json.dump() + "\n" +
                          stats_fingerprint(stats) + "\n" + std::to_string(static_cast<int>(options.nonfinite)) + "\n";
  for (const auto& [module, scheme] : plan.scheme_of) plan_text += module + ": " + scheme_fingerprint(scheme) + "\n";
  for (const auto& shard : shards) {
    plan_text += "shard";
    for (const auto& e : shard) plan_text += " " + e.name + ":" + dtype_name(e.dtype) + ":" + shape_string(e.shape);
    plan_text += "\n";
  }
  Checksum plan_sum;
  plan_sum.update(plan_text.data(), static_cast<int64_t>(plan_text.size()));
  sum.plan = checksum_hex(plan_sum.digest());

  std::unique_ptr<OutputDir> staging;
  LLMQ_RETURN_IF_ERROR(OutputDir::begin(out_dir, rules, checksum_hex(plan_sum.digest()), options.resume, &staging));
  if (Status st = write_staged(source, side_files, shards, sum.bytes, config_json.dump(2), options,
                               staging.get());
      !st.ok()) {
    // A failure to write (a full disk) keeps the shards already finished for --resume, as does a
    // --resume run the shards of the run it resumed. Anything else (the input does not read, a
    // NaN, a wrong request) leaves nothing behind: a rerun starts over anyway.
    const bool resumable = st.code() == StatusCode::kIoError && !input_failed && staging->completed_count() > 0;
    const bool earlier_work = options.resume && staging->reused_count() > 0;
    if (!resumable && !earlier_work) staging->abandon();
    return st;
  }
  sum.reused_shards = staging->reused_count();
  LLMQ_RETURN_IF_ERROR(staging->commit());
  sum.nonfinite_replaced = nonfinite_replaced;
  *summary = sum;
  return {};
}

}  // namespace
}  // namespace llmq
