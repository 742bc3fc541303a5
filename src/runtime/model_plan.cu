// plan_model (model_plan.hpp): each linear planned with the output it writes in the forward pass
// (gpu_runtime.cu): BF16 rows as wide as the linear for the layers, float32 logits for lm_head (its
// own rows when the vocabulary is split over ranks, the gathered row otherwise) and the router.
#include "runtime/model_plan.hpp"

namespace llmq::runtime {

ModelPlan plan_model(const GpuModel::Impl& model, int64_t rows, int64_t lm_rows, const LinearContext& ctx) {
  ModelPlan plan;
  for (const GpuLayer& L : model.layers) {
    LayerPlan p;
    p.qkv = plan_linear(L.qkv, rows, LinearOut::kBF16, L.qkv.n, ctx);
    p.o = plan_linear(L.o, rows, LinearOut::kBF16, L.o.n, ctx);
    p.gate_up = plan_linear(L.gate_up, rows, LinearOut::kBF16, L.gate_up.n, ctx);
    p.down = plan_linear(L.down, rows, LinearOut::kBF16, L.down.n, ctx);
    if (L.moe.active()) p.router = plan_linear(L.moe.router, rows, LinearOut::kF32, L.moe.experts, ctx);
    plan.layers.push_back(std::move(p));
  }
  plan.lm_head = plan_linear(model.lm_head, lm_rows, LinearOut::kF32, model.lm_head.n, ctx);
  return plan;
}

}  // namespace llmq::runtime
