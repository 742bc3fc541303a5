// Shapes of real models for synthetic GPU weights (gpu_runtime.hpp). Host-only, so that every
// build (with or without CUDA) can list and validate them.
#include "llmq/gpu_runtime.hpp"

namespace llmq {

std::vector<std::string> synthetic_model_names() {
  return {"llama3-8b", "llama3-70b", "llama2-7b", "mistral-7b", "qwen2-7b", "mixtral-8x7b", "gpt-oss-20b", "tiny",
          "tiny-moe"};
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
  } else if (name == "gpt-oss-20b") {
    // gpt-oss-20b's shapes (24 layers, 32 experts of 2880 -> 2880, top-4, 64 query heads of 64)
    // with Mixtral's MoE arithmetic: llmq does not model its attention sinks, sliding windows,
    // expert biases or clamped SwiGLU, which do not change what the expert GEMMs cost.
    c.model_type = "mixtral";
    c.dim = 2880, c.hidden_dim = 2880, c.n_layers = 24, c.n_heads = 64, c.n_kv_heads = 8, c.vocab_size = 201088;
    c.n_experts = 32, c.n_experts_per_token = 4;
    c.head_dim = 64;
    c.rope_theta = 150000.0;
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
