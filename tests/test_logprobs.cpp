// Log-probabilities (OpenAI's logprobs / top_logprobs) on the host: the definition's reference
// (src/runtime/row_logprobs_reference.cpp) against a log_softmax written here from scratch, its
// order of the top K (ties to the lower id, -0 equal to +0, NaN last), and the CPU engine's
// requests: every token's logprobs are those of the reference model's logits for that position
// (teacher-forced), the raw distribution whatever the temperature, K = 0 gives only the sampled
// token's, and a request that does not ask gets nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <vector>

#include "llmq/engine_cpu.hpp"
#include "llmq/model.hpp"
#include "llmq/transformer.hpp"
#include "runtime/row_logprobs.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using runtime::row_logprobs_reference;
using runtime::RowLogprobsReference;

// log_softmax of a row, long double, straight from its definition (finite rows).
std::vector<double> log_softmax(const float* row, int64_t vocab) {
  long double m = row[0];
  for (int64_t i = 1; i < vocab; ++i) m = std::max<long double>(m, row[i]);
  long double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<long double>(row[i]) - m);
  std::vector<double> out(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) out[i] = static_cast<double>(static_cast<long double>(row[i]) - m - std::log(sum));
  return out;
}

// The first k ids of a row by (logit descending, id ascending), by a stable sort of all ids.
std::vector<int32_t> top_ids_of(const float* row, int64_t vocab, int64_t k) {
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  ids.resize(static_cast<size_t>(std::min(k, vocab)));
  return ids;
}

constexpr double kExact = 1e-12;  // the reference and the long-double definition: both double sums

TEST(RowLogprobsReference, IsTheLogSoftmaxOfTheRow) {
  for (int64_t vocab : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{32000}}) {
    const uint64_t seed = static_cast<uint64_t>(vocab) + 5;
    std::vector<float> row = testing::normal_vector(vocab, seed, 3.0f);
    if (vocab > 10) row[vocab / 3] += 25.0f;  // a peaked row: most logprobs far below 0
    SCOPED_TRACE(testing::repro(seed, 1, vocab, "N(0, 3) row"));
    const std::vector<double> want = log_softmax(row.data(), vocab);
    const int32_t token = static_cast<int32_t>(vocab / 2);
    const RowLogprobsReference got = row_logprobs_reference(row.data(), vocab, token, 20);
    EXPECT_NEAR(got.token, want[token], kExact);
    const std::vector<int32_t> ids = top_ids_of(row.data(), vocab, 20);
    ASSERT_EQ(got.top_ids, ids);
    for (size_t i = 0; i < ids.size(); ++i) EXPECT_NEAR(got.top[i], want[ids[i]], kExact) << "rank " << i;
    double mass = 0;
    for (double lp : want) mass += std::exp(lp);
    EXPECT_NEAR(mass, 1.0, 1e-9);  // the definition written here is a distribution
    EXPECT_LE(got.top.front(), 0.0);
    if (vocab > 10) {
      EXPECT_EQ(got.top_ids.front(), vocab / 3);
    }
  }
}

TEST(RowLogprobsReference, TopKBreaksTiesByTheLowerIdAndCountsMinusZeroAsZero) {
  // A 0.5 grid: many equal logits; -0 and +0 at ids 3 and 1 are one value.
  std::vector<float> row = {1.0f, 0.0f, 2.0f, -0.0f, 2.0f, 1.0f, -3.0f, 2.0f, 0.5f, 1.0f};
  const RowLogprobsReference got = row_logprobs_reference(row.data(), 10, 0, 7);
  EXPECT_EQ(got.top_ids, (std::vector<int32_t>{2, 4, 7, 0, 5, 9, 8}));
  EXPECT_EQ(got.top[0], got.top[1]);
  EXPECT_EQ(got.top[1], got.top[2]);
  const RowLogprobsReference zeros = row_logprobs_reference(row.data(), 10, 3, 9);
  EXPECT_EQ(zeros.top_ids[7], 1);  // +0 at id 1 before -0 at id 3: equal logits, lower id first
  EXPECT_EQ(zeros.top_ids[8], 3);
  EXPECT_EQ(zeros.token, zeros.top[8]);
  // Strictly decreasing logprobs, ids ascending within a tie, on a random grid row.
  std::vector<float> grid = testing::normal_vector(4000, 11, 2.0f);
  for (float& v : grid) v = std::round(v * 2.0f) / 2.0f;
  const RowLogprobsReference g = row_logprobs_reference(grid.data(), 4000, 0, 20);
  for (size_t i = 1; i < g.top.size(); ++i) {
    EXPECT_GE(g.top[i - 1], g.top[i]);
    if (g.top[i - 1] == g.top[i]) {
      EXPECT_LT(g.top_ids[i - 1], g.top_ids[i]) << "rank " << i;
    }
  }
  EXPECT_EQ(g.top_ids, top_ids_of(grid.data(), 4000, 20));
}

