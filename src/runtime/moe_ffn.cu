// The MoE feed-forward block of the GPU runtime (moe_ffn.hpp).
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/cuda_check.cuh"
#include "llmq/cuda_moe.hpp"
#include "llmq/cuda_quantize.hpp"
#include "runtime/calibration_observer.hpp"
#include "runtime/moe_ffn.hpp"
#include "runtime/row_kernels.hpp"

namespace llmq::runtime {

namespace {
int64_t blocks128(int64_t n) { return (n + 127) / 128; }
}  // namespace

int64_t MoeBuffers::bytes_for(int64_t rows, const ModelConfig& c, bool block) {
  const int64_t slots = rows * c.n_experts_per_token;
  return rows * c.n_experts * 4 + slots * (2 * 4 + 4 * 4) + (c.n_experts + 1) * 4 +
         slots * (c.dim * 2 + 4 * blocks128(c.dim)) + slots * 2 * c.hidden_dim * 2 +
         slots * (c.hidden_dim * 2 + 4 * blocks128(c.hidden_dim)) + (block ? slots * c.hidden_dim * 2 : 0) +
         slots * c.dim * 2 + 16;
}

Status MoeBuffers::allocate(int64_t rows, const ModelConfig& c, bool block) {
  const int64_t slots = rows * c.n_experts_per_token;
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(rows * c.n_experts * 4, "router logits", &logits));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(slots * 4, "moe top-k ids", &topk_ids));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(slots * 4, "moe top-k weights", &topk_weights));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate((c.n_experts + 1) * 4, "moe expert offsets", &offsets));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(slots * 4, "moe sorted slots", &sorted_slots));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(slots * 4, "moe slot rows", &slot_rows));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(slots * 4, "moe row tokens", &row_tokens));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(slots * 4, "moe row experts", &row_experts));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(slots * c.dim * 2, "moe gathered activations", &perm_codes));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(slots * blocks128(c.dim) * 4, "moe gathered scales", &perm_scales));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(slots * 2 * c.hidden_dim * 2, "moe gate/up output", &gate_up_out));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(slots * c.hidden_dim * 2, "moe down input", &act_codes));  // BF16 or codes
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(slots * blocks128(c.hidden_dim) * 4, "moe down input scales", &act_scales));
  if (block) {
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(slots * c.hidden_dim * 2, "moe down input (bf16)", &act_bf16));
    const size_t ws = cuda_quantize_workspace_bytes(slots, c.hidden_dim, QuantSpec::per_block(DType::kE4M3, 1, 128));
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(static_cast<int64_t>(std::max<size_t>(ws, 16)), "moe quantize workspace",
                                                    &quant_workspace));
  }
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(slots * c.dim * 2, "moe down output", &down_out));
  const uint32_t zero[4] = {0, 0, 0, 0};
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::upload(zero, sizeof(zero), "moe router arrival counter", &arrivals));
  return {};
}

int64_t MoeBuffers::bytes() const {
  int64_t b = 0;
  for (const DeviceAllocation* a : {&logits, &topk_ids, &topk_weights, &offsets, &sorted_slots, &slot_rows, &row_tokens, &row_experts,
                                    &perm_codes, &perm_scales, &gate_up_out, &act_codes, &act_scales, &act_bf16,
                                    &quant_workspace, &down_out, &arrivals})
    b += a->bytes();
  return b;
}

void init_moe(const ModelConfig& c, GpuMoe* moe) {
  moe->experts = c.n_experts;
  moe->top_k = c.n_experts_per_token;
  moe->routing = c.moe_routing;
  moe->renormalize = c.moe_renormalize;
  moe->activation = c.activation;
  moe->glu_limit = static_cast<float>(c.glu_limit);
  moe->glu_alpha = static_cast<float>(c.glu_alpha);
}

Status check_moe_linear(const GpuLinear& l) {
  if (l.parts.size() == 1 && l.parts[0].w_dtype == DType::kBF16 && l.act == ActQuant::kNone) return {};
  if (l.parts.size() == 1 && l.parts[0].w_dtype == DType::kE4M3 && l.parts[0].scale_kind == WeightScale::kBlock128 &&
      l.act == ActQuant::kBlock1x128 && l.act_dtype == DType::kE4M3)
    return {};
  if (l.parts.size() != 1 || l.parts[0].w_dtype != DType::kE4M3 || l.parts[0].scale_kind != WeightScale::kChannel)
    return unsupported(l.name + ": MoE experts run in BF16, or FP8 E4M3 with per-channel or per-tensor scales (fp8-dynamic)");
  if (l.act != ActQuant::kPerToken || l.act_dtype != DType::kE4M3)
    return unsupported(l.name + ": MoE experts take per-token dynamic E4M3 activations (fp8-dynamic)");
  return {};
}

