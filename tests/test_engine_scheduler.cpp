// The serving engine's scheduler (include/llmq/scheduler.hpp) driven by a stand-in model behind the
// paged interface: position p's "KV" is a value of (token p, p) written into the block the table
// names, and the token after position p is a hash of every KV value at positions 0..p read back
// through the block table. A request's tokens therefore depend on every KV read being the right
// one: a wrong block table, a stale prefix-cache hit or a lost position changes them. Served
// concurrently (random arrivals, chunked prefill, a cache small enough to force preemption, shared
// prefixes, cancellations), every request must produce exactly the tokens it produces alone, and
// every block must be free at the end.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "llmq/scheduler.hpp"

namespace llmq::engine {
namespace {

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}
uint64_t kv_of(int32_t token, int64_t pos) { return mix(static_cast<uint64_t>(token) * 1000003ull + static_cast<uint64_t>(pos)); }

constexpr int32_t kVocab = 4;  // small: blocks of equal tokens recur at other positions

int32_t next_token(const std::vector<uint64_t>& kv) {
  uint64_t h = 7;
  for (const uint64_t v : kv) h = mix(h ^ v);
  return static_cast<int32_t>(h % kVocab);
}

struct FakePagedModel {
  int64_t block_size;
  std::vector<uint64_t> kv;  // [blocks, block_size]
  FakePagedModel(int64_t blocks, int64_t bs) : block_size(bs), kv(static_cast<size_t>(blocks * bs), 0) {}

