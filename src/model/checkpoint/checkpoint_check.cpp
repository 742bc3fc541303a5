// The one checked way a Hugging Face checkpoint becomes a model: every loader (the CPU model, the
// quantized-checkpoint reader, the streaming quantizer, the GPU loaders, and so every command)
// opens it through open_hf_checkpoint, so a checkpoint that disagrees with its config.json is
// refused the same way everywhere instead of being run as a truncated or re-tied model.
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "llmq/dtype.hpp"
#include "llmq/safetensors.hpp"
#include "llmq/synthetic_checkpoint.hpp"
#include "model/checkpoint/checkpoint_names.hpp"
#include "model/checkpoint/input_file.hpp"
#include "model/checkpoint/model_family.hpp"

namespace llmq {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_8bit(DType d) { return is_fp8(d) || d == DType::kI8; }

}  // namespace

// The writer's list is the checker's list: one enumeration of what a config implies.
std::vector<HfTensorSpec> hf_tensor_specs(const ModelConfig& c) {
  std::vector<HfTensorSpec> specs;
  (void)visit_model_tensors(c, [&specs](const ModelTensor& t) {
    specs.push_back({t.name, t.shape});
    return Status();
  });
  return specs;
}

bool config_has_quantization(const std::string& config_json) {
  nlohmann::json j;
  if (!parse_json_text("config.json", config_json, &j).ok() || !j.is_object()) return false;
  const auto it = j.find("quantization_config");
  return it != j.end() && it->is_object();
}

Status check_hf_checkpoint(const Checkpoint& ckpt, const ModelConfig& config) {
  const std::string where = ckpt.dir() + ": ";
  // One parse of config.json for what the tensors may be (parse_hf_config has accepted the text).
  nlohmann::json j;
  const bool parsed = parse_json_text("config.json", ckpt.config_json(), &j).ok() && j.is_object();
  const auto qc = parsed ? j.find("quantization_config") : j.end();
  const bool quantized = parsed && qc != j.end() && qc->is_object();
  const bool kv_scales_declared = quantized && qc->contains("kv_cache_scheme") && (*qc)["kv_cache_scheme"].is_object();
  std::set<std::string> expected, stored_8bit;
  LLMQ_RETURN_IF_ERROR(visit_model_tensors(config, [&](const ModelTensor& t) -> Status {
    const SafetensorsTensorInfo* info = ckpt.find(t.name);
    if (info == nullptr) {
      if (t.name == "lm_head.weight")
        return invalid_argument(where + "no lm_head.weight, and config.json's tie_word_embeddings is false: "
                                "transformers would start lm_head from random weights");
      return invalid_argument(where + "tensor '" + t.name + "' is missing (config.json: " + config.model_type + ", " +
                              std::to_string(config.n_layers) + " layers" +
                              (config.is_moe() ? ", " + std::to_string(config.n_experts) + " experts" : "") + ")");
    }
    if (info->shape != t.shape)
      return invalid_argument(where + "tensor '" + t.name + "' has shape " + shape_string(info->shape) +
                              ", config.json implies " + shape_string(t.shape));
    if (t.mxfp4 || info->dtype == DType::kU8) {
      if (!t.mxfp4 || info->dtype != DType::kU8)
        return invalid_argument(where + "tensor '" + t.name + "' is " + dtype_name(info->dtype) +
                                (t.mxfp4 ? "; MXFP4 blocks and scales are U8" : "; only MXFP4 blocks and scales are U8"));
    } else if (is_8bit(info->dtype)) {
      if (!t.may_be_8bit)
        return invalid_argument(where + "tensor '" + t.name + "' is " + dtype_name(info->dtype) +
                                "; norms and biases must be F32, F64, F16 or BF16");
      if (!quantized)
        return invalid_argument(where + "tensor '" + t.name + "' is " + dtype_name(info->dtype) +
                                " but config.json has no quantization_config saying how to read it");
      stored_8bit.insert(t.name);
    } else if (!is_high_precision(info->dtype)) {
      return invalid_argument(where + "tensor '" + t.name + "' is " + dtype_name(info->dtype) +
                              "; weights must be F32, F64, F16, BF16 (or FP8/INT8 in a quantized checkpoint)");
    }
    expected.insert(t.name);
    return {};
  }));
  // Tied, with an lm_head.weight stored anyway (merges and conversions write the duplicate): fine
  // when it is the embedding byte for byte; otherwise loaders disagree on which of the two wins.
  if (config.tie_embeddings && ckpt.find("lm_head.weight") != nullptr) {
    TensorView head, embed;
    const bool same = ckpt.view("lm_head.weight", &head).ok() && ckpt.view("model.embed_tokens.weight", &embed).ok() &&
                      head.dtype == embed.dtype && head.shape == embed.shape &&
                      std::memcmp(head.data, embed.data, static_cast<size_t>(ckpt.find("lm_head.weight")->nbytes)) == 0;
    if (!same)
      return invalid_argument(where + "tensor 'lm_head.weight' differs from the embedding, but config.json's "
                              "tie_word_embeddings is true: loaders disagree on which of the two wins");
    expected.insert("lm_head.weight");
  }
  // Nothing the model would not read: an extra layer or expert, a stray tensor, a scale beside a
  // weight stored in float. transformers drops such tensors with a warning; llmq refuses them,
  // since they mean the config and the weights describe different models.
  const std::string layers = "model.layers.";
  for (const std::string& name : ckpt.tensor_names()) {
    if (expected.count(name) != 0) continue;
    // A buffer old checkpoints saved; transformers recomputes it from the config.
    if (ends_with(name, ".rotary_emb.inv_freq")) continue;
    // KV-cache scales of a compressed-tensors checkpoint whose config declares kv_cache_scheme:
    // read_kv_cache_scales checks them (scheme, shape, values) for an E4M3 cache (--kv-cache);
    // a BF16 cache needs none, and the weights are read in full either way.
    if (kv_scales_declared && (ends_with(name, std::string(".self_attn") + kKvKeyScaleSuffix) ||
                               ends_with(name, std::string(".self_attn") + kKvValueScaleSuffix)))
      continue;
    // The tensors a quantized linear weight brings with it (checkpoint_names.hpp).
    bool companion = false;
    for (const char* suffix : kCompanionSuffixes)
      if (ends_with(name, suffix) && stored_8bit.count(name.substr(0, name.size() - std::string(suffix).size()) + kWeightSuffix) != 0)
        companion = true;
    if (companion) continue;
    if (name.rfind(layers, 0) == 0) {
      const std::string rest = name.substr(layers.size());
      size_t digits = 0;
      while (digits < rest.size() && digits < 18 && rest[digits] >= '0' && rest[digits] <= '9') ++digits;
      if (digits > 0 && std::stoll(rest.substr(0, digits)) >= config.n_layers)
        return invalid_argument(where + "tensor '" + name + "' belongs to layer " + rest.substr(0, digits) +
                                ", but config.json's num_hidden_layers is " + std::to_string(config.n_layers));
    }
    for (const char* suffix : kCompanionSuffixes)
      if (ends_with(name, suffix))
        return invalid_argument(where + "tensor '" + name + "' is a quantization scale, but the weight it belongs to is "
                                "not stored in 8 bits (or is not part of the model)");
    return invalid_argument(where + "tensor '" + name + "' is not part of the model config.json describes (" +
                            config.model_type + ", " + std::to_string(config.n_layers) + " layers" +
                            (config.is_moe() ? ", " + std::to_string(config.n_experts) + " experts" : "") +
                            "); refusing rather than ignoring it");
  }
  return {};
}

