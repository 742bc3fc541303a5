// The forward pass of every family against the naive double-precision reference
// (transformer_support.hpp's reference_logits, written from the model definitions: windows, sinks,
// q/k norms, YaRN, gpt-oss's clamped SwiGLU and routing), plus properties that need no reference:
// a window is attention (not a cap), a one-layer window equals full attention over the window's
// tokens alone, sinks far below every score change nothing, q/k norms make the projections' scale
// irrelevant, and top-k-then-softmax equals renormalised softmax-then-top-k.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "llmq/model.hpp"
#include "llmq/transformer.hpp"
#include "model_family_support.hpp"
#include "transformer_support.hpp"

namespace llmq {
namespace {

using family_test::family_model;
using transformer_test::kReferenceTolerance;
using transformer_test::logits_of;
using transformer_test::reference_logits;
using transformer_test::rel_error;
using transformer_test::seeded_tokens;

TEST(ModelFamilyNumerics, EveryFamilyMatchesTheDoubleReference) {
  for (const char* type : {"qwen3", "qwen3_moe", "phi3", "gpt_oss", "mistral"}) {
    SCOPED_TRACE(type);
    const ModelWeights w = family_model(type);
    const std::vector<int32_t> ids = seeded_tokens(24, w.config.vocab_size, 11);  // longer than every window
    Transformer t(w);
    const std::vector<float> got = logits_of(&t, ids);
    const double err = rel_error(got, reference_logits(w, ids));
    EXPECT_LT(err, kReferenceTolerance) << "max |llmq - reference| / max |reference| = " << err;
    // Token by token through the cache: the same numbers as the whole prompt at once.
    t.reset();
    std::vector<float> stepped;
    for (int64_t p = 0; p < 24; ++p) {
      const std::vector<float> one = logits_of(&t, {ids[static_cast<size_t>(p)]}, p);
      stepped.insert(stepped.end(), one.begin(), one.end());
    }
    EXPECT_LT(rel_error(stepped, got), 1e-5);
  }
}

ModelWeights windowed_model(int64_t window) {
  DefaultModelOptions o;
  o.dim = 64, o.hidden_dim = 128, o.n_layers = 2, o.n_heads = 4, o.n_kv_heads = 2, o.vocab_size = 64, o.max_seq_len = 256;
  ModelWeights w = make_default_model(o);
  w.config.model_type = "mistral";
  w.config.sliding_window = window;
  return w;
}

// A sliding window is attention: keys older than the window are masked, at any length.
TEST(ModelFamilyNumerics, WindowMasksKeysOlderThanTheWindow) {
  const ModelWeights w = windowed_model(8);
  std::vector<int32_t> ids(48);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((5 * i + 1) % 64);
  std::vector<float> logits(ids.size() * 64), stepped(ids.size() * 64);
  Transformer t(w);
  ASSERT_TRUE(t.forward(ids.data(), 48, 0, logits.data()).ok());
  // The same positions one at a time (the cache read through the window) give the same numbers.
  t.reset();
  for (int64_t p = 0; p < 48; ++p) ASSERT_TRUE(t.forward(ids.data() + p, 1, p, stepped.data() + p * 64).ok());
  EXPECT_EQ(logits, stepped);
  // Up to the window it is full attention; past it, not.
  ModelWeights full = windowed_model(0);
  std::vector<float> full_logits(logits.size());
  Transformer tf(full);
  ASSERT_TRUE(tf.forward(ids.data(), 48, 0, full_logits.data()).ok());
  EXPECT_TRUE(std::equal(logits.begin(), logits.begin() + 8 * 64, full_logits.begin()));
  EXPECT_FALSE(std::equal(logits.begin() + 40 * 64, logits.end(), full_logits.begin() + 40 * 64));
}

// RoPE scores depend on distance alone, so in a one-layer model the window's last position sees
// exactly what full attention sees over just the window's tokens placed at positions 0 .. W - 1:
// an oracle for the mask that does not share its code.
TEST(ModelFamilyNumerics, OneLayerWindowEqualsFullAttentionOverTheWindowAlone) {
  for (int64_t window : {1, 3, 8}) {
    SCOPED_TRACE("window " + std::to_string(window));
    ModelWeights w = windowed_model(window);
    w.config.n_layers = 1;
    w.layers.resize(1);
    ModelWeights full = w;
    full.config.sliding_window = 0;
    std::vector<int32_t> ids(20);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((11 * i + 7) % 64);
    std::vector<float> logits(ids.size() * 64);
    Transformer t(w);
    ASSERT_TRUE(t.forward(ids.data(), 20, 0, logits.data()).ok());
    for (int64_t p : {window - 1, window, int64_t{12}, int64_t{19}}) {
      std::vector<float> alone(static_cast<size_t>(window * 64));
      Transformer tf(full);
      ASSERT_TRUE(tf.forward(ids.data() + p - window + 1, window, 0, alone.data()).ok());
      for (int64_t v = 0; v < 64; ++v) {
        const float want = alone[static_cast<size_t>((window - 1) * 64 + v)];
        EXPECT_NEAR(logits[static_cast<size_t>(p * 64 + v)], want, 1e-5f * (1.0f + std::fabs(want)))
            << "position " << p << " token " << v;
      }
    }
  }
}

// A sink far below every score adds exp(-huge) = 0 to the denominator: bit for bit no sink. A sink
// far above every score takes all the weight: the attention output vanishes.
TEST(ModelFamilyNumerics, SinksJoinTheDenominatorOnly) {
  ModelWeights w = family_model("gpt_oss");
  const std::vector<int32_t> ids = seeded_tokens(12, w.config.vocab_size, 3);
  ModelWeights none = w;
  none.config.attention_sinks = false;
  for (LayerWeights& L : w.layers) std::fill(L.sinks.data_as<float>(), L.sinks.data_as<float>() + w.config.n_heads, -1e30f);
  Transformer a(w), b(none);
  EXPECT_EQ(logits_of(&a, ids), logits_of(&b, ids));

  ModelWeights high = family_model("gpt_oss");
  ModelWeights no_attention = high;
  for (LayerWeights& L : high.layers) std::fill(L.sinks.data_as<float>(), L.sinks.data_as<float>() + high.config.n_heads, 200.0f);
  for (LayerWeights& L : no_attention.layers) {  // o_proj of a zero attention output: its bias alone
    std::fill(L.o.weight.data_as<float>(), L.o.weight.data_as<float>() + L.o.weight.numel(), 0.0f);
  }
  Transformer c(high), d(no_attention);
  EXPECT_LT(rel_error(logits_of(&c, ids), logits_of(&d, ids)), 1e-6);
}

// RMSNorm is scale-invariant, so with Qwen3's q/k norms scaling q_proj and k_proj changes nothing
// (up to eps); without them it changes the model.
TEST(ModelFamilyNumerics, QkNormMakesTheProjectionScaleIrrelevant) {
  ModelWeights w = family_model("qwen3");
  for (LayerWeights& L : w.layers)
    for (Linear* l : {&L.q, &L.k}) std::fill(l->bias.data_as<float>(), l->bias.data_as<float>() + l->bias.numel(), 0.0f);
  ModelWeights scaled = w;
  for (LayerWeights& L : scaled.layers)
    for (Linear* l : {&L.q, &L.k})
      for (int64_t i = 0; i < l->weight.numel(); ++i) l->weight.data_as<float>()[i] *= 8.0f;
  const std::vector<int32_t> ids = seeded_tokens(10, w.config.vocab_size, 5);
  Transformer a(w), b(scaled);
  const std::vector<float> la = logits_of(&a, ids), lb = logits_of(&b, ids);
  EXPECT_LT(rel_error(lb, la), 1e-5);
  ModelWeights plain = w, plain_scaled = scaled;
  plain.config.qk_norm = plain_scaled.config.qk_norm = false;
  Transformer c(plain), d(plain_scaled);
  EXPECT_GT(rel_error(logits_of(&d, ids), logits_of(&c, ids)), 1e-2);
}

// Softmax over the k largest logits is the renormalised top-k of the full softmax: gpt-oss's
// routing and Mixtral's agree (to rounding); Qwen3-MoE's without renormalisation does not.
TEST(ModelFamilyNumerics, TopKThenSoftmaxIsRenormalisedSoftmaxThenTopK) {
  ModelWeights w = family_model("gpt_oss");
  const std::vector<int32_t> ids = seeded_tokens(12, w.config.vocab_size, 9);
  ModelWeights mixtral_routing = w, unnormalised = w;
  mixtral_routing.config.moe_routing = unnormalised.config.moe_routing = MoeRouting::kSoftmaxTopK;
  unnormalised.config.moe_renormalize = false;
  Transformer a(w), b(mixtral_routing), c(unnormalised);
  const std::vector<float> la = logits_of(&a, ids);
  EXPECT_LT(rel_error(logits_of(&b, ids), la), 1e-5);
  EXPECT_GT(rel_error(logits_of(&c, ids), la), 1e-3);
}

// YaRN's inverse frequencies: pairs below the ramp keep the plain frequency, pairs above it are
// divided by the factor (transformers' _compute_yarn_parameters); cos and sin carry the attention
// factor.
TEST(ModelFamilyNumerics, YarnKeepsHighFrequenciesAndDividesLowOnes) {
  ModelConfig c = family_model("gpt_oss").config;
  c.head_dim = 64;
  c.yarn.original_max_position = 4096;
  ModelConfig plain = c;
  plain.yarn = YarnScaling{};
  const std::vector<float> yarn = rope_inv_freq(c), base = rope_inv_freq(plain);
  // low / high of the ramp: d log(L / (2 pi beta)) / (2 log theta) for beta_fast, beta_slow.
  const double pi = 3.14159265358979323846;
  auto dim_of = [&](double beta) { return 64.0 * std::log(4096.0 / (2 * pi * beta)) / (2 * std::log(c.rope_theta)); };
  const double low = dim_of(32.0), high = dim_of(1.0);
  ASSERT_GT(low, 2.0);
  ASSERT_LT(high, 30.0);
  for (size_t j = 0; j < yarn.size(); ++j) {
    if (static_cast<double>(j) <= low) EXPECT_EQ(yarn[j], base[j]) << j;
    if (static_cast<double>(j) >= high) EXPECT_NEAR(yarn[j], base[j] / 32.0f, 1e-6 * base[j]) << j;
    if (static_cast<double>(j) > low && static_cast<double>(j) < high) {
      EXPECT_LT(yarn[j], base[j]) << j;
      EXPECT_GT(yarn[j], base[j] / 32.0f) << j;
    }
  }
  EXPECT_FLOAT_EQ(rope_attention_factor(c), static_cast<float>(0.1 * std::log(32.0) + 1.0));
  EXPECT_EQ(rope_attention_factor(plain), 1.0f);
}

}  // namespace
}  // namespace llmq
