// Hugging Face checkpoints loaded as models (load_hf_model): tiny models written by the test in
// every storage the loader reads (float, BF16, FP8/INT8 with per-tensor, per-channel and block
// scales), compared tensor by tensor, and the errors that name the tensor.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmq/safetensors.hpp"
#include "safetensors_test_support.hpp"
#include "support.hpp"


namespace llmq {
namespace {

using namespace safetensors_test;  // NOLINT: the suite's shared helpers

// ---------------------------------------------------------------------------------------------
// Tiny models written by the test and loaded with load_hf_model

// How a test checkpoint stores a linear weight, and so what the loader must undo.
enum class WeightStore {
  kF32,
  kBF16,
  kE4M3PerChannel,        // weight_scale [out] (+ an input_scale the loader ignores)
  kE4M3PerChannelColumn,  // weight_scale [out, 1]
  kE5M2PerTensor,         // weight_scale [1], stored as BF16
  kE4M3PerTensorScalar,   // weight_scale [] (shape-less scalar)
  kI8ZeroPoint,           // weight_scale [out] and weight_zero_point [out] (I8)
  kE4M3Block,             // weight_scale_inv [ceil(out / bm), ceil(in / bk)]
  kE4M3NoScale,           // an error
  kE4M3BadScale,          // weight_scale [out + 1]: an error
};

// Collects tensors to write and the float32 values loading must produce for each.
class CheckpointBuilder {
 public:
  explicit CheckpointBuilder(uint64_t seed) : seed_(seed) {}

