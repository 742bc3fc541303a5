// Hugging Face Llama-family checkpoints (llama, mistral, qwen2, mixtral): config.json ->
// ModelConfig, and the safetensors weights, found by their transformers module names, -> float32
// ModelWeights. Every shape is checked against the config. 8-bit linear weights are dequantized on
// load: per-tensor or per-channel `weight_scale`, or block `weight_scale_inv` (vLLM's block FP8,
// where the "inverse" scale multiplies), with an optional `weight_zero_point`.
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "llmq/format.hpp"
#include "llmq/safetensors.hpp"

namespace llmq {
namespace {

using json = nlohmann::json;

// vLLM / DeepSeek block FP8 quantizes 128 x 128 tiles unless quantization_config says otherwise.
constexpr int64_t kDefaultWeightBlock = 128;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// a >= 0, b > 0. Not (a + b - 1) / b: weight_block_size comes from config.json and may be as
// large as INT64_MAX, where that sum overflows.
int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// ---- config.json field readers. A null value counts as absent: configs write "head_dim": null,
// ---- "rope_scaling": null, "sliding_window": null.

const json* field(const json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// `parent` names the enclosing object in messages ("rope_scaling." for its fields).
Status missing(const std::string& key) { return invalid_argument("config.json: " + key + ": missing"); }

Status read_int(const json& obj, const std::string& key, bool required, int64_t* out, const std::string& parent = "") {
  const json* v = field(obj, key.c_str());
  if (v == nullptr) return required ? missing(parent + key) : Status();
  if (!v->is_number_integer())
    return invalid_argument("config.json: " + parent + key + ": expected an integer, got " + v->dump());
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return invalid_argument("config.json: " + parent + key + ": " + v->dump() + " is too large");
  *out = v->get<int64_t>();
  return {};
}

Status read_double(const json& obj, const std::string& key, bool required, double* out,
                   const std::string& parent = "") {
  const json* v = field(obj, key.c_str());
  if (v == nullptr) return required ? missing(parent + key) : Status();
  if (!v->is_number())
    return invalid_argument("config.json: " + parent + key + ": expected a number, got " + v->dump());
  *out = v->get<double>();
  return {};
}

Status read_bool(const json& obj, const std::string& key, bool* out) {
  const json* v = field(obj, key.c_str());
  if (v == nullptr) return {};
  if (!v->is_boolean()) return invalid_argument("config.json: " + key + ": expected true or false, got " + v->dump());
  *out = v->get<bool>();
  return {};
}

Status read_string(const json& obj, const std::string& key, bool required, std::string* out,
                   const std::string& parent = "") {
  const json* v = field(obj, key.c_str());
  if (v == nullptr) return required ? missing(parent + key) : Status();
  if (!v->is_string())
    return invalid_argument("config.json: " + parent + key + ": expected a string, got " + v->dump());
  *out = v->get<std::string>();
  return {};
}

// bos_token_id / eos_token_id: an integer, or a list of them (Llama 3.1 lists three EOS tokens;
// the first is the one generation stops on by default).
Status read_token_id(const json& obj, const std::string& key, int32_t* out) {
  const json* v = field(obj, key.c_str());
  if (v == nullptr) return {};
  const json* id = v;
  if (v->is_array()) {
    if (v->empty()) return {};
    id = &(*v)[0];
  }
  if (!id->is_number_integer() || id->get<int64_t>() < 0 ||
      id->get<int64_t>() > std::numeric_limits<int32_t>::max())
    return invalid_argument("config.json: " + key + ": expected a token id, got " + v->dump());
  *out = static_cast<int32_t>(id->get<int64_t>());
  return {};
}

Status parse_rope_scaling(const json& rs, RopeScaling* out) {
  if (!rs.is_object()) return invalid_argument("config.json: rope_scaling: expected an object, got " + rs.dump());
  std::string type;
  const std::string parent = "rope_scaling.";
  LLMQ_RETURN_IF_ERROR(read_string(rs, "rope_type", false, &type, parent));
  if (type.empty()) LLMQ_RETURN_IF_ERROR(read_string(rs, "type", false, &type, parent));
  if (type == "default") return {};  // transformers' name for plain RoPE
  if (type != "llama3")
    return unsupported("config.json: rope_scaling: rope type '" + type + "' is not supported (only 'llama3')");
  RopeScaling r;
  r.enabled = true;
  // Llama 3 configs give all four; transformers refuses the rope type without them.
  LLMQ_RETURN_IF_ERROR(read_double(rs, "factor", true, &r.factor, parent));
  LLMQ_RETURN_IF_ERROR(read_double(rs, "low_freq_factor", true, &r.low_freq_factor, parent));
  LLMQ_RETURN_IF_ERROR(read_double(rs, "high_freq_factor", true, &r.high_freq_factor, parent));
  LLMQ_RETURN_IF_ERROR(read_int(rs, "original_max_position_embeddings", true, &r.original_max_position, parent));
  if (!(r.factor > 0) || !(r.low_freq_factor > 0) || !(r.high_freq_factor > r.low_freq_factor) ||
      r.original_max_position <= 0)
    return invalid_argument("config.json: rope_scaling: need factor > 0, 0 < low_freq_factor < high_freq_factor, "
                            "original_max_position_embeddings > 0, got " + rs.dump());
  *out = r;
  return {};
}

// ---- weights

class HfLoader {
 public:
  HfLoader(const Checkpoint& ckpt, const ModelConfig& config, int64_t block_rows, int64_t block_cols)
      : ckpt_(ckpt), config_(config), block_rows_(block_rows), block_cols_(block_cols) {}

  // A high-precision tensor (norm gains, biases) of exactly `shape`.
  Status plain(const std::string& name, const std::vector<int64_t>& shape, Tensor* out) const {
    const SafetensorsTensorInfo* info = nullptr;
    LLMQ_RETURN_IF_ERROR(require(name, shape, &info));
    if (!is_high_precision(info->dtype))
      return unsupported(where(name) + "stored as " + safetensors_dtype_name(info->dtype) +
                         "; only linear and embedding weights may be quantized");
    return ckpt_.read_f32(name, out);
  }

  // `<module>.weight` as float32 [rows, cols], dequantized when stored in 8 bits.
  Status weight(const std::string& module, int64_t rows, int64_t cols, Tensor* out) const {
    const std::string name = module + ".weight";
    const SafetensorsTensorInfo* info = nullptr;
    LLMQ_RETURN_IF_ERROR(require(name, {rows, cols}, &info));
    if (is_high_precision(info->dtype)) return ckpt_.read_f32(name, out);
    if (info->dtype != DType::kE4M3 && info->dtype != DType::kE5M2 && info->dtype != DType::kI8)
      return unsupported(where(name) + "cannot dequantize a " + safetensors_dtype_name(info->dtype) + " weight");

    Tensor w;
    LLMQ_RETURN_IF_ERROR(ckpt_.read_f32(name, &w));  // raw codes as floats: q
    // Scale layouts. `weight_scale` wins when both exist (the order vLLM checks them in).
    std::string scale_name = module + ".weight_scale";
    bool inverse_name = false;
    if (ckpt_.find(scale_name) == nullptr) {
      scale_name = module + ".weight_scale_inv";
      inverse_name = true;
    }
    const SafetensorsTensorInfo* scale_info = ckpt_.find(scale_name);
    if (scale_info == nullptr)
      return invalid_argument(where(name) + "stored as " + safetensors_dtype_name(info->dtype) + " but neither " +
                              module + ".weight_scale nor " + module + ".weight_scale_inv exists");
    if (!is_high_precision(scale_info->dtype))
      return invalid_argument(where(scale_name) + "scales must be F32/F64/F16/BF16, got " +
                              safetensors_dtype_name(scale_info->dtype));
    Tensor scale;
    LLMQ_RETURN_IF_ERROR(ckpt_.read_f32(scale_name, &scale));

    // Which scale element covers weight (r, c): a layout decided from the scale's shape.
    enum class Layout { kTensor, kChannel, kBlock } layout;
    const std::vector<int64_t>& ss = scale_info->shape;
    const int64_t grid_rows = ceil_div(rows, block_rows_), grid_cols = ceil_div(cols, block_cols_);
    const bool is_block = ss.size() == 2 && ss[0] == grid_rows && ss[1] == grid_cols;
    if (!inverse_name && scale.numel() == 1 && ss.size() <= 2) {
      layout = Layout::kTensor;  // [], [1], [1, 1]
    } else if (!inverse_name && ((ss.size() == 1 && ss[0] == rows) || (ss.size() == 2 && ss[0] == rows && ss[1] == 1))) {
      layout = Layout::kChannel;  // [out], [out, 1]
    } else if (is_block) {
      layout = Layout::kBlock;  // [ceil(out / bm), ceil(in / bk)]; compressed-tensors names it weight_scale
    } else {
      const std::vector<int64_t> block_shape = {grid_rows, grid_cols};
      return invalid_argument(where(scale_name) + "shape " + shape_text(ss) + " fits no scale layout of weight " +
                              shape_text({rows, cols}) + ": expected " +
                              (inverse_name ? "" : "[], [1], [" + std::to_string(rows) + "], [" +
                                                       std::to_string(rows) + ", 1] or ") +
                              shape_text(block_shape) + " (" + std::to_string(block_rows_) + "x" +
                              std::to_string(block_cols_) + " blocks)");
    }
    const float* s = scale.data_as<float>();
    for (int64_t i = 0; i < scale.numel(); ++i)
      if (!std::isfinite(s[i]))
        return invalid_argument(where(scale_name) + "element " + std::to_string(i) + " is not finite");

    // Optional zero point on the same grid as the scale: w = (q - zp) * s.
    Tensor zero_point;
    const std::string zp_name = module + ".weight_zero_point";
    if (const SafetensorsTensorInfo* zp_info = ckpt_.find(zp_name)) {
      LLMQ_RETURN_IF_ERROR(ckpt_.read_f32(zp_name, &zero_point));
      if (zero_point.numel() != scale.numel())
        return invalid_argument(where(zp_name) + "shape " + shape_text(zp_info->shape) + " does not match " +
                                scale_name + " " + shape_text(ss));
    }
    const float* zp = zero_point.numel() > 0 ? zero_point.data_as<float>() : nullptr;

    float* q = w.data_as<float>();  // (rows, cols), dequantized in place
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        int64_t k = 0;
        if (layout == Layout::kChannel) k = r;
        if (layout == Layout::kBlock) k = (r / block_rows_) * grid_cols + c / block_cols_;
        float& v = q[r * cols + c];
        // q and zp are small integers or FP8 values, so q - zp is exact; one rounding, in the
        // product.
        v = (zp != nullptr ? v - zp[k] : v) * s[k];
      }
    }
    *out = std::move(w);
    return {};
  }

