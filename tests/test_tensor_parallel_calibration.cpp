// Calibration statistics put together: CalibrationStats::merge (two runs folded equal one run over
// both) and merge_tensor_parallel_calibration (the ranks of a split put back into the whole). The
// ranks' statistics are cut here from the CPU reference's whole-model statistics and weights by
// Megatron's split as written out below (q/k/v, gate/up and an expert's w1/w3 by output rows, o_proj,
// down_proj and an expert's w2 by input columns, lm_head by vocabulary rows, the router whole, KV by
// heads), which is what each rank's GPU observer measures; the merge must give the whole back
// exactly. test_cuda_tensor_parallel checks the same on two GPUs against one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "llmq/calibration.hpp"
#include "llmq/model.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/tensor_parallel.hpp"

namespace llmq {
namespace {

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = d(rng);
  return t;
}

void expect_same(const CalibrationStats& got, const CalibrationStats& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.linears.size(), want.linears.size()) << what;
  for (const auto& [name, w] : want.linears) {
    const LinearStats* g = got.find(name);
    ASSERT_NE(g, nullptr) << what << ": " << name << " missing";
    EXPECT_EQ(g->in_features, w.in_features) << what << " " << name;
    EXPECT_EQ(g->rows_seen, w.rows_seen) << what << " " << name;
    EXPECT_EQ(g->input_absmax, w.input_absmax) << what << " " << name;
    EXPECT_EQ(g->input_channel_absmax, w.input_channel_absmax) << what << " " << name;
    EXPECT_EQ(g->weight_absmax, w.weight_absmax) << what << " " << name;
    EXPECT_EQ(g->weight_channel_absmax, w.weight_channel_absmax) << what << " " << name;
  }
  EXPECT_EQ(got.kv_cache.layers, want.kv_cache.layers) << what;
  EXPECT_EQ(got.kv_cache.kv_heads, want.kv_cache.kv_heads) << what;
  EXPECT_EQ(got.kv_cache.k_absmax, want.kv_cache.k_absmax) << what;
  EXPECT_EQ(got.kv_cache.v_absmax, want.kv_cache.v_absmax) << what;
}

TEST(CalibrationMerge, TwoRunsFoldedEqualOneRunOverBoth) {
  for (int64_t experts : {0, 4}) {
    DefaultModelOptions mo;
    mo.n_experts = experts;
    const ModelWeights model = make_default_model(mo);
    const std::vector<int32_t> a = random_tokens(40, model.config.vocab_size, 1);
    const std::vector<int32_t> b = random_tokens(33, model.config.vocab_size, 2);
    CalibrationStats one, first, second;
    ASSERT_TRUE(calibrate(model, a, 16, &one).ok());
    ASSERT_TRUE(calibrate(model, b, 16, &one).ok());
    ASSERT_TRUE(calibrate(model, a, 16, &first).ok());
    ASSERT_TRUE(calibrate(model, b, 16, &second).ok());
    ASSERT_NE(first.linears.begin()->second.input_channel_absmax, second.linears.begin()->second.input_channel_absmax)
        << "the two runs must differ for the fold to show";
    ASSERT_TRUE(first.merge(second).ok());
    expect_same(first, one, experts > 0 ? "moe" : "dense");

    // Another width or KV shape is refused and changes nothing.
    CalibrationStats bad = second, kept = first;
    bad.linears.begin()->second.in_features += 1;
    bad.linears.begin()->second.input_channel_absmax.push_back(1.0f);
    Status st = first.merge(bad);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(bad.linears.begin()->first), std::string::npos) << st.message();
    expect_same(first, kept, "after a refused merge");
    bad = second;
    bad.kv_cache.kv_heads = 1;
    bad.kv_cache.k_absmax.resize(static_cast<size_t>(bad.kv_cache.layers));
    bad.kv_cache.v_absmax.resize(static_cast<size_t>(bad.kv_cache.layers));
    st = first.merge(bad);
    EXPECT_NE(st.message().find("KV heads"), std::string::npos) << st.message();
    expect_same(first, kept, "after a refused KV merge");
    // Either side's entry with maxima of another length than its in_features is refused by name.
    CalibrationStats broken = first;
    LinearStats& entry = broken.linears.begin()->second;
    entry.weight_channel_absmax.push_back(1.0f);
    const CalibrationStats broken_kept = broken;
    st = broken.merge(second);
    EXPECT_NE(st.message().find(broken.linears.begin()->first), std::string::npos) << st.message();
    expect_same(broken, broken_kept, "after merging into a broken entry");
    st = first.merge(broken_kept);
    EXPECT_NE(st.message().find(broken.linears.begin()->first), std::string::npos) << st.message();
    expect_same(first, kept, "after merging a broken entry in");
  }
}

// Per-input-channel absmax of rows [r0, r1) and columns [c0, c1) of a weight [n, k].
std::vector<float> column_absmax(const Tensor& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const int64_t k = w.shape()[1];
  std::vector<float> m(static_cast<size_t>(c1 - c0), 0.0f);
  for (int64_t i = r0; i < r1; ++i)
    for (int64_t j = c0; j < c1; ++j)
      m[static_cast<size_t>(j - c0)] = std::max(m[static_cast<size_t>(j - c0)], std::fabs(w.data_as<float>()[i * k + j]));
  return m;
}

