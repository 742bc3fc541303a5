// The reference forward pass of a Llama-family model on the CPU, in float32: RMSNorm, RoPE
// (interleaved or rotate-half, Llama 3 or YaRN scaling), per-head q/k RMSNorm (Qwen3), grouped-query
// attention with a KV cache, sliding windows per layer and attention sinks (gpt-oss), SwiGLU or
// gpt-oss's clamped SwiGLU, and MoE routing (softmax then top-k, optionally renormalised; or top-k
// then softmax).
// Every linear layer goes through a LinearBackend, so the same forward pass runs in float, through
// llmq's quantized reference GEMM in any scheme, or with calibration observers attached.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "llmq/model.hpp"
#include "llmq/quant_attention.hpp"
#include "llmq/status.hpp"

namespace llmq {

// RoPE inverse frequencies for pair j of a head: 1 / theta^(2j / head_dim), in float as both
// run.c (powf) and Hugging Face (a float32 tensor) compute it, then Llama 3 scaling if enabled
// (transformers' _compute_llama3_parameters, also in float32). The angle of position p is
// float(p) * inv_freq[j], in float; the GPU runtime's cos/sin table is built from the same values.
// YaRN: the inverse frequencies of _compute_yarn_parameters (see YarnScaling).
std::vector<float> rope_inv_freq(const ModelConfig& config);
// What cos and sin are multiplied by after the angle (YaRN's attention factor; 1 otherwise).
float rope_attention_factor(const ModelConfig& config);

class LinearBackend {
 public:
  virtual ~LinearBackend() = default;
  // y[rows, out] = x[rows, in] * W^T (+ bias), for the linear layer `linear`.
  virtual Status forward(const Linear& linear, const float* x, int64_t rows, float* y) = 0;
};

// Plain float32 matmul (accumulation in float32, ascending k): the unquantized baseline.
class FloatLinearBackend : public LinearBackend {
 public:
  Status forward(const Linear& linear, const float* x, int64_t rows, float* y) override;
};

class Transformer {
 public:
  // `weights` and `backend` must outlive the Transformer. backend == nullptr: float.
  Transformer(const ModelWeights& weights, LinearBackend* backend = nullptr);

  // Run `n` tokens at positions start_pos .. start_pos + n - 1 (the cache holds what came
  // before); logits is [n, vocab]. Errors: position past max_seq_len, token out of range.
  Status forward(const int32_t* tokens, int64_t n, int64_t start_pos, float* logits);
  void reset();  // empty the KV cache

  // The KV cache of positions [first, first + n) as K and V buffers of [n_layers, n, n_kv_heads *
  // head_dim] floats: the values attention reads (after RoPE; E4M3-rounded when that cache is on).
  // write_kv sets them (the cache grows as forward's does), so that a forward from position
  // first + n continues a sequence whose KV was computed by an earlier forward, maybe in another
  // Transformer (the serving engine's paged CPU backend keeps KV in blocks); read_kv returns
  // positions an earlier forward or write_kv wrote.
  Status write_kv(int64_t first, int64_t n, const float* k, const float* v);
  Status read_kv(int64_t first, int64_t n, float* k, float* v) const;
  const ModelConfig& config() const { return weights_.config; }

  // An FP8 E4M3 KV cache, as the GPU runtime's --kv-cache e4m3 keeps it: each K (after RoPE) and V
  // element is stored as code = e4m3(x * (1 / scale)) (round to nearest even, saturating) and read
  // as code * scale, one scale per layer and KV head ([n_layers * n_kv_heads] each, layer-major).
  // Empty vectors: float cache (the default). Takes effect for positions written afterwards.
  Status set_kv_cache_e4m3(std::vector<float> k_scales, std::vector<float> v_scales);
  // Calibration statistics of the KV cache: the largest |K| and |V| per layer and KV head over the
  // positions written since the last reset ([n_layers * n_kv_heads] each; E4M3 scales are these
  // over 448).
  void kv_absmax(std::vector<float>* k, std::vector<float>* v) const;

  // Called in every layer of forward() with the inputs of its attention, after RoPE and the cache
  // write: q [n, n_heads, head_dim] of the n new positions, and the layer's K and V for positions
  // 0 .. kv_len - 1 ([kv_len, n_kv_heads, head_dim]; the new positions are the last n). For
  // studying attention on real activations (llmq attention-accuracy --model).
  using AttentionObserver = std::function<void(int64_t layer, const float* q, int64_t n, const float* k,
                                               const float* v, int64_t kv_len)>;
  void set_attention_observer(AttentionObserver observer) { attention_observer_ = std::move(observer); }

  // Attention computed by the 8-bit specification (quant_attention.hpp) instead of in float:
  // what an 8-bit attention kernel costs in accuracy, on the real Q/K/V of every layer. kFloat
  // (the default) restores run.c's float attention.
  void set_attention_options(const QuantAttentionOptions& options) { attention_options_ = options; }

 private:
  const ModelWeights& weights_;
  FloatLinearBackend float_backend_;
  LinearBackend* backend_;
  int64_t reserve_cache(int64_t end_pos);  // grows the cache to hold end_pos positions; its capacity
  std::vector<float> key_cache_;    // [layer, max_seq, n_kv_heads * head_dim]
  std::vector<float> value_cache_;  // same
  int64_t cached_positions_ = 0;    // positions 0 .. cached_positions_ - 1 have been written
  std::vector<float> kv_k_scales_, kv_v_scales_;  // E4M3 cache scales (empty: float cache)
  AttentionObserver attention_observer_;
  QuantAttentionOptions attention_options_{AttentionVariant::kFloat};  // kFloat: run.c's float attention
};

}  // namespace llmq
