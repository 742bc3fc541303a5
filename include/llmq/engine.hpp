// The serving engine's loop: a scheduler over a KV block pool, a backend that computes the
// scheduled positions through their block tables, and per-request sampling. One step: schedule,
// forward, sample each finished chunk's next token with that request's own sampler (so a request's
// tokens do not depend on what it is batched with), update. Host-side and single-threaded: the
// server issue puts a queue in front of it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "llmq/scheduler.hpp"
#include "llmq/sampler.hpp"
#include "llmq/status.hpp"

namespace llmq::engine {

// How a request's tokens are drawn. Temperature 0 is greedy (argmax, ties to the lowest id) on every
// backend. Otherwise: a host-sampling backend (the CPU) samples as llama2.c's run.c (sampler.hpp:
// softmax at the temperature, then top-p, or multinomial for top_p >= 1, from the request's own
// seeded generator; top_k is refused there); a backend that samples itself (the GPU) as
// runtime/row_sampling.hpp defines it (top-k, then top-p, a uniform of (seed, draw)).
struct SamplingParams {
  float temperature = 0.0f;
  float top_p = 1.0f;
  uint64_t seed = 1;  // a request's generator starts here (0 is refused: xorshift stays at zero)
  int32_t top_k = 0;  // 0: no limit
  // Log-probabilities with each token (TokenEvent::logprobs): -1 none (nothing is computed); K in
  // [0, kMaxLogprobs]: the sampled token's and the K most likely tokens'. Of the model's
  // distribution before temperature, top-k and top-p (vLLM's default, "raw" logprobs).
  int32_t logprobs = -1;
};
constexpr int32_t kMaxLogprobs = 20;  // OpenAI's top_logprobs limit

// One sampled row of a step for a backend that samples itself: the request's parameters and how
// many tokens it drew before (so its draws never depend on its batch).
struct RowDraw {
  SamplingParams params;
  int64_t draw = 0;
};

// What computes a step: the model behind the paged interface (engine_cpu.hpp: the CPU reference;
// engine_gpu.hpp: the GPU runtime).
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
  // A backend that samples where its logits are (the GPU) says so and computes and samples a step
  // in one call: rows[i] is how to sample the plan's i-th sampled chunk, tokens gets one per row,
  // and (*logprobs)[i] the row's log-probabilities where rows[i].params.logprobs >= 0 (logprobs
  // gets one entry per row; the others are left empty).
  virtual bool samples_itself() const { return false; }
  virtual Status forward_sample(const StepPlan& plan, const std::vector<RowDraw>& rows, std::vector<int32_t>* tokens,
                                std::vector<TokenLogprobs>* logprobs);
};

class Engine {
 public:
  // `backend` and `pool` must outlive the engine. Refused: a pool of another geometry than the
  // backend's, a max_model_len past the backend's context.
  static Status create(EngineBackend* backend, KvBlockPool* pool, const SchedulerOptions& options, std::unique_ptr<Engine>* out);

  // Queues a request (Scheduler::add's refusals, and token ids outside the vocabulary, a negative
  // temperature, top_p outside (0, 1], a zero seed when sampling, logprobs outside [-1, 20]).
  Status add(RequestSpec spec, const SamplingParams& sampling, int64_t* id);
  Status cancel(int64_t id);
  // One step; its sampled tokens appended to *events (a request's last one says why it ended). A
  // step whose backend fails leaves the engine failed: every later step and add returns that error
  // (cancel still ends requests, so their owners can be told).
  Status step(std::vector<TokenEvent>* events);
  bool idle() const { return scheduler_->idle(); }
  const Scheduler& scheduler() const { return *scheduler_; }

 private:
  Engine() = default;
  EngineBackend* backend_ = nullptr;
  std::unique_ptr<Scheduler> scheduler_;
  struct Live {
    std::optional<Sampler> sampler;  // host sampling only (it holds a vocabulary-sized buffer)
    SamplingParams params;
    int64_t draws = 0;
  };
  std::unordered_map<int64_t, Live> live_;  // live requests' sampling state (nodes stay put)
  std::vector<Live*> sampled_live_;          // the step's, by sampled row
  std::vector<float> logits_;
  std::vector<float> row_copy_;  // a row's logits before the host sampler changes them (logprobs)
  std::vector<RowDraw> rows_;
  std::vector<TokenLogprobs> row_logprobs_;  // the step's, by sampled row
  Status failed_;
};

}  // namespace llmq::engine