  void run(const StepPlan& plan, std::vector<int32_t>* sampled) {
    sampled->clear();
    for (const StepChunk& c : plan.chunks) {
      ASSERT_GE(c.count, 1) << "a chunk computes at least one position (its logits come from it)";
      ASSERT_GE(c.table_blocks * block_size, c.start + c.count) << "the table must cover the chunk";
      for (int64_t p = c.start; p < c.start + c.count; ++p) {
        const BlockId b = c.table[p / block_size];
        ASSERT_NE(b, kNullBlock);
        kv[static_cast<size_t>(b * block_size + p % block_size)] = kv_of(c.tokens[p], p);
      }
      if (!c.sample) continue;
      std::vector<uint64_t> seen;
      for (int64_t p = 0; p < c.start + c.count; ++p)
        seen.push_back(kv[static_cast<size_t>(c.table[p / block_size] * block_size + p % block_size)]);
      sampled->push_back(next_token(seen));
    }
  }
};

// The request alone, without paging.
std::vector<int32_t> reference(const RequestSpec& r, int64_t max_model_len) {
  std::vector<int32_t> tokens = r.prompt;
  for (int64_t g = 0; g < r.max_new_tokens; ++g) {
    std::vector<uint64_t> kv;
    for (size_t p = 0; p < tokens.size(); ++p) kv.push_back(kv_of(tokens[p], static_cast<int64_t>(p)));
    const int32_t t = next_token(kv);
    tokens.push_back(t);
    if (std::find(r.stop_ids.begin(), r.stop_ids.end(), t) != r.stop_ids.end()) break;
    if (static_cast<int64_t>(tokens.size()) >= max_model_len) break;
  }
  return tokens;
}

struct Served {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
};

TEST(EngineScheduler, RefusesWhatCanNeverRunNamingTheNumbers) {
  KvBlockPool pool;
  ASSERT_TRUE(KvBlockPool::create(5, 4, &pool).ok());  // 4 usable blocks: 16 positions
  SchedulerOptions o;
  o.max_model_len = 32;
  o.max_waiting = 2;
  std::unique_ptr<Scheduler> s;
  ASSERT_TRUE(Scheduler::create(&pool, o, &s).ok());
  int64_t id = 0;
  RequestSpec r;
  EXPECT_EQ(s->add(r, &id).code(), StatusCode::kInvalidArgument);  // empty prompt
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 0;
  EXPECT_EQ(s->add(r, &id).code(), StatusCode::kInvalidArgument);
  r.prompt.assign(32, 1);
  r.max_new_tokens = 1;
  const Status ctx = s->add(r, &id);
  EXPECT_EQ(ctx.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ctx.message().find("32 tokens, the model's context holds 32"), std::string::npos) << ctx.to_string();
  r.prompt.assign(10, 1);
  r.max_new_tokens = 8;  // 17 positions: 5 blocks of 4, the cache holds 4
  const Status big = s->add(r, &id);
  EXPECT_EQ(big.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.message().find("need 5 KV blocks of 4 tokens, the whole cache holds 4"), std::string::npos) << big.to_string();
  r.max_new_tokens = 7;  // 16 positions: fits exactly
  ASSERT_TRUE(s->add(r, &id).ok());
  ASSERT_TRUE(s->add(r, &id).ok());
  const Status full = s->add(r, &id);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("queue full"), std::string::npos);
  EXPECT_EQ(s->cancel(99).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(s->cancel(0).ok());
  ASSERT_TRUE(s->cancel(1).ok());
  EXPECT_TRUE(s->idle());
  EXPECT_TRUE(pool.all_free());
}

struct Workload {
  int64_t blocks, block_size, budget, max_running, max_model_len;
  bool prefix_caching;
  bool cancel_some;
  bool no_preemption = false;
};

// Runs `n` random requests arriving over the first steps; returns each one's tokens and finish.
std::map<int64_t, Served> serve(const Workload& w, int64_t n, uint64_t seed, std::vector<RequestSpec>* specs,
                                SchedulerStats* stats, KvBlockPool* pool_out = nullptr, int64_t* most_running = nullptr) {
  KvBlockPool pool;
  EXPECT_TRUE(KvBlockPool::create(w.blocks, w.block_size, &pool).ok());
  SchedulerOptions o;
  o.max_batched_tokens = w.budget;
  o.max_running = w.max_running;
  o.max_model_len = w.max_model_len;
  o.prefix_caching = w.prefix_caching;
  o.no_preemption = w.no_preemption;
  std::unique_ptr<Scheduler> s;
  EXPECT_TRUE(Scheduler::create(&pool, o, &s).ok());
  FakePagedModel model(w.blocks, w.block_size);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  // A few shared openings (system prompts) so that prefixes repeat.
  std::vector<std::vector<int32_t>> openings(3);
  for (auto& op : openings)
    for (int i = 0; i < 9; ++i) op.push_back(static_cast<int32_t>(rng() % kVocab));
  specs->clear();
  for (int64_t i = 0; i < n; ++i) {
    RequestSpec r;
    if (rng() % 3 != 0) r.prompt = openings[rng() % openings.size()];
    const int64_t tail = 1 + static_cast<int64_t>(rng() % 12);
    for (int64_t t = 0; t < tail; ++t) r.prompt.push_back(static_cast<int32_t>(rng() % kVocab));
    r.max_new_tokens = 1 + static_cast<int64_t>(rng() % 20);
    if (rng() % 4 == 0) r.stop_ids = {3};
    specs->push_back(r);
  }
  std::map<int64_t, Served> out;
  int64_t held_most = 0;     // blocks held as each plan goes out
  std::vector<int64_t> ids;  // by spec index
  size_t arrived = 0;
  std::set<int64_t> cancelled;
  for (int64_t step = 0; step < 100000 && (arrived < specs->size() || !s->idle()); ++step) {
    while (arrived < specs->size() && rng() % 2 == 0) {
      int64_t id = 0;
      const Status st = s->add((*specs)[arrived], &id);
      EXPECT_TRUE(st.ok()) << st.to_string();
      ids.push_back(id);
      out[id].tokens = (*specs)[arrived].prompt;
      ++arrived;
    }
    if (w.cancel_some && !ids.empty() && rng() % 23 == 0) {
      const int64_t victim = ids[rng() % ids.size()];
      if (s->tokens_of(victim) != nullptr && s->cancel(victim).ok()) {
        out[victim].finish = FinishReason::kCancelled;
        cancelled.insert(victim);
      }
    }
    const StepPlan plan = s->schedule();
    held_most = std::max(held_most, pool.usable_blocks() - pool.free_blocks());
    if (w.no_preemption) EXPECT_EQ(plan.preempted, 0) << "step " << step;
    if (most_running != nullptr) *most_running = std::max(*most_running, s->running());
    EXPECT_LE(plan.tokens, w.budget);
    EXPECT_LE(static_cast<int64_t>(plan.chunks.size()), w.max_running);
    std::vector<int32_t> sampled;
    model.run(plan, &sampled);
    std::vector<TokenEvent> events;
    const Status st = s->update(plan, sampled, &events);
    EXPECT_TRUE(st.ok()) << st.to_string();
    for (const TokenEvent& e : events) {
      out[e.request].tokens.push_back(e.token);
      if (e.finish != FinishReason::kNone) out[e.request].finish = e.finish;
    }
  }
  EXPECT_TRUE(s->idle());
  EXPECT_TRUE(pool.all_free()) << "a block leaked";
  *stats = s->stats();
  EXPECT_EQ(stats->peak_blocks, held_most);
  EXPECT_LE(stats->peak_blocks, w.blocks - 1);
  if (pool_out != nullptr) *pool_out = std::move(pool);
  return out;
}

void expect_every_request_as_alone(const std::map<int64_t, Served>& got, const std::vector<RequestSpec>& specs,
                                   int64_t max_model_len) {
  ASSERT_EQ(got.size(), specs.size());
  for (const auto& [id, served] : got) {
    const std::vector<int32_t> want = reference(specs[static_cast<size_t>(id)], max_model_len);
    if (served.finish == FinishReason::kCancelled) {  // a prefix of what it would have produced
      ASSERT_LE(served.tokens.size(), want.size()) << "request " << id;
      ASSERT_TRUE(std::equal(served.tokens.begin(), served.tokens.end(), want.begin())) << "request " << id;
      continue;
    }
    ASSERT_NE(served.finish, FinishReason::kNone) << "request " << id << " never finished";
    ASSERT_EQ(served.tokens, want) << "request " << id;
    const bool stopped = std::find(specs[static_cast<size_t>(id)].stop_ids.begin(), specs[static_cast<size_t>(id)].stop_ids.end(),
                                   want.back()) != specs[static_cast<size_t>(id)].stop_ids.end();
    ASSERT_EQ(served.finish, stopped ? FinishReason::kStop : FinishReason::kLength) << "request " << id;
  }
}

TEST(EngineScheduler, ARequestAloneGivesTheReferenceWithChunkedPrefill) {
  for (const int64_t budget : {int64_t{1}, int64_t{5}, int64_t{64}}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    std::vector<RequestSpec> specs;
    SchedulerStats stats;
    const Workload w{64, 4, budget, 1, 64, true, false};
    const auto got = serve(w, 6, 3, &specs, &stats);
    expect_every_request_as_alone(got, specs, w.max_model_len);
  }
}

TEST(EngineScheduler, ConcurrentRequestsUnderPreemptionAndPrefixSharingGiveTheirAloneTokens) {
  // 14 usable blocks of 4 tokens for up to 40 positions a request: preemption is routine.
  const Workload tight{15, 4, 16, 8, 48, true, false};
  std::vector<RequestSpec> specs;
  SchedulerStats stats;
  const auto got = serve(tight, 80, 11, &specs, &stats);
  expect_every_request_as_alone(got, specs, tight.max_model_len);
  EXPECT_GT(stats.preemptions, 0) << "the workload should force preemptions";
  EXPECT_GT(stats.prefix_hit_tokens, 0) << "the shared openings should hit the prefix cache";

  // The same requests without the prefix cache: the same tokens.
  Workload plain = tight;
  plain.prefix_caching = false;
  std::vector<RequestSpec> specs2;
  SchedulerStats stats2;
  const auto got2 = serve(plain, 80, 11, &specs2, &stats2);
  expect_every_request_as_alone(got2, specs2, plain.max_model_len);
  EXPECT_EQ(stats2.prefix_hit_tokens, 0);
  // A roomy cache: no preemption, same tokens again.
  const Workload roomy{400, 16, 256, 64, 48, true, false};
  const auto got3 = serve(roomy, 80, 11, &specs2, &stats2);
  expect_every_request_as_alone(got3, specs2, roomy.max_model_len);
  EXPECT_EQ(stats2.preemptions, 0);
}

// no_preemption on the workload that preempts routinely: never a preemption, still several
// requests at once (admission is not one at a time), every request's tokens as alone, and every
// block free at the end; with the prefix cache and cancellations too.
TEST(EngineScheduler, NoPreemptionAdmitsOnlyWhatTheCacheCanFinish) {
  for (const bool cancel : {false, true}) {
    SCOPED_TRACE(cancel ? "with cancellations" : "without cancellations");
    Workload tight{15, 4, 16, 8, 48, true, cancel};
    tight.no_preemption = true;
    std::vector<RequestSpec> specs;
    SchedulerStats stats;
    int64_t most = 0;
    const auto got = serve(tight, 80, 11, &specs, &stats, nullptr, &most);
    expect_every_request_as_alone(got, specs, tight.max_model_len);
    EXPECT_EQ(stats.preemptions, 0);
    EXPECT_GT(most, 1) << "requests should still share steps";
    EXPECT_GT(stats.prefix_hit_tokens, 0) << "the shared openings should hit the prefix cache";
  }
}

TEST(EngineScheduler, CancellationsAtAnyStepFreeEverythingAndLeaveOthersExact) {
  for (const uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Workload w{15, 4, 12, 6, 48, true, true};
    std::vector<RequestSpec> specs;
    SchedulerStats stats;
    const auto got = serve(w, 60, seed, &specs, &stats);  // serve() checks every block is free
    expect_every_request_as_alone(got, specs, w.max_model_len);
  }
}

// A pool, a scheduler over it (default options but the context) and the stand-in model.
struct Rig {
  KvBlockPool pool;
  std::unique_ptr<Scheduler> s;
  FakePagedModel model;
  Rig(int64_t blocks, int64_t block_size, int64_t max_model_len) : model(blocks, block_size) {
    EXPECT_TRUE(KvBlockPool::create(blocks, block_size, &pool).ok());
    SchedulerOptions o;
    o.max_model_len = max_model_len;
    EXPECT_TRUE(Scheduler::create(&pool, o, &s).ok());
  }
};

// Steps until nothing is waiting or running; every event, in order.
std::vector<TokenEvent> run_to_idle(Scheduler& s, FakePagedModel& model) {
  std::vector<TokenEvent> events;
  while (!s.idle()) {
    const StepPlan plan = s.schedule();
    std::vector<int32_t> sampled;
    model.run(plan, &sampled);
    const Status st = s.update(plan, sampled, &events);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) break;
  }
  return events;
}

