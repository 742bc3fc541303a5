// load_quantized_checkpoint: read an FP8/INT8 Hugging Face directory (vLLM "fp8" or
// compressed-tensors) into a QuantizedModel, keeping the stored codes and scales, so `eval
// --quantized` measures exactly what an engine would load. read_quantized_linear is the one place
// that says how a stored linear is read (the GPU loader streams the codes through it too).
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "llmq/export.hpp"
#include "llmq/safetensors.hpp"
#include "model/checkpoint/checkpoint_names.hpp"
#include "model/checkpoint/input_file.hpp"
#include "model/checkpoint/quantization_targets.hpp"

namespace llmq {
namespace {

// The compressed-tensors formats whose input_activations vLLM applies (a group's own "format"
// first, the global one otherwise); under any other its activations stay unquantized there.
bool activation_format(const std::string& f) {
  return f == "naive-quantized" || f == "int-quantized" || f == "float-quantized";
}

// A string field of the quantization_config: `fallback` when absent or null (a hand-edited
// config.json writes null for "not given"); any other type is refused naming the field, where
// nlohmann's value() would throw.
Status string_field(const nlohmann::json& q, const char* key, const std::string& fallback, std::string* out) {
  const auto it = q.find(key);
  if (it == q.end() || it->is_null()) {
    *out = fallback;
    return {};
  }
  if (!it->is_string()) return invalid_argument(std::string("quantization_config.") + key + ": expected a string, got " + it->dump());
  *out = it->get<std::string>();
  return {};
}

// The activation quantization a quantization_config asks for `module`, whose compressed-tensors
// config group is `group` (named *group_name; nullptr for the fp8 format).
Status activation_spec(const nlohmann::json& q, const nlohmann::json* group, const std::string& module, DType format,
                       bool* quantize_input, QuantSpec* spec, const std::string* group_name) {
  std::string method;
  LLMQ_RETURN_IF_ERROR(string_field(q, "quant_method", "", &method));
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
    if (group == nullptr) return invalid_argument("quantization_config: " + module + " has no config group");
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

}  // namespace

// A checkpoint's quantization_config, parsed and its targets compiled once.
struct QuantizedLinearReader::State {
  const Checkpoint* ckpt = nullptr;
  nlohmann::json q;
  QuantizationTargets targets;  // points into q
  std::string scheme;           // llmq_scheme, or "checkpoint"
};

QuantizedLinearReader::QuantizedLinearReader() = default;
QuantizedLinearReader::~QuantizedLinearReader() = default;

Status QuantizedLinearReader::open(const Checkpoint& ckpt, std::unique_ptr<QuantizedLinearReader>* out) {
  std::unique_ptr<QuantizedLinearReader> r(new QuantizedLinearReader());
  r->state_ = std::make_unique<State>();
  State& s = *r->state_;
  s.ckpt = &ckpt;
  LLMQ_RETURN_IF_ERROR(parse_quantization_config(ckpt, &s.q));
  const auto is_module = [&ckpt](const std::string& name) { return ckpt.find(name + kWeightSuffix) != nullptr; };
  if (Status st = QuantizationTargets::parse(s.q, is_module, &s.targets); !st.ok())
    return Status(st.code(), ckpt.dir() + ": " + st.message());
  if (Status st = string_field(s.q, "llmq_scheme", "checkpoint", &s.scheme); !st.ok())
    return Status(st.code(), ckpt.dir() + ": " + st.message());
  *out = std::move(r);
  return {};
}

const std::string& QuantizedLinearReader::scheme() const { return state_->scheme; }

// One linear under the parsed quantization_config (see read_quantized_linear). Which tensors it
// has and how their shapes read is checkpoint_names.cpp's, shared with load_hf_model.
Status QuantizedLinearReader::read(const std::string& module, bool with_codes, bool* quantized, QuantizedLinear* out) {
  const Checkpoint& ckpt = *state_->ckpt;
  const nlohmann::json& q = state_->q;
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
  const nlohmann::json* group_config = nullptr;
  if (Status st = state_->targets.group_of(module, &group, &group_config); !st.ok())
    return Status(st.code(), ckpt.dir() + ": " + st.message());
  try {
    if (Status st = activation_spec(q, group_config, module, info->dtype, &ql.quantize_input, &ql.input_spec, &group);
        !st.ok())
      return Status(st.code(), ckpt.dir() + ": " + st.message());
  } catch (const std::exception& e) {
    return invalid_argument(ckpt.dir() + ": quantization_config: " + e.what());
  }
  // Which llmq scheme: a mixed checkpoint names each group's ("llmq_groups"), others the whole one.
  ql.scheme = state_->scheme;
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
  std::string scheme;
  // Not a string: the linears' reader refuses the field by name; the label is the generic one.
  if (!string_field(q, "llmq_scheme", "checkpoint", &scheme).ok()) return "checkpoint";
  return scheme;
}

Status read_quantized_linear(const Checkpoint& ckpt, const std::string& module, bool with_codes, bool* quantized,
                             QuantizedLinear* out) {
  std::unique_ptr<QuantizedLinearReader> reader;
  LLMQ_RETURN_IF_ERROR(QuantizedLinearReader::open(ckpt, &reader));
  return reader->read(module, with_codes, quantized, out);
}

Status read_kv_cache_scales(const Checkpoint& ckpt, const ModelConfig& config, bool* declared, std::vector<float>* k_scales,
                            std::vector<float>* v_scales) {
  *declared = false;
  k_scales->clear();
  v_scales->clear();
  nlohmann::json q;
  if (!parse_quantization_config(ckpt, &q).ok()) return {};  // unquantized: nothing declared
  const auto it = q.find("kv_cache_scheme");
  if (it == q.end() || it->is_null()) return {};
  const std::string where = ckpt.dir() + ": quantization_config.kv_cache_scheme";
  const nlohmann::json& s = *it;
  auto field = [&](const char* key) { return s.is_object() && s.contains(key) ? s[key] : nlohmann::json(); };
  const bool eight_bit_float = field("num_bits") == 8 && field("type") == "float" && field("dynamic") == false &&
                               field("symmetric") != false;
  const nlohmann::json strategy = field("strategy");
  const bool per_head = strategy == "attn_head";
  if (!eight_bit_float || !(strategy == "tensor" || per_head))
    return unsupported(where + " is " + s.dump() + "; llmq reads static 8-bit float KV scales, per tensor or per KV head");
  const int64_t heads = config.n_kv_heads;
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const std::string attention = attention_module_name(config, l);
    for (const auto& [suffix, dst] : {std::pair<const char*, std::vector<float>*>{kKvKeyScaleSuffix, k_scales},
                                      {kKvValueScaleSuffix, v_scales}}) {
      const std::string name = attention + suffix;
      if (ckpt.find(name) == nullptr) return invalid_argument(where + " is declared but " + name + " is missing");
      Tensor t;
      LLMQ_RETURN_IF_ERROR(ckpt.read_f32(name, &t));
      const int64_t n = t.numel();
      if (n != (per_head ? heads : 1))
        return invalid_argument(ckpt.dir() + ": " + name + " holds " + std::to_string(n) + " values; the kv_cache_scheme's " +
                                strategy.get<std::string>() + " strategy wants " + std::to_string(per_head ? heads : 1));
      for (int64_t h = 0; h < heads; ++h) {
        const float v = t.data_as<float>()[per_head ? h : 0];
        if (!(v > 0.0f) || !std::isfinite(v))
          return invalid_argument(ckpt.dir() + ": " + name + " holds " + std::to_string(v) + ", not a finite positive scale");
        dst->push_back(v);
      }
    }
  }
  *declared = true;
  return {};
}

Status load_quantized_checkpoint(const std::string& dir, QuantizedModel* out) {
  std::unique_ptr<Checkpoint> ckpt;
  LLMQ_RETURN_IF_ERROR(Checkpoint::open(dir, &ckpt));
  std::unique_ptr<QuantizedLinearReader> reader;
  if (Status st = QuantizedLinearReader::open(*ckpt, &reader); !st.ok()) return invalid_argument("--quantized: " + st.message());

  QuantizedModel qm;
  LLMQ_RETURN_IF_ERROR(load_hf_model(dir, &qm.weights));  // float (dequantized) weights for the rest
  qm.scheme.name = reader->scheme();
  qm.scheme.description = "as stored in " + dir;
  const ModelConfig& c = qm.weights.config;
  for (const Linear* l : qm.weights.linears()) {
    const std::string module = l->id.hf_name(c);
    QuantizedLinear ql;
    bool quantized = false;
    if (Status st = reader->read(module, true, &quantized, &ql); !st.ok())
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
