// Calibration statistics checked against a recomputation written here (RMSNorm inputs, MoE routing,
// save/load), and SmoothQuant's function-preserving rewrite and its factors (eq. 26). The rest of
// whole-model quantization is in test_model_quantize.cpp. Models are small seeded default models
// (dense and MoE).
#include "model_quantize_support.hpp"

namespace llmq {
namespace {

// =============================================================================================
// Calibration

// run.c's RMSNorm in float, operation for operation, as the transformer computes it.
std::vector<float> rmsnorm_row(const float* x, const float* gain, int64_t dim, float eps) {
  float ss = 0.0f;
  for (int64_t j = 0; j < dim; ++j) ss += x[j] * x[j];
  ss /= static_cast<float>(dim);
  ss += eps;
  ss = 1.0f / std::sqrt(ss);
  std::vector<float> o(static_cast<size_t>(dim));
  for (int64_t j = 0; j < dim; ++j) o[j] = gain[j] * (ss * x[j]);
  return o;
}

TEST(Calibration, LayerZeroInputsEqualRecomputedRmsNormOfEmbeddings) {
  const ModelWeights model = make_default_model(small_options(0));
  const ModelConfig& c = model.config;
  const std::vector<int32_t> tokens = sampled_tokens(model, 60, kCalibrationSeed);
  const int64_t n = static_cast<int64_t>(tokens.size());
  CalibrationStats stats;
  // An odd chunk: the KV cache resets between chunks, which must not matter to layer 0's input.
  ASSERT_TRUE(calibrate(model, tokens, 17, &stats).ok());
  EXPECT_EQ(stats.tokens, n);

  std::vector<float> want(static_cast<size_t>(c.dim), 0.0f);
  for (int32_t t : tokens) {
    const std::vector<float> h = rmsnorm_row(model.token_embedding.data_as<float>() + t * c.dim,
                                             model.layers[0].attn_norm.data_as<float>(), c.dim,
                                             static_cast<float>(c.norm_eps));
    for (int64_t k = 0; k < c.dim; ++k) want[k] = std::max(want[k], std::fabs(h[k]));
  }
  const LinearStats* q = stats.find("model.layers.0.self_attn.q_proj");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->in_features, c.dim);
  EXPECT_EQ(q->rows_seen, n);
  ASSERT_EQ(q->input_channel_absmax.size(), want.size());
  for (int64_t k = 0; k < c.dim; ++k)
    ASSERT_EQ(q->input_channel_absmax[k], want[k]) << "channel " << k << " REPRO tokens=" << n << " chunk=17";
  EXPECT_EQ(q->input_absmax, *std::max_element(want.begin(), want.end()));

  // q, k and v read the same normed input in every layer.
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    const LinearStats* sq = stats.find(p + "q_proj");
    const LinearStats* sk = stats.find(p + "k_proj");
    const LinearStats* sv = stats.find(p + "v_proj");
    ASSERT_TRUE(sq && sk && sv) << p;
    EXPECT_EQ(sq->input_channel_absmax, sk->input_channel_absmax) << p;
    EXPECT_EQ(sq->input_channel_absmax, sv->input_channel_absmax) << p;
    EXPECT_EQ(sq->input_absmax, sv->input_absmax) << p;
  }

  // Weight statistics: per-input-channel absmax = column absmax of [out, in], for every linear.
  const auto by_name = linears_by_name(model);
  EXPECT_EQ(stats.linears.size(), by_name.size()) << "every linear of a dense model is observed";
  for (const auto& [name, s] : stats.linears) {
    ASSERT_EQ(by_name.count(name), 1u) << name;
    const std::vector<float> cols = column_absmax_of(by_name.at(name)->weight);
    EXPECT_EQ(s.weight_channel_absmax, cols) << name;
    EXPECT_EQ(s.weight_absmax, *std::max_element(cols.begin(), cols.end())) << name;
    EXPECT_EQ(s.rows_seen, n) << name;
    EXPECT_GT(s.input_absmax, 0.0) << name;
  }
}

