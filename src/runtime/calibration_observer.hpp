// The GPU runtime's calibration observer (GpuRuntime::begin_calibration): while it is attached,
// the forward pass hands it every linear's BF16 input rows before the linear reads them, and it
// folds them into per-input-channel absmax on the device (channel_absmax.hpp), so that
// `llmq calibrate --device cuda` measures what the CPU CalibrationBackend (calibration.hpp)
// measures: per module, r_x| [in] and r_x over the rows it saw, rows_seen, and the weights'
// per-tensor and per-input-channel absmax, under the same Hugging Face module names.
//
// One measurement per input the runtime produces, recorded under every module that reads it, as
// the CPU path records the same x for each of q/k/v and of gate/up: per layer the attention norm's
// output (q_proj, k_proj, v_proj), o_proj's input, the FFN norm's output (gate_proj, up_proj) and
// down_proj's input; then lm_head's. And per layer the K and V cache rows each step writes (keys
// after RoPE, as the cache holds them), folded per channel and reduced per KV head at the end
// (CalibrationStats::kv_cache). The weights are measured once, on the device, from what the
// runtime holds: BF16 weights give the absmax of the BF16-rounded weights, which is the BF16
// rounding of the float absmax (rounding to nearest is monotone and symmetric).
// MoE layers: the router reads the FFN norm's output (kFfn); each expert's w1 and w3 the rows
// routed to it and its w2 those rows' GLU output, folded per expert on the device (segments of the
// routing's expert offsets), with per-expert row counts; an expert no token chose gets no entry,
// as on the CPU. A tensor-parallel rank observes its own slices under the same names (its heads'
// o_proj columns, its share of down's, its KV heads); merge_tensor_parallel_calibration
// (tensor_parallel.hpp) puts the ranks' together. Not observed (refused when the observer is made,
// naming why): expert-parallel ranks, 8-bit linears (their inputs are codes, not BF16). Internal
// header; no CUDA headers.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attention/attention.hpp"
#include "llmq/calibration.hpp"
#include "llmq/cuda_stream.hpp"
#include "llmq/status.hpp"
#include "runtime/gpu_model_impl.hpp"

namespace llmq::runtime {

// The inputs of one layer the forward pass produces.
enum class CalibrationInput { kAttention = 0, kO = 1, kFfn = 2, kDown = 3 };

class CalibrationObserver {
 public:
  // Checks that `model` can be observed, measures its weights (synchronously, on `stream`) and
  // allocates the running maxima (zeros).
  static Status create(const GpuModel::Impl& model, CudaStream stream, std::unique_ptr<CalibrationObserver>* out);

  // Folds x (BF16 [rows, k], k the input's width) into layer `layer`'s input `which`; enqueued on
  // `stream`, no synchronisation.
  Status observe(int64_t layer, CalibrationInput which, const uint16_t* x, int64_t rows, CudaStream stream);
  Status observe_lm_head(const uint16_t* x, int64_t rows, CudaStream stream);
  // An MoE layer's experts: x the step's token rows (BF16 [tokens, dim]), row_tokens the token of
  // each routed row, offsets [experts + 1] the routed rows of each expert (device, the routing's);
  // then act, the routed rows' GLU output (BF16 [rows, hidden], in the same order).
  Status observe_experts_in(int64_t layer, const uint16_t* x, const int32_t* row_tokens, const int32_t* offsets,
                            int64_t rows, CudaStream stream);
  Status observe_experts_down(int64_t layer, const uint16_t* act, const int32_t* offsets, int64_t rows, CudaStream stream);
  // Folds the rows a step wrote into layer `layer`'s BF16 K and V caches (row t: position[t] of
  // block-table row slot[t], tokens rows) into the layer's KV maxima; enqueued on `stream`.
  Status observe_kv(int64_t layer, const uint16_t* k_cache, const uint16_t* v_cache, const attention::KvPages& pages,
                    const int32_t* slot, const int32_t* position, int64_t tokens, CudaStream stream);

  // Waits for `stream`, then folds what was observed into *stats as CalibrationBackend does (a
  // module seen for the first time gets its weight statistics; channel maxima are maxed, rows
  // added). Refused, leaving *stats as it was: any NaN/Inf in an observed input (the error names
  // the first module and the count), or an entry of *stats with another input width.
  Status finish(CudaStream stream, CalibrationStats* stats);

 private:
  struct WeightStats {
    double absmax = 0;
    std::vector<float> channel_absmax;  // [in]
  };
  struct Slot {
    std::vector<std::string> modules;  // Hugging Face names of the linears that read this input
    int64_t k = 0;                     // its width
    int64_t offset = 0;                // its first float in channel_max_
    int64_t rows_seen = 0;
  };
  // A module that reads a slot's input: its name and its rows [row_begin, row_end) of `linear`
  // (q, k and v are row ranges of the merged QKV linear; gate and up of gate/up).
  struct Reader {
    std::string name;
    const GpuLinear* linear = nullptr;
    int64_t row_begin = 0, row_end = 0;
  };
  Status add_slot(const std::vector<Reader>& readers, int64_t k, CudaStream stream);
  Status measure_weight(const Reader& r, int64_t k, CudaStream stream, WeightStats* out);
  Status add_moe_layer(int64_t layer, const GpuMoe& moe, const ModelConfig& c, CudaStream stream);
  void fold_module(const std::string& name, const float* maxima, int64_t k, int64_t rows, CalibrationStats* stats) const;
  Status fold_experts(int64_t layer, bool down, const uint16_t* x, const int32_t* row_tokens, const int32_t* offsets,
                      int64_t rows, CudaStream stream);
  Status fold(int64_t slot, const uint16_t* x, int64_t rows, CudaStream stream);

  std::vector<Slot> slots_;  // 4 per layer (CalibrationInput order), then lm_head's
  std::map<std::string, WeightStats> weights_;
  DeviceAllocation channel_max_;  // f32 [sum of the slots' k]
  DeviceAllocation nonfinite_;    // u64 [slots]
  // An MoE layer's experts: their input maxima [experts, dim] at in_offset and down maxima
  // [experts, hidden] at down_offset of moe_max_, row counts at rows_offset of moe_rows_.
  struct MoeLayer {
    int64_t experts = 0, dim = 0, hidden = 0;
    int64_t in_offset = 0, down_offset = 0, rows_offset = 0;
    std::vector<std::string> w1, w3, w2;  // module names by expert
  };
  std::map<int64_t, MoeLayer> moe_layers_;  // by layer
  DeviceAllocation moe_max_;                // f32
  DeviceAllocation moe_rows_;               // i64
  DeviceAllocation moe_nonfinite_;          // u64
  int64_t layers_ = 0, kv_heads_ = 0, head_dim_ = 0;
  bool kv_seen_ = false;             // some step wrote the cache
  DeviceAllocation kv_max_;          // f32 [layers, 2 (K, V), kv_heads * head_dim]
  DeviceAllocation kv_nonfinite_;    // u64
};

}  // namespace llmq::runtime
