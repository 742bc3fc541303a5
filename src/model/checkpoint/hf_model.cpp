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

  // gpt-oss's fused experts of one layer (model_family.hpp), into per-expert linears: gate_up
  // [E, 2h, d] in [out, in] orientation, its outputs 2r and 2r + 1 being gate and up row r; its
  // bias [E, 2h] alike; down [E, d, h]; down's bias [E, d].
  void experts_gate_up(const Tensor& gate_up, std::vector<Expert>* experts) const {
    const int64_t h = config_.hidden_dim, d = config_.dim;
    const float* gu = gate_up.data_as<float>();
    for (size_t e = 0; e < experts->size(); ++e) {
      Expert& ex = (*experts)[e];
      ex.gate.weight = Tensor(DType::kF32, {h, d});
      ex.up.weight = Tensor(DType::kF32, {h, d});
      for (int64_t r = 0; r < h; ++r) {
        const float* g_row = gu + (static_cast<int64_t>(e) * 2 * h + 2 * r) * d;
        std::copy(g_row, g_row + d, ex.gate.weight.data_as<float>() + r * d);
        std::copy(g_row + d, g_row + 2 * d, ex.up.weight.data_as<float>() + r * d);
      }
    }
  }
  void experts_gate_up_bias(const Tensor& bias, std::vector<Expert>* experts) const {
    const int64_t h = config_.hidden_dim;
    for (size_t e = 0; e < experts->size(); ++e) {
      Expert& ex = (*experts)[e];
      ex.gate.bias = Tensor(DType::kF32, {h});
      ex.up.bias = Tensor(DType::kF32, {h});
      for (int64_t r = 0; r < h; ++r) {
        ex.gate.bias.data_as<float>()[r] = bias.data_as<float>()[static_cast<int64_t>(e) * 2 * h + 2 * r];
        ex.up.bias.data_as<float>()[r] = bias.data_as<float>()[static_cast<int64_t>(e) * 2 * h + 2 * r + 1];
      }
    }
  }
  void experts_down(const Tensor& down, std::vector<Expert>* experts) const {
    const int64_t n = config_.dim * config_.hidden_dim;
    for (size_t e = 0; e < experts->size(); ++e) {
      Tensor w(DType::kF32, {config_.dim, config_.hidden_dim});
      std::copy(down.data_as<float>() + static_cast<int64_t>(e) * n, down.data_as<float>() + (static_cast<int64_t>(e) + 1) * n,
                w.data_as<float>());
      (*experts)[e].down.weight = std::move(w);
    }
  }
  void experts_down_bias(const Tensor& bias, std::vector<Expert>* experts) const {
    const int64_t d = config_.dim;
    for (size_t e = 0; e < experts->size(); ++e) {
      Tensor b(DType::kF32, {d});
      std::copy(bias.data_as<float>() + static_cast<int64_t>(e) * d, bias.data_as<float>() + (static_cast<int64_t>(e) + 1) * d,
                b.data_as<float>());
      (*experts)[e].down.bias = std::move(b);
    }
  }

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
    if (cols % 32 != 0 || cols <= 0)
      return invalid_argument(where(base + "_blocks") + "an input width of " + std::to_string(cols) +
                              " is not whole MXFP4 blocks of 32");
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

 private:
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
  w.layers.resize(static_cast<size_t>(config.n_layers));
  // Every linear's id up front: fused tensors fill several linears at once.
  for (int64_t i = 0; i < config.n_layers; ++i) {
    LayerWeights& L = w.layers[static_cast<size_t>(i)];
    L.q.id = {i, LinearRole::kQ, -1}, L.k.id = {i, LinearRole::kK, -1}, L.v.id = {i, LinearRole::kV, -1};
    L.o.id = {i, LinearRole::kO, -1};
    if (config.is_moe()) {
      L.router.id = {i, LinearRole::kRouter, -1};
      L.experts.resize(static_cast<size_t>(config.n_experts));
      for (int64_t e = 0; e < config.n_experts; ++e) {
        Expert& ex = L.experts[static_cast<size_t>(e)];
        ex.gate.id = {i, LinearRole::kGate, e}, ex.up.id = {i, LinearRole::kUp, e}, ex.down.id = {i, LinearRole::kDown, e};
      }
    } else {
      L.mlp.gate.id = {i, LinearRole::kGate, -1}, L.mlp.up.id = {i, LinearRole::kUp, -1};
      L.mlp.down.id = {i, LinearRole::kDown, -1};
    }
  }
  w.lm_head.id = LinearId{-1, LinearRole::kLmHead, -1};
  // The tensors as the family's description enumerates them (model_family.hpp): each into its
  // place in ModelWeights, fused ones split.
  const Status st = visit_model_tensors(config, [&](const ModelTensor& t) -> Status {
    LayerWeights* L = t.layer >= 0 ? &w.layers[static_cast<size_t>(t.layer)] : nullptr;
    const std::string module = t.name.substr(0, t.name.rfind('.'));
    switch (t.role) {
      case TensorRole::kEmbedding: return load.weight(module, config.vocab_size, dim, &w.token_embedding);
      case TensorRole::kAttnNorm: return load.plain(t.name, t.shape, &L->attn_norm);
      case TensorRole::kFfnNorm: return load.plain(t.name, t.shape, &L->ffn_norm);
      case TensorRole::kQNorm: return load.plain(t.name, t.shape, &L->q_norm);
      case TensorRole::kKNorm: return load.plain(t.name, t.shape, &L->k_norm);
      case TensorRole::kSinks: return load.plain(t.name, t.shape, &L->sinks);
      case TensorRole::kFinalNorm: return load.plain(t.name, t.shape, &w.final_norm);
      case TensorRole::kLinearWeight: return load.weight(module, t.shape[0], t.shape[1], &w.find_linear(t.linear)->weight);
      case TensorRole::kLinearBias: return load.plain(t.name, t.shape, &w.find_linear(t.linear)->bias);
      case TensorRole::kFusedQkv:
        return load.split_rows(module, dim, {q_out, kv_out, kv_out}, {&L->q, &L->k, &L->v});
      case TensorRole::kFusedGateUp: return load.split_rows(module, dim, {hidden, hidden}, {&L->mlp.gate, &L->mlp.up});
      case TensorRole::kExpertsGateUp:
      case TensorRole::kExpertsDown: {  // stored [E, in, out] (x @ W): transposed to [out, in]
        Tensor stored;
        LLMQ_RETURN_IF_ERROR(load.plain(t.name, t.shape, &stored));
        const Tensor out_in = HfLoader::transpose_last(stored, t.shape[0], t.shape[1], t.shape[2]);
        if (t.role == TensorRole::kExpertsGateUp) load.experts_gate_up(out_in, &L->experts);
        else load.experts_down(out_in, &L->experts);
        return {};
      }
      case TensorRole::kExpertsGateUpBlocks:
      case TensorRole::kExpertsDownBlocks: {  // [E, out, in / 32, 16]; the scales come with them
        const std::string base = t.name.substr(0, t.name.size() - std::string("_blocks").size());
        Tensor out_in;
        LLMQ_RETURN_IF_ERROR(load.mxfp4(base, {t.shape[0], t.shape[1], t.shape[2] * 32}, &out_in));
        if (t.role == TensorRole::kExpertsGateUpBlocks) load.experts_gate_up(out_in, &L->experts);
        else load.experts_down(out_in, &L->experts);
        return {};
      }
      case TensorRole::kExpertsGateUpScales:
      case TensorRole::kExpertsDownScales: return {};  // read with their blocks
      case TensorRole::kExpertsGateUpBias:
      case TensorRole::kExpertsDownBias: {
        Tensor bias;
        LLMQ_RETURN_IF_ERROR(load.plain(t.name, t.shape, &bias));
        if (t.role == TensorRole::kExpertsGateUpBias) load.experts_gate_up_bias(bias, &L->experts);
        else load.experts_down_bias(bias, &L->experts);
        return {};
      }
    }
    return invalid_argument("unknown tensor role for " + t.name);
  });
  LLMQ_RETURN_IF_ERROR(st);
  if (config.tie_embeddings) w.lm_head.weight = w.token_embedding;  // a copy: quantizing lm_head must not touch the embedding
  LLMQ_RETURN_IF_ERROR(w.check_finite(dir));
  *out = std::move(w);
  return {};
}

}  // namespace llmq