TEST(Calibration, MoeExpertsSeeTheirRoutedRowsOnly) {
  const ModelWeights model = make_default_model(small_options(4));
  const ModelConfig& c = model.config;
  const std::vector<int32_t> tokens = sampled_tokens(model, 80, kCalibrationSeed);
  const int64_t n = static_cast<int64_t>(tokens.size());
  CalibrationStats stats;
  ASSERT_TRUE(calibrate(model, tokens, n, &stats).ok());
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".block_sparse_moe.";
    const LinearStats* router = stats.find(p + "gate");
    ASSERT_NE(router, nullptr) << p;
    EXPECT_EQ(router->rows_seen, n);
    int64_t routed = 0;
    std::vector<float> union_absmax(static_cast<size_t>(c.dim), 0.0f);
    for (int64_t e = 0; e < c.n_experts; ++e) {
      const std::string ep = p + "experts." + std::to_string(e) + ".";
      const LinearStats* w1 = stats.find(ep + "w1");
      const LinearStats* w3 = stats.find(ep + "w3");
      if (w1 == nullptr) continue;  // an expert no token chose is never observed
      ASSERT_NE(w3, nullptr) << ep;
      EXPECT_EQ(w1->rows_seen, w3->rows_seen) << ep;
      EXPECT_EQ(w1->input_channel_absmax, w3->input_channel_absmax) << ep;
      routed += w1->rows_seen;
      for (int64_t k = 0; k < c.dim; ++k) {
        EXPECT_LE(w1->input_channel_absmax[k], router->input_channel_absmax[k]) << ep << " channel " << k;
        union_absmax[k] = std::max(union_absmax[k], w1->input_channel_absmax[k]);
      }
    }
    // Every token goes to exactly k experts, so the experts' rows partition n * k slots and their
    // union is every token the router saw.
    EXPECT_EQ(routed, n * c.n_experts_per_token) << p;
    EXPECT_EQ(union_absmax, router->input_channel_absmax) << p;
  }
}

// The KV cache's absmax: layer 0's values recomputed here (V = W_v x RMSNorm(embedding), no RoPE,
// the same at every position), and every layer's keys and values the elementwise max of each
// window's own cache (calibrate resets it between windows), each window run alone.
TEST(Calibration, KvCacheAbsmaxIsEveryWindowsCacheMaximum) {
  const ModelWeights model = make_default_model(small_options(0));
  const ModelConfig& c = model.config;
  const std::vector<int32_t> tokens = sampled_tokens(model, 45, kCalibrationSeed);
  const int64_t chunk = 20;  // windows of 20, 20 and 5
  CalibrationStats stats;
  ASSERT_TRUE(calibrate(model, tokens, chunk, &stats).ok());
  const KvCacheStats& kv = stats.kv_cache;
  ASSERT_EQ(kv.layers, c.n_layers);
  ASSERT_EQ(kv.kv_heads, c.n_kv_heads);
  ASSERT_EQ(kv.k_absmax.size(), static_cast<size_t>(c.n_layers * c.n_kv_heads));
  ASSERT_EQ(kv.v_absmax.size(), kv.k_absmax.size());

  const Linear* wv = linears_by_name(model).at("model.layers.0.self_attn.v_proj");
  ASSERT_TRUE(wv->bias.empty()) << "the default model has no v bias";
  const float* w = wv->weight.data_as<float>();
  const int64_t hd = c.head_dim;
  std::vector<double> want_v(static_cast<size_t>(c.n_kv_heads), 0.0);
  for (int32_t t : tokens) {
    const std::vector<float> h = rmsnorm_row(model.token_embedding.data_as<float>() + t * c.dim,
                                             model.layers[0].attn_norm.data_as<float>(), c.dim,
                                             static_cast<float>(c.norm_eps));
    for (int64_t o = 0; o < c.n_kv_heads * hd; ++o) {
      double y = 0.0;
      for (int64_t k = 0; k < c.dim; ++k) y += static_cast<double>(w[o * c.dim + k]) * h[static_cast<size_t>(k)];
      want_v[static_cast<size_t>(o / hd)] = std::max(want_v[static_cast<size_t>(o / hd)], std::fabs(y));
    }
  }
  for (int64_t h = 0; h < c.n_kv_heads; ++h) {
    EXPECT_GT(want_v[static_cast<size_t>(h)], 0.0);
    EXPECT_NEAR(kv.v_absmax[static_cast<size_t>(h)], want_v[static_cast<size_t>(h)], 1e-5 * want_v[static_cast<size_t>(h)])
        << "layer 0 head " << h;
  }

  std::vector<float> k_max(kv.k_absmax.size(), 0.0f), v_max(kv.v_absmax.size(), 0.0f);
  for (size_t start = 0; start < tokens.size(); start += static_cast<size_t>(chunk)) {
    const int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(tokens.size() - start));
    Transformer alone(model);
    std::vector<float> logits(static_cast<size_t>(n * c.vocab_size));
    ASSERT_TRUE(alone.forward(tokens.data() + start, n, 0, logits.data()).ok());
    std::vector<float> k, v;
    alone.kv_absmax(&k, &v);
    for (size_t i = 0; i < k.size(); ++i) {
      k_max[i] = std::max(k_max[i], k[i]);
      v_max[i] = std::max(v_max[i], v[i]);
    }
  }
  EXPECT_EQ(kv.k_absmax, k_max);
  EXPECT_EQ(kv.v_absmax, v_max);

  // A second run folds in by maximum; statistics of another shape are refused, naming both.
  CalibrationStats again = stats;
  ASSERT_TRUE(calibrate(model, std::vector<int32_t>(tokens.begin(), tokens.begin() + 5), chunk, &again).ok());
  EXPECT_EQ(again.kv_cache.k_absmax, kv.k_absmax) << "a window inside the first one adds no new maximum";
  ModelConfig other = c;
  other.n_kv_heads = c.n_kv_heads * 2;
  const Status st = stats.check_matches(other);
  EXPECT_TRUE(contains(st.message(), "KV cache statistics are for " + std::to_string(c.n_layers) + " layers of " +
                                         std::to_string(c.n_kv_heads) + " KV heads"))
      << st.to_string();
  EXPECT_TRUE(stats.check_matches(c).ok());
}