TEST(RowLogprobsReference, KZeroGivesOnlyTheTokensAndKPastTheVocabularyGivesEveryToken) {
  const std::vector<float> row = {0.5f, -1.0f, 3.0f};
  const RowLogprobsReference none = row_logprobs_reference(row.data(), 3, 1, 0);
  EXPECT_TRUE(none.top_ids.empty() && none.top.empty());
  EXPECT_NEAR(none.token, log_softmax(row.data(), 3)[1], kExact);
  const RowLogprobsReference all = row_logprobs_reference(row.data(), 3, 1, 20);
  EXPECT_EQ(all.top_ids, (std::vector<int32_t>{2, 0, 1}));
  EXPECT_TRUE(std::isnan(row_logprobs_reference(row.data(), 3, 3, 1).token));  // a token outside the vocabulary
}

TEST(RowLogprobsReference, NonFiniteLogitsAsTheDefinitionSays) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> row = {nan, 1.0f, -inf, 1.0f};
  const RowLogprobsReference r = row_logprobs_reference(row.data(), 4, 2, 4);
  EXPECT_EQ(r.top_ids, (std::vector<int32_t>{1, 3, 2, 0}));  // NaN last, below -Inf
  EXPECT_NEAR(r.top[0], std::log(0.5), kExact);               // NaN weighs nothing
  EXPECT_EQ(r.token, -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(r.top[3]));
  const std::vector<float> with_inf = {0.0f, inf, 1.0f};
  const RowLogprobsReference bad = row_logprobs_reference(with_inf.data(), 3, 1, 1);
  EXPECT_TRUE(std::isnan(bad.lse) && std::isnan(bad.token) && std::isnan(bad.top[0]));
  EXPECT_EQ(bad.top_ids[0], 1);
}

// ---- The CPU engine, over the seeded default model.

struct Served {
  std::vector<int32_t> tokens;
  std::vector<engine::TokenEvent> events;
};

// Serves `sampling[i]` on prompt `prompts[i]` together (a small token budget, so prompts are
// chunked beside decodes) and returns each request's events.
std::vector<Served> serve(const ModelWeights& w, const std::vector<std::vector<int32_t>>& prompts,
                          const std::vector<engine::SamplingParams>& sampling, int64_t max_new) {
  engine::KvBlockPool pool;
  EXPECT_TRUE(engine::KvBlockPool::create(64, 4, &pool).ok());
  std::unique_ptr<engine::CpuBackend> backend;
  EXPECT_TRUE(engine::CpuBackend::create(w, 64, 4, &backend).ok());
  engine::SchedulerOptions o;
  o.max_batched_tokens = 12;
  o.max_model_len = w.config.max_seq_len;
  std::unique_ptr<engine::Engine> e;
  EXPECT_TRUE(engine::Engine::create(backend.get(), &pool, o, &e).ok());
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) {
    engine::RequestSpec spec;
    spec.prompt = prompts[i];
    spec.max_new_tokens = max_new;
    int64_t id = 0;
    const Status st = e->add(spec, sampling[i], &id);
    EXPECT_TRUE(st.ok()) << st.to_string();
    index[id] = i;
  }
  std::vector<Served> out(prompts.size());
  for (int guard = 0; !e->idle() && guard < 1000; ++guard) {
    std::vector<engine::TokenEvent> events;
    const Status st = e->step(&events);
    EXPECT_TRUE(st.ok()) << st.to_string();
    for (const engine::TokenEvent& ev : events) {
      Served& s = out[index.at(ev.request)];
      s.tokens.push_back(ev.token);
      s.events.push_back(ev);
    }
  }
  return out;
}

// Each token's logprobs against the log_softmax of the reference model's logits at its position
// (prompt + the tokens before it, teacher-forced).
void expect_logprobs_of_the_model(const ModelWeights& w, const std::vector<int32_t>& prompt, const Served& s, int32_t k) {
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), s.tokens.begin(), s.tokens.end());
  const int64_t vocab = w.config.vocab_size, n = static_cast<int64_t>(seq.size()) - 1;
  Transformer t(w);
  std::vector<float> logits(static_cast<size_t>(n * vocab));
  ASSERT_TRUE(t.forward(seq.data(), n, 0, logits.data()).ok());
  for (size_t g = 0; g < s.events.size(); ++g) {
    SCOPED_TRACE("token " + std::to_string(g) + " with k " + std::to_string(k));
    const engine::TokenEvent& ev = s.events[g];
    if (k < 0) {
      EXPECT_EQ(ev.logprobs, nullptr);
      continue;
    }
    ASSERT_NE(ev.logprobs, nullptr);
    const float* row = &logits[(prompt.size() - 1 + g) * static_cast<size_t>(vocab)];
    const std::vector<double> want = log_softmax(row, vocab);
    EXPECT_NEAR(ev.logprobs->token, want[ev.token], 1e-6);
    EXPECT_EQ(ev.logprobs->top_ids, top_ids_of(row, vocab, k));
    ASSERT_EQ(ev.logprobs->top.size(), static_cast<size_t>(k));
    for (int32_t i = 0; i < k; ++i) EXPECT_NEAR(ev.logprobs->top[i], want[ev.logprobs->top_ids[i]], 1e-6) << "rank " << i;
  }
}