// What rank `r` of `n` measures of the whole model's statistics: its slices, under the same names.
CalibrationStats rank_view(const ModelWeights& model, const CalibrationStats& whole, int64_t r, int64_t n) {
  const ModelConfig& c = model.config;
  CalibrationStats s;
  s.model = whole.model;
  s.data = whole.data;
  s.tokens = whole.tokens;
  for (const LinearId& id : linear_ids(c)) {
    const std::string name = id.hf_name(c);
    const LinearStats* w = whole.find(name);
    if (w == nullptr) continue;
    const Tensor& weight = model.find_linear(id)->weight;
    const int64_t rows = weight.shape()[0], k = weight.shape()[1];
    const bool columns = id.role == LinearRole::kO || id.role == LinearRole::kDown;
    const bool whole_rows = id.role == LinearRole::kRouter || (id.role == LinearRole::kLmHead && rows % n != 0);
    int64_t r0 = 0, r1 = rows, c0 = 0, c1 = k;
    if (columns) {
      c0 = r * k / n;
      c1 = (r + 1) * k / n;
    } else if (!whole_rows) {
      r0 = r * rows / n;
      r1 = (r + 1) * rows / n;
    }
    LinearStats l;
    l.in_features = c1 - c0;
    l.rows_seen = w->rows_seen;
    l.input_channel_absmax.assign(w->input_channel_absmax.begin() + c0, w->input_channel_absmax.begin() + c1);
    for (float v : l.input_channel_absmax) l.input_absmax = std::max(l.input_absmax, static_cast<double>(v));
    l.weight_channel_absmax = column_absmax(weight, r0, r1, c0, c1);
    for (float v : l.weight_channel_absmax) l.weight_absmax = std::max(l.weight_absmax, static_cast<double>(v));
    s.linears[name] = std::move(l);
  }
  const int64_t heads = c.n_kv_heads / n;
  std::vector<float> k, v;
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int64_t h = r * heads; h < (r + 1) * heads; ++h) {
      k.push_back(whole.kv_cache.k_absmax[static_cast<size_t>(l * c.n_kv_heads + h)]);
      v.push_back(whole.kv_cache.v_absmax[static_cast<size_t>(l * c.n_kv_heads + h)]);
    }
  EXPECT_TRUE(s.kv_cache.merge(k, v, c.n_layers, heads).ok());
  return s;
}

TEST(TensorParallelCalibration, RanksPutTogetherAreTheWhole) {
  for (int64_t experts : {0, 4}) {
    DefaultModelOptions mo;
    mo.n_experts = experts;
    const ModelWeights model = make_default_model(mo);
    CalibrationStats whole;
    ASSERT_TRUE(calibrate(model, random_tokens(48, model.config.vocab_size, 3), 24, &whole).ok());
    ASSERT_FALSE(whole.kv_cache.empty());
    for (int64_t n : {1, 2, 4}) {
      std::vector<CalibrationStats> ranks;
      for (int64_t r = 0; r < n; ++r) ranks.push_back(rank_view(model, whole, r, n));
      CalibrationStats merged;
      const Status st = merge_tensor_parallel_calibration(model.config, ranks, &merged);
      ASSERT_TRUE(st.ok()) << st.to_string();
      expect_same(merged, whole, (experts > 0 ? "moe tp " : "dense tp ") + std::to_string(n));
    }
  }
}

TEST(TensorParallelCalibration, RanksThatDisagreeAreRefusedByName) {
  const ModelWeights model = make_default_model(DefaultModelOptions());
  CalibrationStats whole;
  ASSERT_TRUE(calibrate(model, random_tokens(30, model.config.vocab_size, 4), 30, &whole).ok());
  const std::vector<CalibrationStats> good = {rank_view(model, whole, 0, 2), rank_view(model, whole, 1, 2)};
  const std::string o = "model.layers.1.self_attn.o_proj", q = "model.layers.0.self_attn.q_proj";
  struct Case {
    std::string what, expect;
    std::function<void(std::vector<CalibrationStats>*)> spoil;
  };
  const std::vector<Case> cases = {
      {"missing on rank 1", o, [&](auto* r) { (*r)[1].linears.erase(o); }},
      {"whole width on a rank", o,
       [&](auto* r) {
         (*r)[0].linears[o] = whole.linears.at(o);
       }},
      {"rows differ", q, [&](auto* r) { (*r)[1].linears[q].rows_seen += 1; }},
      {"not a linear of the model", "model.layers.9.mlp.up_proj",
       [&](auto* r) { (*r)[0].linears["model.layers.9.mlp.up_proj"] = whole.linears.at(q); }},
      {"KV cache on one rank", "KV cache", [&](auto* r) { (*r)[1].kv_cache = KvCacheStats(); }},
      {"KV heads", "KV cache",
       [&](auto* r) {
         (*r)[0].kv_cache = whole.kv_cache;
         (*r)[1].kv_cache = whole.kv_cache;
       }},
  };
  CalibrationStats merged;
  for (const Case& c : cases) {
    std::vector<CalibrationStats> ranks = good;
    c.spoil(&ranks);
    const Status st = merge_tensor_parallel_calibration(model.config, ranks, &merged);
    EXPECT_FALSE(st.ok()) << c.what;
    EXPECT_NE(st.message().find(c.expect), std::string::npos) << c.what << ": " << st.message();
    EXPECT_TRUE(merged.linears.empty()) << c.what << ": *out changed";
  }
  // Three ranks do not split 4 KV heads.
  const std::vector<CalibrationStats> three = {good[0], good[1], good[1]};
  EXPECT_NE(merge_tensor_parallel_calibration(model.config, three, &merged).message().find("num_key_value_heads"),
            std::string::npos);
}

}  // namespace
}  // namespace llmq