  void f32(const std::string& name, const std::vector<int64_t>& shape) {
    const std::vector<float> v = llmq::testing::normal_vector(numel_of(shape), seed_++, 0.5f);
    add(raw_entry(name, DType::kF32, shape, f32_bytes(v)), v);
  }
  void bf16(const std::string& name, const std::vector<int64_t>& shape) { typed(name, DType::kBF16, shape); }
  // Random codes of `dtype`; the expectation is their decoded value.
  void typed(const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
    const std::vector<uint8_t> bytes = random_elements(dtype, numel_of(shape), seed_++);
    std::vector<float> v(static_cast<size_t>(numel_of(shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = element_value(dtype, bytes, static_cast<int64_t>(i));
    add(raw_entry(name, dtype, shape, bytes), v);
  }
  // Written but never loaded (rotary inv_freq, activation scales).
  void extra(const std::string& name, const std::vector<int64_t>& shape) {
    entries_.push_back(raw_entry(name, DType::kF32, shape, random_elements(DType::kF32, numel_of(shape), seed_++)));
  }

  void linear_weight(const std::string& module, int64_t out, int64_t in, WeightStore store) {
    const std::string name = module + ".weight";
    std::mt19937_64 rng(seed_++);
    std::uniform_real_distribution<float> scale_dist(1e-3f, 2e-2f);
    switch (store) {
      case WeightStore::kF32: f32(name, {out, in}); return;
      case WeightStore::kBF16: bf16(name, {out, in}); return;
      default: break;
    }
    const DType dtype = store == WeightStore::kE5M2PerTensor ? DType::kE5M2
                        : store == WeightStore::kI8ZeroPoint ? DType::kI8
                                                              : DType::kE4M3;
    const std::vector<uint8_t> codes = random_elements(dtype, out * in, seed_++);
    entries_.push_back(raw_entry(name, dtype, {out, in}, codes));
    if (store == WeightStore::kE4M3NoScale) return;

    // Scales: which one covers (r, c), the scale tensor itself, and its values.
    const int64_t grid_r = (out + block_rows - 1) / block_rows, grid_c = (in + block_cols - 1) / block_cols;
    std::vector<int64_t> scale_shape;
    int64_t n_scales = out;
    std::function<int64_t(int64_t, int64_t)> scale_index = [](int64_t r, int64_t) { return r; };
    std::string scale_name = module + ".weight_scale";
    switch (store) {
      case WeightStore::kE4M3PerChannel: case WeightStore::kI8ZeroPoint: scale_shape = {out}; break;
      case WeightStore::kE4M3PerChannelColumn: scale_shape = {out, 1}; break;
      case WeightStore::kE5M2PerTensor: scale_shape = {1}; n_scales = 1; break;
      case WeightStore::kE4M3PerTensorScalar: scale_shape = {}; n_scales = 1; break;
      case WeightStore::kE4M3BadScale: scale_shape = {out + 1}; n_scales = out + 1; break;
      case WeightStore::kE4M3Block:
        scale_shape = {grid_r, grid_c};
        n_scales = grid_r * grid_c;
        scale_index = [this, grid_c](int64_t r, int64_t c) { return (r / block_rows) * grid_c + c / block_cols; };
        scale_name = module + ".weight_scale_inv";
        break;
      default: break;
    }
    if (n_scales == 1) scale_index = [](int64_t, int64_t) { return int64_t{0}; };
    std::vector<float> scales(static_cast<size_t>(n_scales));
    for (auto& s : scales) s = scale_dist(rng);
    if (store == WeightStore::kE5M2PerTensor) {  // BF16 scale: keep the top 16 bits
      std::vector<uint8_t> bits(2);
      uint32_t u;
      std::memcpy(&u, &scales[0], 4);
      const auto b16 = static_cast<uint16_t>(u >> 16);
      std::memcpy(bits.data(), &b16, 2);
      scales[0] = bf16_value(b16);
      entries_.push_back(raw_entry(scale_name, DType::kBF16, scale_shape, bits));
    } else {
      entries_.push_back(raw_entry(scale_name, DType::kF32, scale_shape, f32_bytes(scales)));
    }
    if (store == WeightStore::kE4M3PerChannel) extra(module + ".input_scale", {});
    std::vector<float> zero_points(static_cast<size_t>(n_scales), 0.0f);
    if (store == WeightStore::kI8ZeroPoint) {
      std::vector<uint8_t> zp_bytes(static_cast<size_t>(n_scales));
      for (size_t i = 0; i < zp_bytes.size(); ++i) {
        const auto zp = static_cast<int8_t>(static_cast<int>(rng() % 17) - 8);
        zero_points[i] = zp;
        zp_bytes[i] = static_cast<uint8_t>(zp);
      }
      entries_.push_back(raw_entry(module + ".weight_zero_point", DType::kI8, {n_scales}, zp_bytes));
    }
    if (store == WeightStore::kE4M3BadScale) return;
    // (q - zp) and the scale are exact in double, so their product is exact and rounding it to
    // float is the loader's single float32 multiply.
    std::vector<float> want(static_cast<size_t>(out * in));
    for (int64_t r = 0; r < out; ++r)
      for (int64_t c = 0; c < in; ++c) {
        const int64_t k = scale_index(r, c);
        const double q = element_value(dtype, codes, r * in + c);
        want[static_cast<size_t>(r * in + c)] =
            static_cast<float>((q - zero_points[static_cast<size_t>(k)]) * static_cast<double>(scales[static_cast<size_t>(k)]));
      }
    expected_[name] = want;
  }

  void remove(const std::string& name) {
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                  [&](const SafetensorsWriteEntry& e) { return e.name == name; }),
                   entries_.end());
  }

  // config.json plus model.safetensors, or `shards` shards and an index.
  Status write(const std::string& dir, const std::string& config, int shards = 1) const {
    write_text(dir + "/config.json", config);
    if (shards == 1) return write_safetensors(dir + "/model.safetensors", entries_);
    std::map<std::string, std::string> weight_map;
    const size_t per_shard = (entries_.size() + static_cast<size_t>(shards) - 1) / static_cast<size_t>(shards);
    for (int s = 0; s < shards; ++s) {
      const std::string file = "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors";
      const size_t begin = std::min(entries_.size(), static_cast<size_t>(s) * per_shard);
      const size_t end = std::min(entries_.size(), begin + per_shard);
      const std::vector<SafetensorsWriteEntry> part(entries_.begin() + static_cast<std::ptrdiff_t>(begin),
                                                    entries_.begin() + static_cast<std::ptrdiff_t>(end));
      for (const auto& e : part) weight_map[e.name] = file;
      LLMQ_RETURN_IF_ERROR(write_safetensors(dir + "/" + file, part));
    }
    write_text(dir + "/model.safetensors.index.json", index_json(weight_map));
    return {};
  }

  const std::vector<float>* expected(const std::string& name) const {
    const auto it = expected_.find(name);
    return it == expected_.end() ? nullptr : &it->second;
  }

  int64_t block_rows = 128;
  int64_t block_cols = 128;

 private:
  void add(SafetensorsWriteEntry e, std::vector<float> values) {
    expected_[e.name] = std::move(values);
    entries_.push_back(std::move(e));
  }
  uint64_t seed_;
  std::vector<SafetensorsWriteEntry> entries_;
  std::map<std::string, std::vector<float>> expected_;
};

struct TinySpec {
  std::string model_type = "llama";
  int64_t dim = 16, hidden = 36, layers = 2, heads = 4, kv_heads = 2, vocab = 33;
  int64_t experts = 0, top_k = 0;
  bool tie = false;           // tie_word_embeddings in config.json
  bool write_lm_head = true;  // lm_head.weight in the file
  bool qkv_bias = false;      // q/k/v biases in the file
  json extra = json::object();  // merged into config.json
  int64_t head_dim() const { return dim / heads; }
};

std::string tiny_config(const TinySpec& s) {
  json j = {{"model_type", s.model_type},     {"hidden_size", s.dim},        {"intermediate_size", s.hidden},
            {"num_hidden_layers", s.layers},  {"num_attention_heads", s.heads}, {"num_key_value_heads", s.kv_heads},
            {"vocab_size", s.vocab},          {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-5},
            {"rope_theta", 10000.0},          {"tie_word_embeddings", s.tie}, {"bos_token_id", 1},
            {"eos_token_id", 2},              {"hidden_act", "silu"}};
  if (s.experts > 0) {
    j["num_local_experts"] = s.experts;
    j["num_experts_per_tok"] = s.top_k;
  }
  j.update(s.extra);
  return j.dump(2);
}

using StoreFor = std::function<WeightStore(const std::string& module)>;

// Every tensor of the tiny model, named by hand (not through LinearId::hf_name, so the test checks
// the loader's names).
void add_tiny_model(CheckpointBuilder* b, const TinySpec& s, const StoreFor& store) {
  const int64_t q_out = s.heads * s.head_dim(), kv_out = s.kv_heads * s.head_dim();
  auto linear = [&](const std::string& module, int64_t out, int64_t in) { b->linear_weight(module, out, in, store(module)); };
  b->f32("model.embed_tokens.weight", {s.vocab, s.dim});
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    b->bf16(p + "input_layernorm.weight", {s.dim});
    b->f32(p + "post_attention_layernorm.weight", {s.dim});
    linear(p + "self_attn.q_proj", q_out, s.dim);
    linear(p + "self_attn.k_proj", kv_out, s.dim);
    linear(p + "self_attn.v_proj", kv_out, s.dim);
    linear(p + "self_attn.o_proj", s.dim, q_out);
    if (s.qkv_bias) {
      b->f32(p + "self_attn.q_proj.bias", {q_out});
      b->bf16(p + "self_attn.k_proj.bias", {kv_out});
      b->f32(p + "self_attn.v_proj.bias", {kv_out});
    }
    b->extra(p + "self_attn.rotary_emb.inv_freq", {s.head_dim() / 2});
    if (s.experts > 0) {
      linear(p + "block_sparse_moe.gate", s.experts, s.dim);
      for (int64_t e = 0; e < s.experts; ++e) {
        const std::string ep = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
        linear(ep + "w1", s.hidden, s.dim);
        linear(ep + "w3", s.hidden, s.dim);
        linear(ep + "w2", s.dim, s.hidden);
      }
    } else {
      linear(p + "mlp.gate_proj", s.hidden, s.dim);
      linear(p + "mlp.up_proj", s.hidden, s.dim);
      linear(p + "mlp.down_proj", s.dim, s.hidden);
    }
  }
  b->bf16("model.norm.weight", {s.dim});
  if (s.write_lm_head) linear("lm_head", s.vocab, s.dim);
}

void expect_values(const Tensor& t, const std::vector<int64_t>& shape, const std::vector<float>* want,
                   const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_NE(want, nullptr) << "no expectation recorded";
  EXPECT_EQ(t.dtype(), DType::kF32);
  ASSERT_EQ(t.shape(), shape);
  ASSERT_EQ(t.numel(), static_cast<int64_t>(want->size()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float got = t.data_as<float>()[i], w = (*want)[static_cast<size_t>(i)];
    if (got != w) {
      ADD_FAILURE() << what << " element " << i << ": got " << got << ", want " << w;
      return;
    }
  }
}

void expect_linear(const Linear& l, const CheckpointBuilder& b, const std::string& module, int64_t out, int64_t in,
                   int64_t layer, LinearRole role, int64_t expert) {
  EXPECT_EQ(l.id.layer, layer) << module;
  EXPECT_EQ(l.id.role, role) << module;
  EXPECT_EQ(l.id.expert, expert) << module;
  expect_values(l.weight, {out, in}, b.expected(module + ".weight"), module + ".weight");
}

void expect_tiny_model(const ModelWeights& w, const TinySpec& s, const CheckpointBuilder& b) {
  const int64_t q_out = s.heads * s.head_dim(), kv_out = s.kv_heads * s.head_dim();
  EXPECT_EQ(w.config.dim, s.dim);
  EXPECT_EQ(w.config.n_layers, s.layers);
  EXPECT_EQ(w.config.n_experts, s.experts);
  expect_values(w.token_embedding, {s.vocab, s.dim}, b.expected("model.embed_tokens.weight"), "embedding");
  ASSERT_EQ(static_cast<int64_t>(w.layers.size()), s.layers);
  for (int64_t i = 0; i < s.layers; ++i) {
    const LayerWeights& L = w.layers[static_cast<size_t>(i)];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    expect_values(L.attn_norm, {s.dim}, b.expected(p + "input_layernorm.weight"), p + "input_layernorm");
    expect_values(L.ffn_norm, {s.dim}, b.expected(p + "post_attention_layernorm.weight"), p + "post_attention_layernorm");
    expect_linear(L.q, b, p + "self_attn.q_proj", q_out, s.dim, i, LinearRole::kQ, -1);
    expect_linear(L.k, b, p + "self_attn.k_proj", kv_out, s.dim, i, LinearRole::kK, -1);
    expect_linear(L.v, b, p + "self_attn.v_proj", kv_out, s.dim, i, LinearRole::kV, -1);
    expect_linear(L.o, b, p + "self_attn.o_proj", s.dim, q_out, i, LinearRole::kO, -1);
    if (s.qkv_bias) {
      expect_values(L.q.bias, {q_out}, b.expected(p + "self_attn.q_proj.bias"), "q bias");
      expect_values(L.k.bias, {kv_out}, b.expected(p + "self_attn.k_proj.bias"), "k bias");
      expect_values(L.v.bias, {kv_out}, b.expected(p + "self_attn.v_proj.bias"), "v bias");
    } else {
      EXPECT_EQ(L.q.bias.nbytes(), 0);
      EXPECT_EQ(L.k.bias.nbytes(), 0);
    }
    EXPECT_EQ(L.o.bias.nbytes(), 0);
    if (s.experts > 0) {
      expect_linear(L.router, b, p + "block_sparse_moe.gate", s.experts, s.dim, i, LinearRole::kRouter, -1);
      ASSERT_EQ(static_cast<int64_t>(L.experts.size()), s.experts);
      for (int64_t e = 0; e < s.experts; ++e) {
        const std::string ep = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
        const Expert& x = L.experts[static_cast<size_t>(e)];
        expect_linear(x.gate, b, ep + "w1", s.hidden, s.dim, i, LinearRole::kGate, e);
        expect_linear(x.up, b, ep + "w3", s.hidden, s.dim, i, LinearRole::kUp, e);
        expect_linear(x.down, b, ep + "w2", s.dim, s.hidden, i, LinearRole::kDown, e);
      }
    } else {
      EXPECT_TRUE(L.experts.empty());
      expect_linear(L.mlp.gate, b, p + "mlp.gate_proj", s.hidden, s.dim, i, LinearRole::kGate, -1);
      expect_linear(L.mlp.up, b, p + "mlp.up_proj", s.hidden, s.dim, i, LinearRole::kUp, -1);
      expect_linear(L.mlp.down, b, p + "mlp.down_proj", s.dim, s.hidden, i, LinearRole::kDown, -1);
    }
  }
  expect_values(w.final_norm, {s.dim}, b.expected("model.norm.weight"), "final norm");
  EXPECT_EQ(w.lm_head.id.layer, -1);
  EXPECT_EQ(w.lm_head.id.role, LinearRole::kLmHead);
  const bool tied = s.tie || !s.write_lm_head;
  EXPECT_EQ(w.config.tie_embeddings, tied);
  expect_values(w.lm_head.weight, {s.vocab, s.dim},
                b.expected(tied ? "model.embed_tokens.weight" : "lm_head.weight"), "lm_head");
  // Every linear's id names the tensor it was loaded from.
  for (const Linear* l : w.linears()) {
    const std::string name = (l->id.role == LinearRole::kLmHead && tied) ? "model.embed_tokens.weight"
                                                                          : l->id.hf_name(w.config) + ".weight";
    const std::vector<float>* want = b.expected(name);
    ASSERT_NE(want, nullptr) << name;
    EXPECT_EQ(l->weight.numel(), static_cast<int64_t>(want->size())) << name;
  }
}

ModelWeights load_ok(const std::string& dir) {
  ModelWeights w;
  const Status st = load_hf_model(dir, &w);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return w;
}

const StoreFor kAllF32 = [](const std::string&) { return WeightStore::kF32; };

TEST(HfModel, TinyLlamaLoadsEveryTensorInPlace) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TinySpec s;
  CheckpointBuilder b(kSeed);
  // Mixed storage: BF16 for the MLP, float32 elsewhere.
  add_tiny_model(&b, s, [](const std::string& m) { return contains(m, "mlp") ? WeightStore::kBF16 : WeightStore::kF32; });
  ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
  const ModelWeights w = load_ok(dir.path());
  expect_tiny_model(w, s, b);
  EXPECT_EQ(w.config.n_kv_heads, 2);
  EXPECT_EQ(w.config.head_dim, 4);
  EXPECT_EQ(w.linears().size(), 2u * 7u + 1u);
}

TEST(HfModel, ShardedTinyLlamaLoads) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TinySpec s;
  CheckpointBuilder b(kSeed + 1);
  add_tiny_model(&b, s, kAllF32);
  ASSERT_TRUE(b.write(dir.path(), tiny_config(s), 3).ok());
  EXPECT_FALSE(fs::exists(dir.file("model.safetensors")));
  expect_tiny_model(load_ok(dir.path()), s, b);
}

TEST(HfModel, TiedLmHeadCopiesTheEmbedding) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TinySpec s;
  s.tie = true;
  s.write_lm_head = false;
  CheckpointBuilder b(kSeed + 2);
  add_tiny_model(&b, s, kAllF32);
  ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
  ModelWeights w = load_ok(dir.path());
  expect_tiny_model(w, s, b);
  // A copy, not an alias: changing one leaves the other.
  ASSERT_GT(w.lm_head.weight.numel(), 0);
  w.lm_head.weight.data_as<float>()[0] += 1.0f;
  EXPECT_NE(w.lm_head.weight.data_as<float>()[0], w.token_embedding.data_as<float>()[0]);
}

