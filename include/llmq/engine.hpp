// The serving engine's loop: a scheduler over a KV block pool, a backend that computes the
// scheduled positions through their block tables, and per-request sampling. One step: schedule,
// forward, sample each finished chunk's next token with that request's own sampler (so a request's
// tokens do not depend on what it is batched with), update. Host-side and single-threaded: the
// server issue puts a queue in front of it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "llmq/scheduler.hpp"
#include "llmq/sampler.hpp"
#include "llmq/status.hpp"

namespace llmq::engine {

// What computes a step: the model behind the paged interface (the CPU reference here; the GPU
// runtime next).
class EngineBackend {
 public:
  virtual ~EngineBackend() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_context() const = 0;  // positions a sequence may have (the model's)
  // The KV geometry it was made for: Engine::create holds the pool to it.
  virtual int64_t blocks() const = 0;
  virtual int64_t block_size() const = 0;
  // Computes every chunk of the plan (their K/V go into the blocks their tables name) and writes
  // the logits of the last position of each chunk with sample set, in chunk order: [samples, vocab].
  virtual Status forward(const StepPlan& plan, std::vector<float>* logits) = 0;
};

// Sampling as llama2.c's run.c (sampler.hpp): temperature 0 is greedy; otherwise softmax at the
// temperature, then top-p (or multinomial for top_p >= 1) from the request's own seeded generator.
struct SamplingParams {
  float temperature = 0.0f;
  float top_p = 1.0f;
  uint64_t seed = 1;  // a request's generator starts here (0 is refused: xorshift stays at zero)
};

class Engine {
 public:
  // `backend` and `pool` must outlive the engine. Refused: a pool of another geometry than the
  // backend's, a max_model_len past the backend's context.
  static Status create(EngineBackend* backend, KvBlockPool* pool, const SchedulerOptions& options, std::unique_ptr<Engine>* out);

  // Queues a request (Scheduler::add's refusals, and token ids outside the vocabulary, a negative
  // temperature, top_p outside (0, 1], a zero seed when sampling).
  Status add(RequestSpec spec, const SamplingParams& sampling, int64_t* id);
  Status cancel(int64_t id);
  // One step; its sampled tokens appended to *events (a request's last one says why it ended).
  Status step(std::vector<TokenEvent>* events);
  bool idle() const { return scheduler_->idle(); }
  const Scheduler& scheduler() const { return *scheduler_; }

 private:
  Engine() = default;
  EngineBackend* backend_ = nullptr;
  std::unique_ptr<Scheduler> scheduler_;
  std::map<int64_t, Sampler> samplers_;  // live requests' generators
  std::vector<float> logits_;
};

}  // namespace llmq::engine
