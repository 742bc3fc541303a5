// ModelConfig validation, linear-layer names and the weight inventory.
#include "llmq/model.hpp"

#include <cstdio>

#include "llmq/nonfinite.hpp"

namespace llmq {
namespace {

// Whether the product of the (positive) factors (times 8 bytes, the widest element the loaders and the
// KV cache use) fits int64.
bool bytes_fit(const int64_t (&factors)[4]) {
  int64_t p = 8;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(p, f, &p)) return false;
  return true;
}

// A double for a message: "1e-09", not std::to_string's "0.000000".
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

}  // namespace

Status ModelConfig::validate() const {
  auto positive = [](int64_t v, const char* field) -> Status {
    if (v <= 0) return invalid_argument(std::string("config.") + field + ": must be positive, got " + std::to_string(v));
    return {};
  };
  LLMQ_RETURN_IF_ERROR(positive(dim, "dim (hidden_size)"));
  LLMQ_RETURN_IF_ERROR(positive(hidden_dim, "hidden_dim (intermediate_size)"));
  LLMQ_RETURN_IF_ERROR(positive(n_layers, "n_layers (num_hidden_layers)"));
  LLMQ_RETURN_IF_ERROR(positive(n_heads, "n_heads (num_attention_heads)"));
  LLMQ_RETURN_IF_ERROR(positive(n_kv_heads, "n_kv_heads (num_key_value_heads)"));
  LLMQ_RETURN_IF_ERROR(positive(head_dim, "head_dim"));
  LLMQ_RETURN_IF_ERROR(positive(vocab_size, "vocab_size"));
  LLMQ_RETURN_IF_ERROR(positive(max_seq_len, "max_seq_len (max_position_embeddings)"));
  if (n_heads % n_kv_heads != 0)
    return invalid_argument("config.n_kv_heads: " + std::to_string(n_kv_heads) + " does not divide n_heads " +
                            std::to_string(n_heads));
  if (head_dim % 2 != 0) return invalid_argument("config.head_dim: RoPE needs an even head_dim, got " + std::to_string(head_dim));
  if (n_experts < 0 || (n_experts > 0 && (n_experts_per_token <= 0 || n_experts_per_token > n_experts)))
    return invalid_argument("config.n_experts_per_token: need 1 <= k <= n_experts (" + std::to_string(n_experts) +
                            "), got " + std::to_string(n_experts_per_token));
  if (sliding_window < 0)
    return invalid_argument("config.sliding_window: must be 0 (none) or positive, got " + std::to_string(sliding_window));
  // A corrupt config can hold sizes whose products overflow int64 where loaders and the transformer
  // form them (q_proj rows = n_heads * head_dim, vocab x dim tensors, the KV cache): undefined
  // behaviour there, so they are refused here, naming the product.
  const int64_t experts = n_experts > 0 ? n_experts : 1;
  const struct {
    const char* what;
    int64_t factors[4];  // unused ones are 1
  } products[] = {
      {"vocab_size x dim", {vocab_size, dim, 1, 1}},
      {"n_heads x head_dim x dim", {n_heads, head_dim, dim, 1}},
      {"n_experts x hidden_dim x dim", {experts, hidden_dim, dim, 1}},
      {"n_layers x max_seq_len x n_kv_heads x head_dim (the KV cache)", {n_layers, max_seq_len, n_kv_heads, head_dim}},
  };
  for (const auto& p : products)
    if (!bytes_fit(p.factors)) return invalid_argument(std::string("config: ") + p.what + " overflows int64");
  // Caps on each size. Real models sit far below them (Llama 3.1 405B: hidden 16384, intermediate
  // 53248, 126 layers, 128 heads, head_dim 128, vocab 128256, 131072 positions; the largest MoE
  // have a few hundred experts, top-8; Llama 4 Scout: 10M positions), so a value past a cap is a
  // corrupt or hostile file, and refusing it here keeps every loader (llama2.c included) from
  // sizing a buffer, a loop or a tensor list by it before a single weight has been checked.
  const struct {
    const char* field;
    int64_t value;
    int64_t cap;
  } caps[] = {
      {"dim (hidden_size)", dim, int64_t{1} << 17},
      {"hidden_dim (intermediate_size)", hidden_dim, int64_t{1} << 20},
      {"n_layers (num_hidden_layers)", n_layers, 4096},
      {"n_heads (num_attention_heads)", n_heads, 4096},
      {"n_kv_heads (num_key_value_heads)", n_kv_heads, 4096},
      {"head_dim", head_dim, 4096},
      {"vocab_size", vocab_size, int64_t{1} << 24},
      {"max_seq_len (max_position_embeddings)", max_seq_len, int64_t{1} << 26},
      {"n_experts (num_local_experts)", n_experts, 4096},
      {"sliding_window", sliding_window, int64_t{1} << 26},
  };
  for (const auto& c : caps)
    if (c.value > c.cap)
      return invalid_argument(std::string("config.") + c.field + ": " + std::to_string(c.value) +
                              " is beyond what any real model has (at most " + std::to_string(c.cap) + ")");
  // An id outside the vocabulary would index past the embedding (BOS) or never match a sampled
  // token (EOS); -1 says the model has none.
  const struct {
    const char* field;
    int32_t id;
  } tokens[] = {{"bos_token (bos_token_id)", bos_token}, {"eos_token (eos_token_id)", eos_token}};
  for (const auto& t : tokens)
    if (t.id < -1 || t.id >= vocab_size)
      return invalid_argument(std::string("config.") + t.field + ": " + std::to_string(t.id) +
                              " is outside the vocabulary [0, " + std::to_string(vocab_size) + ") and not -1 (none)");
  // Negated comparisons so that NaN fails too.
  if (!(norm_eps > 0 && norm_eps <= 0.1))
    return invalid_argument("config.norm_eps (rms_norm_eps): must be in (0, 0.1], got " + num(norm_eps));
  // 1e12 is far above every published theta (Llama 3: 5e5; long-context models: 1e8 or so) and
  // keeps theta^(2j/d) finite in float.
  if (!(rope_theta > 0 && rope_theta <= 1e12))
    return invalid_argument("config.rope_theta: must be finite and in (0, 1e12], got " + num(rope_theta));
  if (rope_scaling.enabled) {
    const RopeScaling& r = rope_scaling;
    auto finite_positive = [](double v) { return v > 0 && v <= 1e12; };  // false for NaN and Inf
    if (!finite_positive(r.factor))
      return invalid_argument("config.rope_scaling.factor: must be finite and positive, got " + num(r.factor));
    if (!finite_positive(r.low_freq_factor))
      return invalid_argument("config.rope_scaling.low_freq_factor: must be finite and positive, got " +
                              num(r.low_freq_factor));
    // Llama 3's smoothing divides by high_freq_factor - low_freq_factor.
    if (!finite_positive(r.high_freq_factor) || !(r.high_freq_factor > r.low_freq_factor))
      return invalid_argument("config.rope_scaling.high_freq_factor: must be finite and above low_freq_factor (" +
                              num(r.low_freq_factor) + "), got " + num(r.high_freq_factor));
    if (r.original_max_position <= 0 || r.original_max_position > (int64_t{1} << 26))
      return invalid_argument("config.rope_scaling.original_max_position_embeddings: must be in [1, 2^26], got " +
                              std::to_string(r.original_max_position));
  }
  if (yarn.enabled) {
    const YarnScaling& y = yarn;
    auto finite_positive = [](double v) { return v > 0 && v <= 1e12; };
    if (rope_scaling.enabled) return invalid_argument("config.rope: llama3 and yarn scaling at once");
    if (!finite_positive(y.factor)) return invalid_argument("config.rope_parameters.factor: must be finite and positive, got " + num(y.factor));
    if (!finite_positive(y.beta_fast) || !finite_positive(y.beta_slow))
      return invalid_argument("config.rope_parameters.beta_fast / beta_slow: must be finite and positive, got " +
                              num(y.beta_fast) + " / " + num(y.beta_slow));
    if (!finite_positive(y.attention_factor))
      return invalid_argument("config.rope_parameters.attention_factor: must be finite and positive, got " +
                              num(y.attention_factor));
    if (y.original_max_position <= 0 || y.original_max_position > (int64_t{1} << 26))
      return invalid_argument("config.rope_parameters.original_max_position_embeddings: must be in [1, 2^26], got " +
                              std::to_string(y.original_max_position));
  }
  if (!window_layers.empty() && static_cast<int64_t>(window_layers.size()) != n_layers)
    return invalid_argument("config.window_layers: " + std::to_string(window_layers.size()) + " entries for " +
                            std::to_string(n_layers) + " layers");
  if (activation == GluActivation::kClampedSwiglu && (!(glu_limit > 0 && glu_limit < 1e6) || !(glu_alpha > 0 && glu_alpha < 1e6)))
    return invalid_argument("config.swiglu_limit / alpha: must be finite and positive, got " + num(glu_limit) + " / " +
                            num(glu_alpha));
  if (moe_bias && n_experts <= 0) return invalid_argument("config.moe_bias: set on a dense model");
  return {};
}

