// The serving engine on its GPU backend (include/llmq/engine_gpu.hpp): the GPU runtime in its paged
// mode. Requests served concurrently (random arrivals, chunked prefill beside decodes, preemption
// forced by a small cache, shared prompt openings hitting the prefix cache, cancellations, decode
// steps replayed from CUDA graphs of padded batches) must give each request the tokens it gets
// served alone by the same backend up to the GPU's rounding, each token checked against the CPU
// reference teacher-forced (see plausible_tokens); every block must be free afterwards. Plus the
// runtime's refusals of bad steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "cuda_support.hpp"
#include "support.hpp"
#include "llmq/engine_gpu.hpp"
#include "llmq/model.hpp"
#include "llmq/tensor_parallel.hpp"
#include "llmq/transformer.hpp"

namespace llmq::engine {
namespace {

std::string stories_path() { return testing::testdata_dir() + "/../models/stories260K.bin"; }

ModelWeights small_model(int64_t experts = 0) {
  DefaultModelOptions o;
  o.n_experts = experts;
  o.dim = 128;
  o.hidden_dim = 256;
  o.n_layers = 2;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.vocab_size = 96;
  o.max_seq_len = 64;
  o.seed = 7;
  return make_default_model(o);
}

struct Gpu {
  std::unique_ptr<TensorParallelRuntime> tpr;
  std::unique_ptr<GpuBackend> backend;
};

Status start(const ModelWeights& w, const GpuPrecision& precision, int64_t blocks, int64_t block_size, int64_t max_running,
             int64_t budget, bool graphs, Gpu* g) {
  GpuModelSource source;
  source.kind = GpuModelSource::Kind::kHost;
  source.weights = &w;
  LLMQ_RETURN_IF_ERROR(TensorParallelRuntime::load(1, 0, source, precision, &g->tpr));
  GpuRuntimeOptions o;
  o.max_batch = max_running;
  o.max_context = w.config.max_seq_len;
  o.max_step_tokens = budget;
  o.kv_block_size = block_size;
  o.kv_blocks = blocks;
  o.cuda_graphs = graphs;
  LLMQ_RETURN_IF_ERROR(g->tpr->start(o));
  return GpuBackend::create(g->tpr.get(), &g->backend);
}

struct Req {
  RequestSpec spec;
  SamplingParams sampling;
};

// Each served token against the CPU reference, teacher-forced: the reference computes the logits
// of every position of the served sequence (prompt + tokens), and each generated token must be one
// the reference could pick up to the GPU's rounding. The GPU keeps activations in BF16 between
// kernels even with float32 linears (runtime_compare.hpp: rows of these default models differ from
// the CPU's by up to 7e-2 relative), and its split-K sums follow the batch, so a request's tokens
// served beside others can differ from its tokens alone where two logits are that close. Greedy:
// the token's logit within kGreedyMargin of the row's maximum (relative to the row's largest
// magnitude), and the argmax itself at kMinArgmax of the positions. Sampled: a token of the
// request's top-k set widened by 2, and of probability at least kMinProbability at its temperature.
// A wrong block, position or table gives tokens far outside both. The seeded default model's
// RMSNorm gains (20-50x) let one rounding move a whole row, so its margins are wider than those of
// stories260K (a trained model, rows within 2e-2 of the CPU's).
struct Margins {
  double greedy;      // kGreedyMargin
  double min_argmax;  // kMinArgmax
};
constexpr Margins kDefaultModelMargins{0.25, 0.85};
constexpr Margins kTrainedModelMargins{0.05, 0.9};
constexpr double kMinProbability = 1e-6;

struct Agreement {
  int64_t positions = 0, argmax = 0;
};

::testing::AssertionResult plausible_tokens(const ModelWeights& w, const Margins& m, const Req& r, const std::vector<int32_t>& seq,
                                            Agreement* agree) {
  const size_t n = seq.size(), p = r.spec.prompt.size();
  if (n <= p) return ::testing::AssertionSuccess();
  Transformer t(w);
  const int64_t vocab = w.config.vocab_size;
  std::vector<float> logits((n - 1) * static_cast<size_t>(vocab));
  if (!t.forward(seq.data(), static_cast<int64_t>(n - 1), 0, logits.data()).ok()) return ::testing::AssertionFailure() << "forward";
  for (size_t i = p; i < n; ++i) {
    const float* row = &logits[(i - 1) * static_cast<size_t>(vocab)];
    const int32_t tok = seq[i];
    const float top = *std::max_element(row, row + vocab);
    double scale = 0;
    for (int64_t v = 0; v < vocab; ++v) scale = std::max(scale, std::abs(static_cast<double>(row[v])));
    ++agree->positions;
    agree->argmax += row[tok] == top ? 1 : 0;
    if (r.sampling.temperature == 0.0f) {
      const double margin = (static_cast<double>(top) - row[tok]) / scale;
      if (margin > m.greedy)
        return ::testing::AssertionFailure() << "token " << i << " = " << tok << " is " << margin << " below the maximum";
    } else {
      const int64_t rank = std::count_if(row, row + vocab, [&](float v) { return v > row[tok]; });
      const double prob = std::exp((static_cast<double>(row[tok]) - top) / r.sampling.temperature);
      if ((r.sampling.top_k > 0 && rank >= r.sampling.top_k + 2) || prob < kMinProbability)
        return ::testing::AssertionFailure() << "sampled token " << i << " = " << tok << " has rank " << rank
                                             << " and relative probability " << prob;
    }
  }
  return ::testing::AssertionSuccess();
}

struct Setup {
  int64_t blocks, block_size, budget, max_running;
  bool sampled, cancel_some;
  bool no_preemption = false;  // SchedulerOptions::no_preemption
};

// Serves `reqs` through one engine over `backend` with random arrivals (and cancellations); returns
// every request's prompt + tokens by index, and the ids cancelled.
void serve(GpuBackend* backend, const ModelWeights& w, const Setup& s, const std::vector<Req>& reqs, uint32_t seed,
           std::vector<std::vector<int32_t>>* out, std::set<size_t>* cancelled, SchedulerStats* stats) {
  KvBlockPool pool;
  ASSERT_TRUE(KvBlockPool::create(s.blocks, s.block_size, &pool).ok());
  SchedulerOptions o;
  o.max_batched_tokens = s.budget;
  o.max_running = s.max_running;
  o.max_model_len = w.config.max_seq_len;
  o.no_preemption = s.no_preemption;
  std::unique_ptr<Engine> engine;
  const Status created = Engine::create(backend, &pool, o, &engine);
  ASSERT_TRUE(created.ok()) << created.to_string();
  std::mt19937 rng(seed);
  out->assign(reqs.size(), {});
  std::map<int64_t, size_t> index;
  size_t arrived = 0;
  for (int step = 0; step < 100000 && (arrived < reqs.size() || !engine->idle()); ++step) {
    while (arrived < reqs.size() && (reqs.size() == 1 || rng() % 2 == 0)) {
      int64_t id = 0;
      const Status added = engine->add(reqs[arrived].spec, reqs[arrived].sampling, &id);
      ASSERT_TRUE(added.ok()) << added.to_string();
      (*out)[arrived] = reqs[arrived].spec.prompt;
      index[id] = arrived++;
    }
    if (s.cancel_some && !index.empty() && rng() % 17 == 0) {
      const int64_t victim = static_cast<int64_t>(rng() % index.size());
      if (engine->scheduler().tokens_of(victim) != nullptr && engine->cancel(victim).ok()) cancelled->insert(index[victim]);
    }
    std::vector<TokenEvent> events;
    const Status st = engine->step(&events);
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (const TokenEvent& e : events) (*out)[index.at(e.request)].push_back(e.token);
  }
  ASSERT_TRUE(engine->idle());
  EXPECT_TRUE(pool.all_free()) << "a block leaked";
  *stats = engine->scheduler().stats();
}

std::vector<Req> workload(const ModelWeights& w, int n, bool sampled, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> openings(2);
  for (auto& op : openings)
    for (int i = 0; i < 19; ++i) op.push_back(static_cast<int32_t>(rng() % w.config.vocab_size));
  std::vector<Req> reqs;
  for (int i = 0; i < n; ++i) {
    Req r;
    if (rng() % 2 == 0) r.spec.prompt = openings[rng() % 2];
    for (int t = 1 + static_cast<int>(rng() % 13); t > 0; --t) r.spec.prompt.push_back(static_cast<int32_t>(rng() % w.config.vocab_size));
    r.spec.max_new_tokens = 1 + static_cast<int64_t>(rng() % 16);
    if (rng() % 3 == 0) r.spec.stop_ids = {static_cast<int32_t>(rng() % w.config.vocab_size)};
    if (sampled) {
      r.sampling.temperature = rng() % 4 == 0 ? 0.0f : 0.9f;
      r.sampling.top_p = rng() % 2 == 0 ? 0.9f : 1.0f;
      r.sampling.top_k = rng() % 3 == 0 ? 8 : 0;
      r.sampling.seed = 1000u + static_cast<uint64_t>(i);
    }
    reqs.push_back(r);
  }
  return reqs;
}

void serve_and_compare(const ModelWeights& w, const Margins& m, const Setup& s, int n, uint32_t seed, bool graphs,
                       const GpuPrecision& precision = gpu_precision(GpuPrecision::Kind::kF32)) {
  Gpu g;
  const Status st = start(w, precision, s.blocks, s.block_size, s.max_running, s.budget, graphs, &g);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const std::vector<Req> reqs = workload(w, n, s.sampled, seed);
  std::vector<std::vector<int32_t>> got;
  std::set<size_t> cancelled;
  SchedulerStats stats;
  serve(g.backend.get(), w, s, reqs, seed + 100, &got, &cancelled, &stats);
  if (::testing::Test::HasFatalFailure()) return;
  Agreement agree;
  int64_t same_as_alone = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(plausible_tokens(w, m, reqs[i], got[i], &agree)) << "request " << i << " served beside others";
    if (cancelled.count(i) != 0) continue;
    // Alone: the same backend, a fresh pool and engine serving only this request.
    std::vector<std::vector<int32_t>> one;
    std::set<size_t> none;
    SchedulerStats one_stats;
    serve(g.backend.get(), w, {s.blocks, s.block_size, s.budget, s.max_running, s.sampled, false}, {reqs[i]}, 1, &one, &none,
          &one_stats);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_TRUE(plausible_tokens(w, m, reqs[i], one[0], &agree)) << "request " << i << " alone";
    same_as_alone += one[0] == got[i] ? 1 : 0;
  }
  std::printf("  %zu requests: %lld served exactly as alone; %lld of %lld tokens the CPU reference's argmax\n", reqs.size(),
              static_cast<long long>(same_as_alone), static_cast<long long>(agree.argmax), static_cast<long long>(agree.positions));
  if (!s.sampled) {
    EXPECT_GE(static_cast<double>(agree.argmax), m.min_argmax * static_cast<double>(agree.positions));
  }
  if (s.no_preemption) {
    EXPECT_EQ(stats.preemptions, 0) << "admission without eviction";
  } else if (s.blocks < 24) {
    EXPECT_GT(stats.preemptions, 0) << "the small cache should preempt";
  }
  EXPECT_GT(stats.prefix_hit_tokens, 0) << "the shared openings should hit the prefix cache";
}

TEST(GpuEngine, GreedyServedConcurrentlyMatchesTheCpuReference) {
  LLMQ_REQUIRE_GPU();
  const ModelWeights w = small_model();
  serve_and_compare(w, kDefaultModelMargins, {200, 16, 64, 16, false, false}, 24, 1, true);  // roomy, graphs
  serve_and_compare(w, kDefaultModelMargins, {14, 4, 16, 6, false, false}, 24, 2, true);     // 13 blocks of 4: preemption
  serve_and_compare(w, kDefaultModelMargins, {14, 4, 16, 6, false, false}, 16, 3, false);    // no graphs
  serve_and_compare(w, kDefaultModelMargins, {14, 4, 16, 6, false, false, true}, 24, 2, true);  // the same cache, no preemption
}

TEST(GpuEngine, GreedyStories260KServedConcurrentlyMatchesTheCpuReference) {
  LLMQ_REQUIRE_GPU();
  if (!std::ifstream(stories_path(), std::ios::binary).good()) GTEST_SKIP() << testing::test_data_absent(stories_path());
  ModelWeights w;
  ASSERT_TRUE(load_llama2c(stories_path(), &w).ok());
  w.config.max_seq_len = 64;  // the engine's context: small enough for a cache that preempts
  serve_and_compare(w, kTrainedModelMargins, {200, 16, 64, 16, false, false}, 24, 4, true);
  serve_and_compare(w, kTrainedModelMargins, {14, 4, 16, 6, false, false}, 24, 5, true);
}

// Weights quantized to FP8 move logits further than BF16 activations alone: wider margins (on the
// H100, stories260K: 842 of 914 tokens the float reference's argmax, every one within 0.35).
constexpr Margins kQuantizedMargins{0.35, 0.85};

// MoE: routing is a discrete choice, so where BF16 rounding sends a token to another expert its
// logits move by a whole expert's output (measured on the H100: 3 tokens of 788 up to 0.93 below the
// maximum); the argmax must still hold at most positions (measured 755 of 788), with no bound per
// token.
constexpr Margins kMoeMargins{1e30, 0.9};

TEST(GpuEngine, MoeModelServedConcurrentlyMatchesTheCpuReference) {
  LLMQ_REQUIRE_GPU();
  const ModelWeights w = small_model(4);  // 4 experts, 2 per token; the GPU's experts are BF16 or FP8
  const GpuPrecision bf16 = gpu_precision(GpuPrecision::Kind::kBF16);
  serve_and_compare(w, kMoeMargins, {200, 16, 64, 16, false, false}, 24, 6, true, bf16);
  serve_and_compare(w, kMoeMargins, {14, 4, 16, 6, false, false}, 24, 7, true, bf16);
}

// FP8 (fp8-dynamic: E4M3 weights per channel, activations per token) on stories260K against the
// float reference (measured: 384 of 416 tokens its argmax). Not on the seeded default model: its
// outlier channels make FP8 cost about half a row's magnitude (runtime_compare.hpp).
TEST(GpuEngine, Fp8ServedConcurrentlyStaysNearTheFloatReference) {
  LLMQ_REQUIRE_GPU();
  GpuPrecision fp8;
  ASSERT_TRUE(parse_gpu_precision("fp8-dynamic", &fp8).ok());
  if (!std::ifstream(stories_path(), std::ios::binary).good()) GTEST_SKIP() << testing::test_data_absent(stories_path());
  ModelWeights w;
  ASSERT_TRUE(load_llama2c(stories_path(), &w).ok());
  w.config.max_seq_len = 64;
  serve_and_compare(w, kQuantizedMargins, {200, 16, 64, 16, false, false}, 24, 9, true, fp8);
  serve_and_compare(w, kQuantizedMargins, {14, 4, 16, 6, false, false}, 24, 10, true, fp8);
}

TEST(GpuEngine, SampledRequestsDependOnlyOnTheirOwnSeedAndCancellationsFreeEverything) {
  LLMQ_REQUIRE_GPU();
  const ModelWeights w = small_model();
  serve_and_compare(w, kDefaultModelMargins, {14, 4, 16, 6, true, true}, 24, 4, true);
}

TEST(GpuEngine, StepRefusesBadTablesAndFixedSlotCallsOnAPagedRuntime) {
  LLMQ_REQUIRE_GPU();
  const ModelWeights w = small_model();
  Gpu g;
  ASSERT_TRUE(start(w, gpu_precision(GpuPrecision::Kind::kF32), 8, 4, 4, 32, true, &g).ok());
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6};
  std::vector<int32_t> table = {3, 5};
  PagedChunk c;
  c.tokens = tokens.data();
  c.count = 6;
  c.table = table.data();
  c.table_blocks = 2;
  c.sample = true;
  std::vector<int32_t> sampled;
  const Status ok = g.tpr->step({c}, &sampled);
  ASSERT_TRUE(ok.ok()) << ok.to_string();
  ASSERT_EQ(sampled.size(), 1u);
  table = {3, 0};  // the null block
  Status st = g.tpr->step({c}, &sampled);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("table entry 1 = 0 outside [1, 8)"), std::string::npos) << st.to_string();
  table = {3, 8};
  st = g.tpr->step({c}, &sampled);
  EXPECT_NE(st.message().find("table entry 1 = 8 outside [1, 8)"), std::string::npos) << st.to_string();
  c.table_blocks = 1;
  st = g.tpr->step({c}, &sampled);
  EXPECT_NE(st.message().find("a table of 1 blocks for 6 positions (needs 2"), std::string::npos) << st.to_string();
  c.table_blocks = 2;
  table = {3, 5};
  c.start = 60;
  st = g.tpr->step({c}, &sampled);
  EXPECT_NE(st.message().find("positions [60, 66) outside [0, 64)"), std::string::npos) << st.to_string();
  std::vector<float> logits;
  st = g.tpr->decode({1}, &logits);
  EXPECT_NE(st.message().find("the runtime is paged"), std::string::npos) << st.to_string();
  // A paged runtime of one block (only the null block) is refused.
  GpuRuntimeOptions o = g.tpr->runtime(0).options();
  o.kv_blocks = 1;
  std::unique_ptr<GpuRuntime> rt;
  st = GpuRuntime::create(g.tpr->model(0), o, &rt);
  EXPECT_NE(st.message().find("kv_blocks: 1"), std::string::npos) << st.to_string();
}

