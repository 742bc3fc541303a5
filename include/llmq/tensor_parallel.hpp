// Tensor parallelism for the GPU runtime (Megatron-LM's split): a model runs over N GPUs of one
// host, each holding 1/N of every layer.
//   * column-parallel: QKV (whole attention heads: rank r takes q heads [r H/N, (r+1) H/N) and kv heads
//     [r KV/N, (r+1) KV/N)) and gate/up (FFN columns [r F/N, (r+1) F/N) of gate and of up);
//   * row-parallel: o_proj and down_proj take the matching input columns, so each rank computes a
//     partial sum of the block's output, and one all-reduce per attention block and per MLP block
//     (NCCL, BF16, in place) adds them up before the residual add;
//   * MoE layers split every expert the same way (expert FFN columns), or, with expert parallelism,
//     give each rank whole experts (E / N of them; every rank routes every token with the
//     replicated router and adds up only its own experts' share, which the same all-reduce sums);
//   * lm_head is split by vocabulary rows (when N divides the vocabulary) and the logits are
//     all-gathered, so every rank ends a step with the same logits and samples the same token;
//   * embeddings and norms are replicated.
// Per step that is 2 all-reduces per layer and one all-gather; nothing else crosses GPUs.
// 8-bit weights are sliced as codes with their scales: per-channel scales follow their rows (and are
// kept whole for row-parallel layers, whose rows are not split), 128x128 block scales follow their
// blocks (so every rank's slice must be a multiple of 128). A rank's weights are then exactly the
// single-GPU model's, and TP logits differ from TP=1 only by the BF16 rounding of the partial sums
// (and, for dynamically quantized activations of o_proj / down_proj, by each rank's per-token scale
// being the absmax of its own slice).
//
// One thread per GPU drives its rank (TensorParallelRuntime does it); the split itself is the
// host-only plan below (shard_plan.cpp), which the CPU tests check against the unsplit linears.
// No CUDA headers here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "llmq/calibration.hpp"
#include "llmq/cuda_stream.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/model.hpp"
#include "llmq/status.hpp"
#include "llmq/tensor_parallel_group.hpp"

namespace llmq {

// What one rank computes: n_heads, n_kv_heads and hidden_dim divided by tp_size, the rest as `full`
// (with expert_parallel, an MoE model's hidden_dim stays whole: the experts are, and n_experts
// stays the router's).
ModelConfig tensor_parallel_config(const ModelConfig& full, int tp_size, bool expert_parallel = false);

// Whether `full` splits over tp_size ranks; errors name the field that does not divide. With
// `block_scales` (128x128 weight blocks, fp8-block) every rank's slice of q, kv and FFN columns
// must also be a multiple of 128. With expert_parallel the experts (an MoE model's) must divide.
Status check_tensor_parallel(const ModelConfig& full, int tp_size, bool block_scales, bool expert_parallel = false);

// The linears a split touches (norms, embeddings, the router and lm_head are replicated).
enum class ShardedLinear { kQkv, kO, kGateUp, kDown, kExpertsGateUp, kExpertsDown, kLmHead };
const char* sharded_linear_name(ShardedLinear which);

// The part of a linear's weight [n, k] (as the GPU runtime stores it: QKV and gate/up merged along
// n, experts stacked) that one rank holds: the rows `rows` (in order; they become the rank's rows
// 0, 1, ...) of the input columns [col_begin, col_begin + col_count).
struct LinearShard {
  struct Rows {
    int64_t begin = 0;
    int64_t count = 0;
  };
  std::vector<Rows> rows;
  int64_t col_begin = 0;
  int64_t col_count = 0;
  bool partial_sum = false;  // row-parallel: the rank's output is a partial sum (all-reduced)
  int64_t n() const;         // rows held
};
LinearShard linear_shard(const ModelConfig& full, ShardedLinear which, TensorParallelRank tp);

// The whole model's calibration statistics from its ranks' (`ranks[r]`, what GpuRuntime::end_calibration
// gave on rank r of a split of `full` over ranks.size() GPUs, without expert parallelism). Inputs the
// split replicates (q/k/v, gate/up, an expert's w1/w3, the router, lm_head) were seen whole by every
// rank: their maxima are maxed (the all-reduce gives every rank the same rows) and their rows are
// rank 0's; the row-parallel inputs (o_proj, down_proj, an expert's w2) and the KV heads are
// concatenated in rank order. Weight statistics follow the same split: per-input-channel maxima of
// a weight whose rows are split are maxed, of one whose columns are split concatenated. Refused,
// naming the module: a rank's entry of the wrong width, or a module some ranks saw and others did
// not, or saw a different number of rows of.
Status merge_tensor_parallel_calibration(const ModelConfig& full, const std::vector<CalibrationStats>& ranks,
                                         CalibrationStats* out);

// How TensorParallelRuntime::load takes a source.
struct TensorParallelLoadOptions {
  bool expert_parallel = false;             // MoE: whole experts per rank
  GpuProgressFn progress;                   // rank 0's loading progress
  const CalibrationStats* stats = nullptr;  // calibrated schemes quantized on the host
  TensorParallelGroupOptions group;         // tp > 1
};

// Makes rank `tp.rank`'s GpuModel on `device` (one of GpuModel's loaders with that tp).
using ShardLoader = std::function<Status(TensorParallelRank tp, int device, std::unique_ptr<GpuModel>* out)>;

// A model split over a group and the runtime state of every rank. Every call runs on all ranks at
// once, one thread per rank (the all-reduces keep them in step), and returns rank 0's results (the
// ranks' logits are the same). A group of one rank runs on the calling thread with no NCCL at all,
// so the single-GPU path is this class with size 1.
class TensorParallelRuntime;
// calibrate_on_gpu (gpu_runtime.hpp) over a tensor-parallel split: the whole model's statistics.
Status calibrate_on_gpu(TensorParallelRuntime& runtime, const std::vector<std::vector<int32_t>>& sequences, int64_t chunk,
                        CalibrationStats* out, const CalibrationProgressFn& progress = {});

class TensorParallelRuntime {
 public:
  // Loads every rank's shard in parallel (`group` may be null for one device: `devices` = {d}).
  static Status load(std::shared_ptr<TensorParallelGroup> group, const std::vector<int>& devices, const ShardLoader& loader,
                     std::unique_ptr<TensorParallelRuntime>* out);
  // The same over devices first_device .. first_device + tp - 1, with a new group when tp > 1.
  static Status load(int tp, int first_device, const ShardLoader& loader, std::unique_ptr<TensorParallelRuntime>* out,
                     const TensorParallelGroupOptions& group_options = {});
  // GpuModel::load on every rank; a host route (a checkpoint read to the host, a model quantized
  // there) is taken once and shared by the ranks.
  static Status load(int tp, int first_device, const GpuModelSource& source, const GpuPrecision& precision,
                     std::unique_ptr<TensorParallelRuntime>* out, const TensorParallelLoadOptions& options = {});
  ~TensorParallelRuntime();

