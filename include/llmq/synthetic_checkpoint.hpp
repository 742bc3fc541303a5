// Synthetic Hugging Face checkpoints of any size: the tensors a Llama-family config names, filled
// with seeded Gaussian weights with outlier input channels and rare spikes, written shard by
// shard and row block by row block, so a checkpoint larger than RAM is generated in bounded
// memory. For tests (a model big enough to interrupt) and scripts/scale-check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llmq/dtype.hpp"
#include "llmq/model.hpp"
#include "llmq/status.hpp"

namespace llmq {

// A tensor a checkpoint for `config` holds: Hugging Face name and shape, in checkpoint order.
struct HfTensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};
// Every tensor of a dense or Mixtral model (lm_head unless tied; q/k/v biases when
// attention_bias, and o_proj's too for a llama model, as transformers has them): the same list
// check_hf_checkpoint holds a checkpoint to (checkpoint_check.cpp).
std::vector<HfTensorSpec> hf_tensor_specs(const ModelConfig& config);

struct SyntheticCheckpointOptions {
  ModelConfig config;
  DType dtype = DType::kBF16;  // BF16, F16 or F32
  int64_t max_shard_bytes = int64_t{4} << 30;
  uint64_t seed = 1;
  bool overwrite = false;  // replace a previous llmq output directory at the path (never anything else)
};

// Write config.json, the shards and (when sharded) model.safetensors.index.json into `dir`
// (created if absent). *bytes: the tensor bytes written.
Status write_synthetic_checkpoint(const std::string& dir, const SyntheticCheckpointOptions& options,
                                  int64_t* bytes = nullptr);

}  // namespace llmq
