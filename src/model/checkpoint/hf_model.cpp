// Hugging Face Llama-family checkpoints (llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, phi3,
// gpt_oss): config.json -> ModelConfig, and the safetensors weights, found by their transformers
// module names (each family's disk layout: model_family.hpp), -> float32 ModelWeights. Every shape is checked against the config. 8-bit linear weights are dequantized on
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
#include "model/checkpoint/model_family.hpp"
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

  // A fused weight [rows, cols] (Phi-3's qkv_proj / gate_up_proj), dequantized like any weight,
  // cut into consecutive row ranges: parts[i] gets rows [sum of counts before i, + counts[i]).
  Status split_rows(const std::string& module, int64_t cols, const std::vector<int64_t>& counts,
                    const std::vector<Linear*>& parts) const {
    int64_t rows = 0;
    for (int64_t n : counts) rows += n;
    Tensor w;
    LLMQ_RETURN_IF_ERROR(weight(module, rows, cols, &w));
    int64_t first = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      Tensor t(DType::kF32, {counts[i], cols});
      std::copy(w.data_as<float>() + first * cols, w.data_as<float>() + (first + counts[i]) * cols, t.data_as<float>());
      parts[i]->weight = std::move(t);
      first += counts[i];
    }
    return {};
  }

  // gpt-oss's fused experts of one layer (model_family.hpp), as per-expert gate / up / down
  // linears with their biases: gate_up's interleaved outputs 2r and 2r + 1 are gate and up row r.
  Status fused_experts(int64_t layer, const std::string& prefix, std::vector<Expert>* experts) const {
    const int64_t E = config_.n_experts, h = config_.hidden_dim, d = config_.dim;
    Tensor gate_up, down, gate_up_bias, down_bias;  // gate_up [E, 2h, d], down [E, d, h]: [out, in]
    if (config_.experts_mxfp4) {
      LLMQ_RETURN_IF_ERROR(mxfp4(prefix + "gate_up_proj", {E, 2 * h, d}, &gate_up));
      LLMQ_RETURN_IF_ERROR(mxfp4(prefix + "down_proj", {E, d, h}, &down));
    } else {  // stored [E, in, out] (x @ W): transposed here
      Tensor a, b;
      LLMQ_RETURN_IF_ERROR(plain(prefix + "gate_up_proj", {E, d, 2 * h}, &a));
      LLMQ_RETURN_IF_ERROR(plain(prefix + "down_proj", {E, h, d}, &b));
      gate_up = transpose_last(a, E, d, 2 * h);
      down = transpose_last(b, E, h, d);
    }
    LLMQ_RETURN_IF_ERROR(plain(prefix + "gate_up_proj_bias", {E, 2 * h}, &gate_up_bias));
    LLMQ_RETURN_IF_ERROR(plain(prefix + "down_proj_bias", {E, d}, &down_bias));
    experts->assign(static_cast<size_t>(E), Expert{});
    const float* gu = gate_up.data_as<float>();
    const float* gub = gate_up_bias.data_as<float>();
    for (int64_t e = 0; e < E; ++e) {
      Expert& ex = (*experts)[static_cast<size_t>(e)];
      ex.gate.id = {layer, LinearRole::kGate, e};
      ex.up.id = {layer, LinearRole::kUp, e};
      ex.down.id = {layer, LinearRole::kDown, e};
      ex.gate.weight = Tensor(DType::kF32, {h, d});
      ex.up.weight = Tensor(DType::kF32, {h, d});
      ex.gate.bias = Tensor(DType::kF32, {h});
      ex.up.bias = Tensor(DType::kF32, {h});
      for (int64_t r = 0; r < h; ++r) {
        const float* g_row = gu + (e * 2 * h + 2 * r) * d;
        std::copy(g_row, g_row + d, ex.gate.weight.data_as<float>() + r * d);
        std::copy(g_row + d, g_row + 2 * d, ex.up.weight.data_as<float>() + r * d);
        ex.gate.bias.data_as<float>()[r] = gub[e * 2 * h + 2 * r];
        ex.up.bias.data_as<float>()[r] = gub[e * 2 * h + 2 * r + 1];
      }
      ex.down.weight = Tensor(DType::kF32, {d, h});
      std::copy(down.data_as<float>() + e * d * h, down.data_as<float>() + (e + 1) * d * h, ex.down.weight.data_as<float>());
      ex.down.bias = Tensor(DType::kF32, {d});
      std::copy(down_bias.data_as<float>() + e * d, down_bias.data_as<float>() + (e + 1) * d, ex.down.bias.data_as<float>());
    }
    return {};
  }

 private:
  std::string where(const std::string& name) const { return ckpt_.dir() + ": tensor '" + name + "': "; }

  // [n, a, b] -> [n, b, a]
  static Tensor transpose_last(const Tensor& t, int64_t n, int64_t a, int64_t b) {
    Tensor out(DType::kF32, {n, b, a});
    const float* src = t.data_as<float>();
    float* dst = out.data_as<float>();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t x = 0; x < a; ++x)
        for (int64_t y = 0; y < b; ++y) dst[(i * b + y) * a + x] = src[(i * a + x) * b + y];
    return out;
  }

  // MXFP4 `<base>_blocks` U8 [E, out, in / 32, 16] and `<base>_scales` U8 [E, out, in / 32] as
  // float32 [E, out, in]: element 2i of a block is the low nibble of byte i, 2i + 1 the high one,
  // each an E2M1 value times 2^(scale - 127). Every such product is exact in float32 (and BF16),
  // so this equals transformers' convert_moe_packed_tensors bit for bit. A scale of 255 is E8M0's
  // NaN: refused, naming the tensor.
  Status mxfp4(const std::string& base, const std::vector<int64_t>& shape, Tensor* out) const {
    const int64_t E = shape[0], rows = shape[1], cols = shape[2];
    const std::string blocks_name = base + "_blocks", scales_name = base + "_scales";
    TensorView blocks, scales;
    LLMQ_RETURN_IF_ERROR(ckpt_.view(blocks_name, &blocks));
    LLMQ_RETURN_IF_ERROR(ckpt_.view(scales_name, &scales));
    if (blocks.dtype != DType::kU8 || blocks.shape != std::vector<int64_t>{E, rows, cols / 32, 16})
      return invalid_argument(where(blocks_name) + "expected U8 " + shape_text({E, rows, cols / 32, 16}) + ", got " +
                              dtype_name(blocks.dtype) + " " + shape_text(blocks.shape));
    if (scales.dtype != DType::kU8 || scales.shape != std::vector<int64_t>{E, rows, cols / 32})
      return invalid_argument(where(scales_name) + "expected U8 " + shape_text({E, rows, cols / 32}) + ", got " +
                              dtype_name(scales.dtype) + " " + shape_text(scales.shape));
    const uint8_t* b = static_cast<const uint8_t*>(blocks.data);
    const uint8_t* s = static_cast<const uint8_t*>(scales.data);
    Tensor w(DType::kF32, {E, rows, cols});
    float* dst = w.data_as<float>();
    const int64_t groups = E * rows * (cols / 32);
    for (int64_t g = 0; g < groups; ++g) {
      if (s[g] == 255)
        return invalid_argument(where(scales_name) + "element " + std::to_string(g) +
                                " is 255, E8M0's NaN: no MXFP4 block has that scale");
      const float scale = std::ldexp(1.0f, static_cast<int>(s[g]) - 127);
      for (int64_t i = 0; i < 16; ++i) {
        const uint8_t byte = b[g * 16 + i];
        dst[g * 32 + 2 * i] = e2m1_value(byte & 15) * scale;
        dst[g * 32 + 2 * i + 1] = e2m1_value(byte >> 4) * scale;
      }
    }
    *out = std::move(w);
    return {};
  }

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
  const FamilyLayout family = family_layout(config);
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
    if (family.fused_qkv) {
      layer.q.id = {i, LinearRole::kQ, -1};
      layer.k.id = {i, LinearRole::kK, -1};
      layer.v.id = {i, LinearRole::kV, -1};
      LLMQ_RETURN_IF_ERROR(
          load.split_rows(prefix + "self_attn.qkv_proj", dim, {q_out, kv_out, kv_out}, {&layer.q, &layer.k, &layer.v}));
    } else {
      LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kQ, -1}, q_out, dim, &layer.q));
      LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kK, -1}, kv_out, dim, &layer.k));
      LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kV, -1}, kv_out, dim, &layer.v));
    }
    LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kO, -1}, dim, q_out, &layer.o));
    if (config.qk_norm) {
      LLMQ_RETURN_IF_ERROR(load.plain(prefix + "self_attn.q_norm.weight", {config.head_dim}, &layer.q_norm));
      LLMQ_RETURN_IF_ERROR(load.plain(prefix + "self_attn.k_norm.weight", {config.head_dim}, &layer.k_norm));
    }
    if (config.attention_sinks) LLMQ_RETURN_IF_ERROR(load.plain(prefix + "self_attn.sinks", {config.n_heads}, &layer.sinks));
    if (config.is_moe() && family.fused_experts) {
      LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kRouter, -1}, config.n_experts, dim, &layer.router));
      LLMQ_RETURN_IF_ERROR(load.fused_experts(i, prefix + "mlp.experts.", &layer.experts));
    } else if (config.is_moe()) {
      LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kRouter, -1}, config.n_experts, dim, &layer.router));
      layer.experts.resize(static_cast<size_t>(config.n_experts));
      for (int64_t e = 0; e < config.n_experts; ++e) {
        Expert& ex = layer.experts[static_cast<size_t>(e)];
        LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kGate, e}, hidden, dim, &ex.gate));
        LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kUp, e}, hidden, dim, &ex.up));
        LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kDown, e}, dim, hidden, &ex.down));
      }
    } else if (family.fused_gate_up) {
      layer.mlp.gate.id = {i, LinearRole::kGate, -1};
      layer.mlp.up.id = {i, LinearRole::kUp, -1};
      LLMQ_RETURN_IF_ERROR(load.split_rows(prefix + "mlp.gate_up_proj", dim, {hidden, hidden}, {&layer.mlp.gate, &layer.mlp.up}));
      LLMQ_RETURN_IF_ERROR(load.linear({i, LinearRole::kDown, -1}, dim, hidden, &layer.mlp.down));
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
