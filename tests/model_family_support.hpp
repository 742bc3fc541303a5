// Tiny models of each family (Qwen3, Qwen3-MoE, Phi-3, gpt-oss, windowed Mistral / Qwen2) with
// every feature of the family switched on and every tensor random (outliers included, nothing
// zero or one), and a writer of them as Hugging Face checkpoints in the family's own disk layout
// (fused Phi-3 projections, gpt-oss's fused and MXFP4 experts), written here from the published
// layouts rather than through llmq's writer. Shared by test_model_families.cpp (configs, loaders,
// MXFP4) and test_model_family_numerics.cpp (the forward pass against the double reference).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmq/model.hpp"
#include "llmq/safetensors.hpp"
#include "support.hpp"

namespace llmq {
namespace family_test {

using json = nlohmann::json;

// MXFP4's E2M1 values, written out here (not llmq's table).
constexpr float kE2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Normal(center, scale) with one element in 16 five times larger: the outlier channels of real
// models. Never exactly zero or one.
inline Tensor random_tensor(const std::vector<int64_t>& shape, std::mt19937_64& rng, float scale, float center = 0.0f) {
  Tensor t(DType::kF32, shape);
  std::normal_distribution<float> n(0.0f, scale);
  float* d = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    float v = n(rng) * ((rng() % 16) == 0 ? 5.0f : 1.0f) + center;
    if (v == 0.0f || v == 1.0f) v += scale * 0.125f;
    d[i] = v;
  }
  return t;
}

// A weight [out, in] whose every 32-element row group is an MXFP4 block: E2M1 codes times
// 2^(s - 127), s in [121, 127] (magnitudes up to 6).
inline Tensor mxfp4_tensor(int64_t out, int64_t in, std::mt19937_64& rng) {
  Tensor t(DType::kF32, {out, in});
  float* d = t.data_as<float>();
  for (int64_t g = 0; g < out * in / 32; ++g) {
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 7) - 6);
    for (int64_t i = 0; i < 32; ++i) d[g * 32 + i] = kE2M1[rng() % 16] * scale;
  }
  return t;
}

inline Linear make_linear(LinearId id, int64_t out, int64_t in, bool bias, std::mt19937_64& rng, float scale) {
  Linear l;
  l.id = id;
  l.weight = random_tensor({out, in}, rng, scale);
  if (bias) l.bias = random_tensor({out}, rng, 0.1f);
  return l;
}

