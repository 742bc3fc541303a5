// Shapes of real models for synthetic GPU weights (gpu_runtime.hpp). Host-only, so that every
// build (with or without CUDA) can list and validate them.
#include <cmath>

#include "llmq/gpu_runtime.hpp"

namespace llmq {

std::vector<std::string> synthetic_model_names() {
  return {"llama3-8b", "llama3-70b", "llama2-7b", "mistral-7b", "qwen2-7b", "qwen3-8b", "qwen3-32b", "mixtral-8x7b",
          "qwen3-30b-a3b", "gpt-oss-20b", "gpt-oss-120b", "tiny", "tiny-moe"};
}

Status synthetic_model_config(const std::string& name, ModelConfig* out) {
  ModelConfig c;
  c.model_type = "llama";
  c.rope_style = RopeStyle::kHalf;
  c.max_seq_len = 131072;
  if (name == "llama3-8b" || name == "llama3-70b") {
    const bool big = name == "llama3-70b";
    c.dim = big ? 8192 : 4096;
    c.hidden_dim = big ? 28672 : 14336;
    c.n_layers = big ? 80 : 32;
    c.n_heads = big ? 64 : 32;
    c.n_kv_heads = 8;
    c.vocab_size = 128256;
    c.rope_theta = 500000.0;
    c.rope_scaling.enabled = true;
    c.norm_eps = 1e-5;
  } else if (name == "llama2-7b") {
    c.dim = 4096, c.hidden_dim = 11008, c.n_layers = 32, c.n_heads = 32, c.n_kv_heads = 32, c.vocab_size = 32000;
    c.max_seq_len = 4096;
  } else if (name == "mistral-7b") {
    c.model_type = "mistral";
    c.dim = 4096, c.hidden_dim = 14336, c.n_layers = 32, c.n_heads = 32, c.n_kv_heads = 8, c.vocab_size = 32000;
    c.rope_theta = 1000000.0;
    c.max_seq_len = 32768;
  } else if (name == "qwen2-7b") {
    c.model_type = "qwen2";
    c.dim = 3584, c.hidden_dim = 18944, c.n_layers = 28, c.n_heads = 28, c.n_kv_heads = 4, c.vocab_size = 152064;
    c.rope_theta = 1000000.0;
    c.attention_bias = true;
    c.norm_eps = 1e-6;
    c.max_seq_len = 32768;
  } else if (name == "mixtral-8x7b") {
    c.model_type = "mixtral";
    c.dim = 4096, c.hidden_dim = 14336, c.n_layers = 32, c.n_heads = 32, c.n_kv_heads = 8, c.vocab_size = 32000;
    c.n_experts = 8, c.n_experts_per_token = 2;
    c.rope_theta = 1000000.0;
    c.max_seq_len = 32768;
  } else if (name == "qwen3-8b" || name == "qwen3-32b") {
    // Qwen3 dense: q/k RMSNorm, head_dim 128 whatever hidden / heads is, untied.
    const bool big = name == "qwen3-32b";
    c.model_type = "qwen3";
    c.dim = big ? 5120 : 4096, c.hidden_dim = big ? 25600 : 12288, c.n_layers = big ? 64 : 36;
    c.n_heads = big ? 64 : 32, c.n_kv_heads = 8, c.head_dim = 128, c.vocab_size = 151936;
    c.qk_norm = true;
    c.rope_theta = 1000000.0;
    c.norm_eps = 1e-6;
    c.max_seq_len = 40960;
  } else if (name == "qwen3-30b-a3b") {
    // Qwen3-MoE: 128 experts of 768, top-8, weights renormalised (norm_topk_prob), q/k RMSNorm.
    c.model_type = "qwen3_moe";
    c.dim = 2048, c.hidden_dim = 768, c.n_layers = 48, c.n_heads = 32, c.n_kv_heads = 4, c.head_dim = 128;
    c.vocab_size = 151936;
    c.n_experts = 128, c.n_experts_per_token = 8;
    c.moe_renormalize = true;
    c.qk_norm = true;
    c.rope_theta = 1000000.0;
    c.norm_eps = 1e-6;
    c.max_seq_len = 40960;
  } else if (name == "gpt-oss-20b" || name == "gpt-oss-120b") {
    // gpt-oss: 64 query heads of 64 with sinks, attention and MoE biases, experts of 2880 -> 2880
    // (32 or 128, top-4, top-k then softmax, clamped SwiGLU), YaRN (factor 32 over 4096
    // positions), a 128-position window on the even layers.
    c.model_type = "gpt_oss";
    c.dim = 2880, c.hidden_dim = 2880, c.n_layers = name == "gpt-oss-120b" ? 36 : 24;
    c.n_heads = 64, c.n_kv_heads = 8, c.head_dim = 64, c.vocab_size = 201088;
    c.n_experts = name == "gpt-oss-120b" ? 128 : 32, c.n_experts_per_token = 4;
    c.attention_bias = true, c.attention_sinks = true, c.moe_bias = true;
    c.activation = GluActivation::kClampedSwiglu;
    c.moe_routing = MoeRouting::kTopKSoftmax;
    c.rope_theta = 150000.0;
    c.yarn.enabled = true, c.yarn.factor = 32.0, c.yarn.original_max_position = 4096, c.yarn.truncate = false;
    c.yarn.attention_factor = 0.1 * std::log(32.0) + 1.0;
    c.sliding_window = 128;
    for (int64_t l = 0; l < c.n_layers; ++l) c.window_layers.push_back(l % 2 == 0);
    c.bos_token = 199998, c.eos_token = 200002;
  } else if (name == "tiny-moe") {
    c.model_type = "mixtral";
    c.dim = 256, c.hidden_dim = 512, c.n_layers = 2, c.n_heads = 8, c.n_kv_heads = 4, c.vocab_size = 512;
    c.n_experts = 8, c.n_experts_per_token = 2;
    c.max_seq_len = 4096;
  } else if (name == "tiny") {
    c.dim = 256, c.hidden_dim = 768, c.n_layers = 2, c.n_heads = 8, c.n_kv_heads = 4, c.vocab_size = 512;
    c.max_seq_len = 4096;
  } else {
    std::string known;
    for (const std::string& n : synthetic_model_names()) known += (known.empty() ? "" : ", ") + n;
    return invalid_argument("synthetic model '" + name + "': known shapes are " + known);
  }
  if (c.head_dim == 0) c.head_dim = c.dim / c.n_heads;
  *out = c;
  return c.validate();
}

}  // namespace llmq
