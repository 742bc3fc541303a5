// The model runtime on the seeded default model: its shape and seeding, the float forward pass
// against a naive double-precision reference (GQA, Llama 3 scaling, biases), batching invariance,
// MoE routing against a naive per-token loop, run.c-compatible sampling, and the errors. llama2.c
// checkpoints (stories260K) are tested in test_transformer_llama2c.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llmq/model.hpp"
#include "llmq/sampler.hpp"
#include "llmq/transformer.hpp"
#include "support.hpp"
#include "transformer_support.hpp"

namespace llmq {
namespace {

using namespace transformer_test;  // NOLINT: the suite's shared helpers

// Identical experts: the renormalised routing weights sum to 1 up to float rounding.
constexpr double kIdenticalExpertsTolerance = 1e-5;

// ---------------------------------------------------------------------------------------------
// Default model, MoE, Llama 3 scaling, biases

DefaultModelOptions tiny_options(int64_t n_experts) {
  DefaultModelOptions o;
  o.dim = 32;
  o.hidden_dim = 48;
  o.n_layers = 2;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.vocab_size = 64;
  o.max_seq_len = 64;
  o.n_experts = n_experts;
  o.n_experts_per_token = 2;
  o.seed = 5;
  return o;
}

TEST(DefaultModel, ShapedLikeAnLlmAndSeeded) {
  const ModelWeights w = make_default_model();
  ASSERT_TRUE(w.config.validate().ok());
  EXPECT_EQ(w.config.rope_style, RopeStyle::kHalf);
  EXPECT_FALSE(w.config.tie_embeddings);
  EXPECT_EQ(w.config.model_type, "llama");
  // Outlier channels: at least 2, the same in every layer, 20-50x.
  for (const auto& L : w.layers)
    for (const Tensor* g : {&L.attn_norm, &L.ffn_norm}) {
      int64_t outliers = 0;
      for (int64_t i = 0; i < g->numel(); ++i) {
        const float v = g->data_as<float>()[i];
        EXPECT_LE(v, 50.0f);
        if (v >= 20.0f) {
          ++outliers;
          EXPECT_GE(w.layers[0].attn_norm.data_as<float>()[i], 20.0f) << "outlier channel " << i << " differs by layer";
        }
      }
      EXPECT_GE(outliers, 2);
      EXPECT_LE(outliers, w.config.dim / 50);
    }
  const ModelWeights again = make_default_model();
  const ModelWeights other = make_default_model(DefaultModelOptions{256, 768, 4, 8, 4, 512, 1024, 0, 2, 2});
  EXPECT_TRUE(same_tensor(again.layers[3].mlp.down.weight, w.layers[3].mlp.down.weight));
  EXPECT_FALSE(same_tensor(other.layers[3].mlp.down.weight, w.layers[3].mlp.down.weight));
  for (const Linear* l : w.linears()) EXPECT_FALSE(l->id.hf_name(w.config).empty());
}

TEST(DefaultModel, NextTokenDistributionsAreNotDegenerate) {
  const ModelWeights w = make_default_model();
  Transformer t(w);
  const auto tokens = seeded_tokens(16, w.config.vocab_size, 1);
  const auto logits = logits_of(&t, tokens);
  const int64_t v = w.config.vocab_size;
  const double max_entropy = std::log(static_cast<double>(v));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const float* l = &logits[i * static_cast<size_t>(v)];
    const double mx = *std::max_element(l, l + v);
    double sum = 0, ent = 0, mean = 0, var = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(l[j] - mx);
    for (int64_t j = 0; j < v; ++j) {
      const double p = std::exp(l[j] - mx) / sum;
      if (p > 0) ent -= p * std::log(p);
      mean += l[j];
    }
    mean /= static_cast<double>(v);
    for (int64_t j = 0; j < v; ++j) var += (l[j] - mean) * (l[j] - mean);
    const double sd = std::sqrt(var / static_cast<double>(v));
    EXPECT_GT(ent, 0.5) << "position " << i;
    EXPECT_LT(ent, max_entropy - 0.1) << "position " << i;
    EXPECT_GT(sd, 1.0) << "position " << i;
    EXPECT_LT(sd, 10.0) << "position " << i;
  }
}

TEST(DefaultModel, MatchesDoubleReferenceAndBatches) {
  const ModelWeights w = make_default_model();
  const auto tokens = seeded_tokens(12, w.config.vocab_size, 2);
  Transformer t(w);
  const auto all = logits_of(&t, tokens);
  EXPECT_LE(rel_error(all, reference_logits(w, tokens)), kReferenceTolerance);
  Transformer s(w);
  std::vector<float> one;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto l = logits_of(&s, {tokens[i]}, static_cast<int64_t>(i));
    one.insert(one.end(), l.begin(), l.end());
  }
  EXPECT_LE(rel_error(all, one), kBatchRelTolerance);
}

