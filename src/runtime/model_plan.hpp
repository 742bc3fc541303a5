// Every linear's kernels for one runtime, planned once when the runtime is made (plan_linear in
// linear.hpp has the rule): a forward step looks its paths up and decides nothing. No CUDA headers.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/gpu_model_impl.hpp"
#include "runtime/linear.hpp"

namespace llmq::runtime {

struct LayerPlan {
  LinearPlan qkv, o, gate_up, down;  // dense layers (gate_up / down empty in MoE layers)
  LinearPlan router;                 // MoE layers
};

struct ModelPlan {
  std::vector<LayerPlan> layers;
  LinearPlan lm_head;
};

// `rows`: the most rows a layer's step takes; `lm_rows`: the most rows of one lm_head call.
ModelPlan plan_model(const GpuModel::Impl& model, int64_t rows, int64_t lm_rows, const LinearContext& ctx);

}  // namespace llmq::runtime
