// CpuBackend (llmq/engine_cpu.hpp).
#include "llmq/engine_cpu.hpp"

#include <algorithm>
#include <new>
#include <string>

namespace llmq::engine {

Status CpuBackend::create(const ModelWeights& weights, int64_t blocks, int64_t block_size, std::unique_ptr<CpuBackend>* out) {
  if (out == nullptr) return invalid_argument("out: null");
  const ModelConfig& c = weights.config;
  if (blocks < 2 || block_size < 1) return invalid_argument("blocks, block_size: must be >= 2 and >= 1");
  const int64_t kv_dim = c.n_kv_heads * c.head_dim;
  // K and V at most 2^31 floats each (8 GiB each): the reference backend is for tests and small runs.
  if (kv_dim <= 0 || c.n_layers <= 0 || blocks > (int64_t{1} << 31) / block_size / (c.n_layers * kv_dim))
    return invalid_argument("KV cache: " + std::to_string(blocks) + " blocks of " + std::to_string(block_size) +
                            " positions are more than the CPU backend holds (2^31 floats each of K and V)");
  const int64_t floats = blocks * c.n_layers * block_size * kv_dim;  // bounded above
  std::unique_ptr<CpuBackend> b(new CpuBackend(weights));
  b->blocks_ = blocks;
  b->block_size_ = block_size;
  b->layers_ = c.n_layers;
  b->kv_dim_ = kv_dim;
  try {
    b->k_.assign(static_cast<size_t>(floats), 0.0f);
    b->v_.assign(static_cast<size_t>(floats), 0.0f);
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kResourceExhausted, "KV cache: " + std::to_string(2 * floats * 4) + " bytes of host memory are not free");
  }
  *out = std::move(b);
  return {};
}

Status CpuBackend::forward(const StepPlan& plan, std::vector<float>* logits) {
  if (logits == nullptr) return invalid_argument("logits: null");
  const int64_t vocab = weights_.config.vocab_size;
  logits->clear();
  for (const StepChunk& c : plan.chunks) {
    if (c.count < 1 || c.start < 0 || c.table_blocks * block_size_ < c.start + c.count)
      return invalid_argument("chunk of request " + std::to_string(c.request) + ": its table does not cover positions " +
                              std::to_string(c.start) + " .. " + std::to_string(c.start + c.count - 1));
    for (int64_t i = 0; i < c.table_blocks; ++i)
      if (c.table[i] <= kNullBlock || c.table[i] >= blocks_)
        return invalid_argument("chunk of request " + std::to_string(c.request) + ": block " + std::to_string(c.table[i]) +
                                " is not a block of this cache");
    transformer_.reset();
    const auto pos_slot = [&](int64_t p) { return std::make_pair(c.table[p / block_size_], p % block_size_); };
    if (c.start > 0) {  // the positions before the chunk, gathered through the table
      k_seq_.resize(static_cast<size_t>(layers_ * c.start * kv_dim_));
      v_seq_.resize(k_seq_.size());
      for (int64_t l = 0; l < layers_; ++l)
        for (int64_t p = 0; p < c.start; ++p) {
          const auto [b, s] = pos_slot(p);
          std::copy_n(at(k_, b, l, s), kv_dim_, k_seq_.data() + (l * c.start + p) * kv_dim_);
          std::copy_n(at(v_, b, l, s), kv_dim_, v_seq_.data() + (l * c.start + p) * kv_dim_);
        }
      LLMQ_RETURN_IF_ERROR(transformer_.write_kv(0, c.start, k_seq_.data(), v_seq_.data()));
    }
    chunk_logits_.resize(static_cast<size_t>(c.count * vocab));
    LLMQ_RETURN_IF_ERROR(transformer_.forward(c.tokens + c.start, c.count, c.start, chunk_logits_.data()));
    k_seq_.resize(static_cast<size_t>(layers_ * c.count * kv_dim_));
    v_seq_.resize(k_seq_.size());
    LLMQ_RETURN_IF_ERROR(transformer_.read_kv(c.start, c.count, k_seq_.data(), v_seq_.data()));
    for (int64_t l = 0; l < layers_; ++l)
      for (int64_t i = 0; i < c.count; ++i) {
        const auto [b, s] = pos_slot(c.start + i);
        std::copy_n(k_seq_.data() + (l * c.count + i) * kv_dim_, kv_dim_, at(k_, b, l, s));
        std::copy_n(v_seq_.data() + (l * c.count + i) * kv_dim_, kv_dim_, at(v_, b, l, s));
      }
    if (c.sample)
      logits->insert(logits->end(), chunk_logits_.end() - vocab, chunk_logits_.end());
  }
  return {};
}

}  // namespace llmq::engine
