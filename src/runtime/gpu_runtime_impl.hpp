// GpuRuntime::Impl (gpu_runtime.hpp): the buffers of one stream of work, shared by the forward
// pass (gpu_runtime.cu) and the benchmark helpers (gpu_runtime_bench.cu). Internal header; CUDA
// sources only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/cuda_check.cuh"
#include "llmq/gpu_runtime.hpp"
#include "llmq/tensor_parallel.hpp"
#include "parallel/p2p_all_reduce.hpp"
#include "attention/attention.hpp"
#include "runtime/calibration_observer.hpp"
#include "runtime/gpu_model_impl.hpp"
#include "runtime/model_plan.hpp"
#include "attention/bf16_prefill_attention.hpp"
#include "attention/quant_prefill_attention.hpp"
#include "runtime/row_kernels.hpp"
#include "core/int_math.hpp"

namespace llmq {

using runtime::ActQuant;
using runtime::DeviceAllocation;
using runtime::GpuLayer;
using runtime::GpuLinear;
using runtime::LinearInput;
using runtime::LinearOut;
using runtime::RowFn;
using runtime::RowOpArgs;
using runtime::RowOut;

namespace runtime_detail {


// Where one step's metadata lives on the device.
struct StepMeta {
  const int32_t* tokens = nullptr;    // [T]
  const int32_t* position = nullptr;  // [T]
  const int32_t* tok_slot = nullptr;  // [T]
  const int32_t* q_start = nullptr;   // [B + 1] (prefill)
  const int32_t* kv_len = nullptr;    // [B]
  const int32_t* seq_slot = nullptr;  // [B]
  const int32_t* lm_rows = nullptr;   // [lm_count] or null (every row)
  int64_t tokens_count = 0;
  int64_t batch = 0;
  int64_t max_q_len = 0;
  int64_t max_kv_len = 0;
  int64_t lm_count = 0;
  bool decode = false;  // one token per sequence, in slot order
  // A mixed step (prefill chunks beside decodes): its first decode_rows sequences have one query
  // each and come first, so their attention runs in the decode kernel (rows = sequences); the
  // rest in the prefill kernel. decode_max_kv_len: the host bound of those rows' kv_len.
  int64_t decode_rows = 0;
  int64_t decode_max_kv_len = 0;
  std::vector<attention::PrefillSequence> seqs;  // prefill: the same sequences, on the host (8-bit attention)
};

// The activation buffers one linear's input can be produced into.
struct ActBuffers {
  DeviceAllocation bf16;    // [rows, k]
  DeviceAllocation codes;   // [rows, k]
  DeviceAllocation scales;  // [rows * ceil(k / 128)]
  Status allocate(int64_t rows, int64_t k, const std::string& what) {
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(rows * k * 2, what + " (bf16)", &bf16));
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(rows * k, what + " (codes)", &codes));
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(rows * ceil_div(k, 128) * 4, what + " (scales)", &scales));
    // Rows past M (padding for cuBLASLt block scales) are read: keep them finite from the start.
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemset(bf16.get(), 0, static_cast<size_t>(bf16.bytes())));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemset(codes.get(), 0, static_cast<size_t>(codes.bytes())));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemset(scales.get(), 0, static_cast<size_t>(scales.bytes())));
    return {};
  }
  int64_t bytes() const { return bf16.bytes() + codes.bytes() + scales.bytes(); }
};

struct PinnedBuffer {
  void* ptr = nullptr;
  ~PinnedBuffer() {
    if (ptr != nullptr) (void)cudaFreeHost(ptr);
  }
};

// GpuRuntimeOptions::skip_stages ("rope,attention,..."): stages left out of every forward pass, so
// that the time of a stage inside a replayed decode step can be measured by difference (METHOD: no
// timeline profiler on the lent machines). The outputs are then meaningless; it exists for
// `llmq bench e2e --skip-stages`.
enum Stage : uint32_t {
  kStageNorm = 1, kStageQkv = 2, kStageRope = 4, kStageAttention = 8, kStageOQuant = 16, kStageO = 32,
  kStageGateUp = 64, kStageSilu = 128, kStageDown = 256, kStageLmHead = 512, kStageAllReduce = 1024,
};
inline Status parse_skip_stages(const std::string& list, uint32_t* mask) {
  static const std::pair<const char*, uint32_t> names[] = {
      {"norm", kStageNorm}, {"qkv", kStageQkv}, {"rope", kStageRope}, {"attention", kStageAttention},
      {"oquant", kStageOQuant}, {"o", kStageO}, {"gateup", kStageGateUp}, {"silu", kStageSilu},
      {"down", kStageDown}, {"lmhead", kStageLmHead}, {"allreduce", kStageAllReduce}};
  *mask = 0;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    uint32_t bit = 0;
    for (const auto& [name, b] : names)
      if (item == name) bit = b;
    if (bit == 0)
      return invalid_argument("skip_stages: unknown stage '" + item +
                              "' (norm, qkv, rope, attention, oquant, o, gateup, silu, down, lmhead, allreduce)");
    *mask |= bit;
  }
  return {};
}

}  // namespace runtime_detail

