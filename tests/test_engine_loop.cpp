// EngineLoop (include/llmq/engine_loop.hpp) over the CPU backend: requests submitted from several
// threads at once stream exactly the tokens the reference gives each alone; cancellation from
// another thread and from inside a callback, a throwing callback, a full queue, draining and
// hard stops: every request gets exactly one final event, nothing runs after stop(), and every
// KV block is free at the end.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "llmq/engine_cpu.hpp"
#include "llmq/engine_loop.hpp"
#include "llmq/model.hpp"
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
  o.seed = 11;
  return make_default_model(o);
}

// Greedy, alone, through the reference: the prompt, then one token at a time.
std::vector<int32_t> alone(const ModelWeights& w, const RequestSpec& r) {
  Transformer t(w);
  std::vector<int32_t> tokens = r.prompt, out;
  const int64_t vocab = w.config.vocab_size;
  std::vector<float> logits(tokens.size() * static_cast<size_t>(vocab));
  EXPECT_TRUE(t.forward(tokens.data(), static_cast<int64_t>(tokens.size()), 0, logits.data()).ok());
  const float* last = &logits[(tokens.size() - 1) * static_cast<size_t>(vocab)];
  for (int64_t g = 0; g < r.max_new_tokens && static_cast<int64_t>(tokens.size()) < w.config.max_seq_len; ++g) {
    const int32_t next = static_cast<int32_t>(std::max_element(last, last + vocab) - last);
    tokens.push_back(next);
    out.push_back(next);
    logits.resize(static_cast<size_t>(vocab));
    EXPECT_TRUE(t.forward(&tokens.back(), 1, static_cast<int64_t>(tokens.size()) - 1, logits.data()).ok());
    last = logits.data();
  }
  return out;
}

struct Harness {
  ModelWeights w = small_model();
  KvBlockPool pool;
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<EngineLoop> loop;
  explicit Harness(int64_t max_waiting = 1024, int64_t blocks = 24) {
    EXPECT_TRUE(KvBlockPool::create(blocks, 4, &pool).ok());
    EXPECT_TRUE(CpuBackend::create(w, blocks, 4, &backend).ok());
    SchedulerOptions o;
    o.max_batched_tokens = 16;
    o.max_running = 6;
    o.max_waiting = max_waiting;
    o.max_model_len = w.config.max_seq_len;
    EXPECT_TRUE(Engine::create(backend.get(), &pool, o, &engine).ok());
    EXPECT_TRUE(EngineLoop::start(engine.get(), &loop).ok());
  }
};

// What one request's callback saw.
struct Seen {
  std::mutex mu;
  std::vector<int32_t> tokens;
  int finals = 0;
  FinishReason finish = FinishReason::kNone;
  void add(const TokenEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (e.token >= 0) tokens.push_back(e.token);
    if (e.finish != FinishReason::kNone) {
      ++finals;
      finish = e.finish;
    }
  }
};

RequestSpec random_request(std::mt19937& rng, int64_t vocab) {
  RequestSpec r;
  for (int t = 2 + static_cast<int>(rng() % 10); t > 0; --t) r.prompt.push_back(static_cast<int32_t>(rng() % vocab));
  r.max_new_tokens = 1 + static_cast<int64_t>(rng() % 12);
  return r;
}

TEST(EngineLoop, ConcurrentSubmittersStreamTheReferenceTokens) {
  Harness h;
  constexpr int kThreads = 4, kPerThread = 6;
  std::vector<RequestSpec> specs;
  std::mt19937 rng(5);
  for (int i = 0; i < kThreads * kPerThread; ++i) specs.push_back(random_request(rng, h.w.config.vocab_size));
  std::vector<Seen> seen(specs.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = t * kPerThread; i < (t + 1) * kPerThread; ++i) {
        int64_t id = 0;
        const Status st = h.loop->submit(specs[static_cast<size_t>(i)], {}, [&seen, i](const TokenEvent& e) { seen[static_cast<size_t>(i)].add(e); }, &id);
        EXPECT_TRUE(st.ok()) << st.to_string();
        std::this_thread::sleep_for(std::chrono::microseconds(200 * (i % 3)));
      }
    });
  for (auto& th : threads) th.join();
  h.loop->stop(/*drain=*/true);
  EXPECT_EQ(h.loop->live(), 0);
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(seen[i].finals, 1) << "request " << i;
    EXPECT_EQ(seen[i].finish, FinishReason::kLength) << "request " << i;
    EXPECT_EQ(seen[i].tokens, alone(h.w, specs[i])) << "request " << i;
  }
  EXPECT_TRUE(h.pool.all_free());
}

