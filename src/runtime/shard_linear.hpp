// Cutting a GpuLinear / GpuLayer that sits on the device down to one rank's slice (the plan of
// shard_plan.cpp): codes copied row range by row range, scales with them. The loaders build each
// layer whole, then keep only the slice, so a rank's weights are bit for bit the single-GPU
// model's. No CUDA headers here.
#pragma once

#include "llmq/scheme.hpp"
#include "llmq/tensor_parallel.hpp"
#include "runtime/gpu_model_impl.hpp"

namespace llmq::runtime {

// Checks tp against `full` (rank in range, heads and FFN divisible) and gives the config the rank
// computes.
// Checks the whole split before anything is loaded (check_tensor_parallel: heads, FFN columns and,
// with 128x128 weight blocks, every rank's slice on block boundaries) and gives the rank's config.
Status begin_tensor_parallel(const ModelConfig& full, TensorParallelRank tp, bool block_scales, ModelConfig* local);
// Whether a scheme's weights have 128x128-style blocks (their TP slices must fall on boundaries).
inline bool has_weight_blocks(const Scheme& s) { return s.weight.granularity == Granularity::kPerBlock; }

// Replaces `linear` (on the current device) by its slice. Parts stay one tensor where their scales
// allow (per-channel always; 128x128 blocks when every piece starts on a block), so the usual case
// stays one GEMM. 128x128 block scales need the column slice on block boundaries: errors name the
// linear.
Status shard_linear(const LinearShard& shard, GpuLinear* linear);

// lm_head split by vocabulary rows (each rank computes V / N logits, gathered after), when N
// divides the vocabulary; otherwise it stays whole on every rank.
Status shard_lm_head(const ModelConfig& full, TensorParallelRank tp, GpuLinear* lm_head);

// Every split linear of a layer (and Qwen2's QKV bias); nothing when tp.size == 1.
Status shard_layer(const ModelConfig& full, TensorParallelRank tp, GpuLayer* layer);

}  // namespace llmq::runtime