// An untied config without lm_head.weight is not silently tied: transformers would start the
// classifier from random weights, so the two files describe different models.
TEST(HfModel, UntiedConfigWithoutLmHeadIsRefused) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TinySpec s;
  s.tie = false;
  s.write_lm_head = false;
  CheckpointBuilder b(kSeed + 2);
  add_tiny_model(&b, s, kAllF32);
  ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
  ModelWeights w;
  expect_error_mentions(load_hf_model(dir.path(), &w), {"lm_head.weight", "tie_word_embeddings"});
}

TEST(HfModel, Qwen2BiasesLoadAndAreRequired) {
  TinySpec s;
  s.model_type = "qwen2";
  s.qkv_bias = true;
  {
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    CheckpointBuilder b(kSeed + 3);
    add_tiny_model(&b, s, kAllF32);
    ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
    const ModelWeights w = load_ok(dir.path());
    EXPECT_TRUE(w.config.attention_bias);
    expect_tiny_model(w, s, b);
  }
  {  // qwen2 without its biases
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    CheckpointBuilder b(kSeed + 3);
    add_tiny_model(&b, s, kAllF32);
    b.remove("model.layers.1.self_attn.v_proj.bias");
    ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
    ModelWeights w;
    expect_error_mentions(load_hf_model(dir.path(), &w), {"model.layers.1.self_attn.v_proj.bias", "missing"});
  }
  {  // a llama whose file has biases its config does not mention: not silently dropped
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    TinySpec llama;
    llama.qkv_bias = true;
    CheckpointBuilder b(kSeed + 3);
    add_tiny_model(&b, llama, kAllF32);
    ASSERT_TRUE(b.write(dir.path(), tiny_config(llama)).ok());
    ModelWeights w;
    expect_error_mentions(load_hf_model(dir.path(), &w), {"model.layers.0.self_attn.q_proj.bias"});
  }
}

