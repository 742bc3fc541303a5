// Engine (engine.hpp).
#include "llmq/engine.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "runtime/row_logprobs.hpp"

namespace llmq::engine {
namespace {

// A host row's log-probabilities (the CPU path): the definition's reference, computed in double.
TokenLogprobs host_logprobs(const float* logits, int64_t vocab, int32_t token, int32_t k) {
  const runtime::RowLogprobsReference ref = runtime::row_logprobs_reference(logits, vocab, token, k);
  TokenLogprobs out;
  out.token = static_cast<float>(ref.token);
  out.top_ids = ref.top_ids;
  out.top.assign(ref.top.begin(), ref.top.end());
  return out;
}

}  // namespace

Status EngineBackend::forward_sample(const StepPlan&, const std::vector<RowDraw>&, std::vector<int32_t>*, std::vector<TokenLogprobs>*) {
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
  if (sampling.logprobs < -1 || sampling.logprobs > kMaxLogprobs)
    return invalid_argument("logprobs: must be in [-1, " + std::to_string(kMaxLogprobs) + "], got " + std::to_string(sampling.logprobs));
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
  // Each sampled row's request state, found once; (request, sampled row) of the rows that asked for
  // logprobs: empty (and nothing computed) when none did.
  sampled_live_.clear();
  std::vector<std::pair<int64_t, size_t>> asked;
  for (const StepChunk& c : plan.chunks)
    if (c.sample) {
      Live& l = live_.at(c.request);
      if (l.params.logprobs >= 0) asked.emplace_back(c.request, sampled_live_.size());
      sampled_live_.push_back(&l);
    }
  row_logprobs_.clear();
  if (!asked.empty()) row_logprobs_.resize(static_cast<size_t>(plan.samples));
  if (backend_->samples_itself()) {
    rows_.clear();
    for (const Live* l : sampled_live_) rows_.push_back({l->params, l->draws});
    if (Status st = backend_->forward_sample(plan, rows_, &sampled, &row_logprobs_); !st.ok()) return failed_ = st;
    if (static_cast<int64_t>(sampled.size()) != plan.samples ||
        (!asked.empty() && static_cast<int64_t>(row_logprobs_.size()) != plan.samples))
      return failed_ = Status(StatusCode::kInternal, "backend: " + std::to_string(sampled.size()) + " tokens and " +
                                               std::to_string(row_logprobs_.size()) + " logprob rows for " +
                                               std::to_string(plan.samples) + " samples");
  } else {
    if (Status st = backend_->forward(plan, &logits_); !st.ok()) return failed_ = st;
    const int64_t vocab = backend_->vocab_size();
    if (static_cast<int64_t>(logits_.size()) != plan.samples * vocab)
      return failed_ = Status(StatusCode::kInternal, "backend: " + std::to_string(logits_.size()) + " logits for " +
                                               std::to_string(plan.samples) + " samples of " + std::to_string(vocab));
    for (size_t row = 0; row < sampled_live_.size(); ++row) {
      Live& l = *sampled_live_[row];
      float* x = &logits_[row * static_cast<size_t>(vocab)];
      if (l.params.logprobs < 0) {
        sampled.push_back(l.sampler->sample(x));
      } else {  // the sampler rewrites the row (temperature, softmax): the logprobs are of the logits themselves
        row_copy_.assign(x, x + vocab);
        sampled.push_back(l.sampler->sample(x));
        row_logprobs_[row] = host_logprobs(row_copy_.data(), vocab, sampled.back(), l.params.logprobs);
      }
    }
  }
  for (Live* l : sampled_live_) ++l->draws;
  const size_t first = events->size();
  if (Status st = scheduler_->update(plan, sampled, events); !st.ok()) return failed_ = st;
  if (!asked.empty()) {  // each request has at most one sampled row in a step
    std::sort(asked.begin(), asked.end());
    for (size_t i = first; i < events->size(); ++i) {
      TokenEvent& e = (*events)[i];
      const auto it = std::lower_bound(asked.begin(), asked.end(), std::make_pair(e.request, size_t{0}));
      if (it != asked.end() && it->first == e.request)
        e.logprobs = std::make_shared<const TokenLogprobs>(std::move(row_logprobs_[it->second]));
    }
  }
  for (size_t i = first; i < events->size(); ++i)
    if ((*events)[i].finish != FinishReason::kNone) live_.erase((*events)[i].request);
  return {};
}

}  // namespace llmq::engine
