// The engine's CPU backend: the float reference forward (transformer.hpp, the specification)
// behind the paged interface, so the scheduler, preemption and prefix caching run in CI without a
// GPU. K and V live in blocks of host memory, [blocks, n_layers, block_size, n_kv_heads * head_dim]
// each; for every chunk the positions before it are gathered from its block table into a
// Transformer's cache (write_kv), the chunk is computed, and its new positions are scattered back
// (read_kv). A request's logits are then exactly those of the reference running it alone: every
// position is computed by the same float operations, whatever the batch.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "llmq/engine.hpp"
#include "llmq/model.hpp"
#include "llmq/transformer.hpp"

namespace llmq::engine {

class CpuBackend : public EngineBackend {
 public:
  // `weights` must outlive the backend; `blocks` x `block_size` positions of KV (the pool's sizes).
  static Status create(const ModelWeights& weights, int64_t blocks, int64_t block_size, std::unique_ptr<CpuBackend>* out);

  int64_t vocab_size() const override { return weights_.config.vocab_size; }
  int64_t max_context() const override { return weights_.config.max_seq_len; }
  int64_t blocks() const override { return blocks_; }
  int64_t block_size() const override { return block_size_; }
  Status forward(const StepPlan& plan, std::vector<float>* logits) override;

 private:
  explicit CpuBackend(const ModelWeights& weights) : weights_(weights), transformer_(weights) {}
  float* at(std::vector<float>& cache, BlockId b, int64_t layer, int64_t slot) {
    return cache.data() + ((b * layers_ + layer) * block_size_ + slot) * kv_dim_;
  }

  const ModelWeights& weights_;
  Transformer transformer_;  // reset for every chunk
  int64_t blocks_ = 0, block_size_ = 0, layers_ = 0, kv_dim_ = 0;
  std::vector<float> k_, v_;             // the paged cache
  std::vector<float> k_seq_, v_seq_;     // one chunk's gathered / new positions [layers, n, kv_dim]
  std::vector<float> chunk_logits_;
};

}  // namespace llmq::engine
