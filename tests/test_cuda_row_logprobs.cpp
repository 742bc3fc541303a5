// Log-probabilities on the device (src/runtime/row_logprobs.cu) against their host reference
// (row_logprobs_reference.cpp, the definition in row_logprobs.hpp), and the engine's GPU path:
//   1. every asking row's sampled-token logprob and top K (K 0 / 1 / 5 / 20, and past the
//      vocabulary) within |device - reference| <= 1e-5 + 1e-6 |reference|, the top ids identical
//      (ties at the K-th logit to the lower id, -Inf logits), on vocabularies 7, 96, 1000, 32000,
//      151936 and 202048, peaked rows, flat rows and rows on a 0.25 grid; rows that did not ask are
//      left untouched (their output poisoned before and unchanged after);
//   2. bad arguments are refused;
//   3. the engine over the GPU backend (graphs off) on the seeded default model (vocabulary 512):
//      each token's logprobs are the reference's on the logits the backend computed for that very
//      step (recorded by an eager forward of the same plan), for requests asking K -1 / 0 / 5 / 20
//      side by side;
//   4. the same through an EngineLoop with CUDA graphs (padded decode batches): a greedy token is
//      the first of its top list with the same logprob, the list is in order, and a request that
//      did not ask gets nothing.
// Skips visibly without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "cuda_support.hpp"
#include "llmq/engine_gpu.hpp"
#include "llmq/engine_loop.hpp"
#include "llmq/model.hpp"
#include "llmq/tensor_parallel.hpp"
#include "runtime/row_logprobs.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using testing::DeviceBuffer;

constexpr double kAbsTolerance = 1e-5;  // see row_logprobs.hpp: float exp, double sums, a float result
constexpr double kRelTolerance = 1e-6;