// The families, each with its features on:
//   qwen3      q/k RMSNorm, attention biases (o too), windows on layers 1 and 2 (W = 5)
//   qwen3_moe  q/k RMSNorm, 4 experts top-2 without renormalisation
//   phi3       a window on every layer (W = 6); fused on disk
//   gpt_oss    4 experts top-2 (top-k then softmax), biases everywhere, sinks, clamped SwiGLU,
//              YaRN, windows on layers 0 and 2 (W = 4); experts MXFP4-exact, fused on disk
//   mistral    a window on every layer (W = 3)
inline ModelWeights family_model(const std::string& type, uint64_t seed = 7) {
  std::mt19937_64 rng(seed);
  ModelConfig c;
  c.model_type = type;
  c.dim = 64, c.hidden_dim = 64, c.n_layers = 3, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16;
  c.vocab_size = 96, c.max_seq_len = 256, c.norm_eps = 1e-5, c.rope_theta = 10000.0;
  c.bos_token = 1, c.eos_token = 2;
  if (type == "qwen3") {
    c.qk_norm = true;
    c.attention_bias = true;
    c.sliding_window = 5;
    c.window_layers = {false, true, true};
  } else if (type == "qwen3_moe") {
    c.qk_norm = true;
    c.n_experts = 4, c.n_experts_per_token = 2;
    c.moe_renormalize = false;
    c.hidden_dim = 32;
  } else if (type == "phi3") {
    c.sliding_window = 6;
  } else if (type == "gpt_oss") {
    c.attention_bias = true, c.attention_sinks = true, c.moe_bias = true;
    c.activation = GluActivation::kClampedSwiglu;
    c.moe_routing = MoeRouting::kTopKSoftmax;
    c.n_experts = 4, c.n_experts_per_token = 2;
    c.rope_theta = 150000.0;
    c.yarn.enabled = true, c.yarn.factor = 32.0, c.yarn.truncate = false, c.yarn.original_max_position = 64;
    c.yarn.attention_factor = 0.1 * std::log(32.0) + 1.0;
    c.sliding_window = 4;
    c.window_layers = {true, false, true};
  } else if (type == "mistral") {
    c.sliding_window = 3;
  }
  const int64_t q_out = c.n_heads * c.head_dim, kv_out = c.n_kv_heads * c.head_dim;
  const bool o_bias = c.attention_bias && type != "qwen2";
  ModelWeights w;
  w.config = c;
  w.token_embedding = random_tensor({c.vocab_size, c.dim}, rng, 1.0f);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerWeights L;
    L.attn_norm = random_tensor({c.dim}, rng, 0.1f, 1.0f);
    L.ffn_norm = random_tensor({c.dim}, rng, 0.1f, 1.0f);
    L.q = make_linear({l, LinearRole::kQ, -1}, q_out, c.dim, c.attention_bias, rng, 0.15f);
    L.k = make_linear({l, LinearRole::kK, -1}, kv_out, c.dim, c.attention_bias, rng, 0.15f);
    L.v = make_linear({l, LinearRole::kV, -1}, kv_out, c.dim, c.attention_bias, rng, 0.15f);
    L.o = make_linear({l, LinearRole::kO, -1}, c.dim, q_out, o_bias, rng, 0.1f);
    if (c.qk_norm) {
      L.q_norm = random_tensor({c.head_dim}, rng, 0.2f, 1.0f);
      L.k_norm = random_tensor({c.head_dim}, rng, 0.2f, 1.0f);
    }
    if (c.attention_sinks) L.sinks = random_tensor({c.n_heads}, rng, 1.0f, 0.5f);
    if (c.is_moe()) {
      L.router = make_linear({l, LinearRole::kRouter, -1}, c.n_experts, c.dim, c.moe_bias, rng, 0.3f);
      for (int64_t e = 0; e < c.n_experts; ++e) {
        Expert ex;
        if (type == "gpt_oss") {  // MXFP4-exact weights, large enough that the clamps at 7 engage
          ex.gate.id = {l, LinearRole::kGate, e}, ex.up.id = {l, LinearRole::kUp, e}, ex.down.id = {l, LinearRole::kDown, e};
          ex.gate.weight = mxfp4_tensor(c.hidden_dim, c.dim, rng);
          ex.up.weight = mxfp4_tensor(c.hidden_dim, c.dim, rng);
          ex.down.weight = mxfp4_tensor(c.dim, c.hidden_dim, rng);
          ex.gate.bias = random_tensor({c.hidden_dim}, rng, 0.5f);
          ex.up.bias = random_tensor({c.hidden_dim}, rng, 0.5f);
          ex.down.bias = random_tensor({c.dim}, rng, 0.1f);
        } else {
          ex.gate = make_linear({l, LinearRole::kGate, e}, c.hidden_dim, c.dim, c.moe_bias, rng, 0.15f);
          ex.up = make_linear({l, LinearRole::kUp, e}, c.hidden_dim, c.dim, c.moe_bias, rng, 0.15f);
          ex.down = make_linear({l, LinearRole::kDown, e}, c.dim, c.hidden_dim, c.moe_bias, rng, 0.15f);
        }
        L.experts.push_back(std::move(ex));
      }
    } else {
      L.mlp.gate = make_linear({l, LinearRole::kGate, -1}, c.hidden_dim, c.dim, false, rng, 0.15f);
      L.mlp.up = make_linear({l, LinearRole::kUp, -1}, c.hidden_dim, c.dim, false, rng, 0.15f);
      L.mlp.down = make_linear({l, LinearRole::kDown, -1}, c.dim, c.hidden_dim, false, rng, 0.15f);
    }
    w.layers.push_back(std::move(L));
  }
  w.final_norm = random_tensor({c.dim}, rng, 0.1f, 1.0f);
  w.lm_head = make_linear({-1, LinearRole::kLmHead, -1}, c.vocab_size, c.dim, false, rng, 0.2f);
  return w;
}

// ---- the checkpoint on disk

struct DiskTensorData {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

inline DiskTensorData f32(const std::string& name, const std::vector<int64_t>& shape, const float* data) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  DiskTensorData t{name, DType::kF32, shape, std::vector<uint8_t>(static_cast<size_t>(n * 4))};
  std::memcpy(t.bytes.data(), data, t.bytes.size());
  return t;
}
inline DiskTensorData f32(const std::string& name, const Tensor& t) { return f32(name, t.shape(), t.data_as<float>()); }