namespace {

// Per-channel FP8 experts accumulate in the tensor core over all of K (MoeGroupedGemm::
// fast_accumulation) exactly when the runner's cuBLASLt FP8 GEMMs do (CudaGemmOptions::
// fp8_fast_accumulation, set from GpuRuntimeOptions'); 1x128-block experts promote every 128 of K.
bool fast_accumulation(const GpuLinear& l, const LinearContext& ctx) {
  return ctx.gemm != nullptr && ctx.gemm->options().fp8_fast_accumulation && l.parts[0].w_dtype == DType::kE4M3 &&
         l.parts[0].scale_kind != WeightScale::kBlock128;
}

// The grouped GEMM of one expert linear over the step's permuted rows.
MoeGroupedGemm grouped(const GpuMoe& moe, const GpuLinear& l, const MoeBuffers& buf, int64_t tokens,
                       const LinearContext& ctx) {
  MoeGroupedGemm g;
  g.rows = tokens * moe.top_k;
  // Expert parallelism: only this rank's experts, whose rows the routing put at offsets
  // [expert_begin, expert_begin + held] of the whole permutation.
  g.experts = moe.held();
  g.n = l.n / moe.held();
  g.k = l.k;
  g.max_rows_per_expert = tokens;  // a token meets an expert at most once
  g.expert_offsets = buf.offsets.as<int32_t>() + moe.expert_begin;
  g.w = l.parts[0].w.get();
  g.w_dtype = l.parts[0].w_dtype;
  g.w_scale = l.parts[0].w_scale.as<float>();  // null for BF16 experts
  g.a_dtype = l.parts[0].w_dtype;
  g.block_scales = l.parts[0].scale_kind == WeightScale::kBlock128;
  g.fast_accumulation = fast_accumulation(l, ctx);
  // The rows spread over every expert, not only this rank's (g.rows counts all of them).
  g.wgmma_block_rows = moe_wgmma_block_rows(g.rows, moe.experts);
  return g;
}

// The grouped GEMMs' kernel (cuda_moe.hpp's rule): the decode kernel reads the token rows in place,
// the wgmma kernel the gathered rows; an expert meets a token at most once, so `tokens` bounds its rows.
bool decode_sized(int64_t tokens, const LinearContext& ctx) {
  return moe_gemm_kernel_for(tokens, /*rows_in_place=*/false, /*same_types=*/true, ctx.sm_major, ctx.sm_minor) ==
         MoeGemmKernel::kDecode;
}

// Whether the routing kernel computes the router's logits itself (cuda_moe.hpp's rule).
bool router_fused(const GpuMoe& moe, int64_t tokens) {
  return moe.router.parts.size() == 1 && moe.router.parts[0].w_dtype == DType::kBF16 &&
         moe_route_computes_logits(tokens, moe.experts, moe.router.k);
}

// 1x128 E4M3 codes and scales of BF16 rows [rows, n] (block experts' activations).
Status quantize_1x128(const void* bf16, int64_t rows, int64_t n, const QuantSpec& spec, void* codes, float* scales,
                      const DeviceAllocation& workspace, CudaStream stream) {
  TensorView xv{const_cast<void*>(bf16), DType::kBF16, {rows, n}, {}, Device::kCuda};
  TensorView qv{codes, spec.format, {rows, n}, {}, Device::kCuda};
  TensorView sv{scales, DType::kF32, {rows, (n + 127) / 128}, {}, Device::kCuda};
  CudaQuantizeOptions qo;
  qo.stream = stream;
  qo.workspace = workspace.get();
  qo.workspace_bytes = static_cast<size_t>(workspace.bytes());
  return cuda_quantize(xv, spec, qv, sv, qo);
}

}  // namespace