TEST(EngineScheduler, AFullyCachedPromptStillComputesItsLastPosition) {
  // Two requests with the same 8-token prompt (two whole blocks of 4), the second after the first
  // finished: the prefix cache holds every block of its prompt, yet its last position is computed
  // again (the model's logits come from it), and the tokens are the first one's.
  Rig rig(16, 4, 32);
  RequestSpec r;
  r.prompt = {1, 0, 2, 3, 1, 1, 0, 2};
  r.max_new_tokens = 5;
  std::vector<std::vector<int32_t>> outputs;
  for (int round = 0; round < 2; ++round) {
    int64_t id = 0;
    ASSERT_TRUE(rig.s->add(r, &id).ok());
    std::vector<int32_t> out = r.prompt;
    for (const TokenEvent& e : run_to_idle(*rig.s, rig.model)) out.push_back(e.token);
    outputs.push_back(out);
  }
  EXPECT_EQ(rig.s->stats().prefix_hit_tokens, 4) << "one whole block: the second block holds the last position";
  EXPECT_EQ(outputs[1], outputs[0]);
  EXPECT_EQ(outputs[0], reference(r, 32));
  EXPECT_TRUE(rig.pool.all_free());
}

TEST(EngineScheduler, AnUnlimitedMaxNewTokensIsBoundedByTheContextNotOverflowed) {
  {
    Rig rig(5, 4, 1000);  // 4 usable blocks of 4: 16 positions
    RequestSpec r;
    r.prompt.assign(10, 1);
    r.max_new_tokens = std::numeric_limits<int64_t>::max();
    int64_t id = 0;
    const Status st = rig.s->add(r, &id);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);  // 999 positions: past the whole cache
    EXPECT_NE(st.message().find("999 positions need 250 KV blocks"), std::string::npos) << st.to_string();
  }
  Rig rig(5, 4, 16);
  RequestSpec r;
  r.prompt.assign(10, 1);
  r.max_new_tokens = std::numeric_limits<int64_t>::max();
  int64_t id = 0;
  ASSERT_TRUE(rig.s->add(r, &id).ok());
  const std::vector<TokenEvent> events = run_to_idle(*rig.s, rig.model);
  ASSERT_EQ(events.size(), 6u);  // to the context's 16 tokens
  EXPECT_EQ(events.back().finish, FinishReason::kLength);
  EXPECT_TRUE(rig.pool.all_free());
}