const char* linear_role_name(LinearRole role) {
  switch (role) {
    case LinearRole::kQ: return "q_proj";
    case LinearRole::kK: return "k_proj";
    case LinearRole::kV: return "v_proj";
    case LinearRole::kO: return "o_proj";
    case LinearRole::kGate: return "gate_proj";
    case LinearRole::kUp: return "up_proj";
    case LinearRole::kDown: return "down_proj";
    case LinearRole::kRouter: return "router";
    case LinearRole::kLmHead: return "lm_head";
  }
  return "?";
}

// The module names of the unfused families as transformers saves them. Phi-3's fused qkv_proj /
// gate_up_proj and gpt-oss's fused expert tensors are split on load into these same linears,
// named as the unfused families name them (model_family.cpp maps them to the tensors on disk).
std::string LinearId::hf_name(const ModelConfig& config) const {
  if (role == LinearRole::kLmHead) return "lm_head";
  const std::string layer_prefix = "model.layers." + std::to_string(layer) + ".";
  const std::string& type = config.model_type;
  switch (role) {
    case LinearRole::kQ:
    case LinearRole::kK:
    case LinearRole::kV:
    case LinearRole::kO: return layer_prefix + "self_attn." + linear_role_name(role);
    case LinearRole::kRouter:
      return layer_prefix + (type == "qwen3_moe" ? "mlp.gate" : type == "gpt_oss" ? "mlp.router" : "block_sparse_moe.gate");
    default: break;
  }
  if (config.is_moe()) {
    if (type == "qwen3_moe" || type == "gpt_oss")
      return layer_prefix + "mlp.experts." + std::to_string(expert) + "." + linear_role_name(role);
    // Mixtral: w1 = gate, w3 = up, w2 = down.
    const char* w = role == LinearRole::kGate ? "w1" : role == LinearRole::kUp ? "w3" : "w2";
    return layer_prefix + "block_sparse_moe.experts." + std::to_string(expert) + "." + w;
  }
  return layer_prefix + "mlp." + linear_role_name(role);
}

