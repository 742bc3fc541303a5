// load_quantized_checkpoint: read an FP8/INT8 Hugging Face directory (vLLM "fp8" or
// compressed-tensors) into a QuantizedModel, keeping the stored codes and scales, so `eval
// --quantized` measures exactly what an engine would load. read_quantized_linear is the one place
// that says how a stored linear is read (the GPU loader streams the codes through it too).
#include <cstring>
#include <nlohmann/json.hpp>

#include "llmq/export.hpp"
#include "llmq/safetensors.hpp"
#include "model/checkpoint/checkpoint_names.hpp"
#include "model/checkpoint/input_file.hpp"
#include "model/quant/quant_recipe_targets.hpp"

namespace llmq {
namespace {

// The compressed-tensors formats whose input_activations vLLM applies (a group's own "format"
// first, the global one otherwise); under any other its activations stay unquantized there.
bool activation_format(const std::string& f) {
  return f == "naive-quantized" || f == "int-quantized" || f == "float-quantized";
}

// Does one config-group target take `module`, as vLLM and compressed-tensors match: the exact
// name, "re:" + a Python re.match (anchored at the start only), or the class name "Linear" (every
// linear llmq reads is one).
Status target_takes(const std::string& target, const std::string& module, bool* takes) {
  if (target == "Linear" || target == module) {
    *takes = true;
    return {};
  }
  *takes = false;
  if (target.rfind("re:", 0) != 0) return {};
  RecipeTarget t;
  LLMQ_RETURN_IF_ERROR(compile_recipe_target("quantization_config target", "re:(?:" + target.substr(3) + ")[\\s\\S]*", &t));
  return recipe_target_matches(t, module, takes);
}

// The config group of `module` in a compressed-tensors quantization_config: the only group, or
// the one group whose targets take it. A module no group or two groups take is refused: loaders
// would disagree on (or guess) its quantization.
Status group_of(const nlohmann::json& q, const std::string& module, std::string* name, const nlohmann::json** out) {
  const auto& groups = q.at("config_groups");
  if (groups.size() == 1) {
    *name = groups.begin().key();
    *out = &groups.begin().value();
    return {};
  }
  *out = nullptr;
  for (const auto& [key, g] : groups.items()) {
    const auto targets = g.find("targets");
    if (targets == g.end() || !targets->is_array()) return invalid_argument("config_groups." + key + ".targets: expected an array");
    bool takes = false;
    for (const auto& t : *targets) {
      if (!t.is_string()) return invalid_argument("config_groups." + key + ".targets: expected strings");
      LLMQ_RETURN_IF_ERROR(target_takes(t.get<std::string>(), module, &takes));
      if (takes) break;
    }
    if (!takes) continue;
    if (*out != nullptr)
      return invalid_argument("quantization_config: " + module + " is a target of config groups " + *name + " and " + key +
                              "; loaders would disagree on its quantization");
    *name = key;
    *out = &g;
  }
  if (*out == nullptr)
    return invalid_argument("quantization_config: " + module + " is stored 8-bit but no config group targets it");
  return {};
}

// The activation quantization a quantization_config asks for `module`; *group_name is its
// compressed-tensors config group ("" for the fp8 format).
Status activation_spec(const nlohmann::json& q, const std::string& module, DType format, bool* quantize_input,
                       QuantSpec* spec, std::string* group_name) {
  group_name->clear();
  const std::string method = q.value("quant_method", "");
  *quantize_input = true;
  if (method == quant_method_name(ExportFormat::kVllmFp8)) {
    if (q.contains("weight_block_size")) {
      *spec = QuantSpec::per_block(format, 1, q["weight_block_size"][1].get<int64_t>());
      return {};
    }
    *spec = QuantSpec::per_tensor(format);
    if (q.value("activation_scheme", "dynamic") == "static") spec->source = ScaleSource::kStatic;
    return {};
  }
  if (method == quant_method_name(ExportFormat::kCompressedTensors)) {
    const nlohmann::json* group = nullptr;
    LLMQ_RETURN_IF_ERROR(group_of(q, module, group_name, &group));
    const auto& g = *group;
    const std::string group_format = g.contains("format") && g["format"].is_string() ? g["format"].get<std::string>()
                                                                                    : q.value("format", "");
    if (g.contains("input_activations") && !g["input_activations"].is_null() && !activation_format(group_format))
      return unsupported("quantization_config: config group " + *group_name + " (" + module + ") quantizes activations "
                         "under format '" + group_format + "', under which vLLM does not apply them");
    if (!g.contains("input_activations") || g["input_activations"].is_null()) {
      *quantize_input = false;
      return {};
    }
    const auto& a = g["input_activations"];
    const std::string strategy = a.value("strategy", "tensor");
    if (strategy == "token") *spec = QuantSpec::per_token(format);
    else if (strategy == "tensor") *spec = QuantSpec::per_tensor(format);
    else return unsupported("quantization_config: input_activations strategy '" + strategy + "'");
    if (!a.value("dynamic", true)) spec->source = ScaleSource::kStatic;
    return {};
  }
  return unsupported("quantization_config.quant_method '" + method + "' (llmq reads fp8 and compressed-tensors)");
}

Status parse_quantization_config(const Checkpoint& ckpt, nlohmann::json* q) {
  nlohmann::json config;
  LLMQ_RETURN_IF_ERROR(parse_json_text(ckpt.dir() + "/config.json", ckpt.config_json(), &config));
  if (!config.contains("quantization_config") || !config["quantization_config"].is_object())
    return invalid_argument(ckpt.dir() + " has no quantization_config in config.json");
  *q = config["quantization_config"];
  return {};
}

// One linear under a parsed quantization_config (see read_quantized_linear). Which tensors it
// has and how their shapes read is checkpoint_names.cpp's, shared with load_hf_model.
Status read_linear(const Checkpoint& ckpt, const nlohmann::json& q, const std::string& module, bool with_codes,
                   bool* quantized, QuantizedLinear* out) {
  *quantized = false;
  const std::string weight_name = module + kWeightSuffix;
  const SafetensorsTensorInfo* info = ckpt.find(weight_name);
  // Absent (a tied lm_head is the embedding) or stored in float: not quantized.
  if (info == nullptr || !(is_fp8(info->dtype) || info->dtype == DType::kI8)) return {};
  if (info->shape.size() != 2)
    return invalid_argument(ckpt.dir() + ": " + weight_name + " is " + dtype_name(info->dtype) + " with " +
                            std::to_string(info->shape.size()) + " dimensions; a quantized linear weight has 2");
  // A zero point would be dropped here (QuantizedLinear's consumers are symmetric) while
  // load_hf_model subtracts it: refused rather than read as a different model.
  if (ckpt.find(module + kZeroPointSuffix) != nullptr)
    return unsupported(ckpt.dir() + ": tensor '" + module + kZeroPointSuffix +
                       "': asymmetric (zero-point) weights are read dequantized only, not as stored");
  const int64_t n = info->shape[0], k = info->shape[1];
  // The block shape comes from the config (ceil(n / scale_rows) would be wrong for partial edge
  // blocks: 688 rows in 128-row blocks have 6 scale rows, and 688 / 6 is not 128).
  int64_t br = 0, bc = 0;
  if (Status st = parse_hf_weight_block_size(ckpt.config_json(), &br, &bc); !st.ok())
    return Status(st.code(), ckpt.dir() + ": " + st.message());
  FoundWeightScale found;
  LLMQ_RETURN_IF_ERROR(find_weight_scale(ckpt, module, n, k, br, bc, &found));
  QuantizedLinear ql;
  QuantizedTensor& w = ql.weight;
  w.rows = n;
  w.cols = k;
  if (with_codes) {
    w.data = Tensor(info->dtype, {n, k});
    TensorView v;
    LLMQ_RETURN_IF_ERROR(ckpt.view(weight_name, &v));
    std::memcpy(w.data.data(), v.data, static_cast<size_t>(w.data.nbytes()));
  }
  Tensor s;
  LLMQ_RETURN_IF_ERROR(read_weight_scale(ckpt, found, &s));
  switch (found.layout) {
    case ScaleLayout::kTensor:
      w.spec = QuantSpec::per_tensor(info->dtype);
      w.scales.block = {n, k};
      w.scales.scales = Tensor(DType::kF32, {1, 1});
      break;
    case ScaleLayout::kChannel:
      w.spec = QuantSpec::per_channel(info->dtype);
      w.scales.block = {1, k};
      w.scales.scales = Tensor(DType::kF32, {n, 1});
      break;
    case ScaleLayout::kBlock:
      w.spec = QuantSpec::per_block(info->dtype, br, bc);
      w.scales.block = {br, bc};
      w.scales.scales = Tensor(DType::kF32, {found.info->shape[0], found.info->shape[1]});
      break;
  }
  std::memcpy(w.scales.scales.data(), s.data(), static_cast<size_t>(s.nbytes()));
  std::string group;
  try {
    if (Status st = activation_spec(q, module, info->dtype, &ql.quantize_input, &ql.input_spec, &group); !st.ok())
      return Status(st.code(), ckpt.dir() + ": " + st.message());
  } catch (const std::exception& e) {
    return invalid_argument(ckpt.dir() + ": quantization_config: " + e.what());
  }
  // Which llmq scheme: a mixed checkpoint names each group's ("llmq_groups"), others the whole one.
  ql.scheme = q.value("llmq_scheme", std::string("checkpoint"));
  if (const auto names = q.find("llmq_groups"); names != q.end() && names->is_object() && names->contains(group) &&
                                                (*names)[group].is_string())
    ql.scheme = (*names)[group].get<std::string>();
  if (ql.quantize_input && ql.input_spec.source == ScaleSource::kStatic) {
    float in = 0.0f;
    LLMQ_RETURN_IF_ERROR(read_input_scale(ckpt, module, &in));
    ql.static_input_scale.scales = Tensor(DType::kF32, {1, 1});
    ql.static_input_scale.scales.data_as<float>()[0] = in;
    ql.static_input_scale.block = {1, 1};
  }
  *out = std::move(ql);
  *quantized = true;
  return {};
}

}  // namespace

// MXFP4 (gpt-oss's published experts) is a storage format the float loader dequantizes exactly,
// not an 8-bit checkpoint read as stored.
bool is_quantized_checkpoint(const Checkpoint& ckpt) {
  nlohmann::json q;
  if (!parse_quantization_config(ckpt, &q).ok()) return false;
  const auto method = q.find("quant_method");
  return !(method != q.end() && method->is_string() && method->get<std::string>() == "mxfp4");
}

std::string quantized_checkpoint_scheme(const Checkpoint& ckpt) {
  nlohmann::json q;
  if (!parse_quantization_config(ckpt, &q).ok()) return "";
  return q.value("llmq_scheme", std::string("checkpoint"));
}

Status read_quantized_linear(const Checkpoint& ckpt, const std::string& module, bool with_codes, bool* quantized,
                             QuantizedLinear* out) {
  nlohmann::json q;
  LLMQ_RETURN_IF_ERROR(parse_quantization_config(ckpt, &q));
  return read_linear(ckpt, q, module, with_codes, quantized, out);
}

Status load_quantized_checkpoint(const std::string& dir, QuantizedModel* out) {
  std::unique_ptr<Checkpoint> ckpt;
  LLMQ_RETURN_IF_ERROR(Checkpoint::open(dir, &ckpt));
  nlohmann::json q;
  if (Status st = parse_quantization_config(*ckpt, &q); !st.ok()) return invalid_argument("--quantized: " + st.message());

  QuantizedModel qm;
  LLMQ_RETURN_IF_ERROR(load_hf_model(dir, &qm.weights));  // float (dequantized) weights for the rest
  qm.scheme.name = q.value("llmq_scheme", std::string("checkpoint"));
  qm.scheme.description = "as stored in " + dir;
  const ModelConfig& c = qm.weights.config;
  for (const Linear* l : qm.weights.linears()) {
    const std::string module = l->id.hf_name(c);
    QuantizedLinear ql;
    bool quantized = false;
    if (Status st = read_linear(*ckpt, q, module, true, &quantized, &ql); !st.ok())
      return invalid_argument("--quantized: " + st.message());
    if (!quantized) continue;  // kept in float
    qm.scheme.weight = ql.weight.spec;
    qm.scheme.quantize_activations = ql.quantize_input;
    qm.scheme.activation = ql.input_spec;
    qm.linears[module] = std::move(ql);
  }
  if (qm.linears.empty()) return invalid_argument("--quantized: " + dir + " holds no FP8/INT8 linear weights");
  *out = std::move(qm);
  return {};
}

}  // namespace llmq