TEST(Calibration, SaveLoadRoundTripIsExact) {
  const ModelWeights model = make_default_model(small_options(4));
  CalibrationStats stats = calibrated(model);
  stats.model = "default small";
  stats.data = "sampled seeds 101..103";
  TempDir dir;
  const std::string path = dir.file("stats.json");
  ASSERT_TRUE(stats.save(path).ok());
  EXPECT_EQ(dir_entries(dir.path()), std::vector<std::string>{"stats.json"}) << "no temp file left behind";
  CalibrationStats back;
  const Status st = CalibrationStats::load(path, &back);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(back.model, stats.model);
  EXPECT_EQ(back.data, stats.data);
  EXPECT_EQ(back.tokens, stats.tokens);
  ASSERT_EQ(back.linears.size(), stats.linears.size());
  for (const auto& [name, s] : stats.linears) {
    const LinearStats* b = back.find(name);
    ASSERT_NE(b, nullptr) << name;
    EXPECT_EQ(b->in_features, s.in_features) << name;
    EXPECT_EQ(b->rows_seen, s.rows_seen) << name;
    EXPECT_EQ(b->input_absmax, s.input_absmax) << name;
    EXPECT_EQ(b->weight_absmax, s.weight_absmax) << name;
    // Bit-exact floats: the JSON must print enough digits.
    EXPECT_EQ(b->input_channel_absmax, s.input_channel_absmax) << name;
    EXPECT_EQ(b->weight_channel_absmax, s.weight_channel_absmax) << name;
  }
  ASSERT_FALSE(stats.kv_cache.empty());
  EXPECT_EQ(back.kv_cache.layers, stats.kv_cache.layers);
  EXPECT_EQ(back.kv_cache.kv_heads, stats.kv_cache.kv_heads);
  EXPECT_EQ(back.kv_cache.k_absmax, stats.kv_cache.k_absmax);
  EXPECT_EQ(back.kv_cache.v_absmax, stats.kv_cache.v_absmax);
}