TEST(EngineLogprobs, EachTokensAreTheModelsLogSoftmaxAtItsPosition) {
  const ModelWeights w = make_default_model();  // vocabulary 512
  const std::vector<int32_t> ks = {-1, 0, 3, 20, 5};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<engine::SamplingParams> sampling;
  for (size_t i = 0; i < ks.size(); ++i) {
    prompts.push_back({static_cast<int32_t>(3 + i), 17, 40, static_cast<int32_t>(60 + i), 2, 9, 33});
    engine::SamplingParams p;
    p.temperature = i % 2 == 0 ? 0.0f : 0.9f;  // greedy and sampled
    p.top_p = i == 3 ? 0.9f : 1.0f;
    p.seed = 100 + i;
    p.logprobs = ks[i];
    sampling.push_back(p);
  }
  const std::vector<Served> served = serve(w, prompts, sampling, 9);
  for (size_t i = 0; i < ks.size(); ++i) {
    ASSERT_EQ(served[i].events.size(), 9u) << "request " << i;
    expect_logprobs_of_the_model(w, prompts[i], served[i], ks[i]);
    if (HasFatalFailure()) return;
  }
  // Greedy with K >= 1: the token is the first of the top list, and its logprob the top one.
  for (const engine::TokenEvent& ev : served[2].events) {
    EXPECT_EQ(ev.token, ev.logprobs->top_ids[0]);
    EXPECT_EQ(ev.logprobs->token, ev.logprobs->top[0]);
  }
  for (const engine::TokenEvent& ev : served[1].events) EXPECT_TRUE(ev.logprobs->top_ids.empty());  // K = 0
}

TEST(EngineLogprobs, AreOfTheModelsDistributionWhateverTheTemperature) {
  // One prompt, greedy and at temperature 2: the first token's logprobs are of the same logits
  // (vLLM's raw logprobs), not of the tempered distribution the token was drawn from.
  const ModelWeights w = make_default_model();  // vocabulary 512
  const std::vector<int32_t> prompt = {5, 8, 13, 21};
  engine::SamplingParams greedy, hot;
  greedy.logprobs = hot.logprobs = 4;
  hot.temperature = 2.0f;
  hot.seed = 3;
  const std::vector<Served> s = serve(w, {prompt, prompt}, {greedy, hot}, 1);
  ASSERT_EQ(s[0].events.size(), 1u);
  ASSERT_EQ(s[1].events.size(), 1u);
  EXPECT_EQ(s[0].events[0].logprobs->top_ids, s[1].events[0].logprobs->top_ids);
  EXPECT_EQ(s[0].events[0].logprobs->top, s[1].events[0].logprobs->top);
  double mass = 0;
  for (float lp : s[0].events[0].logprobs->top) mass += std::exp(static_cast<double>(lp));
  EXPECT_LE(mass, 1.0 + 1e-6);
}

TEST(EngineLogprobs, AnOutOfRangeCountIsRefusedByName) {
  const ModelWeights w = make_default_model();  // vocabulary 512
  engine::KvBlockPool pool;
  ASSERT_TRUE(engine::KvBlockPool::create(8, 4, &pool).ok());
  std::unique_ptr<engine::CpuBackend> backend;
  ASSERT_TRUE(engine::CpuBackend::create(w, 8, 4, &backend).ok());
  engine::SchedulerOptions o;
  o.max_model_len = w.config.max_seq_len;
  std::unique_ptr<engine::Engine> e;
  ASSERT_TRUE(engine::Engine::create(backend.get(), &pool, o, &e).ok());
  engine::RequestSpec spec;
  spec.prompt = {1, 2};
  for (int32_t bad : {-2, engine::kMaxLogprobs + 1}) {
    engine::SamplingParams p;
    p.logprobs = bad;
    int64_t id = 0;
    const Status st = e->add(spec, p, &id);
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find("logprobs"), std::string::npos) << st.message();
  }
  EXPECT_TRUE(e->idle());
}

}  // namespace
}  // namespace llmq