Status moe_ffn(const GpuMoe& moe, const LinearPlan& router_plan, MoeBuffers& buf, const MoeInput& x, int64_t tokens,
               uint16_t* out, const LinearContext& ctx) {
  if (tokens == 0) return {};
  const int64_t slots = tokens * moe.top_k, dim = moe.down.n / moe.held(), hidden = moe.down.k;
  MoeRouteArgs r;
  if (router_fused(moe, tokens)) {  // the routing kernel takes the router GEMM (decode sizes)
    r.router_x = x.x_bf16;
    r.router_w = moe.router.parts[0].w.get();
    r.dim = moe.router.k;
  } else {
    LinearInput rin;
    rin.bf16 = x.x_bf16;
    LLMQ_RETURN_IF_ERROR(run_linear(moe.router, router_plan, rin, tokens, buf.logits.get(), ctx));
  }
  r.tokens = tokens;
  r.experts = moe.experts;
  r.top_k = moe.top_k;
  r.logits = buf.logits.as<float>();
  r.arrivals = buf.arrivals.as<uint32_t>();
  r.topk_ids = buf.topk_ids.as<int32_t>();
  r.topk_weights = buf.topk_weights.as<float>();
  r.expert_offsets = buf.offsets.as<int32_t>();
  r.sorted_slots = buf.sorted_slots.as<int32_t>();
  r.slot_rows = buf.slot_rows.as<int32_t>();
  r.row_tokens = buf.row_tokens.as<int32_t>();
  r.row_experts = moe.gate_up_bias.empty() ? nullptr : buf.row_experts.as<int32_t>();
  r.logit_bias = moe.router_bias.as<float>();
  r.topk_softmax = moe.routing == MoeRouting::kTopKSoftmax;
  r.renormalize = moe.renormalize;
  LLMQ_RETURN_IF_ERROR(cuda_moe_route(r, ctx.stream));
  if (x.calibration != nullptr)
    LLMQ_RETURN_IF_ERROR(x.calibration->observe_experts_in(x.layer, x.x_bf16, r.row_tokens, r.expert_offsets, slots, ctx.stream));

  const bool block = moe.block();
  const bool decode = decode_sized(tokens, ctx);
  const MoeGemmKernel kernel = decode ? MoeGemmKernel::kDecode : MoeGemmKernel::kWgmma;
  MoeGroupedGemm g1 = grouped(moe, moe.gate_up, buf, tokens, ctx);
  const bool bf16 = moe.bf16();
  if (decode) {
    // The token rows in place: no gather.
    g1.a = bf16 ? static_cast<const void*>(x.x_bf16) : x.x_codes;
    g1.a_scale = bf16 ? nullptr : x.x_scales;
    g1.a_rows = buf.row_tokens.as<int32_t>();
    g1.a_rows_count = tokens;
  } else {
    MoeGatherArgs ga;
    ga.rows = slots;
    ga.top_k = moe.top_k;
    ga.k = bf16 ? 2 * dim : dim;  // bytes per row
    ga.src_codes = bf16 ? static_cast<const void*>(x.x_bf16) : x.x_codes;
    ga.src_scales = bf16 ? nullptr : x.x_scales;
    ga.scales_per_row = block ? (dim + 127) / 128 : 1;
    ga.sorted_slots = buf.sorted_slots.as<int32_t>();
    ga.dst_codes = buf.perm_codes.get();
    ga.dst_scales = bf16 ? nullptr : buf.perm_scales.as<float>();
    LLMQ_RETURN_IF_ERROR(cuda_moe_gather(ga, ctx.stream));
    g1.a = buf.perm_codes.get();
    g1.a_scale = bf16 ? nullptr : buf.perm_scales.as<float>();
  }
  g1.d = buf.gate_up_out.as<uint16_t>();
  LLMQ_RETURN_IF_ERROR(cuda_moe_grouped_gemm(g1, ctx.stream, kernel));

  RowOpArgs silu;
  silu.fn = moe.activation == GluActivation::kClampedSwiglu ? RowFn::kClampedSwiglu : RowFn::kSiluMul;
  silu.rows = slots;
  silu.n = hidden;
  silu.src = buf.gate_up_out.as<uint16_t>();
  silu.glu_limit = moe.glu_limit;
  silu.glu_alpha = moe.glu_alpha;
  if (!moe.gate_up_bias.empty()) {  // each permuted row takes its expert's gate/up biases
    silu.glu_bias = moe.gate_up_bias.as<float>();
    silu.bias_group = buf.row_experts.as<int32_t>();
    silu.group_begin = moe.expert_begin;
    silu.groups = moe.held();
  }
  if (bf16) {
    silu.out = RowOut::kBF16;
    silu.out_bf16 = buf.act_codes.as<uint16_t>();
  } else if (block) {
    silu.out = RowOut::kBF16;  // then quantized in 1x128 blocks below
    silu.out_bf16 = buf.act_bf16.as<uint16_t>();
  } else {
    silu.out = RowOut::kCodesPerToken;
    silu.codes = buf.act_codes.get();
    silu.scales = buf.act_scales.as<float>();
    silu.spec = moe.down.act_spec;
  }
  LLMQ_RETURN_IF_ERROR(row_op(silu, ctx.stream));
  if (x.calibration != nullptr) {
    if (!bf16) return Status(StatusCode::kInternal, "calibration observes BF16 experts only");
    LLMQ_RETURN_IF_ERROR(x.calibration->observe_experts_down(x.layer, buf.act_codes.as<uint16_t>(), r.expert_offsets, slots,
                                                             ctx.stream));
  }
  if (block)
    LLMQ_RETURN_IF_ERROR(quantize_1x128(buf.act_bf16.get(), slots, hidden, moe.down.act_spec, buf.act_codes.get(),
                                        buf.act_scales.as<float>(), buf.quant_workspace, ctx.stream));

  // Expert parallelism: the rows of other ranks' experts stay zero, so the combine adds only this
  // rank's share (the all-reduce after the block adds the ranks').
  if (moe.held() < moe.experts)
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buf.down_out.get(), 0, static_cast<size_t>(slots * dim * 2), ctx.stream));
  MoeGroupedGemm g2 = grouped(moe, moe.down, buf, tokens, ctx);
  g2.a = buf.act_codes.get();
  g2.a_scale = bf16 ? nullptr : buf.act_scales.as<float>();
  g2.d = buf.down_out.as<uint16_t>();
  LLMQ_RETURN_IF_ERROR(cuda_moe_grouped_gemm(g2, ctx.stream, kernel));

  MoeCombineArgs cb;
  cb.tokens = tokens;
  cb.top_k = moe.top_k;
  cb.n = dim;
  cb.y = buf.down_out.as<uint16_t>();
  cb.topk_weights = buf.topk_weights.as<float>();
  cb.slot_rows = buf.slot_rows.as<int32_t>();
  cb.out = out;
  if (!moe.down_bias.empty()) {
    cb.bias = moe.down_bias.as<float>();
    cb.topk_ids = buf.topk_ids.as<int32_t>();
    cb.bias_first = moe.expert_begin;
    cb.bias_experts = moe.held();
  }
  return cuda_moe_combine(cb, ctx.stream);
}

