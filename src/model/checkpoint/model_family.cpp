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

float e2m1_value(int code) {
  static constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return kValues[code & 15];
}

}  // namespace llmq