  // (Re)creates every rank's GpuRuntime with these options (the old ones are freed first).
  Status start(const GpuRuntimeOptions& options);

  int size() const;
  bool started() const { return !runtimes_.empty() && runtimes_.front() != nullptr; }
  const GpuModel& model(int rank) const;
  const TensorParallelGroup* group() const { return group_.get(); }  // null for one device
  GpuRuntime& runtime(int rank);  // after start()
  const ModelConfig& config() const;  // the full model's

  Status prefill(const std::vector<std::vector<int32_t>>& tokens, bool all_positions, std::vector<float>* logits);
  Status decode(const std::vector<int32_t>& tokens, std::vector<float>* logits);
  Status generate(const std::vector<int32_t>& first, int64_t steps, const SamplingOptions& sampling,
                  std::vector<std::vector<int32_t>>* out);
  // GpuRuntime::step on every rank (the serving engine's paged steps); rank 0's tokens (and
  // logits, logprobs) come back; only rank 0 computes the logprobs.
  Status step(const std::vector<PagedChunk>& chunks, std::vector<int32_t>* sampled, std::vector<float>* logits = nullptr,
              std::vector<RowLogprobs>* logprobs = nullptr);
  // Calibration over every rank (GpuRuntime::begin_calibration); end_calibration folds the ranks'
  // statistics, put together by merge_tensor_parallel_calibration, into *stats (null: discards them).
  Status begin_calibration();
  Status end_calibration(CalibrationStats* stats);
  Status fill_context_for_benchmark(int64_t batch, int64_t length, uint64_t seed);
  // Rank 0's step times (every rank's steps end together at the all-reduces).
  Status time_decode(int64_t batch, int64_t warmup, int64_t steps, std::vector<double>* step_ms);
  Status time_prefill(int64_t tokens, uint64_t seed, double* ms);
  void reset();

  // Runs fn(rank) on every rank at once, each on its own thread with its device current; the first
  // error (by rank) comes back.
  Status on_every_rank(const std::function<Status(int rank)>& fn);

 private:
  TensorParallelRuntime();
  Status each_runtime(const std::function<Status(int rank, GpuRuntime& rt)>& fn);
  std::shared_ptr<TensorParallelGroup> group_;
  std::vector<int> devices_;
  std::vector<std::unique_ptr<GpuModel>> models_;
  std::vector<std::unique_ptr<GpuRuntime>> runtimes_;
};

}  // namespace llmq