TEST(EngineScheduler, ACancelWhileAPlanIsOutTakesEffectInUpdate) {
  Rig rig(16, 4, 32);
  RequestSpec r;
  r.prompt = {1, 2, 3, 0, 1};
  r.max_new_tokens = 8;
  int64_t a = 0, b = 0;
  ASSERT_TRUE(rig.s->add(r, &a).ok());
  ASSERT_TRUE(rig.s->add(r, &b).ok());
  const StepPlan plan = rig.s->schedule();
  ASSERT_EQ(plan.chunks.size(), 2u);
  ASSERT_TRUE(rig.s->cancel(a).ok());
  EXPECT_EQ(rig.s->cancel(a).code(), StatusCode::kInvalidArgument) << "cancelled twice";
  std::vector<int32_t> sampled;
  rig.model.run(plan, &sampled);  // the plan's pointers are still the requests' own (ASan checks)
  std::vector<TokenEvent> events;
  ASSERT_TRUE(rig.s->update(plan, sampled, &events).ok());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].request, b);
  EXPECT_EQ(rig.s->tokens_of(a), nullptr);
  ASSERT_TRUE(rig.s->cancel(b).ok());
  EXPECT_TRUE(rig.s->idle());
  EXPECT_TRUE(rig.pool.all_free());
}

