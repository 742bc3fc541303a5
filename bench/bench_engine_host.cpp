// The serving engine's host cost per step (scheduler, engine bookkeeping, the plan and its events),
// with a backend that computes nothing: what a GPU step waits for on the host between two device
// steps, apart from the backend's own uploads and launch. Decode-only steps of N running sequences
// (128-token prompts, prefix caching on, 16-token blocks), and a step that also admits and
// prefills new requests.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "llmq/engine.hpp"
#include "llmq/kv_block_pool.hpp"
#include "llmq/scheduler.hpp"

namespace {

using namespace llmq;
using namespace llmq::engine;

// Samples on "the device": every row's token is 7 (never a stop id here).
class NullBackend : public EngineBackend {
 public:
  explicit NullBackend(int64_t blocks) : blocks_(blocks) {}
  int64_t vocab_size() const override { return 32000; }
  int64_t max_context() const override { return 1 << 20; }
  int64_t blocks() const override { return blocks_; }
  int64_t block_size() const override { return 16; }
  Status forward(const StepPlan&, std::vector<float>*) override { return unsupported("samples itself"); }
  bool samples_itself() const override { return true; }
  Status forward_sample(const StepPlan& plan, const std::vector<RowDraw>&, std::vector<int32_t>* tokens,
                        std::vector<TokenLogprobs>* logprobs) override {
    tokens->assign(static_cast<size_t>(plan.samples), 7);
    logprobs->clear();
    return {};
  }

 private:
  int64_t blocks_;
};

struct Setup {
  std::unique_ptr<NullBackend> backend;
  KvBlockPool pool;
  std::unique_ptr<Engine> engine;
};

// `running` requests of 128 distinct prompt tokens each, all prefilled: the next step decodes them all.
bool make_running(int64_t running, Setup* s) {
  const int64_t blocks = running * 64 + 1;
  s->backend = std::make_unique<NullBackend>(blocks);
  if (!KvBlockPool::create(blocks, 16, &s->pool).ok()) return false;
  SchedulerOptions o;
  o.max_running = running;
  o.max_batched_tokens = running * 128;
  o.max_waiting = running;
  o.max_model_len = 1024;
  if (!Engine::create(s->backend.get(), &s->pool, o, &s->engine).ok()) return false;
  for (int64_t r = 0; r < running; ++r) {
    RequestSpec spec;
    for (int32_t i = 0; i < 128; ++i) spec.prompt.push_back(static_cast<int32_t>((r * 131 + i * 7) % 32000));
    spec.max_new_tokens = 900;
    int64_t id = 0;
    if (!s->engine->add(std::move(spec), SamplingParams{}, &id).ok()) return false;
  }
  std::vector<TokenEvent> events;
  return s->engine->step(&events).ok();  // every prompt in one step
}

void engine_decode_step(benchmark::State& state) {
  Setup s;
  if (!make_running(state.range(0), &s)) {
    state.SkipWithError("setup failed");
    return;
  }
  std::vector<TokenEvent> events;
  int64_t steps = 0;
  for (auto _ : state) {
    events.clear();
    if (!s.engine->step(&events).ok()) {
      state.SkipWithError("step failed");
      return;
    }
    benchmark::DoNotOptimize(events.data());
    if (++steps == 700) {  // stay below max_new_tokens: every step decodes every request
      state.PauseTiming();
      s = Setup{};
      if (!make_running(state.range(0), &s)) state.SkipWithError("setup failed");
      steps = 0;
      state.ResumeTiming();
    }
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(engine_decode_step)->Arg(64)->Arg(512)->Arg(1024)->Unit(benchmark::kMicrosecond);

}  // namespace
