// evaluate() (KL, perplexity ratio, the windows it scores) and the token-data readers (ids per line,
// seeded sampled sequences), on small seeded default models. The rest of whole-model quantization
// is in test_model_quantize.cpp.
#include "model_quantize_support.hpp"

namespace llmq {
namespace {

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

// Scoring a window's positions on several threads (in pieces appended in order) gives the summary
// one thread gives, bit for bit, for two candidates scored at once or one at a time.
TEST(Evaluate, ScoringThreadsChangeNothing) {
  const ModelWeights model = make_default_model(small_options(0));
  std::vector<std::vector<int32_t>> seqs;
  ASSERT_TRUE(sample_token_sequences(model, 3, 40, kEvalSeed, &seqs).ok());
  std::vector<std::unique_ptr<QuantizedModel>> qms;
  std::vector<std::unique_ptr<QuantizedLinearBackend>> backends;
  std::vector<std::unique_ptr<Transformer>> cands;
  for (const char* name : {"int8-w8a8", "fp8-dynamic"}) {
    Scheme scheme;
    ASSERT_TRUE(find_scheme(name, &scheme).ok());
    qms.push_back(std::make_unique<QuantizedModel>());
    ASSERT_TRUE(quantize_model(model, scheme, nullptr, {}, qms.back().get()).ok());
    backends.push_back(std::make_unique<QuantizedLinearBackend>(*qms.back()));
    cands.push_back(std::make_unique<Transformer>(qms.back()->weights, backends.back().get()));
  }
  Transformer base(model);
  auto run = [&](int threads, int scoring_threads, std::vector<EvalAccumulator::Summary>* out) {
    EvalOptions options;
    options.context = 24;
    options.threads = threads;
    options.scoring_threads = scoring_threads;
    std::vector<EvalAccumulator> results;
    ASSERT_TRUE(evaluate(&base, {cands[0].get(), cands[1].get()}, seqs, options, &results).ok());
    out->clear();
    for (const auto& r : results) out->push_back(r.summarize());
  };
  std::vector<EvalAccumulator::Summary> one, many, wide;
  run(1, 1, &one);
  run(1, 5, &many);   // one candidate at a time, its positions in 5 pieces
  run(3, 7, &wide);   // both candidates at once, 3 pieces each
  ASSERT_EQ(one.size(), 2u);
  EXPECT_GT(one[0].kl.mean, 0.0);
  for (const auto* other : {&many, &wide})
    for (size_t m = 0; m < 2; ++m) {
      EXPECT_EQ((*other)[m].tokens, one[m].tokens);
      EXPECT_EQ((*other)[m].kl.mean, one[m].kl.mean);
      EXPECT_EQ((*other)[m].kl.stderr_, one[m].kl.stderr_);
      EXPECT_EQ((*other)[m].kl_p99, one[m].kl_p99);
      EXPECT_EQ((*other)[m].top1_agreement.mean, one[m].top1_agreement.mean);
      EXPECT_EQ((*other)[m].ppl_ratio, one[m].ppl_ratio);
      EXPECT_EQ((*other)[m].delta_p.mean, one[m].delta_p.mean);
    }
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

// A model without BOS (bos_token -1): windows of up to context tokens with nothing prepended, the
// first token of each window context only, so a sequence of n tokens scores n - (windows) tokens.
TEST(Evaluate, WithoutBosWindowsAreThePlainTokens) {
  ModelWeights model = make_default_model(small_options(0));
  model.config.bos_token = -1;
  Transformer base(model), same(model);
  const std::vector<std::vector<int32_t>> seqs = {{1, 10, 11, 12, 13, 14, 15, 16}, {20, 21, 22}, {5}};
  EvalOptions options;
  options.context = 4;
  std::vector<int64_t> progress;
  options.progress = [&](int64_t scored, int64_t total) {
    progress.push_back(scored);
    EXPECT_EQ(total, 8);  // windows {1 10 11 12} {13 14 15 16} {20 21 22} {5}: 3 + 3 + 2 + 0
  };
  std::vector<EvalAccumulator> results;
  ASSERT_TRUE(evaluate(&base, {&same}, seqs, options, &results).ok());
  EXPECT_EQ(results[0].summarize().tokens, 8);
  EXPECT_EQ(progress, (std::vector<int64_t>{3, 6, 8}));  // the last window ({5}) has nothing to score
  // The base model's perplexity over those windows, by hand: token 1 is a token like any other.
  const int64_t v = model.config.vocab_size;
  double nll = 0;
  for (const std::vector<int32_t>& w : std::vector<std::vector<int32_t>>{{1, 10, 11, 12}, {13, 14, 15, 16}, {20, 21, 22}}) {
    const std::vector<float> l = logits_of(model, nullptr, w);
    for (size_t p = 0; p + 1 < w.size(); ++p) {
      double m = -1e30, z = 0;
      for (int64_t t = 0; t < v; ++t) m = std::max(m, static_cast<double>(l[p * v + t]));
      for (int64_t t = 0; t < v; ++t) z += std::exp(static_cast<double>(l[p * v + t]) - m);
      nll -= static_cast<double>(l[p * v + w[p + 1]]) - m - std::log(z);
    }
  }
  EXPECT_NEAR(results[0].summarize().ppl_base, std::exp(nll / 8), 1e-4 * std::exp(nll / 8));
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
