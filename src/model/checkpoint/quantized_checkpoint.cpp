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

namespace llmq {
namespace {

// The activation quantization a quantization_config asks for.
Status activation_spec(const nlohmann::json& q, DType format, bool* quantize_input, QuantSpec* spec) {
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
    const auto& groups = q.at("config_groups");
    if (groups.size() != 1) return unsupported("quantization_config: one config group supported");
    const auto& g = groups.begin().value();
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
  try {
    LLMQ_RETURN_IF_ERROR(activation_spec(q, info->dtype, &ql.quantize_input, &ql.input_spec));
  } catch (const std::exception& e) {
    return invalid_argument(ckpt.dir() + ": quantization_config: " + e.what());
  }
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