// The E2M1 code of v at scale 2^(s - 127), or -1.
inline int e2m1_code(float v, int s) {
  for (int c = 0; c < 16; ++c)
    if (kE2M1[c] * std::ldexp(1.0f, s - 127) == v && std::signbit(kE2M1[c]) == std::signbit(v)) return c;
  return -1;
}

// W [E][out, in] (nn.Linear orientation) as MXFP4 `<base>_blocks` [E, out, in/32, 16] and
// `<base>_scales` [E, out, in/32]: per group the smallest exponent that holds every value exactly.
inline void mxfp4_pack(const std::string& base, const std::vector<const float*>& experts, int64_t out, int64_t in,
                       std::vector<DiskTensorData>* tensors) {
  const int64_t E = static_cast<int64_t>(experts.size()), groups = out * in / 32;
  DiskTensorData blocks{base + "_blocks", DType::kU8, {E, out, in / 32, 16}, std::vector<uint8_t>(static_cast<size_t>(E * groups * 16))};
  DiskTensorData scales{base + "_scales", DType::kU8, {E, out, in / 32}, std::vector<uint8_t>(static_cast<size_t>(E * groups))};
  for (int64_t e = 0; e < E; ++e)
    for (int64_t g = 0; g < groups; ++g) {
      const float* v = experts[static_cast<size_t>(e)] + g * 32;
      int s = 0;
      for (; s < 255; ++s) {
        bool ok = true;
        for (int i = 0; i < 32 && ok; ++i) ok = e2m1_code(v[i], s) >= 0;
        if (ok) break;
      }
      ASSERT_LT(s, 255) << base << ": group " << g << " is not MXFP4";
      scales.bytes[static_cast<size_t>(e * groups + g)] = static_cast<uint8_t>(s);
      for (int i = 0; i < 16; ++i)
        blocks.bytes[static_cast<size_t>((e * groups + g) * 16 + i)] =
            static_cast<uint8_t>(e2m1_code(v[2 * i], s) | (e2m1_code(v[2 * i + 1], s) << 4));
    }
  tensors->push_back(std::move(blocks));
  tensors->push_back(std::move(scales));
}

// config.json as transformers 5 writes it for the family.
inline json family_config_json(const ModelConfig& c) {
  const std::string& t = c.model_type;
  json j = {{"model_type", t},
            {"hidden_size", c.dim},
            {"intermediate_size", c.hidden_dim},
            {"num_hidden_layers", c.n_layers},
            {"num_attention_heads", c.n_heads},
            {"num_key_value_heads", c.n_kv_heads},
            {"head_dim", c.head_dim},
            {"vocab_size", c.vocab_size},
            {"max_position_embeddings", c.max_seq_len},
            {"rms_norm_eps", c.norm_eps},
            {"tie_word_embeddings", c.tie_embeddings},
            {"hidden_act", "silu"},
            {"bos_token_id", c.bos_token},
            {"eos_token_id", c.eos_token},
            {"dtype", "float32"},
            {"transformers_version", "5.17.0"}};
  j["rope_parameters"] = {{"rope_theta", c.rope_theta}, {"rope_type", "default"}};
  json types = json::array();
  for (int64_t l = 0; l < c.n_layers; ++l) types.push_back(c.layer_window(l) > 0 ? "sliding_attention" : "full_attention");
  if (t == "qwen3") {
    j["architectures"] = {"Qwen3ForCausalLM"};
    j["attention_bias"] = c.attention_bias;
    j["use_sliding_window"] = c.sliding_window > 0;
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
    j["max_window_layers"] = 28;
    j["layer_types"] = types;
  } else if (t == "qwen3_moe") {
    j["architectures"] = {"Qwen3MoeForCausalLM"};
    j["attention_bias"] = c.attention_bias;
    j["num_local_experts"] = c.n_experts;
    j["num_experts_per_tok"] = c.n_experts_per_token;
    j["moe_intermediate_size"] = c.hidden_dim;
    j["norm_topk_prob"] = c.moe_renormalize;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = json::array();
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  } else if (t == "phi3") {
    j["architectures"] = {"Phi3ForCausalLM"};
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
    j["pad_token_id"] = 0;
    j["original_max_position_embeddings"] = c.max_seq_len;
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
  } else if (t == "gpt_oss") {
    j["architectures"] = {"GptOssForCausalLM"};
    j["attention_bias"] = c.attention_bias;
    j["num_local_experts"] = c.n_experts;
    j["num_experts_per_tok"] = c.n_experts_per_token;
    j["sliding_window"] = c.sliding_window;
    j["layer_types"] = types;
    j["rope_parameters"] = {{"rope_theta", c.rope_theta},   {"rope_type", "yarn"},   {"factor", c.yarn.factor},
                            {"beta_fast", c.yarn.beta_fast}, {"beta_slow", c.yarn.beta_slow},
                            {"truncate", c.yarn.truncate},   {"original_max_position_embeddings", c.yarn.original_max_position}};
  } else if (t == "mistral") {
    j["architectures"] = {"MistralForCausalLM"};
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  } else {
    j["architectures"] = {"LlamaForCausalLM"};
    j["attention_bias"] = c.attention_bias;
  }
  return j;
}