TEST(EngineScheduler, ASequenceFillingTheContextEndsWithLength) {
  Rig rig(8, 2, 6);
  RequestSpec r;
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 100;
  int64_t id = 0;
  ASSERT_TRUE(rig.s->add(r, &id).ok());
  const std::vector<TokenEvent> events = run_to_idle(*rig.s, rig.model);
  ASSERT_EQ(events.size(), 3u);  // positions 3, 4, 5 filled: the context holds 6
  EXPECT_EQ(events.back().finish, FinishReason::kLength);
  EXPECT_TRUE(rig.pool.all_free());
}

// A plan refused part way through update() (a chunk's start no longer the sequence's): the requests
// that ended before the refused chunk have left live and running both, so the scheduler stays whole.
TEST(EngineScheduler, APlanRefusedInUpdateLeavesTheSchedulerWhole) {
  Rig rig(16, 4, 32);
  RequestSpec one;
  one.prompt = {1, 2, 3};
  one.max_new_tokens = 1;  // ends with its first token
  RequestSpec more = one;
  more.max_new_tokens = 8;
  int64_t a = 0, b = 0;
  ASSERT_TRUE(rig.s->add(one, &a).ok());
  ASSERT_TRUE(rig.s->add(more, &b).ok());
  StepPlan plan = rig.s->schedule();
  ASSERT_EQ(plan.chunks.size(), 2u);
  ASSERT_EQ(plan.chunks[0].request, a);
  std::vector<int32_t> sampled;
  rig.model.run(plan, &sampled);
  plan.chunks[1].start += 1;  // b's chunk is not what was scheduled
  std::vector<TokenEvent> events;
  EXPECT_EQ(rig.s->update(plan, sampled, &events).code(), StatusCode::kInvalidArgument);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].finish, FinishReason::kLength);
  EXPECT_EQ(rig.s->running(), 1) << "a ended: only b runs";
  EXPECT_EQ(rig.s->tokens_of(a), nullptr);
  EXPECT_EQ(rig.s->cancel(a).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(rig.s->cancel(b).ok());
  EXPECT_TRUE(rig.s->idle());
  EXPECT_TRUE(rig.pool.all_free());
}

}  // namespace
}  // namespace llmq::engine
