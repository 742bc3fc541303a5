// A Llama-family model in memory: its configuration and its weights as float32 host tensors, in
// Hugging Face (nn.Linear, out x in) layout. Dense (Llama, Mistral, Qwen2) and Mixtral-style MoE.
// Loaders: load_llama2c (llama2.c .bin), load_hf_model (config.json + safetensors), and
// make_default_model (a seeded model llmq generates itself, so every command works without one).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "llmq/status.hpp"
#include "llmq/tensor.hpp"

namespace llmq {

// How RoPE pairs dimensions: llama2.c rotates adjacent pairs (2i, 2i+1); Hugging Face Llama
// rotates (i, i + head_dim/2) ("rotate_half"), its q/k weights being permuted to match.
enum class RopeStyle { kInterleaved, kHalf };

struct RopeScaling {  // Llama 3 "rope_type": "llama3"
  bool enabled = false;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
};

struct ModelConfig {
  std::string model_type = "llama";  // llama, mistral, qwen2, mixtral
  int64_t dim = 0;                   // hidden_size
  int64_t hidden_dim = 0;            // intermediate_size (per expert for MoE)
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;              // dim / n_heads unless the config says otherwise
  int64_t vocab_size = 0;
  int64_t max_seq_len = 2048;
  // Sliding-window attention (Mistral's sliding_window; Qwen2's when use_sliding_window puts some
  // layer in a window): the window in positions, 0 for none. llmq does not implement windows yet,
  // so sequences are limited to it; within the window a window and full attention agree exactly.
  int64_t sliding_window = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  RopeStyle rope_style = RopeStyle::kHalf;
  bool tie_embeddings = false;
  bool attention_bias = false;       // Qwen2: q/k/v have biases
  int64_t n_experts = 0;             // 0: dense
  int64_t n_experts_per_token = 0;
  int32_t bos_token = 1;
  int32_t eos_token = 2;
  bool is_moe() const { return n_experts > 0; }
  Status validate() const;  // errors name the field
};

// The roles of the linear layers, for calibration, quantization and naming.
enum class LinearRole { kQ, kK, kV, kO, kGate, kUp, kDown, kRouter, kLmHead };
const char* linear_role_name(LinearRole role);  // "q_proj", "gate_proj", ..., "lm_head"

struct LinearId {
  int64_t layer = -1;   // -1 for lm_head
  LinearRole role = LinearRole::kQ;
  int64_t expert = -1;  // MoE experts: 0 .. n_experts-1
  // The Hugging Face module name: "model.layers.3.self_attn.q_proj",
  // "model.layers.0.block_sparse_moe.experts.5.w1" (Mixtral), "lm_head".
  std::string hf_name(const ModelConfig& config) const;
};

// The weight shape [out, in] of a linear layer under `config`.
std::vector<int64_t> linear_shape(const ModelConfig& config, const LinearId& id);

struct Linear {
  LinearId id;
  Tensor weight;  // f32 [out, in]
  Tensor bias;    // f32 [out] or empty
};

struct Expert {
  Linear gate;  // w1 [hidden, dim]
  Linear up;    // w3 [hidden, dim]
  Linear down;  // w2 [dim, hidden]
};

struct LayerWeights {
  Tensor attn_norm;  // f32 [dim]
  Linear q, k, v, o;
  Tensor ffn_norm;   // f32 [dim]
  Expert mlp;        // dense models
  Linear router;     // MoE: [n_experts, dim]
  std::vector<Expert> experts;
};

struct ModelWeights {
  ModelConfig config;
  Tensor token_embedding;  // f32 [vocab, dim]
  std::vector<LayerWeights> layers;
  Tensor final_norm;       // f32 [dim]
  Linear lm_head;          // f32 [vocab, dim]; a copy of the embedding when tied
  // Every linear layer, in forward order (lm_head last): for calibration and quantization.
  std::vector<Linear*> linears();
  std::vector<const Linear*> linears() const;
  int64_t parameter_count() const;
  // NaN / Inf anywhere is an error naming the tensor, counts and first position (nonfinite.hpp);
  // `where` (the model's path) prefixes the message.
  Status check_finite(const std::string& where) const;
};

// llama2.c checkpoints: the legacy header of 7 int32 (negative vocab = unshared classifier) and
// the v1 format (magic "ak42", version 1, float32). Weights are float32.
Status load_llama2c(const std::string& path, ModelWeights* out);
// The same from a seekable stream (a file, or bytes in memory for the fuzz target); `source` names
// it in errors.
Status load_llama2c(const std::string& source, std::istream& in, ModelWeights* out);

// A seeded Llama-shaped model with the outlier channels and heavy-tailed activations of real LLMs
// (a few RMSNorm gains far above the rest feed outlier input channels to the next linears).
struct DefaultModelOptions {
  int64_t dim = 256;
  int64_t hidden_dim = 768;  // a multiple of 128, as real models (and FP8 block formats) have
  int64_t n_layers = 4;
  int64_t n_heads = 8;
  int64_t n_kv_heads = 4;
  int64_t vocab_size = 512;
  int64_t max_seq_len = 1024;
  int64_t n_experts = 0;  // > 0: Mixtral-style MoE
  int64_t n_experts_per_token = 2;
  uint64_t seed = 1;
};
ModelWeights make_default_model(const DefaultModelOptions& options = {});

}  // namespace llmq
