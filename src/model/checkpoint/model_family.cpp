// FamilyLayout per model_type (model_family.hpp).
#include "model/checkpoint/model_family.hpp"

namespace llmq {

FamilyLayout family_layout(const ModelConfig& c) {
  FamilyLayout f;
  const std::string& t = c.model_type;
  f.fused_qkv = f.fused_gate_up = t == "phi3";
  f.fused_experts = t == "gpt_oss" && c.is_moe();
  f.o_bias = t == "llama" || t == "qwen3" || t == "qwen3_moe" || t == "gpt_oss";
  return f;
}

Status visit_model_tensors(const ModelConfig& c, const std::function<Status(const ModelTensor&)>& fn) {
  const FamilyLayout f = family_layout(c);
  const int64_t q_out = c.n_heads * c.head_dim, kv_out = c.n_kv_heads * c.head_dim;
  auto emit = [&fn](std::string name, std::vector<int64_t> shape, TensorRole role, int64_t layer, bool may_be_8bit = false,
                    bool mxfp4 = false) {
    ModelTensor t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.role = role;
    t.layer = layer;
    t.may_be_8bit = may_be_8bit;
    t.mxfp4 = mxfp4;
    return fn(t);
  };
  auto linear = [&](const LinearId& id, bool bias) -> Status {
    ModelTensor t;
    t.name = id.hf_name(c) + ".weight";
    t.shape = linear_shape(c, id);
    t.role = TensorRole::kLinearWeight;
    t.layer = id.layer;
    t.linear = id;
    t.may_be_8bit = true;
    LLMQ_RETURN_IF_ERROR(fn(t));
    if (!bias) return {};
    t.name = id.hf_name(c) + ".bias";
    t.shape = {t.shape[0]};
    t.role = TensorRole::kLinearBias;
    t.may_be_8bit = false;
    return fn(t);
  };
  LLMQ_RETURN_IF_ERROR(emit("model.embed_tokens.weight", {c.vocab_size, c.dim}, TensorRole::kEmbedding, -1, true));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LLMQ_RETURN_IF_ERROR(emit(p + "input_layernorm.weight", {c.dim}, TensorRole::kAttnNorm, i));
    LLMQ_RETURN_IF_ERROR(emit(p + "post_attention_layernorm.weight", {c.dim}, TensorRole::kFfnNorm, i));
    if (f.fused_qkv) {
      LLMQ_RETURN_IF_ERROR(emit(p + "self_attn.qkv_proj.weight", {q_out + 2 * kv_out, c.dim}, TensorRole::kFusedQkv, i, true));
    } else {
      for (LinearRole r : {LinearRole::kQ, LinearRole::kK, LinearRole::kV}) LLMQ_RETURN_IF_ERROR(linear({i, r, -1}, c.attention_bias));
    }
    LLMQ_RETURN_IF_ERROR(linear({i, LinearRole::kO, -1}, c.attention_bias && f.o_bias));
    if (c.qk_norm) {
      LLMQ_RETURN_IF_ERROR(emit(p + "self_attn.q_norm.weight", {c.head_dim}, TensorRole::kQNorm, i));
      LLMQ_RETURN_IF_ERROR(emit(p + "self_attn.k_norm.weight", {c.head_dim}, TensorRole::kKNorm, i));
    }
    if (c.attention_sinks) LLMQ_RETURN_IF_ERROR(emit(p + "self_attn.sinks", {c.n_heads}, TensorRole::kSinks, i));
    if (c.is_moe()) {
      LLMQ_RETURN_IF_ERROR(linear({i, LinearRole::kRouter, -1}, c.moe_bias));
      if (f.fused_experts) {
        const std::string e = p + "mlp.experts.";
        const int64_t E = c.n_experts, h = c.hidden_dim, d = c.dim;
        if (c.experts_mxfp4) {
          LLMQ_RETURN_IF_ERROR(emit(e + "gate_up_proj_blocks", {E, 2 * h, d / 32, 16}, TensorRole::kExpertsGateUpBlocks, i, false, true));
          LLMQ_RETURN_IF_ERROR(emit(e + "gate_up_proj_scales", {E, 2 * h, d / 32}, TensorRole::kExpertsGateUpScales, i, false, true));
        } else {
          LLMQ_RETURN_IF_ERROR(emit(e + "gate_up_proj", {E, d, 2 * h}, TensorRole::kExpertsGateUp, i));
        }
        LLMQ_RETURN_IF_ERROR(emit(e + "gate_up_proj_bias", {E, 2 * h}, TensorRole::kExpertsGateUpBias, i));
        if (c.experts_mxfp4) {
          LLMQ_RETURN_IF_ERROR(emit(e + "down_proj_blocks", {E, d, h / 32, 16}, TensorRole::kExpertsDownBlocks, i, false, true));
          LLMQ_RETURN_IF_ERROR(emit(e + "down_proj_scales", {E, d, h / 32}, TensorRole::kExpertsDownScales, i, false, true));
        } else {
          LLMQ_RETURN_IF_ERROR(emit(e + "down_proj", {E, h, d}, TensorRole::kExpertsDown, i));
        }
        LLMQ_RETURN_IF_ERROR(emit(e + "down_proj_bias", {E, d}, TensorRole::kExpertsDownBias, i));
      } else {
        for (int64_t e = 0; e < c.n_experts; ++e)
          for (LinearRole r : {LinearRole::kGate, LinearRole::kUp, LinearRole::kDown})
            LLMQ_RETURN_IF_ERROR(linear({i, r, e}, c.moe_bias));
      }
    } else if (f.fused_gate_up) {
      LLMQ_RETURN_IF_ERROR(emit(p + "mlp.gate_up_proj.weight", {2 * c.hidden_dim, c.dim}, TensorRole::kFusedGateUp, i, true));
      LLMQ_RETURN_IF_ERROR(linear({i, LinearRole::kDown, -1}, false));
    } else {
      for (LinearRole r : {LinearRole::kGate, LinearRole::kUp, LinearRole::kDown}) LLMQ_RETURN_IF_ERROR(linear({i, r, -1}, false));
    }
  }
  LLMQ_RETURN_IF_ERROR(emit("model.norm.weight", {c.dim}, TensorRole::kFinalNorm, -1));
  if (!c.tie_embeddings) LLMQ_RETURN_IF_ERROR(linear({-1, LinearRole::kLmHead, -1}, false));
  return {};
}

float e2m1_value(int code) {
  static constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return kValues[code & 15];
}

}  // namespace llmq
