// Whole-model quantization end to end: the scheme table; calibration statistics checked against a
// recomputation written here; SmoothQuant's function-preserving rewrite and its factors (eq. 26);
// quantize_model and QuantizedLinearBackend (bit for bit against quantize -> quantized_gemm); and
// evaluate() with the token-data readers. Export lives in test_model_export.cpp. Models are small
// seeded default models (dense and MoE) and, when present, llama2.c's stories260K.
#include "model_quantize_support.hpp"

namespace llmq {
namespace {

TEST(Schemes, NamesAreUniqueAndEachIsFound) {
  std::set<std::string> names;
  for (const Scheme& s : all_schemes()) {
    EXPECT_TRUE(names.insert(s.name).second) << "duplicate scheme name " << s.name;
    EXPECT_FALSE(s.description.empty()) << s.name;
    Scheme found;
    ASSERT_TRUE(find_scheme(s.name, &found).ok()) << s.name;
    EXPECT_EQ(found.name, s.name);
  }
  EXPECT_GE(names.size(), 10u);
  EXPECT_EQ(names.count(kDefaultScheme), 1u) << "the default scheme must be in the table";
  EXPECT_EQ(all_schemes().front().name, kDefaultScheme);
}

TEST(Schemes, UnknownNameListsEveryKnownName) {
  Scheme s;
  const Status st = find_scheme("fp9-imaginary", &s);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(st.message(), "--scheme")) << st.message();
  EXPECT_TRUE(contains(st.message(), "'fp9-imaginary'")) << st.message();
  for (const Scheme& k : all_schemes()) EXPECT_TRUE(contains(st.message(), k.name)) << k.name << ": " << st.message();
}

TEST(Schemes, NeedsStatisticsExactlyForStaticAndSmoothQuantSchemes) {
  // Written out by hand so that a changed table or a changed predicate both show up here.
  const std::set<std::string> expected = {"fp8-unit",  "fp8-tensor-static", "fp8-channel-static", "fp8-pow2",
                                          "fp8-hwset", "fp8-smoothquant",   "int8-smoothquant"};
  std::set<std::string> got;
  for (const Scheme& s : all_schemes()) {
    if (s.needs_statistics()) got.insert(s.name);
    EXPECT_EQ(s.needs_statistics(), is_static(s) || s.smooth_alpha >= 0.0f) << s.name;
  }
  EXPECT_EQ(got, expected);
  // Weight-only never needs activation statistics, whatever its (unused) activation spec says.
  Scheme weight_only;
  weight_only.quantize_activations = false;
  weight_only.activation.source = ScaleSource::kStatic;
  EXPECT_FALSE(weight_only.needs_statistics());
  weight_only.smooth_alpha = 0.0f;  // alpha 0 is still SmoothQuant
  EXPECT_TRUE(weight_only.needs_statistics());
}

TEST(Schemes, ExportFormatNames) {
  EXPECT_STREQ(export_format_name(ExportFormat::kVllmFp8), "vllm-fp8");
  EXPECT_STREQ(export_format_name(ExportFormat::kCompressedTensors), "compressed-tensors");
  EXPECT_STREQ(export_format_name(ExportFormat::kNone), "none");
}

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

// =============================================================================================
// quantize_model and QuantizedLinearBackend

// KL(float || quantized) of every scheme on `tokens`: finite, nonzero, and a small fraction of
// the KL of a model that knows nothing.
using QuantizedOf = std::function<const QuantizedModel&(const Scheme&)>;
std::map<std::string, EvalAccumulator::Summary> scheme_kls(const ModelWeights& model, const QuantizedOf& quantized_of,
                                                           const std::vector<int32_t>& tokens, const std::string& label) {
  std::map<std::string, EvalAccumulator::Summary> out;
  const std::vector<float> base = logits_of(model, nullptr, tokens);
  // The yardstick: a model that knows nothing (uniform next-token distribution).
  const double know_nothing = compare(base, std::vector<float>(base.size(), 0.0f), tokens, model.config.vocab_size).kl.mean;
  for (const Scheme& scheme : all_schemes()) {
    SCOPED_TRACE("REPRO scheme=" + scheme.name + " model=" + label + " tokens=" + std::to_string(tokens.size()));
    const QuantizedModel& qm = quantized_of(scheme);
    QuantizedLinearBackend backend(qm);
    const std::vector<float> q = logits_of(qm.weights, &backend, tokens);
    EXPECT_TRUE(std::all_of(q.begin(), q.end(), [](float v) { return std::isfinite(v); }));
    EXPECT_NE(0, std::memcmp(q.data(), base.data(), q.size() * sizeof(float))) << "quantization changed nothing";
    const EvalAccumulator::Summary s = compare(base, q, tokens, model.config.vocab_size);
    const bool int8 = scheme.weight.format == DType::kI8;
    EXPECT_GT(s.kl.mean, 0.0);
    EXPECT_LE(s.kl.mean, (int8 ? kMaxInt8KlFractionOfUniform : kMaxKlFractionOfUniform) * know_nothing)
        << "KL(float || uniform) = " << know_nothing;
    EXPECT_GE(s.top1_agreement.mean, kMinSchemeTop1);
    std::printf("  %-22s %-20s KL %.3e (%.3f of uniform's)  top1 %.3f  ppl ratio %.4f\n", label.c_str(),
                scheme.name.c_str(), s.kl.mean, s.kl.mean / know_nothing, s.top1_agreement.mean, s.ppl_ratio);
    out[scheme.name] = s;
  }
  return out;
}

TEST(QuantizeModel, EverySchemeRunsCloseToButNotEqualToFloat) {
  for (int64_t experts : {int64_t{0}, int64_t{4}}) {
    const ModelWeights& model = small_model(experts).model;
    const std::vector<int32_t> tokens = sampled_tokens(model, kEvalLength, kEvalSeed);
    ASSERT_GE(static_cast<int64_t>(tokens.size()), kEvalLength / 2);
    const auto kl = scheme_kls(
        model, [experts](const Scheme& s) -> const QuantizedModel& { return quantized(experts, s); }, tokens,
        kind_name(experts));
    // The default model's outlier channels are what SmoothQuant is for: INT8 per-token activations
    // lose their small channels to the outliers' scale, and smoothing must win clearly (measured
    // 7-40x lower KL). FP8's range absorbs outliers, so no such margin is required of it.
    ASSERT_TRUE(kl.count("int8-smoothquant") && kl.count("int8-w8a8"));
    EXPECT_LT(kl.at("int8-smoothquant").kl.mean * kMinSmoothQuantInt8Gain, kl.at("int8-w8a8").kl.mean)
        << kind_name(experts);
  }
}

TEST(QuantizeModel, Stories260KEverySchemeRunsCloseToFloat) {
  if (!have_stories()) GTEST_SKIP() << skip_reason();
  const ModelWeights& model = small_model(kStories).model;
  const std::vector<int32_t> tokens = sampled_tokens(model, 96, kEvalSeed);
  ASSERT_GE(tokens.size(), 48u);
  scheme_kls(
      model, [](const Scheme& s) -> const QuantizedModel& { return quantized(kStories, s); }, tokens, "stories260K");
}

// The backend for one linear, against the library's pieces called by hand: the stored weight is
// quantize_weight of the (smoothed) float weight, and the output is quantize(x) -> quantized_gemm.
TEST(QuantizeModel, BackendEqualsQuantizeThenGemmBitForBit) {
  for (int64_t experts : {int64_t{0}, int64_t{4}}) {
    const std::vector<std::string> modules = {
        "model.layers.1.self_attn.q_proj", "model.layers.0.self_attn.o_proj",
        experts > 0 ? "model.layers.0.block_sparse_moe.experts.2.w2" : "model.layers.0.mlp.down_proj"};
    for (const Scheme& scheme : all_schemes()) {
      const QuantizedModel& qm = quantized(experts, scheme);
      const auto by_name = linears_by_name(qm.weights);
      QuantizedLinearBackend backend(qm);
      for (const std::string& module : modules) {
        constexpr int64_t kRows = 19;
        const uint64_t seed = 5;
        const Linear& lin = *by_name.at(module);
        const int64_t out = lin.weight.shape()[0], in = lin.weight.shape()[1];
        SCOPED_TRACE(testing::repro(seed, kRows, in, scheme_repro(scheme, experts) + " module=" + module));
        const QuantizedLinear* ql = qm.find(module);
        ASSERT_NE(ql, nullptr);

        QuantizedTensor w;
        ASSERT_TRUE(quantize_weight(lin.weight, scheme, &w).ok());
        ASSERT_EQ(w.data.nbytes(), ql->weight.data.nbytes());
        EXPECT_EQ(0, std::memcmp(w.data.data(), ql->weight.data.data(), static_cast<size_t>(w.data.nbytes())));
        ASSERT_EQ(w.scales.scales.nbytes(), ql->weight.scales.scales.nbytes());
        EXPECT_EQ(0, std::memcmp(w.scales.scales.data(), ql->weight.scales.scales.data(),
                                 static_cast<size_t>(w.scales.scales.nbytes())));

        const std::vector<float> x = testing::outlier_matrix(kRows, in, seed);
        const TensorView xv = matrix_view(x.data(), kRows, in);
        std::vector<float> want(static_cast<size_t>(kRows * out), std::nanf(""));
        QuantizedTensor qx;
        GemmOperand a = GemmOperand::of(xv);
        EXPECT_EQ(ql->quantize_input, scheme.quantize_activations);
        if (scheme.quantize_activations) {
          if (is_static(scheme) && ql->input_spec.source == ScaleSource::kStatic) {
            ScaleSet s;
            s.scales = Tensor(DType::kF32, {1, 1});
            s.scales.data_as<float>()[0] = ql->static_input_scale.scales.data_as<float>()[0];
            s.block = {kRows, in};
            ASSERT_TRUE(quantize(xv, scheme.activation, &qx, &s).ok());
          } else {
            EXPECT_FALSE(is_static(scheme)) << "a calibrated linear fell back to dynamic scales";
            ASSERT_TRUE(quantize(xv, scheme.activation, &qx).ok());
          }
          a = GemmOperand::of(qx);
        }
        ASSERT_TRUE(quantized_gemm(a, GemmOperand::of(w), matrix_view(want.data(), kRows, out)).ok());

        std::vector<float> got(static_cast<size_t>(kRows * out), std::nanf(""));
        ASSERT_TRUE(backend.forward(lin, x.data(), kRows, got.data()).ok());
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
              << "first difference at (" << i / out << ", " << i % out << "): " << got[i] << " vs " << want[i];
        // Run to run: the same input gives the same bits.
        std::vector<float> again(got.size(), std::nanf(""));
        ASSERT_TRUE(backend.forward(lin, x.data(), kRows, again.data()).ok());
        EXPECT_EQ(0, std::memcmp(again.data(), got.data(), got.size() * sizeof(float)));
      }
    }
  }
}

// The quantized model against the float model run on dequantized operands ("fake quantization"):
// each linear's input is quantized and dequantized as the scheme says, its weight is the
// dequantized stored weight, and the product is a float matmul. What is left is the GEMM's
// accumulation order, so quantization error and GEMM error are measured apart.
class FakeQuantBackend : public LinearBackend {
 public:
  explicit FakeQuantBackend(const QuantizedModel& qm) : qm_(qm) {}
  Status forward(const Linear& linear, const float* x, int64_t rows, float* y) override {
    const QuantizedLinear* ql = qm_.find(linear.id.hf_name(qm_.weights.config));
    if (ql == nullptr) return float_.forward(linear, x, rows, y);
    const int64_t in = linear.weight.shape()[1];
    auto [it, fresh] = dequantized_.try_emplace(linear.id.hf_name(qm_.weights.config));
    Linear& deq = it->second;
    if (fresh) {
      deq.id = linear.id;
      deq.bias = linear.bias;
      deq.weight = Tensor(DType::kF32, linear.weight.shape());
      LLMQ_RETURN_IF_ERROR(dequantize(ql->weight, deq.weight.view()));
    }
    std::vector<float> xq(x, x + rows * in);
    if (ql->quantize_input) {
      QuantizedTensor q;
      const TensorView xv = matrix_view(x, rows, in);
      if (ql->input_spec.source == ScaleSource::kStatic) {
        ScaleSet s = ql->static_input_scale;
        s.block = {rows, in};
        LLMQ_RETURN_IF_ERROR(quantize(xv, ql->input_spec, &q, &s));
      } else {
        LLMQ_RETURN_IF_ERROR(quantize(xv, ql->input_spec, &q));
      }
      LLMQ_RETURN_IF_ERROR(dequantize(q, matrix_view(xq.data(), rows, in)));
    }
    return float_.forward(deq, xq.data(), rows, y);
  }

