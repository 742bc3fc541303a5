// GpuBackend (engine_gpu.hpp): the plan's chunks as the runtime's paged chunks.
#include "llmq/engine_gpu.hpp"

#include <algorithm>
#include <string>

namespace llmq::engine {

Status GpuBackend::create(TensorParallelRuntime* runtime, std::unique_ptr<GpuBackend>* out) {
  if (runtime == nullptr || out == nullptr) return invalid_argument("GpuBackend: runtime and out must not be null");
  std::unique_ptr<GpuBackend> b(new GpuBackend(runtime));
  b->options_ = runtime->runtime(0).options();
  if (b->options_.kv_blocks <= 0)
    return invalid_argument("GpuBackend: the runtime has fixed slots; start it with kv_blocks > 0 (paged)");
  b->vocab_ = runtime->config().vocab_size;
  *out = std::move(b);
  return {};
}

Status GpuBackend::to_chunks(const StepPlan& plan, const std::vector<RowDraw>* rows) {
  chunks_.clear();
  size_t row = 0;
  for (const StepChunk& c : plan.chunks) {
    PagedChunk p;
    p.tokens = c.tokens;
    p.start = c.start;
    p.count = c.count;
    p.table = c.table;
    p.table_blocks = c.table_blocks;
    p.sample = c.sample;
    if (c.sample && rows != nullptr) {
      if (row >= rows->size()) return invalid_argument("forward_sample: fewer sampling rows than sampled chunks");
      const RowDraw& r = (*rows)[row++];
      p.sampling.temperature = r.params.temperature;
      p.sampling.top_p = r.params.top_p;
      p.sampling.top_k = r.params.top_k;
      p.sampling.seed = r.params.seed;
      p.sampling.draw = r.draw;
      p.sampling.logprobs = r.params.logprobs;
    }
    chunks_.push_back(p);
  }
  if (rows != nullptr && row != rows->size())
    return invalid_argument("forward_sample: " + std::to_string(rows->size()) + " sampling rows for " + std::to_string(row) +
                            " sampled chunks");
  return {};
}

Status GpuBackend::forward(const StepPlan& plan, std::vector<float>* logits) {
  LLMQ_RETURN_IF_ERROR(to_chunks(plan, nullptr));
  return runtime_->step(chunks_, &sampled_, logits);
}

Status GpuBackend::forward_sample(const StepPlan& plan, const std::vector<RowDraw>& rows, std::vector<int32_t>* tokens,
                                  std::vector<TokenLogprobs>* logprobs) {
  static_assert(kMaxLogprobs <= kMaxTopLogprobs, "the device computes every count a request may ask for");
  LLMQ_RETURN_IF_ERROR(to_chunks(plan, &rows));
  bool asked = false;
  for (const RowDraw& r : rows) asked = asked || r.params.logprobs >= 0;
  if (!asked || logprobs == nullptr) return runtime_->step(chunks_, tokens);
  LLMQ_RETURN_IF_ERROR(runtime_->step(chunks_, tokens, nullptr, &row_logprobs_));
  if (row_logprobs_.size() != rows.size())
    return Status(StatusCode::kInternal, "forward_sample: " + std::to_string(row_logprobs_.size()) + " logprob rows for " +
                                             std::to_string(rows.size()) + " sampled rows");
  logprobs->assign(rows.size(), TokenLogprobs{});
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].params.logprobs < 0) continue;
    const RowLogprobs& d = row_logprobs_[i];
    TokenLogprobs& t = (*logprobs)[i];
    t.token = d.token;
    const int32_t n = std::clamp(d.count, 0, kMaxTopLogprobs);  // the device's word, held to the array
    t.top_ids.assign(d.top_ids, d.top_ids + n);
    t.top.assign(d.top, d.top + n);
  }
  return {};
}

}  // namespace llmq::engine