TEST(DefaultModel, KvWrittenIntoAnotherTransformerContinuesTheSequenceExactly) {
  // The serving engine's CPU backend moves KV between a paged store and Transformers: positions
  // read from one Transformer and written into a fresh one must continue the sequence with the
  // very same logits.
  DefaultModelOptions o;
  o.dim = 64;
  o.hidden_dim = 128;
  o.n_layers = 2;
  o.max_seq_len = 32;
  const ModelWeights w = make_default_model(o);
  const int64_t V = w.config.vocab_size, kv = w.config.n_kv_heads * w.config.head_dim, L = w.config.n_layers;
  const std::vector<int32_t> tokens = {1, 17, 93, 4, 250, 8, 61, 7, 300, 12};
  const int64_t n = static_cast<int64_t>(tokens.size()), first = 6;
  Transformer whole(w);
  std::vector<float> want(static_cast<size_t>(n * V));
  ASSERT_TRUE(whole.forward(tokens.data(), n, 0, want.data()).ok());
  std::vector<float> k(static_cast<size_t>(L * first * kv)), v(k.size());
  ASSERT_TRUE(whole.read_kv(0, first, k.data(), v.data()).ok());
  Transformer rest(w);
  ASSERT_TRUE(rest.write_kv(0, first, k.data(), v.data()).ok());
  std::vector<float> got(static_cast<size_t>((n - first) * V));
  ASSERT_TRUE(rest.forward(tokens.data() + first, n - first, first, got.data()).ok());
  for (int64_t i = 0; i < (n - first) * V; ++i) ASSERT_EQ(got[i], want[first * V + i]) << "logit " << i;
  // Only written positions can be read; writes stay inside the context.
  EXPECT_EQ(rest.read_kv(0, n + 1, k.data(), v.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rest.write_kv(30, 3, k.data(), v.data()).code(), StatusCode::kInvalidArgument);
}

TEST(DefaultModel, Llama3RopeScalingAndBiasesMatchReference) {
  ModelWeights w = make_default_model(tiny_options(0));
  w.config.rope_scaling.enabled = true;
  w.config.rope_scaling.factor = 8.0;
  w.config.rope_scaling.low_freq_factor = 1.0;
  w.config.rope_scaling.high_freq_factor = 4.0;
  // A small original context puts the head's wavelengths in all three bands (2pi .. ~2pi*1e4).
  w.config.rope_scaling.original_max_position = 64;
  w.config.attention_bias = true;
  for (auto& L : w.layers)
    for (Linear* l : {&L.q, &L.k, &L.v}) {
      l->bias = Tensor(DType::kF32, {l->weight.shape()[0]});
      for (int64_t i = 0; i < l->bias.numel(); ++i) l->bias.data_as<float>()[i] = 0.1f * static_cast<float>(i % 5) - 0.2f;
    }
  const auto tokens = seeded_tokens(30, w.config.vocab_size, 4);
  Transformer t(w);
  const auto scaled = logits_of(&t, tokens);
  EXPECT_LE(rel_error(scaled, reference_logits(w, tokens)), kReferenceTolerance);
  ModelWeights plain = w;
  plain.config.rope_scaling.enabled = false;
  Transformer p(plain);
  EXPECT_GT(rel_error(logits_of(&p, tokens), reference_logits(w, tokens)), 100 * kReferenceTolerance)
      << "scaling must change the function";
}

// Records the rows every linear layer sees, and can fail on demand.
class RecordingBackend : public LinearBackend {
 public:
  Status forward(const Linear& linear, const float* x, int64_t rows, float* y) override {
    if (fail_role && linear.id.role == *fail_role) return Status(StatusCode::kInternal, "injected failure");
    if (linear.id.expert >= 0) expert_rows += rows;
    if (linear.id.role == LinearRole::kRouter) router_rows += rows;
    return inner.forward(linear, x, rows, y);
  }
  FloatLinearBackend inner;
  const LinearRole* fail_role = nullptr;
  int64_t expert_rows = 0;  // gate + up + down rows over all experts
  int64_t router_rows = 0;
};

TEST(Moe, MatchesNaivePerTokenRouting) {
  const ModelWeights w = make_default_model(tiny_options(4));
  ASSERT_TRUE(w.config.validate().ok());
  EXPECT_EQ(w.config.model_type, "mixtral");
  EXPECT_EQ(w.layers[0].experts.size(), 4u);
  EXPECT_EQ(w.linears().size(), 2u * (4u + 1u + 12u) + 1u);
  EXPECT_EQ(w.layers[1].experts[3].up.id.hf_name(w.config), "model.layers.1.block_sparse_moe.experts.3.w3");
  const auto tokens = seeded_tokens(16, w.config.vocab_size, 9);
  RecordingBackend rec;
  Transformer t(w, &rec);
  const auto logits = logits_of(&t, tokens);
  EXPECT_LE(rel_error(logits, reference_logits(w, tokens)), kReferenceTolerance);
  // Sparse: each token runs exactly k experts (3 linears each) per layer.
  const int64_t n = static_cast<int64_t>(tokens.size());
  EXPECT_EQ(rec.expert_rows, w.config.n_layers * n * w.config.n_experts_per_token * 3);
  EXPECT_EQ(rec.router_rows, w.config.n_layers * n);
  // Batched == one by one.
  Transformer s(w);
  std::vector<float> one;
  for (int64_t i = 0; i < n; ++i) {
    const auto l = logits_of(&s, {tokens[static_cast<size_t>(i)]}, i);
    one.insert(one.end(), l.begin(), l.end());
  }
  EXPECT_LE(rel_error(logits, one), kBatchRelTolerance);
}

TEST(Moe, RoutingWeightsSumToOne) {
  // With every expert equal to one MLP, sum_k w_k * mlp(x) == mlp(x) iff the weights sum to 1.
  ModelWeights moe = make_default_model(tiny_options(4));
  ModelWeights dense = make_default_model(tiny_options(0));
  dense.config.hidden_dim = moe.config.hidden_dim;
  dense.token_embedding = moe.token_embedding;
  dense.final_norm = moe.final_norm;
  dense.lm_head = moe.lm_head;
  for (size_t l = 0; l < moe.layers.size(); ++l) {
    LayerWeights& M = moe.layers[l];
    for (size_t e = 1; e < M.experts.size(); ++e) {
      M.experts[e].gate.weight = M.experts[0].gate.weight;
      M.experts[e].up.weight = M.experts[0].up.weight;
      M.experts[e].down.weight = M.experts[0].down.weight;
    }
    LayerWeights& D = dense.layers[l];
    D.attn_norm = M.attn_norm;
    D.ffn_norm = M.ffn_norm;
    D.q = M.q;
    D.k = M.k;
    D.v = M.v;
    D.o = M.o;
    D.mlp.gate.weight = M.experts[0].gate.weight;
    D.mlp.up.weight = M.experts[0].up.weight;
    D.mlp.down.weight = M.experts[0].down.weight;
  }
  const auto tokens = seeded_tokens(10, moe.config.vocab_size, 12);
  Transformer a(moe), b(dense);
  EXPECT_LE(rel_error(logits_of(&a, tokens), logits_of(&b, tokens)), kIdenticalExpertsTolerance);
}

// ---------------------------------------------------------------------------------------------
// Sampler

TEST(Sampler, GreedyTakesTheFirstMaximum) {
  Sampler s(5, 0.0f, 0.9f, 1);
  float logits[5] = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  EXPECT_EQ(s.sample(logits), 1);
}

TEST(Sampler, MultinomialFollowsTheProbabilities) {
  // Probabilities 0.1, 0.2, 0.3, 0.4 (log-space); topp 0 = plain multinomial.
  const float probs[4] = {0.1f, 0.2f, 0.3f, 0.4f};
  Sampler s(4, 1.0f, 0.0f, 42);
  int64_t counts[4] = {};
  constexpr int64_t kDraws = 20000;
  for (int64_t i = 0; i < kDraws; ++i) {
    float logits[4];
    for (int j = 0; j < 4; ++j) logits[j] = std::log(probs[j]);
    ++counts[s.sample(logits)];
  }
  for (int j = 0; j < 4; ++j) {
    const double freq = static_cast<double>(counts[j]) / kDraws;
    EXPECT_NEAR(freq, probs[j], 0.02) << "REPRO seed=42 token " << j;  // ~6 sigma
  }
}

TEST(Sampler, TopPKeepsOnlyTheNucleus) {
  // 0.7, 0.25, then 0.05 over 100 tokens: topp 0.9 keeps the first two only.
  constexpr int64_t kVocab = 102;
  std::vector<float> probs(kVocab, 0.05f / 100.0f);
  probs[7] = 0.7f;
  probs[3] = 0.25f;
  Sampler s(kVocab, 1.0f, 0.9f, 7);
  int64_t counts[2] = {};
  for (int i = 0; i < 5000; ++i) {
    std::vector<float> logits(kVocab);
    for (int64_t j = 0; j < kVocab; ++j) logits[j] = std::log(probs[j]);
    const int32_t t = s.sample(logits.data());
    ASSERT_TRUE(t == 7 || t == 3) << "REPRO seed=7 draw " << i << " sampled " << t;
    ++counts[t == 7 ? 0 : 1];
  }
  EXPECT_NEAR(static_cast<double>(counts[0]) / 5000.0, 0.7 / 0.95, 0.03);
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST(Errors, TokensPositionsAndBackends) {
  const ModelWeights w = make_default_model(tiny_options(0));
  Transformer t(w);
  std::vector<float> logits(static_cast<size_t>(2 * w.config.vocab_size));
  const int32_t bad_low[2] = {1, -1};
  Status st = t.forward(bad_low, 2, 0, logits.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tokens[1] = -1"), std::string::npos) << st.to_string();
  const int32_t bad_high[1] = {static_cast<int32_t>(w.config.vocab_size)};
  st = t.forward(bad_high, 1, 0, logits.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("vocabulary"), std::string::npos) << st.to_string();
  const int32_t ok[2] = {1, 2};
  st = t.forward(ok, 2, w.config.max_seq_len - 1, logits.data());  // last position + 1
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("max_seq_len"), std::string::npos) << st.to_string();
  EXPECT_TRUE(t.forward(ok, 1, w.config.max_seq_len - 1, logits.data()).ok()) << "the last position is fine";
  EXPECT_EQ(t.forward(ok, 1, -1, logits.data()).code(), StatusCode::kInvalidArgument);

  RecordingBackend failing;
  const LinearRole role = LinearRole::kDown;
  failing.fail_role = &role;
  Transformer f(w, &failing);
  st = f.forward(ok, 2, 0, logits.data());
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_EQ(st.message(), "injected failure");

  std::vector<int32_t> out;
  GenerateOptions opt;
  EXPECT_EQ(generate(&t, {}, opt, &out).code(), StatusCode::kInvalidArgument) << "empty prompt";
  opt.seed = 0;
  opt.temperature = 1.0f;
  EXPECT_EQ(generate(&t, {1}, opt, &out).code(), StatusCode::kInvalidArgument) << "sampling without a seed";

  ModelWeights broken = w;
  broken.layers[1].k.weight = Tensor(DType::kF32, {3, 3});
  Transformer b(broken);
  st = b.forward(ok, 1, 0, logits.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("model.layers.1.self_attn.k_proj"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace llmq
