// GpuBackend (engine_gpu.hpp): the plan's chunks as the runtime's paged chunks.
#include "llmq/engine_gpu.hpp"

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

Status GpuBackend::forward_sample(const StepPlan& plan, const std::vector<RowDraw>& rows, std::vector<int32_t>* tokens) {
  LLMQ_RETURN_IF_ERROR(to_chunks(plan, &rows));
  return runtime_->step(chunks_, tokens);
}

}  // namespace llmq::engine