using namespace runtime_detail;  // StepMeta, ActBuffers, stages: the runtime files' own vocabulary

struct GpuRuntime::Impl {
  const GpuModel::Impl* model = nullptr;
  GpuRuntimeOptions options;
  ModelConfig c;
  int64_t q_dim = 0, kv_dim = 0, qkv_n = 0;
  int64_t rows = 0;      // activation rows: max(max_step_tokens, max_batch), padded to 4
  int64_t lm_rows = 0;   // logits rows per lm_head call
  cudaStream_t stream = nullptr;
  std::unique_ptr<CudaGemmRunner> gemm;
  runtime::LinearContext lin;
  runtime::ModelPlan plan;  // every linear's kernels for this runtime's step sizes (model_plan.cu)
  DeviceAllocation gemm_workspace, quant_workspace, attn_workspace, argmax_workspace;
  DeviceAllocation dequant_scratch;  // W8A16 at prefill sizes: one part's codes in BF16 and FP32 sums (linear.hpp)
  DeviceAllocation logits_flag;  // int32, set by the device when a sampled row is NaN/Inf or constant
  attention::QuantPrefillAttention quant_attention;  // --attention int8 / fp8 / half-int8
  attention::Bf16PrefillAttention bf16_attention;    // BF16 prefill of long sequences on Hopper (wgmma)
  const TensorParallelGroup* group = nullptr;  // a model split over several GPUs (tensor_parallel.hpp)
  int tp_rank = 0;
  runtime::RowPeerSum peer;  // the group's all-reduce folded into the norms (ranks 0: none)

  DeviceAllocation x;  // f32 [rows, dim]
  ActBuffers in_attn, in_o, in_mlp, in_down, in_lm;
  DeviceAllocation qkv_out, q_rot, attn_out, o_out, gu_out, down_out;  // bf16
  runtime::MoeBuffers moe;  // MoE models only
  DeviceAllocation logits;  // f32 [lm_rows, vocab]
  DeviceAllocation lm_gather;  // vocabulary-split lm_head: f32 [ranks, lm_rows, vocab / ranks]
  DeviceAllocation kv_cache;  // [2, layers, pages.num_blocks * pages.block_size, kv_dim], bf16 or e4m3
  // Paging (attention::KvPages). Fixed slots: table row b lists slot b's own blocks (uploaded once);
  // paged (options.kv_blocks > 0): the step's tables, row b for the step's sequence b.
  attention::KvPages pages;
  DeviceAllocation block_table;  // int32 [max_batch, pages.table_stride]
  bool paged = false;
  DeviceAllocation kv_scales;  // f32 [2, layers, n_kv_heads]: K then V (e4m3 cache)
  bool kv_fp8 = false;
  DeviceAllocation cos_sin;   // f32 [capacity, head_dim / 2, 2]

  // Step metadata (prefill and explicit decode): one device block, filled from pinned memory.
  DeviceAllocation meta;
  PinnedBuffer meta_host;
  int64_t meta_ints = 0;
  // Decode state read and advanced by graph replays.
  DeviceAllocation dec;  // int32: tokens, position, kv_len, slot, next [max_batch each], step [1]
  DeviceAllocation history;  // int32 [history_rows, max_batch]
  int64_t history_rows = 0;
  std::map<std::tuple<int64_t, float, float, uint64_t>, cudaGraphExec_t> graphs;

  std::vector<int64_t> lengths;

  // Paged steps (gpu_runtime_paged.cu). The step's metadata lives at fixed offsets of one device
  // block (so a captured decode graph reads each new step's values), byte offsets below; the table
  // comes last so that a step copies only the rows it uses.
  struct PagedLayout {
    int64_t tokens = 0, position = 0, tok_slot = 0, q_start = 0, kv_len = 0, seq_slot = 0, lm_rows = 0, params = 0,
            valid_rows = 0, logprobs_k = 0, table = 0, bytes = 0;
  } paged_at;
  DeviceAllocation paged_meta;
  PinnedBuffer paged_meta_host;
  DeviceAllocation sampled;  // int32 [max_batch] sampled tokens, then the unusable-logits flag
  PinnedBuffer sampled_host;
  DeviceAllocation sample_workspace;
  DeviceAllocation logprobs_out;  // RowLogprobs [max_batch] of the rows that asked (row_logprobs.hpp)
  PinnedBuffer logprobs_host;
  std::map<int64_t, cudaGraphExec_t> paged_graphs;  // decode steps by padded batch
  std::set<int64_t> paged_warmed;                     // padded batches that ran once eagerly
  Status init_paged();
  // The fixed-slot calls (prefill, decode, generate, the benchmark helpers) on a paged runtime.
  Status fixed_slots(const char* what) const {
    return paged ? invalid_argument(std::string(what) + ": the runtime is paged (kv_blocks > 0): use step()") : Status{};
  }
  Status paged_body(const StepMeta& m, int64_t samples);