  Status linear(const LinearId& id, int64_t rows, int64_t cols, Linear* out) const {
    Linear l;
    l.id = id;
    const std::string module = id.hf_name(config_);
    LLMQ_RETURN_IF_ERROR(weight(module, rows, cols, &l.weight));
    // Biases: Qwen2 (attention_bias) has them on q/k/v; Llama's attention_bias also puts one on
    // o_proj. A bias the config does not foresee is an error rather than a silently dropped term.
    const std::string bias_name = module + ".bias";
    const bool qkv = id.role == LinearRole::kQ || id.role == LinearRole::kK || id.role == LinearRole::kV;
    const bool required = config_.attention_bias && qkv;
    const bool allowed = required || (config_.attention_bias && id.role == LinearRole::kO);
    if (ckpt_.find(bias_name) != nullptr) {
      if (!allowed)
        return unsupported(where(bias_name) + "the config has no bias for this layer (attention_bias is " +
                           (config_.attention_bias ? "true" : "false") + "); refusing to drop it");
      LLMQ_RETURN_IF_ERROR(plain(bias_name, {rows}, &l.bias));
    } else if (required) {
      return invalid_argument(where(bias_name) + "missing (attention_bias is true)");
    }
    *out = std::move(l);
    return {};
  }

  bool has(const std::string& name) const { return ckpt_.find(name) != nullptr; }