TEST(HfModel, TinyMixtralExpertsAndRouter) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TinySpec s;
  s.model_type = "mixtral";
  s.experts = 3;
  s.top_k = 2;
  s.hidden = 20;
  CheckpointBuilder b(kSeed + 4);
  add_tiny_model(&b, s, kAllF32);
  ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
  const ModelWeights w = load_ok(dir.path());
  EXPECT_TRUE(w.config.is_moe());
  EXPECT_EQ(w.config.n_experts_per_token, 2);
  expect_tiny_model(w, s, b);
  EXPECT_EQ(w.linears().size(), 2u * (4u + 1u + 3u * 3u) + 1u);
}

TEST(HfModel, MissingTensorsAndWrongShapesAreNamed) {
  TinySpec s;
  {
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    CheckpointBuilder b(kSeed + 5);
    add_tiny_model(&b, s, kAllF32);
    b.remove("model.layers.1.mlp.up_proj.weight");
    ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
    ModelWeights w;
    expect_error_mentions(load_hf_model(dir.path(), &w), {"model.layers.1.mlp.up_proj.weight", "missing"});
  }
  {
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    CheckpointBuilder b(kSeed + 5);
    add_tiny_model(&b, s, kAllF32);
    TinySpec wider = s;
    wider.hidden = 40;  // config.json disagrees with the tensors
    ASSERT_TRUE(b.write(dir.path(), tiny_config(wider)).ok());
    ModelWeights w;
    expect_error_mentions(load_hf_model(dir.path(), &w),
                          {"model.layers.0.mlp.gate_proj.weight", "[40, 16]", "[36, 16]"});
  }
  {
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    CheckpointBuilder b(kSeed + 5);
    add_tiny_model(&b, s, kAllF32);
    TinySpec bad = s;
    bad.model_type = "falcon";
    ASSERT_TRUE(b.write(dir.path(), tiny_config(bad)).ok());
    ModelWeights w;
    const Status st = load_hf_model(dir.path(), &w);
    expect_error_mentions(st, {"model_type", "falcon"});
    EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  }
}

