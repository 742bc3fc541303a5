// Whole-model quantization end to end: the scheme table; quantize_model and QuantizedLinearBackend
// (bit for bit against quantize -> quantized_gemm, and against the float model on dequantized
// operands). Calibration and SmoothQuant live in test_calibration.cpp, evaluate() and the token-data
// readers in test_evaluate.cpp, export in test_model_export.cpp. Models are small seeded default
// models (dense and MoE) and, when present, llama2.c's stories260K.
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
  EXPECT_STREQ(export_format_name(ExportFormat::kVllmFp8), "fp8");
  for (ExportFormat f : {ExportFormat::kVllmFp8, ExportFormat::kCompressedTensors}) {
    ExportFormat back = ExportFormat::kNone;
    ASSERT_TRUE(parse_export_format(export_format_name(f), &back).ok());
    EXPECT_EQ(back, f);
  }
  ExportFormat unused;
  EXPECT_FALSE(parse_export_format("vllm-fp8", &unused).ok()) << "one name per format";
  EXPECT_FALSE(parse_export_format("none", &unused).ok());
  EXPECT_STREQ(export_format_name(ExportFormat::kCompressedTensors), "compressed-tensors");
  EXPECT_STREQ(export_format_name(ExportFormat::kNone), "none");
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

}  // namespace
}  // namespace llmq
