// export_config.hpp: the quantization_config JSON and the format checks of export_quantized.
#include "model/checkpoint/export_config.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "llmq/quant_recipe.hpp"
#include "model/checkpoint/checkpoint_names.hpp"

namespace llmq::export_detail {

bool is_block(const QuantSpec& s) { return s.granularity == Granularity::kPerBlock; }

Status check_scheme_format(const Scheme& scheme) {
  const Granularity wg = scheme.weight.granularity;
  const bool act_static = scheme.quantize_activations && scheme.activation.source == ScaleSource::kStatic;
  if (act_static && scheme.activation.granularity != Granularity::kPerTensor)
    return unsupported("--scheme " + scheme.name + ": static activation scales are per-tensor only");
  if (!scheme.weight.symmetric || !scheme.activation.symmetric)
    return unsupported("--scheme " + scheme.name + ": asymmetric schemes have no export format yet");
  // An engine computes dynamic activation scales itself; no format can ask it for a backoff, so
  // the checkpoint would run another model than the one evaluated.
  if (scheme.quantize_activations && scheme.activation.source == ScaleSource::kDynamic && scheme.activation.backoff != 1.0f)
    return unsupported("--scheme " + scheme.name + ": a backoff on dynamic activation scales (" +
                       std::to_string(scheme.activation.backoff) + ") has no export format: engines compute those "
                       "scales themselves (--backoff applies to weights and static activation scales)");
  switch (scheme.export_format) {
    case ExportFormat::kVllmFp8:
      if (scheme.weight.format != DType::kE4M3)
        return unsupported("--scheme " + scheme.name + ": the vLLM fp8 format stores e4m3 only");
      if (wg == Granularity::kPerBlock && (scheme.weight.block_rows != 128 || scheme.weight.block_cols != 128))
        return unsupported("--scheme " + scheme.name + ": vLLM fp8 blocks are 128x128");
      if (wg == Granularity::kPerTensor)
        return unsupported("--format fp8: --scheme " + scheme.name +
                           " has per-tensor weights; transformers reads every quant_method 'fp8' checkpoint as "
                           "128x128 blocks and would load it wrong without a word. llmq writes per-tensor FP8 as "
                           "compressed-tensors (--format compressed-tensors), which vLLM loads");
      if (wg != Granularity::kPerBlock)
        return unsupported("--format fp8: --scheme " + scheme.name + ": the fp8 format holds 128x128 block weights");
      if (act_static)
        return unsupported("--scheme " + scheme.name + ": block fp8 takes dynamic activations");
      return {};
    case ExportFormat::kCompressedTensors:
      if (wg != Granularity::kPerTensor && wg != Granularity::kPerChannel)
        return unsupported("--format compressed-tensors: --scheme " + scheme.name +
                           ": llmq writes compressed-tensors with tensor or channel weights (blocks: --format fp8)");
      if (scheme.weight.format != DType::kE4M3 && scheme.weight.format != DType::kI8)
        return unsupported("--scheme " + scheme.name + ": compressed-tensors 8-bit is e4m3 or int8");
      if (scheme.quantize_activations && scheme.activation.source == ScaleSource::kDynamic &&
          scheme.activation.granularity != Granularity::kPerToken &&
          scheme.activation.granularity != Granularity::kPerTensor)
        return unsupported("--scheme " + scheme.name + ": dynamic activations must be per-token or per-tensor");
      return {};
    case ExportFormat::kNone: break;
  }
  return unsupported("--scheme " + scheme.name + ": evaluation only; no engine loads its format");
}

namespace {

const char* compressed_tensors_format(const Scheme& scheme) {
  return scheme.weight.format == DType::kE4M3 ? "float-quantized" : "int-quantized";
}

// compressed-tensors' QuantizationArgs: 8 bits, symmetric, of the given type and strategy.
nlohmann::ordered_json quantization_args(bool is_float, bool dynamic, const char* strategy) {
  return nlohmann::ordered_json{{"num_bits", 8},           {"type", is_float ? "float" : "int"},
                                {"symmetric", true},       {"strategy", strategy},
                                {"dynamic", dynamic},      {"group_size", nullptr},
                                {"block_structure", nullptr}, {"actorder", nullptr},
                                {"observer", nullptr},     {"observer_kwargs", nlohmann::ordered_json::object()}};
}

// The KV cache in E4M3 with one static scale per layer for keys and one for values (vLLM reads
// self_attn.k_scale and .v_scale under it).
nlohmann::ordered_json kv_cache_scheme() { return quantization_args(true, false, "tensor"); }

}  // namespace

// One compressed-tensors config group: the scheme's weights and input activations, for `targets`.
static nlohmann::ordered_json compressed_tensors_group(const Scheme& scheme, const std::vector<std::string>& targets) {
  const bool act = scheme.quantize_activations;
  const bool act_static = act && scheme.activation.source == ScaleSource::kStatic;
  const bool is_float = scheme.weight.format == DType::kE4M3;
  auto args = [&](bool dynamic, const char* strategy) { return quantization_args(is_float, dynamic, strategy); };
  nlohmann::ordered_json group;
  group["targets"] = targets;
  group["weights"] = args(false, scheme.weight.granularity == Granularity::kPerChannel ? "channel" : "tensor");
  if (act)
    group["input_activations"] =
        args(!act_static, scheme.activation.granularity == Granularity::kPerToken ? "token" : "tensor");
  else
    group["input_activations"] = nullptr;
  group["output_activations"] = nullptr;
  return group;
}

// A model quantized under several schemes: one config group per scheme, its targets every module
// it holds by exact name (no "Linear" class target and no regular expression, so every loader's
// matching, first match or all matches, finds each module in exactly one group), each group with
// its own "format" (vLLM reads a group's format before the global one; the global one is the
// common format, or "mixed-precision" when FP8 and INT8 groups are both present), `ignore` every
// kept linear by exact name. "llmq_groups" says which llmq scheme each group is.
nlohmann::ordered_json mixed_quantization_config(const std::map<std::string, Scheme>& scheme_of,
                                                 const std::vector<std::string>& ignored, bool kv_cache_scales) {
  std::map<std::string, std::vector<std::string>> modules_of;  // scheme name -> modules
  std::map<std::string, const Scheme*> by_name;
  for (const auto& [module, s] : scheme_of) {
    modules_of[s.name].push_back(module);
    by_name[s.name] = &s;
  }
  nlohmann::ordered_json q, groups = nlohmann::ordered_json::object(), names = nlohmann::ordered_json::object();
  std::set<std::string> formats;
  int index = 0;
  for (const auto& [name, modules] : modules_of) {
    const std::string group_name = "group_" + std::to_string(index++);
    nlohmann::ordered_json g = compressed_tensors_group(*by_name[name], modules);
    g["format"] = compressed_tensors_format(*by_name[name]);
    formats.insert(compressed_tensors_format(*by_name[name]));
    groups[group_name] = std::move(g);
    names[group_name] = name;
  }
  q["quant_method"] = quant_method_name(ExportFormat::kCompressedTensors);
  q["format"] = formats.size() == 1 ? *formats.begin() : std::string("mixed-precision");
  q["quantization_status"] = "compressed";
  q["config_groups"] = std::move(groups);
  q["ignore"] = ignored;
  q["kv_cache_scheme"] = kv_cache_scales ? kv_cache_scheme() : nlohmann::ordered_json(nullptr);
  q["global_compression_ratio"] = nullptr;
  q["llmq_scheme"] = kMixedSchemeName;
  q["llmq_groups"] = std::move(names);
  return q;
}

nlohmann::ordered_json quantization_config(const Scheme& scheme, const std::vector<std::string>& ignored,
                                           bool kv_cache_scales) {
  nlohmann::ordered_json q;
  const bool act = scheme.quantize_activations;
  const bool act_static = act && scheme.activation.source == ScaleSource::kStatic;
  if (scheme.export_format == ExportFormat::kVllmFp8) {
    q["quant_method"] = quant_method_name(ExportFormat::kVllmFp8);
    q["activation_scheme"] = act_static ? "static" : "dynamic";
    if (is_block(scheme.weight)) q["weight_block_size"] = {scheme.weight.block_rows, scheme.weight.block_cols};
    q["ignored_layers"] = ignored;
    q["modules_to_not_convert"] = ignored;  // the transformers spelling
  } else {
    const bool is_float = scheme.weight.format == DType::kE4M3;
    q["quant_method"] = quant_method_name(ExportFormat::kCompressedTensors);
    q["format"] = is_float ? "float-quantized" : "int-quantized";
    q["quantization_status"] = "compressed";
    q["config_groups"] = {{"group_0", compressed_tensors_group(scheme, {"Linear"})}};
    q["ignore"] = ignored;
    q["kv_cache_scheme"] = kv_cache_scales ? kv_cache_scheme() : nlohmann::ordered_json(nullptr);
    q["global_compression_ratio"] = nullptr;
  }
  q["llmq_scheme"] = scheme.name;  // which llmq scheme produced it (loaders ignore unknown keys)
  return q;
}

Status kv_cache_scales(const ModelConfig& config, const CalibrationStats* stats,
                       std::vector<std::pair<std::string, float>>* out) {
  if (stats == nullptr || stats->kv_cache.empty())
    return invalid_argument("--kv-cache-scales: needs calibration statistics with the KV cache (--stats from llmq "
                            "calibrate)");
  const KvCacheStats& kv = stats->kv_cache;
  if (kv.layers != config.n_layers || kv.kv_heads != config.n_kv_heads)
    return invalid_argument("--kv-cache-scales: the statistics' KV cache is " + std::to_string(kv.layers) + " layers of " +
                            std::to_string(kv.kv_heads) + " KV heads; this model has " + std::to_string(config.n_layers) +
                            " of " + std::to_string(config.n_kv_heads));
  std::vector<float> k, v;  // one value per layer, repeated per head
  if (Status st = kv.static_e4m3_scales(&k, &v); !st.ok()) return Status(st.code(), "--kv-cache-scales: " + st.message());
  out->clear();
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const std::string attention = attention_module_name(config, l);
    out->emplace_back(attention + kKvKeyScaleSuffix, k[static_cast<size_t>(l * kv.kv_heads)]);
    out->emplace_back(attention + kKvValueScaleSuffix, v[static_cast<size_t>(l * kv.kv_heads)]);
  }
  return {};
}

}  // namespace llmq::export_detail