// Callbacks run on the delivery thread: one that submits (each of the first request's tokens starts
// a follow-up) waits for the loop like any submitter, and every request still streams exactly its
// reference tokens.
TEST(EngineLoop, ACallbackSubmitsFollowUpsThatStreamTheReferenceTokens) {
  Harness h;
  std::mt19937 rng(21);
  RequestSpec first = random_request(rng, h.w.config.vocab_size);
  first.max_new_tokens = 6;
  std::vector<RequestSpec> follow;
  for (int i = 0; i < 6; ++i) follow.push_back(random_request(rng, h.w.config.vocab_size));
  std::vector<Seen> seen(follow.size() + 1);
  std::atomic<int> submitted{0}, answered{0};
  EngineLoop* loop = h.loop.get();
  StreamFn on_first = [&](const TokenEvent& e) {
    seen[0].add(e);
    if (e.token < 0) return;
    const int i = submitted++;
    if (i >= static_cast<int>(follow.size())) return;
    int64_t id = 0;
    const Status st = loop->submit(follow[static_cast<size_t>(i)], {},
                                   [&seen, i](const TokenEvent& ev) { seen[static_cast<size_t>(i) + 1].add(ev); }, &id);
    EXPECT_TRUE(st.ok()) << st.to_string();
    ++answered;
  };
  int64_t id = 0;
  ASSERT_TRUE(h.loop->submit(first, {}, on_first, &id).ok());
  for (int spin = 0; spin < 5000 && answered.load() < 6; ++spin) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  h.loop->stop(/*drain=*/true);
  EXPECT_EQ(answered.load(), 6);
  EXPECT_EQ(seen[0].tokens, alone(h.w, first));
  for (size_t i = 0; i < follow.size(); ++i) {
    EXPECT_EQ(seen[i + 1].finals, 1) << "follow-up " << i;
    EXPECT_EQ(seen[i + 1].tokens, alone(h.w, follow[i])) << "follow-up " << i;
  }
  EXPECT_TRUE(h.pool.all_free());
}