  ~Impl() {
    for (auto& [key, exec] : graphs) (void)cudaGraphExecDestroy(exec);
    for (auto& [key, exec] : paged_graphs) (void)cudaGraphExecDestroy(exec);
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
  }

  // Layer l's K (which = 0) or V (which = 1) cache, whatever its element size.
  void* cache(int which, int64_t layer) const {
    const int64_t elem = kv_fp8 ? 1 : 2;
    return kv_cache.as<char>() + (which * c.n_layers + layer) * pages.num_blocks * pages.block_size * kv_dim * elem;
  }
  uint16_t* k_cache(int64_t layer) const { return kv_fp8 ? nullptr : static_cast<uint16_t*>(cache(0, layer)); }
  uint16_t* v_cache(int64_t layer) const { return kv_fp8 ? nullptr : static_cast<uint16_t*>(cache(1, layer)); }
  uint8_t* k_cache8(int64_t layer) const { return kv_fp8 ? static_cast<uint8_t*>(cache(0, layer)) : nullptr; }
  uint8_t* v_cache8(int64_t layer) const { return kv_fp8 ? static_cast<uint8_t*>(cache(1, layer)) : nullptr; }
  const float* k_scale(int64_t layer) const { return kv_fp8 ? kv_scales.as<float>() + layer * c.n_kv_heads : nullptr; }
  const float* v_scale(int64_t layer) const {
    return kv_fp8 ? kv_scales.as<float>() + (c.n_layers + layer) * c.n_kv_heads : nullptr;
  }
  int32_t* dec_ptr(int i) const { return dec.as<int32_t>() + i * options.max_batch; }
  int32_t* dec_step() const { return dec.as<int32_t>() + 5 * options.max_batch; }

  template <typename AttentionArgs>
  void set_cache(int64_t layer, AttentionArgs* a) const {
    a->k_cache = k_cache(layer);
    a->v_cache = v_cache(layer);
    a->kv_dtype = kv_fp8 ? attention::KvCacheDType::kE4M3 : attention::KvCacheDType::kBF16;
    a->k_cache8 = k_cache8(layer);
    a->v_cache8 = v_cache8(layer);
    a->k_scale = k_scale(layer);
    a->v_scale = v_scale(layer);
  }
  Status init(const GpuModel& gm, const GpuRuntimeOptions& o);
  Status produce(const GpuLinear& consumer, RowOpArgs op, ActBuffers& bufs, LinearInput* in, bool launch = true);
  Status forward(const StepMeta& m);
  // Tensor parallelism: the partial sums of a row-parallel block ([tokens, dim] BF16) added up over
  // the ranks, in place. Nothing on one GPU.
  Status all_reduce(const DeviceAllocation& partial, int64_t tokens) const {
    if (group == nullptr || (skip & kStageAllReduce) != 0) return {};
    return group->all_reduce_bf16(tp_rank, partial.get(), tokens * c.dim, stream);
  }
  // Whether a step of `tokens` rows adds its row-parallel partial sums inside the norms that read
  // them (decode sizes) instead of all-reducing them first: one launch less per block.
  bool fused_sum(int64_t tokens) const {
    return peer.ranks > 1 && (skip & kStageAllReduce) == 0 && runtime::row_op_fuses_peer_sum(tokens, c.dim, peer.ranks, peer.slot_elements);
  }
  // Attached between begin_calibration and end_calibration; null otherwise (then the forward pass
  // only tests the pointer).
  std::unique_ptr<runtime::CalibrationObserver> calibration;
  // Profiling aid (GpuRuntimeOptions::skip_stages, parse_skip_stages): stages left out of the
  // forward pass.
  uint32_t skip = 0;
  bool run(uint32_t stage) const { return (skip & stage) == 0; }
  Status lm_head(const StepMeta& m, int64_t first, int64_t count);
  Status upload_meta(const std::vector<int32_t>& ints);
  Status prefill_step(const std::vector<std::tuple<int64_t, int64_t, int64_t>>& segs,
                      const std::vector<std::vector<int32_t>>& tokens, bool all_positions,
                      float* out, int64_t* out_rows);
  Status decode_graph(int64_t batch, const SamplingOptions& s, cudaGraphExec_t* exec);
  Status decode_body(int64_t batch, const SamplingOptions& s);
  Status start_decode_state(const std::vector<int32_t>& first);
};

}  // namespace llmq