::testing::AssertionResult close(double device, double reference) {
  if (std::isnan(reference) ? std::isnan(device) : device == reference) return ::testing::AssertionSuccess();  // -Inf too
  if (std::fabs(device - reference) <= kAbsTolerance + kRelTolerance * std::fabs(reference)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "device " << device << ", reference " << reference;
}

// RowLogprobs against the reference for row `row` of `logits` with token and k.
void expect_matches(const RowLogprobs& got, const float* row, int64_t vocab, int32_t token, int32_t k) {
  const runtime::RowLogprobsReference ref = runtime::row_logprobs_reference(row, vocab, token, k);
  EXPECT_TRUE(close(got.token, ref.token)) << "the sampled token " << token;
  ASSERT_EQ(got.count, static_cast<int32_t>(ref.top_ids.size()));
  for (int32_t i = 0; i < got.count; ++i) {
    EXPECT_EQ(got.top_ids[i], ref.top_ids[static_cast<size_t>(i)]) << "rank " << i;
    EXPECT_TRUE(close(got.top[i], ref.top[static_cast<size_t>(i)])) << "rank " << i;
  }
}

// Rows by kind: peaked (a few outliers far above), N(0, 2), flat (N(0, 0.01)), on a 0.25 grid
// (many ties), with -Inf at a tenth of the ids.
std::vector<float> make_logits(int64_t rows, int64_t vocab, uint64_t seed) {
  std::vector<float> all;
  std::mt19937_64 rng(seed);
  for (int64_t r = 0; r < rows; ++r) {
    const int kind = static_cast<int>(r % 5);
    std::vector<float> row = testing::normal_vector(vocab, seed * 1000 + static_cast<uint64_t>(r), kind == 2 ? 0.01f : 2.0f);
    if (kind == 0)
      for (int o = 0; o < 4; ++o) row[rng() % static_cast<uint64_t>(vocab)] += 18.0f;
    if (kind == 3)
      for (float& v : row) v = std::round(v * 4.0f) / 4.0f;
    if (kind == 4)
      for (int64_t i = 0; i < vocab; i += 10) row[i] = -std::numeric_limits<float>::infinity();
    all.insert(all.end(), row.begin(), row.end());
  }
  return all;
}

TEST(CudaRowLogprobs, MatchTheReference) {
  LLMQ_REQUIRE_GPU();
  const int32_t ks[] = {-1, 0, 1, 5, 20, 20, 3};
  for (int64_t vocab : {int64_t{7}, int64_t{96}, int64_t{1000}, int64_t{32000}, int64_t{151936}, int64_t{202048}}) {
    const int64_t rows = 23;
    const uint64_t seed = static_cast<uint64_t>(vocab) * 3 + 1;
    const std::vector<float> logits = make_logits(rows, vocab, seed);
    std::vector<int32_t> k(rows), tokens(rows);
    std::mt19937_64 rng(seed);
    for (int64_t r = 0; r < rows; ++r) {
      k[r] = ks[r % 7];
      tokens[r] = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    }
    DeviceBuffer<float> d_logits(logits.size());
    DeviceBuffer<int32_t> d_k(k.size()), d_tokens(tokens.size());
    DeviceBuffer<RowLogprobs> d_out(static_cast<size_t>(rows));
    ASSERT_TRUE(d_logits.ok() && d_k.ok() && d_tokens.ok() && d_out.ok());
    CUDA_ASSERT(d_logits.upload(logits));
    CUDA_ASSERT(d_k.upload(k));
    CUDA_ASSERT(d_tokens.upload(tokens));
    CUDA_ASSERT(d_out.fill_bytes(0x7F));  // poison: rows that did not ask must keep it
    const Status st = runtime::row_logprobs(d_logits.get(), rows, vocab, d_k.get(), d_tokens.get(), d_out.get(), nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<RowLogprobs> out;
    CUDA_ASSERT(d_out.download(&out));
    const std::vector<unsigned char> poison(sizeof(RowLogprobs), 0x7F);
    for (int64_t r = 0; r < rows; ++r) {
      SCOPED_TRACE(testing::repro(seed, r, vocab, "row kind " + std::to_string(r % 5) + ", k " + std::to_string(k[r])));
      if (k[r] < 0) {
        EXPECT_EQ(std::memcmp(&out[r], poison.data(), poison.size()), 0) << "a row that did not ask was written";
        continue;
      }
      expect_matches(out[r], logits.data() + r * vocab, vocab, tokens[r], k[r]);
    }
  }
}

TEST(CudaRowLogprobs, RefusesBadArguments) {
  LLMQ_REQUIRE_GPU();
  DeviceBuffer<float> logits(16);
  DeviceBuffer<int32_t> k(1), tokens(1);
  DeviceBuffer<RowLogprobs> out(1);
  EXPECT_FALSE(runtime::row_logprobs(logits.get(), -1, 16, k.get(), tokens.get(), out.get(), nullptr).ok());
  EXPECT_FALSE(runtime::row_logprobs(logits.get(), 1, 0, k.get(), tokens.get(), out.get(), nullptr).ok());
  EXPECT_FALSE(runtime::row_logprobs(logits.get(), 1, 16, nullptr, tokens.get(), out.get(), nullptr).ok());
  EXPECT_TRUE(runtime::row_logprobs(nullptr, 0, 16, nullptr, nullptr, nullptr, nullptr).ok());  // nothing to do
}

// ---- The engine's GPU path.

struct Gpu {
  std::unique_ptr<TensorParallelRuntime> tpr;
  std::unique_ptr<engine::GpuBackend> backend;
};

Status start(const ModelWeights& w, bool graphs, Gpu* g) {
  GpuModelSource source;
  source.kind = GpuModelSource::Kind::kHost;
  source.weights = &w;
  LLMQ_RETURN_IF_ERROR(TensorParallelRuntime::load(1, 0, source, gpu_precision(GpuPrecision::Kind::kF32), &g->tpr));
  GpuRuntimeOptions o;
  o.max_batch = 8;
  o.max_context = 64;
  o.max_step_tokens = 24;
  o.kv_block_size = 4;
  o.kv_blocks = 64;
  o.cuda_graphs = graphs;
  LLMQ_RETURN_IF_ERROR(g->tpr->start(o));
  return engine::GpuBackend::create(g->tpr.get(), &g->backend);
}

// An engine over `backend` with the runtime's geometry: 64 blocks of 4, steps of 24 tokens and 8
// sequences, a context of 64.
Status make_engine(engine::EngineBackend* backend, engine::KvBlockPool* pool, std::unique_ptr<engine::Engine>* e) {
  LLMQ_RETURN_IF_ERROR(engine::KvBlockPool::create(64, 4, pool));
  engine::SchedulerOptions o;
  o.max_batched_tokens = 24;
  o.max_running = 8;
  o.max_model_len = 64;
  return engine::Engine::create(backend, pool, o, e);
}

// The GPU backend, each step's logits recorded first by an eager forward of the same plan (its K/V
// writes are the values the step writes again), by request.
class RecordingBackend : public engine::EngineBackend {
 public:
  explicit RecordingBackend(engine::GpuBackend* inner) : inner_(inner) {}
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t max_context() const override { return inner_->max_context(); }
  int64_t blocks() const override { return inner_->blocks(); }
  int64_t block_size() const override { return inner_->block_size(); }
  Status forward(const engine::StepPlan& plan, std::vector<float>* logits) override { return inner_->forward(plan, logits); }
  bool samples_itself() const override { return true; }
  Status forward_sample(const engine::StepPlan& plan, const std::vector<engine::RowDraw>& rows, std::vector<int32_t>* tokens,
                        std::vector<engine::TokenLogprobs>* logprobs) override {
    std::vector<float> logits;
    LLMQ_RETURN_IF_ERROR(inner_->forward(plan, &logits));
    const int64_t vocab = vocab_size();
    size_t row = 0;
    for (const engine::StepChunk& c : plan.chunks)
      if (c.sample) {
        last_[c.request].assign(logits.begin() + static_cast<int64_t>(row) * vocab, logits.begin() + static_cast<int64_t>(row + 1) * vocab);
        ++row;
      }
    return inner_->forward_sample(plan, rows, tokens, logprobs);
  }
  const std::vector<float>& last_logits(int64_t request) const { return last_.at(request); }

 private:
  engine::GpuBackend* inner_;
  std::map<int64_t, std::vector<float>> last_;
};

TEST(CudaRowLogprobs, TheEnginesGpuPathGivesTheReferencesOnTheStepsLogits) {
  LLMQ_REQUIRE_GPU();
  const ModelWeights w = make_default_model();  // vocabulary 512
  Gpu g;
  const Status started = start(w, /*graphs=*/false, &g);
  ASSERT_TRUE(started.ok()) << started.to_string();
  RecordingBackend backend(g.backend.get());
  engine::KvBlockPool pool;
  std::unique_ptr<engine::Engine> e;
  ASSERT_TRUE(make_engine(&backend, &pool, &e).ok());
  const int32_t ks[] = {-1, 0, 5, 20, 3};
  std::map<int64_t, int32_t> k_of;
  for (int i = 0; i < 5; ++i) {
    engine::RequestSpec spec;
    for (int t = 0; t < 9 + i; ++t) spec.prompt.push_back(static_cast<int32_t>((t * 31 + i * 7) % 512));
    spec.max_new_tokens = 12;
    engine::SamplingParams p;
    p.temperature = i % 2 == 0 ? 0.0f : 0.8f;
    p.top_k = i == 3 ? 10 : 0;
    p.seed = 50 + static_cast<uint64_t>(i);
    p.logprobs = ks[i];
    int64_t id = 0;
    ASSERT_TRUE(e->add(spec, p, &id).ok());
    k_of[id] = ks[i];
  }
  int64_t checked = 0;
  for (int guard = 0; !e->idle() && guard < 1000; ++guard) {
    std::vector<engine::TokenEvent> events;
    const Status st = e->step(&events);
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (const engine::TokenEvent& ev : events) {
      const int32_t k = k_of.at(ev.request);
      SCOPED_TRACE("request " + std::to_string(ev.request) + ", k " + std::to_string(k));
      if (k < 0) {
        EXPECT_EQ(ev.logprobs, nullptr);
        continue;
      }
      ASSERT_NE(ev.logprobs, nullptr);
      RowLogprobs got;
      got.token = ev.logprobs->token;
      got.count = static_cast<int32_t>(ev.logprobs->top_ids.size());
      ASSERT_LE(got.count, kMaxTopLogprobs);
      std::copy(ev.logprobs->top_ids.begin(), ev.logprobs->top_ids.end(), got.top_ids);
      std::copy(ev.logprobs->top.begin(), ev.logprobs->top.end(), got.top);
      const std::vector<float>& row = backend.last_logits(ev.request);
      expect_matches(got, row.data(), w.config.vocab_size, ev.token, k);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4 * 12);
  EXPECT_TRUE(pool.all_free());
}

TEST(CudaRowLogprobs, ThroughAnEngineLoopWithCudaGraphs) {
  LLMQ_REQUIRE_GPU();
  const ModelWeights w = make_default_model();  // vocabulary 512
  Gpu g;
  const Status started = start(w, /*graphs=*/true, &g);
  ASSERT_TRUE(started.ok()) << started.to_string();
  engine::KvBlockPool pool;
  std::unique_ptr<engine::Engine> e;
  ASSERT_TRUE(make_engine(g.backend.get(), &pool, &e).ok());
  std::unique_ptr<engine::EngineLoop> loop;
  ASSERT_TRUE(engine::EngineLoop::start(e.get(), &loop).ok());
  std::mutex mu;
  std::condition_variable cv;
  std::map<int64_t, std::vector<engine::TokenEvent>> got;
  int ended = 0;
  const int32_t ks[] = {4, -1, 0, 20, 2};  // 5 requests: decode graphs of 8 with 3 padding rows
  std::map<int64_t, int32_t> k_of;
  for (int i = 0; i < 5; ++i) {
    engine::RequestSpec spec;
    for (int t = 0; t < 6; ++t) spec.prompt.push_back(static_cast<int32_t>((t * 13 + i * 5 + 1) % 512));
    spec.max_new_tokens = 20;
    engine::SamplingParams p;  // greedy
    p.logprobs = ks[i];
    int64_t id = 0;
    const Status st = loop->submit(spec, p,
                                   [&](const engine::TokenEvent& ev) {
                                     std::lock_guard<std::mutex> lock(mu);
                                     got[ev.request].push_back(ev);
                                     if (ev.finish != engine::FinishReason::kNone) ++ended;
                                     cv.notify_all();
                                   },
                                   &id);
    ASSERT_TRUE(st.ok()) << st.to_string();
    k_of[id] = ks[i];
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return ended == 5; }));
  }
  loop->stop(true);
  ASSERT_TRUE(loop->error().ok()) << loop->error().to_string();
  for (const auto& [id, events] : got) {
    const int32_t k = k_of.at(id);
    EXPECT_EQ(events.size(), 20u) << "request " << id;
    for (const engine::TokenEvent& ev : events) {
      if (k < 0) {
        EXPECT_EQ(ev.logprobs, nullptr);
        continue;
      }
      ASSERT_NE(ev.logprobs, nullptr);
      const engine::TokenLogprobs& lp = *ev.logprobs;
      ASSERT_EQ(lp.top_ids.size(), static_cast<size_t>(k));
      EXPECT_LE(lp.token, 0.0f);
      double mass = 0;
      for (size_t i = 0; i < lp.top.size(); ++i) {
        mass += std::exp(static_cast<double>(lp.top[i]));
        if (i > 0) {
          EXPECT_GE(lp.top[i - 1], lp.top[i]) << "request " << id << " rank " << i;
        }
      }
      EXPECT_LE(mass, 1.0 + 1e-5);
      if (k >= 1) {  // greedy: the sampled token is the top one (ties to the lower id on both sides)
        EXPECT_EQ(ev.token, lp.top_ids[0]) << "request " << id;
        EXPECT_EQ(lp.token, lp.top[0]) << "request " << id;
      }
    }
  }
}

}  // namespace
}  // namespace llmq