 private:
  const QuantizedModel& qm_;
  FloatLinearBackend float_;
  std::map<std::string, Linear> dequantized_;  // by module, built on first use
};

TEST(QuantizeModel, QuantizedModelEqualsFloatModelOnDequantizedOperands) {
  for (int64_t experts : {int64_t{0}, int64_t{4}}) {
    const ModelWeights& model = small_model(experts).model;
    const std::vector<int32_t> tokens = sampled_tokens(model, 32, kEvalSeed);
    for (const Scheme& scheme : all_schemes()) {
      SCOPED_TRACE(scheme_repro(scheme, experts));
      const QuantizedModel& qm = quantized(experts, scheme);
      QuantizedLinearBackend real(qm);
      FakeQuantBackend fake(qm);
      const std::vector<float> a = logits_of(qm.weights, &real, tokens), b = logits_of(qm.weights, &fake, tokens);
      const EvalAccumulator::Summary s = compare(b, a, tokens, model.config.vocab_size);
      EXPECT_LE(s.kl.mean, kFakeQuantMaxKl);
      std::printf("  %-22s %-20s KL(fake-quant || quantized) %.2e  max rel logit diff %.2e\n", kind_name(experts),
                  scheme.name.c_str(), s.kl.mean, rel_diff(a, b));
      // Weight-only has no activation rounding for a reordered sum to push across a boundary.
      if (!scheme.quantize_activations) {
        EXPECT_LE(rel_diff(a, b), kWeightOnlyFakeQuantRelTolerance);
      }
    }
  }
}

TEST(QuantizeModel, StaticScalesComeFromTheCalibration) {
  const ModelWeights& model = small_model(0).model;
  const CalibrationStats& stats = small_model(0).stats;
  const std::string module = "model.layers.1.mlp.gate_proj";
  const LinearStats* st = stats.find(module);
  ASSERT_NE(st, nullptr);
  const double r_q = 448.0;  // e4m3 max
  const double plain = st->input_absmax / r_q;
  auto scale_of = [&](const std::string& name) {
    Scheme s;
    EXPECT_TRUE(find_scheme(name, &s).ok());
    const QuantizedLinear* ql = quantized(0, s).find(module);
    EXPECT_TRUE(ql != nullptr && ql->input_spec.source == ScaleSource::kStatic) << name;
    return ql ? static_cast<double>(ql->static_input_scale.scales.data_as<float>()[0]) : 0.0;
  };
  EXPECT_NEAR(scale_of("fp8-tensor-static"), plain, kStaticScaleRelTolerance * plain);
  EXPECT_NEAR(scale_of("fp8-channel-static"), plain, kStaticScaleRelTolerance * plain);
  EXPECT_EQ(scale_of("fp8-unit"), 1.0);
  const double pow2 = scale_of("fp8-pow2");
  EXPECT_EQ(pow2, std::exp2(std::ceil(std::log2(plain)))) << "the next power of two at or above " << plain;
  const double hw = scale_of("fp8-hwset");
  double want_hw = 16.0;  // the smallest member of {2^-8, 2^-4, 1, 16} >= s, else the largest
  for (double m : {0x1p-8, 0x1p-4, 1.0, 16.0})
    if (m >= plain) {
      want_hw = m;
      break;
    }
  EXPECT_EQ(hw, want_hw) << "plain scale " << plain;

  // SmoothQuant (eq. 27): max_k (r_x[k] / s[k]) / r_q, with gate_proj's group factors.
  std::vector<SmoothingGroup> groups;
  ASSERT_TRUE(smoothing_groups(model, stats, 0.5f, &groups).ok());
  const std::vector<float>& s = groups[3].factors;  // layer 1 post_attention_layernorm
  ASSERT_EQ(groups[3].norm, "model.layers.1.post_attention_layernorm.weight");
  double r = 0;
  for (size_t k = 0; k < s.size(); ++k)
    r = std::max(r, static_cast<double>(st->input_channel_absmax[k] / s[k]));
  EXPECT_NEAR(scale_of("fp8-smoothquant"), r / r_q, kStaticScaleRelTolerance * r / r_q);
  EXPECT_LT(r, st->input_absmax) << "smoothing must shrink the activation range";
}

TEST(QuantizeModel, LmHeadAndRoutersAreKeptUnlessAsked) {
  for (int64_t experts : {int64_t{0}, int64_t{4}}) {
    SCOPED_TRACE(std::string("REPRO model=") + kind_name(experts) + " scheme=fp8-dynamic");
    const ModelWeights model = make_default_model(small_options(experts));
    const ModelConfig& c = model.config;
    Scheme scheme;
    ASSERT_TRUE(find_scheme("fp8-dynamic", &scheme).ok());
    QuantizedModel plain, with_head, with_router;
    ASSERT_TRUE(quantize_model(model, scheme, nullptr, {}, &plain).ok());
    const size_t per_layer = experts > 0 ? static_cast<size_t>(4 + 3 * experts) : 7u;
    EXPECT_EQ(plain.linears.size(), per_layer * static_cast<size_t>(c.n_layers));
    EXPECT_EQ(plain.find("lm_head"), nullptr);
    if (experts > 0) {
      EXPECT_EQ(plain.find("model.layers.0.block_sparse_moe.gate"), nullptr);
    }

    QuantizeModelOptions head;
    head.quantize_lm_head = true;
    ASSERT_TRUE(quantize_model(model, scheme, nullptr, head, &with_head).ok());
    ASSERT_NE(with_head.find("lm_head"), nullptr);
    EXPECT_EQ(with_head.linears.size(), plain.linears.size() + 1);
    const std::vector<int32_t> tokens = sampled_tokens(model, 16, kEvalSeed);
    QuantizedLinearBackend b1(plain), b2(with_head);
    const std::vector<float> l1 = logits_of(plain.weights, &b1, tokens), l2 = logits_of(with_head.weights, &b2, tokens);
    EXPECT_NE(0, std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float))) << "quantizing lm_head changed nothing";