std::string describe_moe(const GpuMoe& moe, const LinearPlan& router_plan, int64_t tokens, const LinearContext& ctx) {
  const bool decode = decode_sized(tokens, ctx);
  const bool fused = router_fused(moe, tokens);
  // Router GEMM (cuBLASLt: counted as one), route, [gather], two GEMMs, SiLU, combine; block: SiLU,
  // then a 1x128 quantize.
  const int launches = (decode ? 6 : 7) - (fused ? 1 : 0) + (moe.block() ? 1 : 0);
  const std::string held = moe.held() < moe.experts ? " (experts " + std::to_string(moe.expert_begin) + ".." +
                                                          std::to_string(moe.expert_begin + moe.held() - 1) + " here)" : "";
  return "moe " + std::to_string(moe.experts) + " experts" + held + " top-" + std::to_string(moe.top_k) + ": " +
         (fused ? std::string("router + route (one kernel), ") : "router " + linear_path(moe.router, router_plan, tokens) + ", route, ") + (decode ? "" : "gather, ") + "grouped " +
         (decode ? "decode-gemm" : "wgmma") + (!decode && fast_accumulation(moe.gate_up, ctx) ? " (fast accumulation)" : "") +
         " gate/up, " +
         (moe.activation == GluActivation::kClampedSwiglu ? "clamped-swiglu" : "silu") + "-quant, grouped " + (decode ? "decode-gemm" : "wgmma") +
         " down, combine (" + std::to_string(launches) + " launches, + the norm)";
}

}  // namespace llmq::runtime