// The quantization_config fields the readers (quantized_checkpoint.cpp, the GPU loader) take as
// given: checked here once, so a malformed one is an error naming the field, not an exception or
// an out-of-bounds read in a loader (some run on worker threads).
static Status check_quantization_fields(const std::string& config_json) {
  if (!config_has_quantization(config_json)) return {};
  int64_t rows = 0, cols = 0;
  LLMQ_RETURN_IF_ERROR(parse_hf_weight_block_size(config_json, &rows, &cols));
  nlohmann::json j;
  LLMQ_RETURN_IF_ERROR(parse_json_text("config.json", config_json, &j));
  const nlohmann::json& q = j["quantization_config"];
  for (const char* key : {"quant_method", "llmq_scheme", "activation_scheme", "format"}) {
    const auto it = q.find(key);
    if (it != q.end() && !it->is_null() && !it->is_string())
      return invalid_argument(std::string("config.json: quantization_config.") + key + ": expected a string, got " +
                              it->dump());
  }
  const auto groups = q.find("config_groups");
  if (groups != q.end() && !groups->is_null()) {
    if (!groups->is_object()) return invalid_argument("config.json: quantization_config.config_groups: expected an object");
    for (const auto& [name, g] : groups->items()) {
      if (!g.is_object())
        return invalid_argument("config.json: quantization_config.config_groups." + name + ": expected an object");
      const auto a = g.find("input_activations");
      if (a != g.end() && !a->is_null() && !a->is_object())
        return invalid_argument("config.json: quantization_config.config_groups." + name +
                                ".input_activations: expected an object or null");
      if (a != g.end() && a->is_object())
        for (const char* key : {"strategy", "dynamic"}) {
          const auto v = a->find(key);
          const bool ok = v == a->end() || v->is_null() || (key[0] == 's' ? v->is_string() : v->is_boolean());
          if (!ok)
            return invalid_argument("config.json: quantization_config.config_groups." + name + ".input_activations." +
                                    key + ": unexpected " + v->dump());
        }
    }
  }
  return {};
}

Status open_hf_checkpoint(const std::string& dir, std::unique_ptr<Checkpoint>* ckpt, ModelConfig* config) {
  std::unique_ptr<Checkpoint> c;
  LLMQ_RETURN_IF_ERROR(Checkpoint::open(dir, &c));
  ModelConfig mc;
  if (Status st = parse_hf_config(c->config_json(), &mc); !st.ok()) return Status(st.code(), dir + "/" + st.message());
  if (Status st = check_quantization_fields(c->config_json()); !st.ok())
    return Status(st.code(), dir + "/" + st.message());
  LLMQ_RETURN_IF_ERROR(check_hf_checkpoint(*c, mc));
  *ckpt = std::move(c);
  *config = std::move(mc);
  return {};
}

}  // namespace llmq