    if (experts > 0) {
      QuantizeModelOptions router;
      router.quantize_router = true;
      ASSERT_TRUE(quantize_model(model, scheme, nullptr, router, &with_router).ok());
      EXPECT_NE(with_router.find("model.layers.0.block_sparse_moe.gate"), nullptr);
      EXPECT_EQ(with_router.linears.size(), plain.linears.size() + static_cast<size_t>(c.n_layers));
    }
  }
}

TEST(QuantizeModel, SchemesThatNeedStatisticsRefuseToRunWithout) {
  const ModelWeights model = make_default_model(small_options(0));
  TempDir dir;
  const auto src = memory_weight_source(model);
  for (const Scheme& scheme : all_schemes()) {
    SCOPED_TRACE(scheme_repro(scheme, 0));
    // Whether a scheme asks for statistics does not depend on its weights: plan fp8-mse's export
    // only, rather than run its slow weight search.
    const bool run = scheme.needs_statistics() || !slow_weight_search(scheme);
    QuantizedModel qm;
    const Status st = run ? quantize_model(model, scheme, nullptr, {}, &qm) : Status();
    ExportSummary sum;
    ExportOptions options;
    options.dry_run = !run;
    const Status ex = export_quantized(is_block(scheme) ? *memory_weight_source(small_model(kAligned).model) : *src,
                                       scheme, nullptr, dir.file(scheme.name), options, &sum);
    if (scheme.needs_statistics()) {
      ASSERT_FALSE(st.ok());
      EXPECT_TRUE(contains(st.message(), "--stats")) << st.message();
      EXPECT_TRUE(contains(st.message(), scheme.name)) << st.message();
      ASSERT_FALSE(ex.ok());
      EXPECT_TRUE(contains(ex.message(), "--stats")) << ex.message();
      EXPECT_FALSE(fs::exists(dir.file(scheme.name)));
    } else {
      EXPECT_TRUE(st.ok()) << st.to_string();
      EXPECT_TRUE(ex.ok()) << ex.to_string();
    }
  }
}

