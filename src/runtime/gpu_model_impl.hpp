// What GpuModel holds on the device (gpu_runtime.hpp): per layer the norm gains (q/k norms too),
// biases and sinks, the merged QKV and gate/up linears, o_proj and down_proj (or, in MoE layers,
// the router and the stacked experts); the embedding table, the final norm and lm_head.
#pragma once

#include <string>
#include <vector>

#include "llmq/gpu_runtime.hpp"
#include "cuda/device_memory.hpp"
#include "runtime/linear.hpp"
#include "runtime/moe_ffn.hpp"

namespace llmq::runtime {

struct GpuLayer {
  DeviceAllocation attn_norm;  // f32 [dim]
  DeviceAllocation ffn_norm;   // f32 [dim]
  DeviceAllocation qkv_bias;   // f32 [q_dim + 2 kv_dim] (Qwen2) or empty
  DeviceAllocation q_norm;     // f32 [head_dim] (Qwen3's qk_norm) or empty; k_norm with it
  DeviceAllocation k_norm;
  DeviceAllocation o_bias;     // f32 [dim] (Llama / Qwen3 / gpt-oss attention_bias) or empty; whole on every rank
  DeviceAllocation sinks;      // f32 [n_heads of this rank] (gpt-oss) or empty
  GpuLinear qkv;               // [q_dim + 2 kv_dim, dim]
  GpuLinear o;                 // [dim, q_dim]
  GpuLinear gate_up;           // [2 hidden, dim]: gate rows, then up rows (dense layers)
  GpuLinear down;              // [dim, hidden] (dense layers)
  GpuMoe moe;                  // MoE layers: router and experts (gate_up / down stay empty)
};

}  // namespace llmq::runtime

namespace llmq {

struct GpuModel::Impl {
  ModelConfig config;       // what this rank computes (tensor_parallel_config of full_config)
  ModelConfig full_config;  // the whole model
  TensorParallelRank tp;
  std::string precision;
  int device = 0;
  runtime::DeviceAllocation embedding;  // [vocab, dim], bf16 or f32
  bool embedding_f32 = false;
  runtime::DeviceAllocation final_norm;  // f32 [dim]
  runtime::GpuLinear lm_head;            // [vocab, dim]
  std::vector<runtime::GpuLayer> layers;
  // The KV cache's static FP8 scales a checkpoint declared (read_kv_cache_scales), for this rank's
  // KV heads, [n_layers * n_kv_heads] each; empty when none (an E4M3 cache then starts at 1.0).
  std::vector<float> kv_k_scales, kv_v_scales;
  int64_t bytes() const;
};

}  // namespace llmq