TEST(Calibration, LoadErrorsNameTheFileAndTheFlag) {
  TempDir dir;
  CalibrationStats out;
  auto expect_error = [&](const std::string& path, const std::string& what) {
    const Status st = CalibrationStats::load(path, &out);
    ASSERT_FALSE(st.ok()) << path;
    EXPECT_TRUE(contains(st.message(), "--stats")) << st.message();
    EXPECT_TRUE(contains(st.message(), path)) << st.message();
    EXPECT_TRUE(contains(st.message(), what)) << "want '" << what << "' in: " << st.message();
  };
  expect_error(dir.file("missing.json"), "cannot open");
  write_text(dir.file("garbage.json"), "{ this is not json");
  expect_error(dir.file("garbage.json"), "");
  write_text(dir.file("other.json"), R"({"format": "something-else", "linears": {}})");
  expect_error(dir.file("other.json"), "llmq-calibration-v1");
  write_text(dir.file("short.json"),
             R"({"format": "llmq-calibration-v1", "linears": {"model.layers.0.self_attn.q_proj": {
                 "in_features": 3, "rows_seen": 1, "input_absmax": 1.0, "input_channel_absmax": [1, 2],
                 "weight_absmax": 1.0, "weight_channel_absmax": [1, 2, 3]}}})");
  expect_error(dir.file("short.json"), "model.layers.0.self_attn.q_proj");
  write_text(dir.file("kv_short.json"), R"({"format": "llmq-calibration-v1", "linears": {},
      "kv_cache": {"layers": 2, "kv_heads": 2, "k_absmax": [1, 2, 3, 4], "v_absmax": [1, 2, 3]}})");
  expect_error(dir.file("kv_short.json"), "kv_cache.v_absmax: 3 values for layers x kv_heads 4");
  write_text(dir.file("kv_negative.json"), R"({"format": "llmq-calibration-v1", "linears": {},
      "kv_cache": {"layers": 1, "kv_heads": 2, "k_absmax": [1, -2], "v_absmax": [1, 2]}})");
  expect_error(dir.file("kv_negative.json"), "kv_cache.k_absmax[1]");
  write_text(dir.file("kv_huge.json"), R"({"format": "llmq-calibration-v1", "linears": {},
      "kv_cache": {"layers": 9223372036854775807, "kv_heads": 9223372036854775807, "k_absmax": [], "v_absmax": []}})");
  expect_error(dir.file("kv_huge.json"), "at most 2^24 entries");
  // Files from before the KV statistics load without them.
  write_text(dir.file("old.json"), R"({"format": "llmq-calibration-v1", "linears": {}})");
  ASSERT_TRUE(CalibrationStats::load(dir.file("old.json"), &out).ok());
  EXPECT_TRUE(out.kv_cache.empty());
}

TEST(Calibration, BadChunkAndNoTokensAreErrors) {
  const ModelWeights model = make_default_model(small_options(0));
  CalibrationStats stats;
  const std::vector<int32_t> tokens = {1, 5, 9};
  EXPECT_TRUE(contains(calibrate(model, tokens, 0, &stats).message(), "--chunk"));
  EXPECT_TRUE(contains(calibrate(model, tokens, model.config.max_seq_len + 1, &stats).message(), "--chunk"));
  EXPECT_TRUE(contains(calibrate(model, {}, 8, &stats).message(), "--data"));
}

// =============================================================================================
// SmoothQuant

