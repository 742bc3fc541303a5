// hf_config_json: a ModelConfig as the config.json of the family that computes it, in
// transformers 4's spelling, which transformers 5, vLLM and llmq all read.
#include <nlohmann/json.hpp>

#include "llmq/export.hpp"

namespace llmq {

// The model_type a ModelConfig is written as: its own family where transformers' class computes
// exactly what llmq does and the tensors are written under that class's names. A Llama-shaped
// MoE is a Mixtral; Phi-3's fused tensors are written unfused, so it becomes a Llama (or, with
// its window, a Mistral); a windowed Llama becomes a Mistral (a Qwen2 with q/k/v biases).
std::string hf_written_model_type(const ModelConfig& c) {
  std::string type = c.model_type;
  if (type == "phi3") type = "llama";
  if (c.is_moe() && type != "qwen3_moe" && type != "gpt_oss") type = "mixtral";
  if (type == "llama" && c.sliding_window > 0) type = c.attention_bias ? "qwen2" : "mistral";
  return type;
}

// Written in transformers 4's spelling (top-level rope_theta / rope_scaling), which transformers 5,
// vLLM and llmq all read.
std::string hf_config_json(const ModelConfig& c) {
  nlohmann::ordered_json j;
  // The config's own family: a Qwen2 model written as "llama" with attention_bias would make
  // transformers expect an o_proj bias (Llama's attention_bias biases o_proj too) and start it
  // from random weights.
  const std::string type = hf_written_model_type(c);
  const char* arch = type == "mixtral"     ? "MixtralForCausalLM"
                     : type == "mistral"   ? "MistralForCausalLM"
                     : type == "qwen2"     ? "Qwen2ForCausalLM"
                     : type == "qwen3"     ? "Qwen3ForCausalLM"
                     : type == "qwen3_moe" ? "Qwen3MoeForCausalLM"
                     : type == "gpt_oss"   ? "GptOssForCausalLM"
                                           : "LlamaForCausalLM";
  const bool qwen = type == "qwen2" || type == "qwen3" || type == "qwen3_moe";
  j["architectures"] = {arch};
  j["model_type"] = type;
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.hidden_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.enabled)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_max_position}};
  if (c.yarn.enabled)
    j["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", c.yarn.factor},
                         {"beta_fast", c.yarn.beta_fast},
                         {"beta_slow", c.yarn.beta_slow},
                         {"truncate", c.yarn.truncate},
                         {"attention_factor", c.yarn.attention_factor},
                         {"original_max_position_embeddings", c.yarn.original_max_position}};
  // gpt-oss's class takes YaRN when a config names no RoPE: its plain RoPE must be written out.
  if (type == "gpt_oss" && !c.yarn.enabled && !c.rope_scaling.enabled) j["rope_scaling"] = {{"rope_type", "default"}};
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["hidden_act"] = "silu";
  // Qwen2 biases q/k/v by its type; Mistral and Mixtral never.
  if (type == "llama" || type == "qwen3" || type == "qwen3_moe" || type == "gpt_oss") j["attention_bias"] = c.attention_bias;
  // -1 (none) as transformers writes it: null.
  j["bos_token_id"] = c.bos_token >= 0 ? nlohmann::ordered_json(c.bos_token) : nlohmann::ordered_json(nullptr);
  j["eos_token_id"] = c.eos_token >= 0 ? nlohmann::ordered_json(c.eos_token) : nlohmann::ordered_json(nullptr);
  j["torch_dtype"] = "bfloat16";
  // Which layers attend through the window: layer_types (5.x; gpt-oss's class would alternate
  // without it); for 4.x Qwen readers also max_window_layers, exact when the windowed layers are a
  // suffix (0: every layer).
  nlohmann::ordered_json types = nlohmann::ordered_json::array();
  for (int64_t l = 0; l < c.n_layers; ++l) types.push_back(c.layer_window(l) > 0 ? "sliding_attention" : "full_attention");
  if (type == "gpt_oss" || (c.sliding_window > 0 && !c.window_layers.empty() && (type == "qwen2" || type == "qwen3")))
    j["layer_types"] = types;
  if (c.sliding_window > 0) {
    if (qwen) j["use_sliding_window"] = true;
    j["sliding_window"] = c.sliding_window;
    if (type == "qwen2" || type == "qwen3") {
      int64_t first_windowed = c.n_layers;
      for (int64_t l = c.n_layers - 1; l >= 0 && c.layer_window(l) > 0; --l) first_windowed = l;
      j["max_window_layers"] = first_windowed;
    }
  } else if (type != "llama") {
    j["sliding_window"] = nullptr;  // explicit: an absent key means a window to Mistral, Qwen, gpt-oss
  }
  if (c.is_moe()) {
    j[type == "qwen3_moe" ? "num_experts" : "num_local_experts"] = c.n_experts;
    j["num_experts_per_tok"] = c.n_experts_per_token;
  }
  if (type == "qwen3_moe") {
    j["moe_intermediate_size"] = c.hidden_dim;
    j["norm_topk_prob"] = c.moe_renormalize;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = nlohmann::ordered_json::array();
  }
  return j.dump(2);
}

}  // namespace llmq