std::vector<int64_t> linear_shape(const ModelConfig& c, const LinearId& id) {
  const int64_t q_out = c.n_heads * c.head_dim, kv_out = c.n_kv_heads * c.head_dim;
  switch (id.role) {
    case LinearRole::kQ: return {q_out, c.dim};
    case LinearRole::kK:
    case LinearRole::kV: return {kv_out, c.dim};
    case LinearRole::kO: return {c.dim, q_out};
    case LinearRole::kGate:
    case LinearRole::kUp: return {c.hidden_dim, c.dim};
    case LinearRole::kDown: return {c.dim, c.hidden_dim};
    case LinearRole::kRouter: return {c.n_experts, c.dim};
    case LinearRole::kLmHead: return {c.vocab_size, c.dim};
  }
  return {};
}

namespace {

template <typename Weights, typename Out>
void collect_linears(Weights& w, Out* out) {
  for (auto& layer : w.layers) {
    out->push_back(&layer.q);
    out->push_back(&layer.k);
    out->push_back(&layer.v);
    out->push_back(&layer.o);
    if (w.config.is_moe()) {
      out->push_back(&layer.router);
      for (auto& e : layer.experts) {
        out->push_back(&e.gate);
        out->push_back(&e.up);
        out->push_back(&e.down);
      }
    } else {
      out->push_back(&layer.mlp.gate);
      out->push_back(&layer.mlp.up);
      out->push_back(&layer.mlp.down);
    }
  }
  out->push_back(&w.lm_head);
}

}  // namespace