// =============================================================================================
// evaluate() and token data

TEST(Evaluate, AnIdenticalCandidateHasZeroKlAndPplRatioOne) {
  const ModelWeights model = make_default_model(small_options(0));
  Transformer base(model), same(model);
  std::vector<std::vector<int32_t>> seqs;
  ASSERT_TRUE(sample_token_sequences(model, 2, 30, kEvalSeed, &seqs).ok());
  EvalOptions options;
  options.context = 16;
  std::vector<EvalAccumulator> results;
  ASSERT_TRUE(evaluate(&base, {&same}, seqs, options, &results).ok());
  ASSERT_EQ(results.size(), 1u);
  const EvalAccumulator::Summary s = results[0].summarize();
  EXPECT_EQ(s.tokens, static_cast<int64_t>(seqs[0].size() + seqs[1].size()));
  EXPECT_EQ(s.kl.mean, 0.0);
  EXPECT_EQ(s.kl_max, 0.0);
  EXPECT_EQ(s.ppl_ratio, 1.0);
  EXPECT_EQ(s.top1_agreement.mean, 1.0);
  EXPECT_EQ(s.ppl_base, s.ppl_quant);
}

// The windows built by hand: [BOS] + up to context - 1 tokens, a leading BOS of a sequence
// dropped, every token of a window predicted from the positions before it.
TEST(Evaluate, WindowsStartWithBosAndEveryTokenIsScoredOnce) {
  const ModelWeights model = make_default_model(small_options(0));
  const int32_t bos = model.config.bos_token;
  Scheme scheme;
  ASSERT_TRUE(find_scheme("int8-w8a8", &scheme).ok());
  QuantizedModel qm;
  ASSERT_TRUE(quantize_model(model, scheme, nullptr, {}, &qm).ok());
  QuantizedLinearBackend backend(qm);
  Transformer base(model), cand(qm.weights, &backend);
  const std::vector<std::vector<int32_t>> seqs = {{bos, 10, 11, 12, 13, 14, 15, 16}, {20, 21, 22}, {}, {bos}};
  constexpr int64_t kContext = 4;
  SCOPED_TRACE("REPRO context=4 sequences={BOS 10..16} {20 21 22} {} {BOS} candidate=int8-w8a8 dense");
  EvalOptions options;
  options.context = kContext;
  std::vector<int64_t> progress;
  options.progress = [&](int64_t scored, int64_t total) {
    progress.push_back(scored);
    EXPECT_EQ(total, 10);
  };
  std::vector<EvalAccumulator> results;
  ASSERT_TRUE(evaluate(&base, {&cand}, seqs, options, &results).ok());
  EXPECT_EQ(progress, (std::vector<int64_t>{3, 6, 7, 10}));

  const std::vector<std::vector<int32_t>> windows = {{bos, 10, 11, 12}, {bos, 13, 14, 15}, {bos, 16}, {bos, 20, 21, 22}};
  EvalAccumulator want;
  for (const auto& w : windows) {
    const std::vector<float> lb = logits_of(model, nullptr, w), lq = logits_of(qm.weights, &backend, w);
    const int64_t v = model.config.vocab_size;
    for (size_t p = 0; p + 1 < w.size(); ++p) ASSERT_TRUE(want.add(&lb[p * v], &lq[p * v], v, w[p + 1]).ok());
  }
  const EvalAccumulator::Summary got = results[0].summarize(), exp = want.summarize();
  EXPECT_EQ(got.tokens, 10);
  EXPECT_EQ(got.tokens, exp.tokens);
  EXPECT_EQ(got.kl.mean, exp.kl.mean);
  EXPECT_EQ(got.kl_max, exp.kl_max);
  EXPECT_EQ(got.ppl_base, exp.ppl_base);
  EXPECT_EQ(got.ppl_quant, exp.ppl_quant);
  EXPECT_EQ(got.delta_p.mean, exp.delta_p.mean);
  EXPECT_GT(got.kl.mean, 0.0);

  // max_tokens stops mid-window.
  options.max_tokens = 5;
  options.progress = nullptr;
  ASSERT_TRUE(evaluate(&base, {&cand}, seqs, options, &results).ok());
  EXPECT_EQ(results[0].count(), 5);
}

