// Each family's description, decided once: which features it switches on (ModelConfig, read by
// hf_config.cpp) and how its tensors lie on disk (FamilyLayout), and from the two the one
// enumeration of the tensors a config implies (visit_model_tensors). The checkpoint check, the
// float loader (hf_model.cpp), the export writer (weight_source.cpp) and the synthetic checkpoint
// writer all walk that enumeration; the GPU loaders ask FamilyLayout whether they can stream a
// checkpoint as is. In memory every family is the same ModelWeights (unfused q/k/v, gate/up, one
// Linear per expert, nn.Linear's [out, in] layout); only the disk layouts differ. Adding a family
// is its config keys (hf_config.cpp) and, if its tensors lie differently, a FamilyLayout switch
// and its cases here and in the loader.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "llmq/model.hpp"

namespace llmq {

struct FamilyLayout {
  // Phi-3: self_attn.qkv_proj.weight [q + 2 kv, dim] (rows q | k | v) and mlp.gate_up_proj.weight
  // [2 hidden, dim] (rows gate | up) instead of q/k/v_proj and gate/up_proj.
  bool fused_qkv = false;
  bool fused_gate_up = false;
  // gpt-oss: per layer mlp.experts.gate_up_proj [E, dim, 2 hidden] in x @ W layout, its columns
  // interleaved (gate, up, gate, up, ...), gate_up_proj_bias [E, 2 hidden], down_proj [E, hidden,
  // dim], down_proj_bias [E, dim]; or, MXFP4 (ModelConfig::experts_mxfp4), gate_up_proj_blocks U8
  // [E, 2 hidden, dim / 32, 16] and gate_up_proj_scales U8 [E, 2 hidden, dim / 32] (nn.Linear's
  // [out, in] orientation, 32 E2M1 values per block: low nibble first), and the same for down_proj.
  bool fused_experts = false;
  // attention_bias biases o_proj too (Llama, Qwen3, gpt-oss); Qwen2's biases only q/k/v.
  bool o_bias = false;
  // Whether the GPU loaders can stream the checkpoint tensor by tensor under these names (the
  // unfused layout); otherwise they go through the float loader.
  bool streams() const { return !fused_qkv && !fused_gate_up && !fused_experts; }
};

FamilyLayout family_layout(const ModelConfig& config);

// What one tensor of a checkpoint is to the model.
enum class TensorRole {
  kEmbedding,     // model.embed_tokens.weight [vocab, dim]
  kAttnNorm,      // input_layernorm [dim]
  kFfnNorm,       // post_attention_layernorm [dim]
  kQNorm,         // Qwen3: self_attn.q_norm [head_dim]
  kKNorm,         // Qwen3: self_attn.k_norm [head_dim]
  kSinks,         // gpt-oss: self_attn.sinks [n_heads]
  kLinearWeight,  // `linear`'s weight [out, in] (lm_head included)
  kLinearBias,    // `linear`'s bias [out]
  kFusedQkv,      // Phi-3: rows q | k | v
  kFusedGateUp,   // Phi-3: rows gate | up
  kExpertsGateUp, kExpertsGateUpBias, kExpertsDown, kExpertsDownBias,  // gpt-oss, fused (FamilyLayout)
  kExpertsGateUpBlocks, kExpertsGateUpScales, kExpertsDownBlocks, kExpertsDownScales,  // gpt-oss MXFP4
  kFinalNorm,     // model.norm [dim]
};

struct ModelTensor {
  std::string name;
  std::vector<int64_t> shape;
  TensorRole role = TensorRole::kEmbedding;
  int64_t layer = -1;       // per-layer roles
  LinearId linear;          // kLinearWeight / kLinearBias
  bool may_be_8bit = false; // a quantized checkpoint may store it in 8 bits (linear and embedding weights)
  bool mxfp4 = false;       // stored as U8 MXFP4 blocks or E8M0 scales
};

// Every tensor `config` implies, in checkpoint order, stopping at the first error `fn` returns.
// Lazy on purpose: a config claiming 10^9 layers fails at the first missing tensor, after at most
// as many steps as the checkpoint has tensors, instead of building 10^10 names first.
Status visit_model_tensors(const ModelConfig& config, const std::function<Status(const ModelTensor&)>& fn);

// MXFP4 E2M1 code (low 4 bits) as a float: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
float e2m1_value(int code);

}  // namespace llmq
