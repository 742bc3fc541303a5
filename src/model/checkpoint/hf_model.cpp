// Hugging Face Llama-family checkpoints (llama, mistral, qwen2, mixtral): config.json ->
// ModelConfig, and the safetensors weights, found by their transformers module names, -> float32
// ModelWeights. Every shape is checked against the config. 8-bit linear weights are dequantized on
// load: per-tensor or per-channel `weight_scale`, or block `weight_scale_inv` (vLLM's block FP8,
// where the "inverse" scale multiplies), with an optional `weight_zero_point`; which names and
// shapes those may have is checkpoint_names.hpp's, shared with the as-stored reader.
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "llmq/format.hpp"
#include "llmq/safetensors.hpp"
#include "model/checkpoint/checkpoint_names.hpp"
#include "core/int_math.hpp"

namespace llmq {
namespace {

using json = nlohmann::json;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
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
    const std::string name = module + kWeightSuffix;
    const SafetensorsTensorInfo* info = nullptr;
    LLMQ_RETURN_IF_ERROR(require(name, {rows, cols}, &info));
    if (is_high_precision(info->dtype)) return ckpt_.read_f32(name, out);
    if (info->dtype != DType::kE4M3 && info->dtype != DType::kE5M2 && info->dtype != DType::kI8)
      return unsupported(where(name) + "cannot dequantize a " + safetensors_dtype_name(info->dtype) + " weight");

    Tensor w;
    LLMQ_RETURN_IF_ERROR(ckpt_.read_f32(name, &w));  // raw codes as floats: q
    // Which scale, and which weight elements each of its elements covers: decided in
    // checkpoint_names.cpp, as for the as-stored reader (quantized_checkpoint.cpp).
    FoundWeightScale found;
    LLMQ_RETURN_IF_ERROR(find_weight_scale(ckpt_, module, rows, cols, block_rows_, block_cols_, &found));
    const std::string& scale_name = found.name;
    const std::vector<int64_t>& ss = found.info->shape;
    const ScaleLayout layout = found.layout;
    const int64_t grid_cols = ceil_div(cols, block_cols_);
    Tensor scale;
    LLMQ_RETURN_IF_ERROR(read_weight_scale(ckpt_, found, &scale));
    const float* s = scale.data_as<float>();

    // Optional zero point on the same grid as the scale: w = (q - zp) * s.
    Tensor zero_point;
    const std::string zp_name = module + kZeroPointSuffix;
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
        if (layout == ScaleLayout::kChannel) k = r;
        if (layout == ScaleLayout::kBlock) k = (r / block_rows_) * grid_cols + c / block_cols_;
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
    // Which linears have a bias is decided once, by check_hf_checkpoint (open_hf_checkpoint ran
    // it): a bias present here is one the config implies.
    const std::string bias_name = module + kBiasSuffix;
    if (ckpt_.find(bias_name) != nullptr) LLMQ_RETURN_IF_ERROR(plain(bias_name, {rows}, &l.bias));
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

Status load_hf_model(const std::string& dir, ModelWeights* out) {
  std::unique_ptr<Checkpoint> ckpt;
  ModelConfig config;
  LLMQ_RETURN_IF_ERROR(open_hf_checkpoint(dir, &ckpt, &config));
  int64_t block_rows = 0, block_cols = 0;
  const Status block_status = parse_hf_weight_block_size(ckpt->config_json(), &block_rows, &block_cols);
  if (!block_status.ok()) return Status(block_status.code(), dir + ": " + block_status.message());

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