TEST(Evaluate, BadContextAndVocabularyMismatchAreErrors) {
  const ModelWeights model = make_default_model(small_options(0));
  DefaultModelOptions other_options = small_options(0);
  other_options.vocab_size = 96;
  const ModelWeights other = make_default_model(other_options);
  Transformer base(model), cand(other);
  const std::vector<std::vector<int32_t>> seqs = {{3, 4, 5}};
  std::vector<EvalAccumulator> results;
  EvalOptions options;
  options.context = 1;
  EXPECT_TRUE(contains(evaluate(&base, {}, seqs, options, &results).message(), "--context"));
  options.context = model.config.max_seq_len + 1;
  EXPECT_TRUE(contains(evaluate(&base, {}, seqs, options, &results).message(), "--context"));
  options.context = 8;
  const Status st = evaluate(&base, {&cand}, seqs, options, &results);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "vocabulary")) << st.message();
}

TEST(TokenData, ReadsIdsPerLineAndRejectsTextAndOutOfVocabularyIds) {
  TempDir dir;
  std::vector<std::vector<int32_t>> seqs;
  write_text(dir.file("ok.txt"), "1 5 7\n\n  3\t4  \n");
  ASSERT_TRUE(read_token_sequences(dir.file("ok.txt"), 160, &seqs).ok());
  EXPECT_EQ(seqs, (std::vector<std::vector<int32_t>>{{1, 5, 7}, {3, 4}}));

  auto expect_error = [&](const std::string& file, const std::string& text, const std::vector<std::string>& words) {
    write_text(dir.file(file), text);
    const Status st = read_token_sequences(dir.file(file), 160, &seqs);
    ASSERT_FALSE(st.ok()) << file;
    EXPECT_TRUE(contains(st.message(), "--data")) << st.message();
    EXPECT_TRUE(contains(st.message(), dir.file(file))) << st.message();
    for (const std::string& w : words) EXPECT_TRUE(contains(st.message(), w)) << "want '" << w << "' in " << st.message();
  };
  expect_error("text.txt", "1 2 3\nOnce upon a time\n", {":2:", "'Once'", "tokenizer"});
  expect_error("mixed.txt", "12abc\n", {"'12abc'", "tokenizer"});
  expect_error("big.txt", "1 160\n", {"160", "outside the vocabulary"});
  expect_error("negative.txt", "-1\n", {"-1", "outside the vocabulary"});
  expect_error("empty.txt", "\n\n", {"no token ids"});
  const Status missing = read_token_sequences(dir.file("missing.txt"), 160, &seqs);
  EXPECT_TRUE(contains(missing.message(), dir.file("missing.txt"))) << missing.message();
}