std::vector<Linear*> ModelWeights::linears() {
  std::vector<Linear*> out;
  collect_linears(*this, &out);
  return out;
}

std::vector<const Linear*> ModelWeights::linears() const {
  std::vector<const Linear*> out;
  collect_linears(*this, &out);
  return out;
}

namespace {

template <typename Weights, typename L>
L* linear_of(Weights& w, const LinearId& id) {
  if (id.role == LinearRole::kLmHead) return &w.lm_head;
  if (id.layer < 0 || id.layer >= static_cast<int64_t>(w.layers.size())) return nullptr;
  auto& layer = w.layers[static_cast<size_t>(id.layer)];
  switch (id.role) {
    case LinearRole::kQ: return &layer.q;
    case LinearRole::kK: return &layer.k;
    case LinearRole::kV: return &layer.v;
    case LinearRole::kO: return &layer.o;
    case LinearRole::kRouter: return &layer.router;
    default: break;
  }
  if (id.expert < 0) {
    if (id.role == LinearRole::kGate) return &layer.mlp.gate;
    if (id.role == LinearRole::kUp) return &layer.mlp.up;
    return &layer.mlp.down;
  }
  if (id.expert >= static_cast<int64_t>(layer.experts.size())) return nullptr;
  auto& e = layer.experts[static_cast<size_t>(id.expert)];
  return id.role == LinearRole::kGate ? &e.gate : id.role == LinearRole::kUp ? &e.up : &e.down;
}

}  // namespace

Linear* ModelWeights::find_linear(const LinearId& id) { return linear_of<ModelWeights, Linear>(*this, id); }
const Linear* ModelWeights::find_linear(const LinearId& id) const {
  return linear_of<const ModelWeights, const Linear>(*this, id);
}

int64_t ModelWeights::parameter_count() const {
  int64_t n = token_embedding.numel() + final_norm.numel();
  for (const auto& layer : layers) {
    n += layer.attn_norm.numel() + layer.ffn_norm.numel();
    // nbytes, not numel: an absent tensor's empty shape has numel() 1.
    for (const Tensor* t : {&layer.q_norm, &layer.k_norm, &layer.sinks})
      if (t->nbytes() > 0) n += t->numel();
  }
  for (const Linear* l : linears()) {
    if (l->id.role == LinearRole::kLmHead && config.tie_embeddings) continue;
    n += l->weight.numel() + l->bias.numel();
  }
  return n;
}

Status ModelWeights::check_finite(const std::string& where) const {
  auto check = [&where](const std::string& name, const Tensor& t) -> Status {
    if (t.nbytes() == 0) return {};
    const NonFiniteCount c = count_nonfinite(t.data_as<float>(), t.numel());
    if (c.total() == 0) return {};
    Tensor copy = t;  // the policy's message, without modifying the model
    const Status st = apply_nonfinite_policy(name, NonFinitePolicy::kError, &copy);
    return {st.code(), where + ": " + st.message()};
  };
  LLMQ_RETURN_IF_ERROR(check("model.embed_tokens.weight", token_embedding));
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LLMQ_RETURN_IF_ERROR(check(p + "input_layernorm.weight", layers[i].attn_norm));
    LLMQ_RETURN_IF_ERROR(check(p + "post_attention_layernorm.weight", layers[i].ffn_norm));
    if (layers[i].q_norm.nbytes() > 0) LLMQ_RETURN_IF_ERROR(check(p + "self_attn.q_norm.weight", layers[i].q_norm));
    if (layers[i].k_norm.nbytes() > 0) LLMQ_RETURN_IF_ERROR(check(p + "self_attn.k_norm.weight", layers[i].k_norm));
    if (layers[i].sinks.nbytes() > 0) LLMQ_RETURN_IF_ERROR(check(p + "self_attn.sinks", layers[i].sinks));
  }
  LLMQ_RETURN_IF_ERROR(check("model.norm.weight", final_norm));
  for (const Linear* l : linears()) {
    LLMQ_RETURN_IF_ERROR(check(l->id.hf_name(config) + ".weight", l->weight));
    LLMQ_RETURN_IF_ERROR(check(l->id.hf_name(config) + ".bias", l->bias));
  }
  return {};
}

}  // namespace llmq