TEST(EngineLoop, CancellationFromOutsideAndFromACallbackAndAThrowingCallbackFreeEverything) {
  Harness h;
  std::mt19937 rng(9);
  constexpr int kRequests = 18;
  std::vector<Seen> seen(kRequests);
  std::vector<int64_t> ids(kRequests, -1);
  std::atomic<int> thrown{0};
  EngineLoop* loop = h.loop.get();
  for (int i = 0; i < kRequests; ++i) {
    RequestSpec r = random_request(rng, h.w.config.vocab_size);
    r.max_new_tokens = 40;  // long enough to be cancelled on the way
    StreamFn fn = [&, i](const TokenEvent& e) {
      seen[static_cast<size_t>(i)].add(e);
      if (i % 3 == 1 && e.finish == FinishReason::kNone && seen[static_cast<size_t>(i)].tokens.size() == 2)
        (void)loop->cancel(e.request);  // from inside its own callback
      if (i % 3 == 2 && e.finish == FinishReason::kNone && seen[static_cast<size_t>(i)].tokens.size() == 3) {
        ++thrown;
        throw std::runtime_error("client went away");
      }
    };
    ASSERT_TRUE(h.loop->submit(r, {}, fn, &ids[static_cast<size_t>(i)]).ok());
  }
  // From outside: every third request, once it has streamed something (or at once).
  for (int i = 0; i < kRequests; i += 3) {
    for (int spin = 0; spin < 2000; ++spin) {
      {
        std::lock_guard<std::mutex> lock(seen[static_cast<size_t>(i)].mu);
        if (!seen[static_cast<size_t>(i)].tokens.empty() || seen[static_cast<size_t>(i)].finals > 0) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    (void)h.loop->cancel(ids[static_cast<size_t>(i)]);  // may have ended already: refused then
  }
  h.loop->stop(/*drain=*/true);
  EXPECT_EQ(h.loop->live(), 0);
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(seen[static_cast<size_t>(i)].finals, 1) << "request " << i;
    if (i % 3 != 0) {
      EXPECT_EQ(seen[static_cast<size_t>(i)].finish, FinishReason::kCancelled) << "request " << i;
      EXPECT_EQ(seen[static_cast<size_t>(i)].tokens.size(), static_cast<size_t>(i % 3 == 1 ? 2 : 3)) << "request " << i;
    }
  }
  EXPECT_EQ(thrown.load(), kRequests / 3);
  EXPECT_TRUE(h.pool.all_free()) << "a cancelled request kept its blocks";
  EXPECT_FALSE(h.loop->cancel(ids[0]).ok());
}

// A slow reader leaves tokens queued behind the engine: once cancel() has returned ok, the callback
// gets only the kCancelled end, however many tokens were queued or being delivered meanwhile.
TEST(EngineLoop, NoTokenReachesACallbackAfterCancelReturns) {
  Harness h;
  std::mt19937 rng(31);
  constexpr int kRequests = 8;
  std::vector<Seen> seen(kRequests);
  std::vector<std::atomic<bool>> returned(kRequests);
  std::atomic<int> late{0};
  std::vector<int64_t> ids(kRequests, -1);
  for (int i = 0; i < kRequests; ++i) {
    RequestSpec r = random_request(rng, h.w.config.vocab_size);
    r.max_new_tokens = 40;
    StreamFn fn = [&, i](const TokenEvent& e) {
      if (e.finish == FinishReason::kNone && returned[static_cast<size_t>(i)].load()) ++late;
      seen[static_cast<size_t>(i)].add(e);
      std::this_thread::sleep_for(std::chrono::microseconds(300));  // slower than the engine
    };
    ASSERT_TRUE(h.loop->submit(r, {}, fn, &ids[static_cast<size_t>(i)]).ok());
  }
  int cancelled = 0;
  for (int i = 0; i < kRequests; ++i) {
    for (int spin = 0; spin < 2000; ++spin) {
      {
        std::lock_guard<std::mutex> lock(seen[static_cast<size_t>(i)].mu);
        if (seen[static_cast<size_t>(i)].tokens.size() >= 2 || seen[static_cast<size_t>(i)].finals > 0) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (h.loop->cancel(ids[static_cast<size_t>(i)]).ok()) {
      returned[static_cast<size_t>(i)].store(true);
      ++cancelled;
    }
  }
  h.loop->stop(/*drain=*/true);
  EXPECT_EQ(late.load(), 0) << "tokens delivered after cancel() returned";
  EXPECT_GT(cancelled, 0);
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(seen[static_cast<size_t>(i)].finals, 1) << "request " << i;
    if (returned[static_cast<size_t>(i)].load())
      EXPECT_EQ(seen[static_cast<size_t>(i)].finish, FinishReason::kCancelled) << "request " << i;
  }
  EXPECT_EQ(h.loop->live(), 0);
  EXPECT_TRUE(h.pool.all_free());
}

TEST(EngineLoop, AFullQueueIsRefusedAtOnceAndAHardStopEndsEveryRequest) {
  Harness h(/*max_waiting=*/3);
  std::mt19937 rng(13);
  std::vector<Seen> seen(64);
  int accepted = 0, refused = 0;
  for (int i = 0; i < 64; ++i) {
    RequestSpec r = random_request(rng, h.w.config.vocab_size);
    r.max_new_tokens = 50;
    int64_t id = 0;
    const Status st = h.loop->submit(r, {}, [&seen, i](const TokenEvent& e) { seen[static_cast<size_t>(i)].add(e); }, &id);
    if (st.ok()) {
      ++accepted;
    } else {
      EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
      ++refused;
    }
  }
  EXPECT_GT(refused, 0) << "64 requests at once into a queue of 3";
  h.loop->stop(/*drain=*/false);
  int finals = 0, cut_short = 0;
  for (auto& s : seen) {
    finals += s.finals;
    cut_short += s.finish == FinishReason::kCancelled && s.tokens.size() < 50 ? 1 : 0;
  }
  EXPECT_EQ(finals, accepted) << "every accepted request gets one final event";
  EXPECT_GT(cut_short, 0) << "a hard stop cancels what is running instead of finishing it";
  EXPECT_EQ(h.loop->live(), 0);
  EXPECT_TRUE(h.pool.all_free());
  int64_t id = 0;
  const Status after = h.loop->submit(random_request(rng, h.w.config.vocab_size), {}, [](const TokenEvent&) {}, &id);
  EXPECT_EQ(after.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(after.message().find("shutting down"), std::string::npos) << after.to_string();
  EXPECT_EQ(h.loop->submit({}, {}, nullptr, &id).code(), StatusCode::kInvalidArgument);
}

// The CPU backend, each step slowed down, until `fail` is set: then a device error on every step.
class FailingBackend : public EngineBackend {
 public:
  FailingBackend(EngineBackend* inner, const std::atomic<bool>* fail) : inner_(inner), fail_(fail) {}
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t max_context() const override { return inner_->max_context(); }
  int64_t blocks() const override { return inner_->blocks(); }
  int64_t block_size() const override { return inner_->block_size(); }
  Status forward(const StepPlan& plan, std::vector<float>* logits) override {
    if (fail_->load()) return Status(StatusCode::kCudaError, "an illegal memory access was encountered");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return inner_->forward(plan, logits);
  }

 private:
  EngineBackend* inner_;
  const std::atomic<bool>* fail_;
};

TEST(EngineLoop, AFailedStepEndsEveryRequestOnceAndRefusesNewOnesWithTheError) {
  Harness h;
  h.loop->stop(true);  // this test drives its own engine over a failing backend
  std::atomic<bool> fail{false};
  FailingBackend failing(h.backend.get(), &fail);
  SchedulerOptions o;
  o.max_batched_tokens = 16;
  o.max_running = 6;
  o.max_model_len = h.w.config.max_seq_len;
  std::unique_ptr<Engine> engine;
  ASSERT_TRUE(Engine::create(&failing, &h.pool, o, &engine).ok());
  std::unique_ptr<EngineLoop> loop;
  ASSERT_TRUE(EngineLoop::start(engine.get(), &loop).ok());
  std::mt19937 rng(17);
  std::vector<Seen> seen(8);
  // Each submit waits for at most the step in progress (5 ms here): the 8 requests are in long before
  // any of them could have ended (30 tokens, 150 ms), and the failure comes after all of them.
  for (int i = 0; i < 8; ++i) {
    RequestSpec r = random_request(rng, h.w.config.vocab_size);
    r.max_new_tokens = 30;
    int64_t id = 0;
    ASSERT_TRUE(loop->submit(r, {}, [&seen, i](const TokenEvent& e) { seen[static_cast<size_t>(i)].add(e); }, &id).ok());
  }
  fail.store(true);
  for (int spin = 0; spin < 5000 && loop->error().ok(); ++spin) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  loop->stop(false);
  EXPECT_EQ(loop->error().code(), StatusCode::kCudaError);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(seen[static_cast<size_t>(i)].finals, 1) << "request " << i;
    EXPECT_EQ(seen[static_cast<size_t>(i)].finish, FinishReason::kCancelled) << "request " << i;
  }
  int64_t id = 0;
  const Status after = loop->submit(random_request(rng, h.w.config.vocab_size), {}, [](const TokenEvent&) {}, &id);
  EXPECT_EQ(after.code(), StatusCode::kCudaError) << after.to_string();
  // The engine itself: failed, it refuses steps and adds with the error, and cancel does not throw.
  std::vector<TokenEvent> events;
  EXPECT_EQ(engine->step(&events).code(), StatusCode::kCudaError);
  EXPECT_EQ(engine->add(random_request(rng, h.w.config.vocab_size), {}, &id).code(), StatusCode::kCudaError);
}

}  // namespace
}  // namespace llmq::engine