TEST(TokenData, SampledSequencesAreDeterministicPerSeed) {
  const ModelWeights model = make_default_model(small_options(0));
  std::vector<std::vector<int32_t>> a, b, c, d;
  ASSERT_TRUE(sample_token_sequences(model, 3, 24, 42, &a).ok());
  ASSERT_TRUE(sample_token_sequences(model, 3, 24, 42, &b).ok());
  ASSERT_TRUE(sample_token_sequences(model, 1, 24, 43, &c).ok());
  ASSERT_TRUE(sample_token_sequences(model, 1, 24, 99, &d).ok());
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a, b) << "REPRO seed=42 count=3 length=24";
  EXPECT_EQ(a[1], c[0]) << "sequence i uses seed + i";
  EXPECT_NE(a[0], d[0]) << "different seeds gave the same sequence";
  for (const auto& s : a) {
    EXPECT_LE(static_cast<int64_t>(s.size()), 24);
    for (int32_t t : s) {
      EXPECT_GE(t, 0);
      EXPECT_LT(t, model.config.vocab_size);
      EXPECT_NE(t, model.config.bos_token) << "BOS ends a sample; it is never part of one";
    }
  }
  EXPECT_FALSE(sample_token_sequences(model, 1, model.config.max_seq_len + 1, 42, &a).ok());
}

}  // namespace
}  // namespace llmq
