// A Llama-family model in memory: its configuration and its weights as float32 host tensors, in
// Hugging Face (nn.Linear, out x in) layout. Dense (Llama, Mistral, Qwen2, Qwen3, Phi-3) and MoE
// (Mixtral, Qwen3-MoE, gpt-oss). What differs between the families is a handful of switches in
// ModelConfig (which features are on) and the tensor names (model_family.hpp); the arithmetic of
// each switch is the CPU reference's (transformer.cpp).
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

// YaRN (rope_type "yarn", gpt-oss): inverse frequencies blended between interpolated and
// extrapolated by a linear ramp over the pair index, and cos / sin multiplied by attention_factor,
// as transformers' _compute_yarn_parameters.
struct YarnScaling {
  bool enabled = false;
  double factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_max_position = 4096;
  bool truncate = true;           // round the ramp's ends to whole pairs
  double attention_factor = 1.0;  // as given, or 0.1 ln(factor) + 1 (decided by the config reader)
};

// Feed-forward activation of the gate and up projections.
enum class GluActivation {
  kSilu,          // silu(gate) * up (Llama and every family but gpt-oss)
  kClampedSwiglu  // gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit), (u + 1) * g * sigmoid(alpha g)
};

// How an MoE router turns its logits into the weights of the chosen experts.
enum class MoeRouting {
  kSoftmaxTopK,  // Mixtral, Qwen3-MoE: softmax over all experts, then the top k (renormalised when moe_renormalize)
  kTopKSoftmax   // gpt-oss: the top k logits, then a softmax over those k
};

struct ModelConfig {
  // Which transformers class computes this model: llama, mistral, qwen2, mixtral, qwen3,
  // qwen3_moe, phi3, gpt_oss. Names the tensors (model_family.hpp) and the config written back.
  std::string model_type = "llama";
  int64_t dim = 0;                   // hidden_size
  int64_t hidden_dim = 0;            // intermediate_size (per expert for MoE)
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;              // dim / n_heads unless the config says otherwise
  int64_t vocab_size = 0;
  int64_t max_seq_len = 2048;
  // Sliding-window attention: a query at position p sees the keys at t with p - W < t <= p, W the
  // window in positions (0: none). window_layers says which layers attend through it (Qwen2/3's
  // max_window_layers or layer_types, gpt-oss's alternating layers); empty means every layer
  // (Mistral). layer_window(l) is the window of layer l, 0 for full attention.
  int64_t sliding_window = 0;
  std::vector<bool> window_layers;
  int64_t layer_window(int64_t layer) const {
    if (sliding_window <= 0) return 0;
    if (window_layers.empty()) return sliding_window;
    return layer >= 0 && layer < static_cast<int64_t>(window_layers.size()) && window_layers[static_cast<size_t>(layer)]
               ? sliding_window
               : 0;
  }
  bool has_window() const {
    for (int64_t l = 0; l < n_layers; ++l)
      if (layer_window(l) > 0) return true;
    return false;
  }
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  YarnScaling yarn;
  RopeStyle rope_style = RopeStyle::kHalf;
  bool tie_embeddings = false;
  // Which linears have biases: attention_bias q/k/v (and o, for Llama's and gpt-oss's meaning of
  // the key; the loader reads whichever the checkpoint check allowed). MoE biases (gpt-oss): the
  // router and every expert projection.
  bool attention_bias = false;
  bool qk_norm = false;              // Qwen3: RMSNorm over each head of q and k (weights [head_dim]) before RoPE
  bool attention_sinks = false;      // gpt-oss: one learned logit per query head in the softmax denominator
  GluActivation activation = GluActivation::kSilu;
  double glu_limit = 7.0;            // kClampedSwiglu
  double glu_alpha = 1.702;          // kClampedSwiglu
  int64_t n_experts = 0;             // 0: dense
  int64_t n_experts_per_token = 0;
  MoeRouting moe_routing = MoeRouting::kSoftmaxTopK;
  bool moe_renormalize = true;       // kSoftmaxTopK: the k weights divided by their sum (Qwen3-MoE's norm_topk_prob)
  bool moe_bias = false;             // gpt-oss: router and expert biases
  // Storage, not arithmetic: the checkpoint keeps gpt-oss's expert weights as MXFP4 blocks and
  // E8M0 scales (quantization_config.quant_method "mxfp4"); the loader dequantizes them exactly.
  bool experts_mxfp4 = false;
  // -1: the model has none (a Hugging Face config without bos_token_id / eos_token_id, or null): no
  // BOS is prepended to token-id prompts or evaluation windows, and generation does not stop on
  // token 1. llama2.c models have 1 and 2 (run.c's).
  int32_t bos_token = 1;
  int32_t eos_token = 2;
  bool is_moe() const { return n_experts > 0; }
  // The token a text sampled from the model starts after: BOS, or for a model without one the EOS
  // that separates its documents; -1: neither.
  int32_t text_start_token() const { return bos_token >= 0 ? bos_token : eos_token; }
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
  Tensor q_norm, k_norm;  // qk_norm: f32 [head_dim] each
  Tensor sinks;           // attention_sinks: f32 [n_heads]
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
  // The linear `id` names (lm_head, a layer's q..down or router, an expert's), or null when the
  // model has no such linear (a layer or expert out of range, an expert of a dense model).
  Linear* find_linear(const LinearId& id);
  const Linear* find_linear(const LinearId& id) const;
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
