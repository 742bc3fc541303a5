// The serving engine end to end on its CPU backend (include/llmq/engine_cpu.hpp): a seeded model
// (make_default_model), requests served concurrently through the paged KV cache (random arrivals,
// chunked prefill, preemption forced by a small cache, shared prompt openings hitting the prefix
// cache, cancellations) against each request run alone through the reference Transformer with its
// own sampler. The tokens must be equal exactly, greedy and sampled (the same float operations
// compute every position whatever the batch), and every block must be free afterwards.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <vector>

#include "llmq/engine_cpu.hpp"
#include "llmq/model.hpp"
#include "llmq/sampler.hpp"
#include "llmq/transformer.hpp"

namespace llmq::engine {
namespace {

ModelWeights small_model() {
  DefaultModelOptions o;
  o.dim = 64;
  o.hidden_dim = 128;
  o.n_layers = 2;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.vocab_size = 96;
  o.max_seq_len = 64;
  o.seed = 7;
  return make_default_model(o);
}

struct Req {
  RequestSpec spec;
  SamplingParams sampling;
};

// The request alone: the whole prompt in one forward, then one token at a time.
std::vector<int32_t> alone(const ModelWeights& w, const Req& r, int64_t max_model_len) {
  Transformer t(w);
  Sampler sampler(w.config.vocab_size, r.sampling.temperature, r.sampling.top_p, r.sampling.seed);
  std::vector<int32_t> tokens = r.spec.prompt;
  std::vector<float> logits(tokens.size() * static_cast<size_t>(w.config.vocab_size));
  EXPECT_TRUE(t.forward(tokens.data(), static_cast<int64_t>(tokens.size()), 0, logits.data()).ok());
  float* last = &logits[(tokens.size() - 1) * static_cast<size_t>(w.config.vocab_size)];
  for (int64_t g = 0; g < r.spec.max_new_tokens; ++g) {
    const int32_t next = sampler.sample(last);
    tokens.push_back(next);
    if (std::find(r.spec.stop_ids.begin(), r.spec.stop_ids.end(), next) != r.spec.stop_ids.end()) break;
    if (static_cast<int64_t>(tokens.size()) >= max_model_len || g + 1 == r.spec.max_new_tokens) break;
    logits.resize(static_cast<size_t>(w.config.vocab_size));
    EXPECT_TRUE(t.forward(&tokens.back(), 1, static_cast<int64_t>(tokens.size()) - 1, logits.data()).ok());
    last = logits.data();
  }
  return tokens;
}

struct Setup {
  int64_t blocks, block_size, budget, max_running;
  bool sampled, cancel_some;
  bool no_preemption = false;  // SchedulerOptions::no_preemption
};

void serve_and_compare(const ModelWeights& w, const Setup& s, int n, uint32_t seed) {
  KvBlockPool pool;
  ASSERT_TRUE(KvBlockPool::create(s.blocks, s.block_size, &pool).ok());
  std::unique_ptr<CpuBackend> backend;
  ASSERT_TRUE(CpuBackend::create(w, s.blocks, s.block_size, &backend).ok());
  SchedulerOptions o;
  o.max_batched_tokens = s.budget;
  o.max_running = s.max_running;
  o.max_model_len = w.config.max_seq_len;
  o.no_preemption = s.no_preemption;
  std::unique_ptr<Engine> engine;
  ASSERT_TRUE(Engine::create(backend.get(), &pool, o, &engine).ok());
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> openings(2);
  for (auto& op : openings)
    for (int i = 0; i < 11; ++i) op.push_back(static_cast<int32_t>(rng() % w.config.vocab_size));
  std::vector<Req> reqs;
  for (int i = 0; i < n; ++i) {
    Req r;
    if (rng() % 2 == 0) r.spec.prompt = openings[rng() % 2];
    for (int t = 1 + static_cast<int>(rng() % 9); t > 0; --t) r.spec.prompt.push_back(static_cast<int32_t>(rng() % w.config.vocab_size));
    r.spec.max_new_tokens = 1 + static_cast<int64_t>(rng() % 12);
    if (rng() % 3 == 0) r.spec.stop_ids = {static_cast<int32_t>(rng() % w.config.vocab_size)};
    if (s.sampled) r.sampling = {0.8f, rng() % 2 == 0 ? 0.9f : 1.0f, 1000u + static_cast<uint64_t>(i)};
    reqs.push_back(r);
  }
  std::map<int64_t, std::vector<int32_t>> got;
  std::map<int64_t, size_t> index;
  std::set<int64_t> cancelled;
  size_t arrived = 0;
  for (int step = 0; step < 100000 && (arrived < reqs.size() || !engine->idle()); ++step) {
    while (arrived < reqs.size() && rng() % 2 == 0) {
      int64_t id = 0;
      ASSERT_TRUE(engine->add(reqs[arrived].spec, reqs[arrived].sampling, &id).ok());
      got[id] = reqs[arrived].spec.prompt;
      index[id] = arrived++;
    }
    if (s.cancel_some && !got.empty() && rng() % 17 == 0) {
      const int64_t victim = static_cast<int64_t>(rng() % got.size());
      if (engine->scheduler().tokens_of(victim) != nullptr && engine->cancel(victim).ok()) cancelled.insert(victim);
    }
    std::vector<TokenEvent> events;
    const Status st = engine->step(&events);
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (const TokenEvent& e : events) got[e.request].push_back(e.token);
  }
  ASSERT_TRUE(engine->idle());
  EXPECT_TRUE(pool.all_free()) << "a block leaked";
  for (const auto& [id, tokens] : got) {
    const std::vector<int32_t> want = alone(w, reqs[index[id]], o.max_model_len);
    if (cancelled.count(id) != 0) {
      ASSERT_LE(tokens.size(), want.size()) << "request " << id;
      ASSERT_TRUE(std::equal(tokens.begin(), tokens.end(), want.begin())) << "cancelled request " << id;
    } else {
      ASSERT_EQ(tokens, want) << "request " << id;
    }
  }
  if (s.no_preemption) {
    EXPECT_EQ(engine->scheduler().stats().preemptions, 0) << "admission without eviction";
  } else if (s.blocks < 20) {
    EXPECT_GT(engine->scheduler().stats().preemptions, 0) << "the small cache should preempt";
  }
  EXPECT_GT(engine->scheduler().stats().prefix_hit_tokens, 0) << "the shared openings should hit the prefix cache";
}

TEST(EngineCpu, GreedyServedConcurrentlyEqualsEachRequestAlone) {
  const ModelWeights w = small_model();
  serve_and_compare(w, {200, 8, 64, 16, false, false}, 24, 1);   // roomy
  serve_and_compare(w, {12, 4, 16, 6, false, false}, 24, 2);     // 11 blocks of 4: preemption
}

TEST(EngineCpu, SampledRequestsKeepTheirOwnGeneratorsAndCancellationsFreeEverything) {
  const ModelWeights w = small_model();
  serve_and_compare(w, {12, 4, 16, 6, true, true}, 24, 3);
}

// The cache that preempts above, with admission without eviction: no preemption, the same tokens.
TEST(EngineCpu, NoPreemptionServesEveryRequestAsAloneWithoutPreempting) {
  const ModelWeights w = small_model();
  serve_and_compare(w, {12, 4, 16, 6, false, false, true}, 24, 2);
  serve_and_compare(w, {12, 4, 16, 6, true, true, true}, 24, 3);
}

TEST(EngineCpu, RefusesTokensOutsideTheVocabularyAndBadSampling) {
  const ModelWeights w = small_model();
  KvBlockPool pool;
  ASSERT_TRUE(KvBlockPool::create(16, 4, &pool).ok());
  std::unique_ptr<CpuBackend> backend;
  ASSERT_TRUE(CpuBackend::create(w, 16, 4, &backend).ok());
  SchedulerOptions o;
  o.max_model_len = w.config.max_seq_len;
  std::unique_ptr<Engine> engine;
  ASSERT_TRUE(Engine::create(backend.get(), &pool, o, &engine).ok());
  RequestSpec r;
  r.prompt = {1, 96};
  int64_t id = 0;
  const Status vocab = engine->add(r, {}, &id);
  EXPECT_EQ(vocab.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(vocab.message().find("token 96 at 1 is outside the vocabulary [0, 96)"), std::string::npos) << vocab.to_string();
  r.prompt = {1, 2};
  EXPECT_EQ(engine->add(r, {-1.0f, 1.0f, 1}, &id).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->add(r, {0.5f, 0.0f, 1}, &id).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->add(r, {0.5f, 0.9f, 0}, &id).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(engine->idle());
  // A pool of another geometry than the backend's, a context past the model's.
  KvBlockPool other;
  ASSERT_TRUE(KvBlockPool::create(16, 8, &other).ok());
  std::unique_ptr<Engine> bad;
  const Status geometry = Engine::create(backend.get(), &other, o, &bad);
  EXPECT_EQ(geometry.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(geometry.message().find("16 blocks of 8 positions, the backend holds 16 of 4"), std::string::npos)
      << geometry.to_string();
  std::unique_ptr<CpuBackend> huge;  // past the CPU backend's bound: refused, nothing allocated
  const Status big = CpuBackend::create(w, int64_t{1} << 30, 16, &huge);
  EXPECT_EQ(big.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.message().find("more than the CPU backend holds"), std::string::npos) << big.to_string();
  o.max_model_len = w.config.max_seq_len + 1;
  const Status context = Engine::create(backend.get(), &pool, o, &bad);
  EXPECT_EQ(context.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(context.message().find("the model's context is 64"), std::string::npos) << context.to_string();
}

}  // namespace
}  // namespace llmq::engine
