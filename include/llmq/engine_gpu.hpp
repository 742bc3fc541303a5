// The engine's GPU backend: the GPU runtime in its paged mode (GpuRuntimeOptions::kv_blocks > 0)
// behind the engine's interface, on one GPU or split over several (a TensorParallelRuntime of size
// 1 is one GPU). Each engine step is one GpuRuntime::step on every rank: the plan's chunks with their
// block tables go up in one copy, decode-only steps replay a CUDA graph of their padded batch, and
// the tokens are sampled on the device with each request's own parameters (runtime/row_sampling.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "llmq/engine.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/tensor_parallel.hpp"

namespace llmq::engine {

class GpuBackend : public EngineBackend {
 public:
  // `runtime` started with kv_blocks > 0; it must outlive the backend. The engine's pool must have
  // the runtime's kv_blocks and kv_block_size.
  static Status create(TensorParallelRuntime* runtime, std::unique_ptr<GpuBackend>* out);

  int64_t vocab_size() const override { return vocab_; }
  int64_t max_context() const override { return options_.max_context; }
  int64_t blocks() const override { return options_.kv_blocks; }
  int64_t block_size() const override { return options_.kv_block_size; }
  // Logits of the sampled chunks (tests and the CPU-style path; the step runs without a graph).
  Status forward(const StepPlan& plan, std::vector<float>* logits) override;
  bool samples_itself() const override { return true; }
  // Rows that ask for logprobs get them from the device with the tokens (GpuRuntime::step).
  Status forward_sample(const StepPlan& plan, const std::vector<RowDraw>& rows, std::vector<int32_t>* tokens,
                        std::vector<TokenLogprobs>* logprobs) override;

 private:
  explicit GpuBackend(TensorParallelRuntime* runtime) : runtime_(runtime) {}
  Status to_chunks(const StepPlan& plan, const std::vector<RowDraw>* rows);

  TensorParallelRuntime* runtime_;
  GpuRuntimeOptions options_;
  int64_t vocab_ = 0;
  std::vector<PagedChunk> chunks_;
  std::vector<int32_t> sampled_;
  std::vector<RowLogprobs> row_logprobs_;
};

}  // namespace llmq::engine
