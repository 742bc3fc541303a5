// How each family lays its tensors out on disk, decided once: the checkpoint check enumerates the
// tensors a config implies from it (checkpoint_check.cpp), the float loader reads them through it
// (hf_model.cpp), and the GPU loaders ask it whether they can stream a checkpoint as is. In memory
// every family is the same ModelWeights (unfused q/k/v, gate/up, one Linear per expert, nn.Linear's
// [out, in] layout); only these disk layouts differ.
#pragma once

#include <string>

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

// MXFP4 E2M1 code (low 4 bits) as a float: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
float e2m1_value(int code);

}  // namespace llmq