 private:
  std::string where(const std::string& name) const { return ckpt_.dir() + ": tensor '" + name + "': "; }

  Status require(const std::string& name, const std::vector<int64_t>& shape, const SafetensorsTensorInfo** out) const {
    const SafetensorsTensorInfo* info = ckpt_.find(name);
    if (info == nullptr) return invalid_argument(where(name) + "missing from the checkpoint");
    if (info->shape != shape)
      return invalid_argument(where(name) + "expected shape " + shape_text(shape) + " from config.json, got " +
                              shape_text(info->shape));
    *out = info;
    return {};
  }

  const Checkpoint& ckpt_;
  const ModelConfig& config_;
  int64_t block_rows_;
  int64_t block_cols_;
};

}  // namespace

Status parse_hf_config(const std::string& json_text, ModelConfig* out) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const std::exception& e) {
    return invalid_argument(std::string("config.json: not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return invalid_argument("config.json: not a JSON object");

  ModelConfig c;
  LLMQ_RETURN_IF_ERROR(read_string(j, "model_type", true, &c.model_type));
  static const std::set<std::string> kSupported = {"llama", "mistral", "qwen2", "mixtral"};
  if (kSupported.count(c.model_type) == 0)
    return unsupported("config.json: model_type '" + c.model_type +
                       "' is not supported (llama, mistral, qwen2, mixtral)");
  const bool mixtral = c.model_type == "mixtral";

  LLMQ_RETURN_IF_ERROR(read_int(j, "hidden_size", true, &c.dim));
  LLMQ_RETURN_IF_ERROR(read_int(j, "intermediate_size", true, &c.hidden_dim));
  LLMQ_RETURN_IF_ERROR(read_int(j, "num_hidden_layers", true, &c.n_layers));
  LLMQ_RETURN_IF_ERROR(read_int(j, "num_attention_heads", true, &c.n_heads));
  LLMQ_RETURN_IF_ERROR(read_int(j, "vocab_size", true, &c.vocab_size));
  c.n_kv_heads = c.n_heads;  // no GQA unless stated
  LLMQ_RETURN_IF_ERROR(read_int(j, "num_key_value_heads", false, &c.n_kv_heads));
  c.head_dim = 0;
  LLMQ_RETURN_IF_ERROR(read_int(j, "head_dim", false, &c.head_dim));
  if (c.head_dim == 0 && c.n_heads > 0) {
    if (c.dim % c.n_heads != 0)
      return invalid_argument("config.json: head_dim: missing, and hidden_size " + std::to_string(c.dim) +
                              " is not a multiple of num_attention_heads " + std::to_string(c.n_heads));
    c.head_dim = c.dim / c.n_heads;
  }
  c.max_seq_len = 2048;
  LLMQ_RETURN_IF_ERROR(read_int(j, "max_position_embeddings", false, &c.max_seq_len));
  // transformers' class defaults where a config leaves a field out.
  c.norm_eps = mixtral ? 1e-5 : 1e-6;
  LLMQ_RETURN_IF_ERROR(read_double(j, "rms_norm_eps", false, &c.norm_eps));
  c.rope_theta = mixtral ? 1e6 : 10000.0;
  LLMQ_RETURN_IF_ERROR(read_double(j, "rope_theta", false, &c.rope_theta));
  if (const json* rs = field(j, "rope_scaling")) LLMQ_RETURN_IF_ERROR(parse_rope_scaling(*rs, &c.rope_scaling));
  c.rope_style = RopeStyle::kHalf;  // transformers' rotate_half
  c.tie_embeddings = false;
  LLMQ_RETURN_IF_ERROR(read_bool(j, "tie_word_embeddings", &c.tie_embeddings));
  c.attention_bias = c.model_type == "qwen2";
  LLMQ_RETURN_IF_ERROR(read_bool(j, "attention_bias", &c.attention_bias));

  // Things llmq's transformer does not compute: refuse rather than run a different model.
  bool mlp_bias = false;
  LLMQ_RETURN_IF_ERROR(read_bool(j, "mlp_bias", &mlp_bias));
  if (mlp_bias) return unsupported("config.json: mlp_bias: MLP biases are not supported");
  std::string act = "silu";
  LLMQ_RETURN_IF_ERROR(read_string(j, "hidden_act", false, &act));
  if (act != "silu") return unsupported("config.json: hidden_act: '" + act + "' is not supported (only silu)");
  // A sliding window only differs from full attention past the window, so the window bounds the
  // sequence length (Mistral v0.1: 4096; Qwen2 only when use_sliding_window is true).
  bool window_on = c.model_type != "qwen2";
  LLMQ_RETURN_IF_ERROR(read_bool(j, "use_sliding_window", &window_on));
  int64_t window = 0;
  LLMQ_RETURN_IF_ERROR(read_int(j, "sliding_window", false, &window));
  if (window_on && window > 0 && window < c.max_seq_len) c.max_seq_len = window;

  if (mixtral) {
    LLMQ_RETURN_IF_ERROR(read_int(j, "num_local_experts", true, &c.n_experts));
    LLMQ_RETURN_IF_ERROR(read_int(j, "num_experts_per_tok", true, &c.n_experts_per_token));
    if (c.n_experts <= 0) return invalid_argument("config.json: num_local_experts: must be positive");
  }
  LLMQ_RETURN_IF_ERROR(read_token_id(j, "bos_token_id", &c.bos_token));
  LLMQ_RETURN_IF_ERROR(read_token_id(j, "eos_token_id", &c.eos_token));
  // validate() names the ModelConfig field; the prefix names the file it came from.
  if (Status st = c.validate(); !st.ok()) return Status(st.code(), "config.json: " + st.message());
  *out = std::move(c);
  return {};
}

Status parse_hf_weight_block_size(const std::string& config_text, int64_t* rows, int64_t* cols) {
  *rows = *cols = kDefaultWeightBlock;
  const json j = json::parse(config_text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return {};  // parse_hf_config has already accepted it
  const json* qc = field(j, "quantization_config");
  if (qc == nullptr || !qc->is_object()) return {};
  const json* wbs = field(*qc, "weight_block_size");
  if (wbs == nullptr) return {};
  if (!wbs->is_array() || wbs->size() != 2 || !(*wbs)[0].is_number_integer() || !(*wbs)[1].is_number_integer() ||
      (*wbs)[0].get<int64_t>() <= 0 || (*wbs)[1].get<int64_t>() <= 0)
    return invalid_argument("config.json: quantization_config.weight_block_size: expected [rows, cols], got " +
                            wbs->dump());
  *rows = (*wbs)[0].get<int64_t>();
  *cols = (*wbs)[1].get<int64_t>();
  return {};
}

Status load_hf_model(const std::string& dir, ModelWeights* out) {
  std::unique_ptr<Checkpoint> ckpt;
  LLMQ_RETURN_IF_ERROR(Checkpoint::open(dir, &ckpt));
  ModelConfig config;
  const Status config_status = parse_hf_config(ckpt->config_json(), &config);
  if (!config_status.ok()) return Status(config_status.code(), dir + ": " + config_status.message());
  int64_t block_rows = 0, block_cols = 0;
  const Status block_status = parse_hf_weight_block_size(ckpt->config_json(), &block_rows, &block_cols);
  if (!block_status.ok()) return Status(block_status.code(), dir + ": " + block_status.message());

  // An absent lm_head means the classifier shares the embedding (transformers ties it).
  if (!config.tie_embeddings && ckpt->find("lm_head.weight") == nullptr) config.tie_embeddings = true;

  const HfLoader load(*ckpt, config, block_rows, block_cols);
  const int64_t dim = config.dim, hidden = config.hidden_dim;
  const int64_t q_out = config.n_heads * config.head_dim, kv_out = config.n_kv_heads * config.head_dim;

  ModelWeights w;
  w.config = config;
  LLMQ_RETURN_IF_ERROR(load.weight("model.embed_tokens", config.vocab_size, dim, &w.token_embedding));
  w.layers.resize(static_cast<size_t>(config.n_layers));
  for (int64_t i = 0; i < config.n_layers; ++i) {
    LayerWeights& layer = w.layers[static_cast<size_t>(i)];
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    LLMQ_RETURN_IF_ERROR(load.plain(prefix + "input_layernorm.weight", {dim}, &layer.attn_norm));
    LLMQ_RETURN_IF_ERROR(load.plain(prefix + "post_attention_layernorm.weight", {dim}, &layer.ffn_norm));
    LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kQ, -1}, q_out, dim, &layer.q));
    LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kK, -1}, kv_out, dim, &layer.k));
    LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kV, -1}, kv_out, dim, &layer.v));
    LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kO, -1}, dim, q_out, &layer.o));
    if (config.is_moe()) {
      LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kRouter, -1}, config.n_experts, dim, &layer.router));
      layer.experts.resize(static_cast<size_t>(config.n_experts));
      for (int64_t e = 0; e < config.n_experts; ++e) {
        Expert& ex = layer.experts[static_cast<size_t>(e)];
        LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kGate, e}, hidden, dim, &ex.gate));
        LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kUp, e}, hidden, dim, &ex.up));
        LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kDown, e}, dim, hidden, &ex.down));
      }
    } else {
      LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kGate, -1}, hidden, dim, &layer.mlp.gate));
      LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kUp, -1}, hidden, dim, &layer.mlp.up));
      LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kDown, -1}, dim, hidden, &layer.mlp.down));
    }
  }
  LLMQ_RETURN_IF_ERROR(load.plain("model.norm.weight", {dim}, &w.final_norm));
  w.lm_head.id = LinearId{-1, LinearRole::kLmHead, -1};
  if (config.tie_embeddings) {
    w.lm_head.weight = w.token_embedding;  // a copy: quantizing lm_head must not touch the embedding
  } else {
    LLMQ_RETURN_IF_ERROR(load.linear(w.lm_head.id, config.vocab_size, dim, &w.lm_head));
  }
  LLMQ_RETURN_IF_ERROR(w.check_finite(dir));
  *out = std::move(w);
  return {};
}

}  // namespace llmq
