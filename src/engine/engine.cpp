// Engine (engine.hpp).
#include "llmq/engine.hpp"

#include <cmath>
#include <string>
#include <utility>

namespace llmq::engine {

Status EngineBackend::forward_sample(const StepPlan&, const std::vector<RowDraw>&, std::vector<int32_t>*) {
  return unsupported("forward_sample: this backend samples on the host (forward)");
}

Status Engine::create(EngineBackend* backend, KvBlockPool* pool, const SchedulerOptions& options, std::unique_ptr<Engine>* out) {
  if (backend == nullptr || pool == nullptr || out == nullptr) return invalid_argument("backend, pool, out: must not be null");
  if (pool->usable_blocks() + 1 != backend->blocks() || pool->block_size() != backend->block_size())
    return invalid_argument("pool: " + std::to_string(pool->usable_blocks() + 1) + " blocks of " + std::to_string(pool->block_size()) +
                            " positions, the backend holds " + std::to_string(backend->blocks()) + " of " +
                            std::to_string(backend->block_size()));
  if (options.max_model_len > backend->max_context())
    return invalid_argument("max_model_len: " + std::to_string(options.max_model_len) + " positions, the model's context is " +
                            std::to_string(backend->max_context()));
  std::unique_ptr<Engine> e(new Engine());
  e->backend_ = backend;
  LLMQ_RETURN_IF_ERROR(Scheduler::create(pool, options, &e->scheduler_));
  *out = std::move(e);
  return {};
}

Status Engine::add(RequestSpec spec, const SamplingParams& sampling, int64_t* id) {
  if (!failed_.ok()) return failed_;
  const int64_t vocab = backend_->vocab_size();
  for (size_t i = 0; i < spec.prompt.size(); ++i)
    if (spec.prompt[i] < 0 || spec.prompt[i] >= vocab)
      return invalid_argument("prompt: token " + std::to_string(spec.prompt[i]) + " at " + std::to_string(i) +
                              " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  if (!(sampling.temperature >= 0.0f) || !std::isfinite(sampling.temperature))
    return invalid_argument("temperature: must be finite and >= 0, got " + std::to_string(sampling.temperature));
  if (!(sampling.top_p > 0.0f && sampling.top_p <= 1.0f))
    return invalid_argument("top_p: must be in (0, 1], got " + std::to_string(sampling.top_p));
  if (sampling.temperature > 0.0f && sampling.seed == 0) return invalid_argument("seed: must not be 0 when sampling");
  if (sampling.top_k < 0) return invalid_argument("top_k: must be >= 0, got " + std::to_string(sampling.top_k));
  if (sampling.top_k > 0 && sampling.temperature > 0.0f && !backend_->samples_itself())
    return unsupported("top_k: this backend samples on the host as llama2.c's run.c does (temperature, top_p)");
  LLMQ_RETURN_IF_ERROR(scheduler_->add(std::move(spec), id));
  Live live{std::nullopt, sampling, 0};
  if (!backend_->samples_itself()) live.sampler.emplace(vocab, sampling.temperature, sampling.top_p, sampling.seed);
  live_.emplace(*id, std::move(live));
  return {};
}

Status Engine::cancel(int64_t id) {
  LLMQ_RETURN_IF_ERROR(scheduler_->cancel(id));
  live_.erase(id);
  return {};
}

Status Engine::step(std::vector<TokenEvent>* events) {
  if (events == nullptr) return invalid_argument("events: null");
  if (!failed_.ok()) return failed_;
  const StepPlan plan = scheduler_->schedule();
  if (plan.chunks.empty()) return {};
  std::vector<int32_t> sampled;
  if (backend_->samples_itself()) {
    rows_.clear();
    for (const StepChunk& c : plan.chunks)
      if (c.sample) {
        const Live& l = live_.at(c.request);
        rows_.push_back({l.params, l.draws});
      }
    if (Status st = backend_->forward_sample(plan, rows_, &sampled); !st.ok()) return failed_ = st;
    if (static_cast<int64_t>(sampled.size()) != plan.samples)
      return failed_ = Status(StatusCode::kInternal, "backend: " + std::to_string(sampled.size()) + " tokens for " +
                                               std::to_string(plan.samples) + " samples");
  } else {
    if (Status st = backend_->forward(plan, &logits_); !st.ok()) return failed_ = st;
    const int64_t vocab = backend_->vocab_size();
    if (static_cast<int64_t>(logits_.size()) != plan.samples * vocab)
      return failed_ = Status(StatusCode::kInternal, "backend: " + std::to_string(logits_.size()) + " logits for " +
                                               std::to_string(plan.samples) + " samples of " + std::to_string(vocab));
    int64_t row = 0;
    for (const StepChunk& c : plan.chunks)
      if (c.sample) sampled.push_back(live_.at(c.request).sampler->sample(&logits_[static_cast<size_t>(row++ * vocab)]));
  }
  for (const StepChunk& c : plan.chunks)
    if (c.sample) ++live_.at(c.request).draws;
  const size_t first = events->size();
  if (Status st = scheduler_->update(plan, sampled, events); !st.ok()) return failed_ = st;
  for (size_t i = first; i < events->size(); ++i)
    if ((*events)[i].finish != FinishReason::kNone) live_.erase((*events)[i].request);
  return {};
}

}  // namespace llmq::engine