TEST(SmoothQuant, SmoothingKeepsTheFloatFunctionAndFollowsEquation26) {
  for (int64_t experts : {int64_t{0}, int64_t{4}}) {
    SCOPED_TRACE(std::string("REPRO model=") + kind_name(experts) + " alpha=0.5");
    const ModelWeights model = make_default_model(small_options(experts));
    const ModelConfig& c = model.config;
    const CalibrationStats stats = calibrated(model);
    constexpr float kAlpha = 0.5f;
    std::vector<SmoothingGroup> groups;
    ASSERT_TRUE(smoothing_groups(model, stats, kAlpha, &groups).ok());
    ASSERT_EQ(static_cast<int64_t>(groups.size()), 2 * c.n_layers);

    // Factors: s = r_x^a / r_w^(1-a), r_x the element-wise max of the members' input absmax,
    // r_w the max of their weight columns.
    const auto by_name = linears_by_name(model);
    for (size_t g = 0; g < groups.size(); ++g) {
      const SmoothingGroup& grp = groups[g];
      const int64_t layer = static_cast<int64_t>(g / 2);
      const std::string p = "model.layers." + std::to_string(layer) + ".";
      if (g % 2 == 0) {
        EXPECT_EQ(grp.norm, p + "input_layernorm.weight");
        EXPECT_EQ(grp.members, (std::vector<std::string>{p + "self_attn.q_proj", p + "self_attn.k_proj",
                                                         p + "self_attn.v_proj"}));
      } else {
        EXPECT_EQ(grp.norm, p + "post_attention_layernorm.weight");
        const size_t want = experts > 0 ? static_cast<size_t>(1 + 2 * experts) : 2u;
        EXPECT_EQ(grp.members.size(), want);
      }
      ASSERT_EQ(static_cast<int64_t>(grp.factors.size()), c.dim);
      std::vector<double> rx(static_cast<size_t>(c.dim), 0.0), rw(static_cast<size_t>(c.dim), 0.0);
      for (const std::string& m : grp.members) {
        if (const LinearStats* s = stats.find(m))
          for (int64_t k = 0; k < c.dim; ++k) rx[k] = std::max(rx[k], static_cast<double>(s->input_channel_absmax[k]));
        const std::vector<float> cols = column_absmax_of(by_name.at(m)->weight);
        for (int64_t k = 0; k < c.dim; ++k) rw[k] = std::max(rw[k], static_cast<double>(cols[k]));
      }
      for (int64_t k = 0; k < c.dim; ++k) {
        const double want = std::pow(rx[k], kAlpha) / std::pow(rw[k], 1.0 - kAlpha);
        ASSERT_NEAR(grp.factors[k], want, kSmoothFactorRelTolerance * want) << grp.norm << " channel " << k;
      }
    }

    // The float model's function is unchanged...
    ModelWeights smoothed = model;
    ASSERT_TRUE(apply_smoothing(groups, &smoothed).ok());
    EXPECT_NE(0, std::memcmp(smoothed.layers[0].attn_norm.data(), model.layers[0].attn_norm.data(),
                             static_cast<size_t>(model.layers[0].attn_norm.nbytes())))
        << "smoothing changed nothing";
    const std::vector<int32_t> tokens = sampled_tokens(model, kEvalLength, kEvalSeed);
    const double d = rel_diff(logits_of(smoothed, nullptr, tokens), logits_of(model, nullptr, tokens));
    EXPECT_LE(d, kSmoothingRelTolerance);

    // ...while q's input, divided by s, has a far smaller largest channel.
    const LinearStats* q = stats.find("model.layers.0.self_attn.q_proj");
    ASSERT_NE(q, nullptr);
    double before = 0, after = 0;
    for (int64_t k = 0; k < c.dim; ++k) {
      before = std::max(before, static_cast<double>(q->input_channel_absmax[k]));
      after = std::max(after, static_cast<double>(q->input_channel_absmax[k]) / groups[0].factors[k]);
    }
    EXPECT_GE(before / after, kMinOutlierReduction) << "before " << before << " after " << after;
  }
}

TEST(SmoothQuant, NeedsStatisticsAndAValidAlpha) {
  const ModelWeights model = make_default_model(small_options(0));
  std::vector<SmoothingGroup> groups;
  const Status none = smoothing_groups(model, CalibrationStats{}, 0.5f, &groups);
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(contains(none.message(), "--stats")) << none.message();
  EXPECT_TRUE(contains(none.message(), "input_layernorm")) << none.message();
  const CalibrationStats stats = calibrated(model);
  EXPECT_FALSE(smoothing_groups(model, stats, 1.5f, &groups).ok());
  EXPECT_FALSE(smoothing_groups(model, stats, -0.1f, &groups).ok());
}

}  // namespace
}  // namespace llmq