TEST(HfModel, Fp8PerChannelAndPerTensorScalesDequantize) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TinySpec s;
  CheckpointBuilder b(kSeed + 6);
  add_tiny_model(&b, s, [](const std::string& m) {
    if (contains(m, "q_proj")) return WeightStore::kE5M2PerTensor;
    if (contains(m, "k_proj")) return WeightStore::kE4M3PerChannelColumn;
    if (contains(m, "v_proj")) return WeightStore::kI8ZeroPoint;
    if (contains(m, "o_proj")) return WeightStore::kE4M3PerTensorScalar;
    return WeightStore::kE4M3PerChannel;  // MLP and lm_head, with an ignored input_scale
  });
  // 8-bit weights are read only under a quantization_config (without one, transformers would
  // load the codes as plain numbers).
  s.extra = {{"quantization_config", {{"quant_method", "fp8"}}}};
  ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
  expect_tiny_model(load_ok(dir.path()), s, b);
}

// Sizes not multiples of the block, so edge blocks are partial: q [160, 160] has a 2 x 2 scale
// grid, gate [272, 160] 3 x 2, down [160, 272] 2 x 3.
TinySpec partial_block_spec() {
  TinySpec s;
  s.dim = 160;
  s.hidden = 272;
  s.heads = 5;
  s.kv_heads = 1;
  s.layers = 1;
  s.vocab = 20;
  return s;
}