// A mixed step packs its one-query chunks first (their attention runs in the decode kernel) and
// must hand every sampled row back in the caller's order: here the decodes sit between prefill
// chunks. Each row of the mixed step is compared with the same chunk stepped alone on a second
// runtime in the same state: it must be nearest to its own chunk's row (a row handed to the wrong
// chunk is another sequence's distribution), within the GPU's rounding of it, with the same argmax,
// and the sampled (greedy) token must be that argmax.
TEST(GpuEngine, MixedStepHandsRowsBackInTheCallersOrder) {
  LLMQ_REQUIRE_GPU();
  const ModelWeights w = small_model();
  const int64_t vocab = w.config.vocab_size;
  const std::vector<int32_t> seq_a = {5, 9, 13, 2, 40}, seq_b = {1, 7, 3, 88, 21, 6, 17}, seq_c = {60, 4, 33},
                             seq_d = {2, 2, 50, 71, 9, 30, 44};
  std::vector<int32_t> tab_a = {1, 2}, tab_b = {3, 4}, tab_c = {5}, tab_d = {6, 7};
  auto chunk = [](const std::vector<int32_t>& t, const std::vector<int32_t>& table, int64_t start, int64_t count) {
    PagedChunk c;
    c.tokens = t.data();
    c.start = start;
    c.count = count;
    c.table = table.data();
    c.table_blocks = static_cast<int64_t>(table.size());
    c.sample = true;
    return c;
  };
  // Both runtimes first prefill b and d up to their last token.
  auto ready = [&](Gpu* g) {
    std::vector<int32_t> sampled;
    const Status st = g->tpr->step({chunk(seq_b, tab_b, 0, 6), chunk(seq_d, tab_d, 0, 6)}, &sampled);
    ASSERT_TRUE(st.ok()) << st.to_string();
  };
  const std::vector<PagedChunk> mixed = {chunk(seq_a, tab_a, 0, 5), chunk(seq_b, tab_b, 6, 1), chunk(seq_c, tab_c, 0, 3),
                                         chunk(seq_d, tab_d, 6, 1)};
  Gpu g, ref;
  ASSERT_TRUE(start(w, gpu_precision(GpuPrecision::Kind::kF32), 16, 4, 4, 32, false, &g).ok());
  ASSERT_TRUE(start(w, gpu_precision(GpuPrecision::Kind::kF32), 16, 4, 4, 32, false, &ref).ok());
  ready(&g);
  ready(&ref);
  std::vector<int32_t> sampled;
  std::vector<float> logits;
  Status st = g.tpr->step(mixed, &sampled, &logits);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_EQ(sampled.size(), mixed.size());
  ASSERT_EQ(logits.size(), mixed.size() * static_cast<size_t>(vocab));
  std::vector<std::vector<float>> alone;
  for (const PagedChunk& c : mixed) {
    std::vector<int32_t> s1;
    std::vector<float> row;
    st = ref.tpr->step({c}, &s1, &row);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_EQ(row.size(), static_cast<size_t>(vocab));
    alone.push_back(row);
  }
  for (size_t r = 0; r < mixed.size(); ++r) {
    const float* got = logits.data() + r * static_cast<size_t>(vocab);
    auto distance = [&](const std::vector<float>& other) {
      double d = 0.0;
      for (int64_t v = 0; v < vocab; ++v) d = std::max(d, static_cast<double>(std::fabs(got[v] - other[static_cast<size_t>(v)])));
      return d;
    };
    double scale = 0.0;
    for (float x : alone[r]) scale = std::max(scale, static_cast<double>(std::fabs(x)));
    const double own = distance(alone[r]);
    EXPECT_LE(own, 2e-2 * scale) << "row " << r;
    for (size_t o = 0; o < mixed.size(); ++o)
      if (o != r) EXPECT_LT(own, distance(alone[o])) << "row " << r << " is nearer chunk " << o << "'s";
    const int64_t top = std::max_element(got, got + vocab) - got;
    EXPECT_EQ(top, std::max_element(alone[r].begin(), alone[r].end()) - alone[r].begin()) << "row " << r;
    EXPECT_EQ(sampled[r], top) << "row " << r;
  }
}

}  // namespace
}  // namespace llmq::engine
