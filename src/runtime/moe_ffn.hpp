// The GPU runtime's MoE feed-forward block (the sparse top-k path of include/llmq/cuda_moe.hpp
// inside a forward pass), for Mixtral, Qwen3-MoE and gpt-oss:
//   router GEMM (BF16 weights, F32 logits) -> cuda_moe_route (router bias, top-k, the weights,
//   the expert-major permutation) -> [prefill: cuda_moe_gather] -> grouped FP8 GEMM gate/up ->
//   [gate/up biases +] SiLU * up or clamped SwiGLU + per-row FP8 quantize (row_op) -> grouped FP8
//   GEMM down -> cuda_moe_combine ([down bias +] weighted sum).
// No host sync anywhere, so a decode step with MoE layers is captured in one CUDA graph like a
// dense one. At decode sizes (<= kMoeDecodeMaxRows tokens) the grouped GEMMs run the decode kernel
// on the token rows in place (only routed experts' weights are read); above, the tokens are
// gathered into expert order for the wgmma kernel. Experts are FP8 E4M3 with per-channel scales
// (a per-expert per-tensor scale is expanded) and per-token dynamic E4M3 activations, or BF16 (the
// baseline: the same kernels on BF16 x BF16, no quantize passes).
// No CUDA headers here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llmq/model.hpp"
#include "cuda/device_memory.hpp"
#include "runtime/linear.hpp"

namespace llmq::runtime {

struct GpuMoe {
  int64_t experts = 0;  // 0: a dense layer (the router's experts: every one)
  int64_t top_k = 0;
  // Expert parallelism (tensor_parallel.hpp): this rank holds experts [expert_begin, expert_begin +
  // local_experts) only; 0: all of them.
  int64_t expert_begin = 0;
  int64_t local_experts = 0;
  int64_t held() const { return local_experts > 0 ? local_experts : experts; }
  GpuLinear router;   // [experts, dim], BF16
  GpuLinear gate_up;  // one part, E4M3 [held * 2 hidden, dim]: expert e's gate rows, then its up rows
  GpuLinear down;     // one part, E4M3 [held * dim, hidden]
  // gpt-oss's biases, f32, empty when the model has none: the router's [experts]; gate/up's
  // [held * 2 hidden] as the rows of gate_up; down's [held * dim], on one rank only when the ranks
  // split every expert's hidden columns (their partial sums are added up after the block).
  DeviceAllocation router_bias, gate_up_bias, down_bias;
  // The arithmetic (ModelConfig): routing rule, and the activation between the GEMMs.
  MoeRouting routing = MoeRouting::kSoftmaxTopK;
  bool renormalize = true;
  GluActivation activation = GluActivation::kSilu;
  float glu_limit = 7.0f, glu_alpha = 1.702f;
  bool active() const { return experts > 0; }
  bool bf16() const { return !gate_up.parts.empty() && gate_up.parts[0].w_dtype == DType::kBF16; }
  // 128x128 weight blocks with 1x128 activation blocks (fp8-block).
  bool block() const { return !gate_up.parts.empty() && gate_up.parts[0].scale_kind == WeightScale::kBlock128; }
  int64_t bytes() const {
    return router.bytes() + gate_up.bytes() + down.bytes() + router_bias.bytes() + gate_up_bias.bytes() + down_bias.bytes();
  }
};

// An MoE layer's experts, top-k and arithmetic from the model's config (every loader's first step).
void init_moe(const ModelConfig& c, GpuMoe* moe);

// The buffers one step of up to `rows` tokens needs (owned by the runtime); activation buffers are
// sized for BF16, so they serve both kinds of experts.
struct MoeBuffers {
  DeviceAllocation logits;                       // f32 [rows, experts]
  DeviceAllocation topk_ids, topk_weights;       // [rows * top_k]
  DeviceAllocation offsets;                      // int32 [experts + 1]
  DeviceAllocation sorted_slots, slot_rows, row_tokens, row_experts;  // int32 [rows * top_k]
  DeviceAllocation perm_codes, perm_scales;      // gathered activations [rows * top_k, dim], [rows * top_k]
  DeviceAllocation gate_up_out;                  // bf16 [rows * top_k, 2 hidden]
  DeviceAllocation act_codes, act_scales;        // SiLU * up, quantized [rows * top_k, hidden], [rows * top_k, hidden / 128]
  DeviceAllocation act_bf16;                     // block experts: SiLU * up in BF16 before its 1x128 quantize
  DeviceAllocation quant_workspace;              // block experts: cuda_quantize's scratch (one-block rows)
  DeviceAllocation down_out;                     // bf16 [rows * top_k, dim]
  DeviceAllocation arrivals;                     // uint32: the fused router's counter (zero between calls)
  Status allocate(int64_t rows, const ModelConfig& c, bool block);
  int64_t bytes() const;
  static int64_t bytes_for(int64_t rows, const ModelConfig& c, bool block);
};

// out (BF16 [tokens, dim]) = the MoE block applied to the normalised activations: x_bf16 [tokens,
// dim] for the router, and their per-token E4M3 codes and scales for the experts.
class CalibrationObserver;  // calibration_observer.hpp

struct MoeInput {
  const uint16_t* x_bf16 = nullptr;
  const void* x_codes = nullptr;
  const float* x_scales = nullptr;
  // While calibrating: the observer folds each expert's routed rows and their GLU output (layer
  // `layer`); null otherwise.
  CalibrationObserver* calibration = nullptr;
  int64_t layer = -1;
};
Status moe_ffn(const GpuMoe& moe, const LinearPlan& router_plan, MoeBuffers& buf, const MoeInput& x, int64_t tokens,
               uint16_t* out, const LinearContext& ctx);

// The kernels a step of `tokens` tokens launches, e.g. "moe: router cublaslt-bf16, route, grouped
// decode x2, silu-quant, combine (6 launches)".
std::string describe_moe(const GpuMoe& moe, const LinearPlan& router_plan, int64_t tokens, const LinearContext& ctx);

// Checks an expert linear the MoE block can run: one E4M3 part with per-channel scales, per-token
// E4M3 activations (errors name the linear).
Status check_moe_linear(const GpuLinear& l);

}  // namespace llmq::runtime