// The checkpoint of `w` in its family's layout (mxfp4: gpt-oss's experts as MXFP4 blocks).
inline std::vector<DiskTensorData> family_tensors(const ModelWeights& w, bool mxfp4) {
  const ModelConfig& c = w.config;
  const int64_t q_out = c.n_heads * c.head_dim, kv_out = c.n_kv_heads * c.head_dim, d = c.dim, h = c.hidden_dim;
  std::vector<DiskTensorData> out;
  auto linear = [&](const std::string& module, const Linear& l) {
    out.push_back(f32(module + ".weight", l.weight));
    if (l.bias.nbytes() > 0) out.push_back(f32(module + ".bias", l.bias));
  };
  out.push_back(f32("model.embed_tokens.weight", w.token_embedding));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const LayerWeights& L = w.layers[static_cast<size_t>(i)];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out.push_back(f32(p + "input_layernorm.weight", L.attn_norm));
    out.push_back(f32(p + "post_attention_layernorm.weight", L.ffn_norm));
    if (c.model_type == "phi3") {  // rows q | k | v
      std::vector<float> qkv;
      for (const Linear* l : {&L.q, &L.k, &L.v}) qkv.insert(qkv.end(), l->weight.data_as<float>(), l->weight.data_as<float>() + l->weight.numel());
      out.push_back(f32(p + "self_attn.qkv_proj.weight", {q_out + 2 * kv_out, d}, qkv.data()));
    } else {
      linear(p + "self_attn.q_proj", L.q);
      linear(p + "self_attn.k_proj", L.k);
      linear(p + "self_attn.v_proj", L.v);
    }
    linear(p + "self_attn.o_proj", L.o);
    if (c.qk_norm) {
      out.push_back(f32(p + "self_attn.q_norm.weight", L.q_norm));
      out.push_back(f32(p + "self_attn.k_norm.weight", L.k_norm));
    }
    if (c.attention_sinks) out.push_back(f32(p + "self_attn.sinks", L.sinks));
    if (c.model_type == "gpt_oss") {
      linear(p + "mlp.router", L.router);
      const std::string e = p + "mlp.experts.";
      const int64_t E = c.n_experts;
      // gate_up [E, d, 2h] (x @ W), columns gate, up interleaved; as [out, in]: rows 2r, 2r + 1.
      std::vector<float> gu_out(static_cast<size_t>(E * 2 * h * d)), gu_in(gu_out.size()), gub(static_cast<size_t>(E * 2 * h));
      std::vector<float> dn_in(static_cast<size_t>(E * h * d)), dnb(static_cast<size_t>(E * d));
      for (int64_t x = 0; x < E; ++x) {
        const Expert& ex = L.experts[static_cast<size_t>(x)];
        for (int64_t r = 0; r < h; ++r)
          for (int64_t k = 0; k < d; ++k) {
            const float g = ex.gate.weight.data_as<float>()[r * d + k], u = ex.up.weight.data_as<float>()[r * d + k];
            gu_out[static_cast<size_t>((x * 2 * h + 2 * r) * d + k)] = g;
            gu_out[static_cast<size_t>((x * 2 * h + 2 * r + 1) * d + k)] = u;
            gu_in[static_cast<size_t>((x * d + k) * 2 * h + 2 * r)] = g;
            gu_in[static_cast<size_t>((x * d + k) * 2 * h + 2 * r + 1)] = u;
          }
        for (int64_t r = 0; r < h; ++r) {
          gub[static_cast<size_t>(x * 2 * h + 2 * r)] = ex.gate.bias.data_as<float>()[r];
          gub[static_cast<size_t>(x * 2 * h + 2 * r + 1)] = ex.up.bias.data_as<float>()[r];
        }
        for (int64_t r = 0; r < d; ++r)
          for (int64_t k = 0; k < h; ++k) dn_in[static_cast<size_t>((x * h + k) * d + r)] = ex.down.weight.data_as<float>()[r * h + k];
        std::memcpy(dnb.data() + x * d, ex.down.bias.data_as<float>(), static_cast<size_t>(d) * 4);
      }
      if (mxfp4) {
        std::vector<const float*> gu_ptrs, dn_ptrs;
        for (int64_t x = 0; x < E; ++x) {
          gu_ptrs.push_back(gu_out.data() + x * 2 * h * d);
          dn_ptrs.push_back(L.experts[static_cast<size_t>(x)].down.weight.data_as<float>());
        }
        mxfp4_pack(e + "gate_up_proj", gu_ptrs, 2 * h, d, &out);
        out.push_back(f32(e + "gate_up_proj_bias", {E, 2 * h}, gub.data()));
        mxfp4_pack(e + "down_proj", dn_ptrs, d, h, &out);
      } else {
        out.push_back(f32(e + "gate_up_proj", {E, d, 2 * h}, gu_in.data()));
        out.push_back(f32(e + "gate_up_proj_bias", {E, 2 * h}, gub.data()));
        out.push_back(f32(e + "down_proj", {E, h, d}, dn_in.data()));
      }
      out.push_back(f32(e + "down_proj_bias", {E, d}, dnb.data()));
    } else if (c.is_moe()) {
      linear(p + "mlp.gate", L.router);
      for (int64_t x = 0; x < c.n_experts; ++x) {
        const Expert& ex = L.experts[static_cast<size_t>(x)];
        const std::string e = p + "mlp.experts." + std::to_string(x) + ".";
        linear(e + "gate_proj", ex.gate);
        linear(e + "up_proj", ex.up);
        linear(e + "down_proj", ex.down);
      }
    } else if (c.model_type == "phi3") {  // rows gate | up
      std::vector<float> gu(L.mlp.gate.weight.data_as<float>(), L.mlp.gate.weight.data_as<float>() + h * d);
      gu.insert(gu.end(), L.mlp.up.weight.data_as<float>(), L.mlp.up.weight.data_as<float>() + h * d);
      out.push_back(f32(p + "mlp.gate_up_proj.weight", {2 * h, d}, gu.data()));
      linear(p + "mlp.down_proj", L.mlp.down);
    } else {
      linear(p + "mlp.gate_proj", L.mlp.gate);
      linear(p + "mlp.up_proj", L.mlp.up);
      linear(p + "mlp.down_proj", L.mlp.down);
    }
  }
  out.push_back(f32("model.norm.weight", w.final_norm));
  if (!c.tie_embeddings) out.push_back(f32("lm_head.weight", w.lm_head.weight));
  return out;
}