TEST(HfModel, BlockFp8ScaleInvDequantizes) {
  const std::vector<std::pair<int64_t, int64_t>> blocks = {{128, 128}, {64, 32}};
  for (const auto& [block_rows, block_cols] : blocks) {
    SCOPED_TRACE("block " + std::to_string(block_rows) + "x" + std::to_string(block_cols));
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    TinySpec s = partial_block_spec();
    s.extra = {{"quantization_config", {{"quant_method", "fp8"}}}};
    if (block_rows != 128)
      s.extra = {{"quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {block_rows, block_cols}}}}};
    CheckpointBuilder b(kSeed + 7);
    b.block_rows = block_rows;
    b.block_cols = block_cols;
    add_tiny_model(&b, s, [](const std::string&) { return WeightStore::kE4M3Block; });
    ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
    expect_tiny_model(load_ok(dir.path()), s, b);
  }
}

// Found while writing fuzz/fuzz_hf_config.cpp: the scale grid was ceil(rows / block) computed as
// (rows + block - 1) / block, which overflows int64 for a weight_block_size near INT64_MAX (UBSan
// stops the asan preset there). Any block at least as large as the weight is one block.
TEST(HfModel, WeightBlockSizeUpToInt64MaxIsOneBlock) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TinySpec s = partial_block_spec();
  const int64_t huge = std::numeric_limits<int64_t>::max();
  s.extra = {{"quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {huge, huge}}}}};
  CheckpointBuilder b(kSeed + 9);
  b.block_rows = b.block_cols = int64_t{1} << 20;  // the same single block, scales [1, 1]
  add_tiny_model(&b, s, [](const std::string&) { return WeightStore::kE4M3Block; });
  ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
  expect_tiny_model(load_ok(dir.path()), s, b);
}

TEST(HfModel, QuantizedWeightsWithoutUsableScalesAreErrors) {
  TinySpec s;
  const std::pair<WeightStore, std::vector<std::string>> cases[] = {
      {WeightStore::kE4M3NoScale, {"model.layers.0.self_attn.o_proj.weight", "weight_scale"}},
      {WeightStore::kE4M3BadScale, {"model.layers.0.self_attn.o_proj.weight_scale", "[17]"}},
  };
  for (const auto& [store, mentions] : cases) {
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    CheckpointBuilder b(kSeed + 8);
    add_tiny_model(&b, s, [store = store](const std::string& m) { return contains(m, "o_proj") ? store : WeightStore::kF32; });
    TinySpec quantized = s;  // 8-bit weights are read only under a quantization_config
    quantized.extra = {{"quantization_config", {{"quant_method", "fp8"}}}};
    ASSERT_TRUE(b.write(dir.path(), tiny_config(quantized)).ok());
    ModelWeights w;
    expect_error_mentions(load_hf_model(dir.path(), &w), mentions);
  }
}

}  // namespace
}  // namespace llmq