inline void write_tensors(const std::string& path, const std::vector<DiskTensorData>& tensors) {
  std::vector<SafetensorsWriteEntry> entries;
  for (const DiskTensorData& t : tensors) {
    const DiskTensorData* p = &t;
    entries.push_back({t.name, t.dtype, t.shape, [p](uint8_t* dst) {
                         std::memcpy(dst, p->bytes.data(), p->bytes.size());
                         return Status();
                       }, nullptr});
  }
  const Status st = write_safetensors(path, entries);
  ASSERT_TRUE(st.ok()) << st.to_string();
}

inline void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  ASSERT_TRUE(f.good()) << path;
}

// A checkpoint directory `dir` (created) of `w` in its family's layout; `edit` may change the
// config and tensors first.
inline void write_family_checkpoint(const std::string& dir, const ModelWeights& w, bool mxfp4 = false,
                                    const std::function<void(json&, std::vector<DiskTensorData>&)>& edit = {}) {
  std::filesystem::create_directories(dir);
  json config = family_config_json(w.config);
  if (mxfp4)
    config["quantization_config"] = {{"quant_method", "mxfp4"},
                                     {"modules_to_not_convert", {"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                 "model.embed_tokens", "lm_head"}}};
  std::vector<DiskTensorData> tensors = family_tensors(w, mxfp4);
  if (edit) edit(config, tensors);
  write_text_file(dir + "/config.json", config.dump(2));
  write_tensors(dir + "/model.safetensors", tensors);
}

}  // namespace family_test
}  // namespace llmq
