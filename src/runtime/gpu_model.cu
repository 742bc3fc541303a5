// GpuModel (gpu_runtime.hpp): weights onto the device from a float model, from a QuantizedModel
// (its codes and scales as they are) or generated there (synthetic). Loading goes linear by
// linear, so the host never holds more than one layer's converted copy at a time.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "cuda/cuda_check.cuh"
#include "cuda/device_facts.cuh"
#include "llmq/cuda_quantize.hpp"
#include "llmq/format.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/scheme.hpp"
#include "runtime/shard_linear.hpp"
#include "runtime/gpu_model_build.hpp"
#include "runtime/gpu_model_impl.hpp"
#include "runtime/row_kernels.hpp"
#include "model/checkpoint/model_family.hpp"

namespace llmq {

using runtime::ActQuant;
using runtime::DeviceAllocation;
using runtime::GpuLayer;
using runtime::GpuLinear;
using runtime::LinearPart;
using runtime::WeightScale;

int64_t GpuModel::Impl::bytes() const {
  int64_t b = embedding.bytes() + final_norm.bytes() + lm_head.bytes();
  for (const GpuLayer& l : layers)
    b += l.attn_norm.bytes() + l.ffn_norm.bytes() + l.qkv_bias.bytes() + l.q_norm.bytes() + l.k_norm.bytes() +
         l.o_bias.bytes() + l.sinks.bytes() + l.qkv.bytes() + l.o.bytes() + l.gate_up.bytes() + l.down.bytes() + l.moe.bytes();
  return b;
}

GpuModel::GpuModel() : impl_(std::make_unique<Impl>()) {}
GpuModel::~GpuModel() = default;
const ModelConfig& GpuModel::config() const { return impl_->full_config; }
const ModelConfig& GpuModel::local_config() const { return impl_->config; }
TensorParallelRank GpuModel::tensor_parallel() const { return impl_->tp; }
const std::string& GpuModel::precision() const { return impl_->precision; }
int GpuModel::device() const { return impl_->device; }
int64_t GpuModel::weight_bytes() const { return impl_->bytes(); }

namespace runtime {

const char* const kMoeNotF32 =
    "MoE experts run in BF16 or FP8 on the GPU (the grouped expert GEMMs are BF16 x BF16 or E4M3 x E4M3), not F32";

Status upload_f32(const Tensor& t, const std::string& what, DeviceAllocation* out) {
  if (t.dtype() != DType::kF32) return invalid_argument(what + ": expected f32, got " + t.view().describe());
  return DeviceAllocation::upload(t.data(), t.nbytes(), what, out);
}

Status upload_as(const float* data, int64_t count, DType dtype, const std::string& what, DeviceAllocation* out) {
  if (dtype == DType::kF32) return DeviceAllocation::upload(data, count * 4, what, out);
  std::vector<uint16_t> bf(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) bf[i] = float_to_bf16_bits(data[i]);
  return DeviceAllocation::upload(bf.data(), count * 2, what, out);
}

// One float linear from one or more weights concatenated along N.
Status float_linear(const std::string& name, const std::vector<const Linear*>& parts, DType dtype, GpuLinear* out) {
  out->name = name;
  out->k = parts[0]->weight.shape()[1];
  out->n = 0;
  std::vector<float> merged;
  for (const Linear* l : parts) {
    if (l->weight.shape().size() != 2 || l->weight.shape()[1] != out->k)
      return invalid_argument(name + ": part " + l->weight.view().describe() + " does not match K = " + std::to_string(out->k));
    merged.insert(merged.end(), l->weight.data_as<float>(), l->weight.data_as<float>() + l->weight.numel());
    out->n += l->weight.shape()[0];
  }
  LinearPart part;
  part.n = out->n;
  part.w_dtype = dtype;
  LLMQ_RETURN_IF_ERROR(upload_as(merged.data(), static_cast<int64_t>(merged.size()), dtype, name + ".weight", &part.w));
  out->parts.clear();
  out->parts.push_back(std::move(part));
  return {};
}

Status bias_of(const std::vector<const Linear*>& parts, const std::string& what, DeviceAllocation* out) {
  bool any = false;
  for (const Linear* l : parts) any = any || l->bias.nbytes() > 0;
  if (!any) return {};
  std::vector<float> b;
  for (const Linear* l : parts) {
    const int64_t n = l->weight.shape()[0];
    if (l->bias.nbytes() > 0) b.insert(b.end(), l->bias.data_as<float>(), l->bias.data_as<float>() + n);
    else b.insert(b.end(), static_cast<size_t>(n), 0.0f);
  }
  return DeviceAllocation::upload(b.data(), static_cast<int64_t>(b.size() * 4), what, out);
}

// A per-layer f32 vector of `n` values (a norm's gains, sinks), checked: a missing one would
// otherwise run as a model without it.
Status upload_vector(const Tensor& t, int64_t n, const std::string& what, DeviceAllocation* out) {
  if (t.numel() != n) return invalid_argument(what + ": expected " + std::to_string(n) + " values, got " + t.view().describe());
  return upload_f32(t, what, out);
}

// What every float route uploads of a layer besides its linears, as f32: q/k/v biases merged,
// o_proj's bias, q/k norms and sinks; and an MoE layer's arithmetic and its router and expert
// biases, stacked as the expert linears are.
Status upload_layer_extras(const ModelConfig& c, const LayerWeights& L, int64_t i, GpuLayer* gl) {
  LLMQ_RETURN_IF_ERROR(bias_of({&L.q, &L.k, &L.v}, layer_name(i, "qkv.bias"), &gl->qkv_bias));
  LLMQ_RETURN_IF_ERROR(bias_of({&L.o}, layer_name(i, "o_proj.bias"), &gl->o_bias));
  if (c.qk_norm) {
    LLMQ_RETURN_IF_ERROR(upload_vector(L.q_norm, c.head_dim, layer_name(i, "self_attn.q_norm"), &gl->q_norm));
    LLMQ_RETURN_IF_ERROR(upload_vector(L.k_norm, c.head_dim, layer_name(i, "self_attn.k_norm"), &gl->k_norm));
  }
  if (c.attention_sinks) LLMQ_RETURN_IF_ERROR(upload_vector(L.sinks, c.n_heads, layer_name(i, "self_attn.sinks"), &gl->sinks));
  if (!c.is_moe()) return {};
  init_moe(c, &gl->moe);
  std::vector<const Linear*> gate_up, down;
  for (const Expert& ex : L.experts) {
    gate_up.insert(gate_up.end(), {&ex.gate, &ex.up});
    down.push_back(&ex.down);
  }
  LLMQ_RETURN_IF_ERROR(bias_of({&L.router}, layer_name(i, "router.bias"), &gl->moe.router_bias));
  LLMQ_RETURN_IF_ERROR(bias_of(gate_up, layer_name(i, "experts.gate_up.bias"), &gl->moe.gate_up_bias));
  return bias_of(down, layer_name(i, "experts.down.bias"), &gl->moe.down_bias);
}

// ---- Quantized linears.

Status act_mode(const QuantizedLinear& ql, const std::string& name, GpuLinear* out) {
  if (!ql.quantize_input) {
    out->act = ActQuant::kNone;
    out->act_dtype = DType::kBF16;
    return {};
  }
  const QuantSpec& s = ql.input_spec;
  if (s.format != DType::kE4M3 && s.format != DType::kI8)
    return unsupported(name + ": activations in " + std::string(dtype_name(s.format)) + " (the GPU runtime runs e4m3 and int8)");
  if (s.rounding != Rounding::kNearestEven) return unsupported(name + ": stochastic rounding of activations");
  out->act_dtype = s.format;
  out->act_spec = s;
  if (s.source == ScaleSource::kStatic) {
    if (s.granularity != Granularity::kPerTensor) return unsupported(name + ": static activation scales other than per-tensor");
    if (ql.static_input_scale.scales.numel() < 1) return invalid_argument(name + ": static activation scale missing");
    out->act = ActQuant::kStaticTensor;
    out->static_scale = std::max(out->static_scale, ql.static_input_scale.scales.data_as<float>()[0]);
    return {};
  }
  if (s.method == ScaleMethod::kMseSearch) return unsupported(name + ": dynamic MSE-searched activation scales");
  switch (s.granularity) {
    case Granularity::kPerToken: out->act = ActQuant::kPerToken; return {};
    case Granularity::kPerTensor: out->act = ActQuant::kDynamicTensor; return {};
    case Granularity::kPerBlock:
      if (s.block_rows == 1 && s.block_cols == 128) {
        out->act = ActQuant::kBlock1x128;
        return {};
      }
      break;
    default: break;
  }
  return unsupported(name + ": activation scales " + describe(s) + " (the GPU runtime runs per-token, per-tensor and 1x128)");
}

// Scales of one quantized weight as the runtime stores them: per-channel [n] (per-tensor scales
// expanded), or 128x128 blocks.
Status weight_scales(const QuantizedTensor& w, const std::string& name, WeightScale* kind, std::vector<float>* out) {
  const QuantSpec& s = w.spec;
  const float* sc = w.scales.scales.data_as<float>();
  out->clear();
  if (!w.scales.zero_points.empty()) return unsupported(name + ": asymmetric weights");
  switch (s.granularity) {
    case Granularity::kPerTensor: *kind = WeightScale::kChannel; out->assign(static_cast<size_t>(w.rows), sc[0]); return {};
    case Granularity::kPerChannel:
    case Granularity::kPerToken: *kind = WeightScale::kChannel; out->assign(sc, sc + w.rows); return {};
    case Granularity::kPerBlock:
      if (s.block_rows == 128 && s.block_cols == 128) {
        *kind = WeightScale::kBlock128;
        out->assign(sc, sc + w.scales.scales.numel());
        return {};
      }
      break;
    default: break;
  }
  return unsupported(name + ": weight scales " + describe(s) + " (the GPU runtime runs per-tensor, per-channel, 128x128)");
}

Status finish_block_part(LinearPart* part, int64_t k, const std::vector<float>& scales, const std::string& name) {
  const int64_t lt = cublaslt_scale_count(GemmScaleMode::kBlock128x128, part->n, k);
  std::vector<float> packed(static_cast<size_t>(lt));
  LLMQ_RETURN_IF_ERROR(pack_scales_for_cublaslt(GemmScaleMode::kBlock128x128, part->n, k, scales.data(), packed.data()));
  return DeviceAllocation::upload(packed.data(), lt * 4, name + ".weight_scale (cuBLASLt order)", &part->w_scale_lt);
}

Status quantized_linear(const std::string& name, const std::vector<const QuantizedLinear*>& parts, GpuLinear* out) {
  out->name = name;
  out->k = parts[0]->weight.cols;
  out->n = 0;
  out->static_scale = 0.0f;
  std::vector<WeightScale> kinds;
  std::vector<std::vector<float>> scales(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    const QuantizedLinear& ql = *parts[i];
    const ActQuant act_before = out->act;
    const DType act_dtype_before = out->act_dtype;
    LLMQ_RETURN_IF_ERROR(act_mode(ql, name, out));
    // One GEMM quantizes its input once: parts quantized differently (a mixed model that splits a
    // fused linear, which resolve_recipe refuses) are refused rather than run as another model.
    if (i > 0 && (out->act != act_before || out->act_dtype != act_dtype_before ||
                  ql.weight.spec.format != parts[0]->weight.spec.format))
      return unsupported(name + ": its parts are quantized differently (weights or activations); the GPU runtime runs "
                         "them as one GEMM with one activation quantization");
    const DType f = ql.weight.spec.format;
    if (f != DType::kE4M3 && f != DType::kI8) return unsupported(name + ": weights in " + std::string(dtype_name(f)));
    if (ql.weight.cols != out->k) return invalid_argument(name + ": parts disagree on K");
    WeightScale kind;
    LLMQ_RETURN_IF_ERROR(weight_scales(ql.weight, name, &kind, &scales[i]));
    kinds.push_back(kind);
    out->n += ql.weight.rows;
  }
  // Merge into one part when the scales concatenate: per-channel always; blocks when every part
  // but the last has a multiple of 128 rows.
  bool mergeable = true;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (kinds[i] != kinds[0] || parts[i]->weight.spec.format != parts[0]->weight.spec.format) mergeable = false;
    if (kinds[i] == WeightScale::kBlock128 && i + 1 < parts.size() && parts[i]->weight.rows % 128 != 0) mergeable = false;
  }
  out->parts.clear();
  if (mergeable) {
    LinearPart part;
    part.n = out->n;
    part.w_dtype = parts[0]->weight.spec.format;
    part.scale_kind = kinds[0];
    std::vector<uint8_t> codes;
    std::vector<float> merged_scales;
    for (size_t i = 0; i < parts.size(); ++i) {
      const Tensor& d = parts[i]->weight.data;
      codes.insert(codes.end(), static_cast<const uint8_t*>(d.data()), static_cast<const uint8_t*>(d.data()) + d.nbytes());
      merged_scales.insert(merged_scales.end(), scales[i].begin(), scales[i].end());
    }
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::upload(codes.data(), static_cast<int64_t>(codes.size()), name + ".weight", &part.w));
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::upload(merged_scales.data(), static_cast<int64_t>(merged_scales.size() * 4),
                                                  name + ".weight_scale", &part.w_scale));
    part.uniform_scale = part.scale_kind == WeightScale::kChannel && one_scale(merged_scales);
    if (part.scale_kind == WeightScale::kBlock128) LLMQ_RETURN_IF_ERROR(finish_block_part(&part, out->k, merged_scales, name));
    out->parts.push_back(std::move(part));
    return {};
  }
  int64_t offset = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    LinearPart part;
    part.n = parts[i]->weight.rows;
    part.n_offset = offset;
    part.w_dtype = parts[i]->weight.spec.format;
    part.scale_kind = kinds[i];
    const Tensor& d = parts[i]->weight.data;
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::upload(d.data(), d.nbytes(), name + ".weight", &part.w));
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::upload(scales[i].data(), static_cast<int64_t>(scales[i].size() * 4),
                                                  name + ".weight_scale", &part.w_scale));
    part.uniform_scale = part.scale_kind == WeightScale::kChannel && one_scale(scales[i]);
    if (part.scale_kind == WeightScale::kBlock128) LLMQ_RETURN_IF_ERROR(finish_block_part(&part, out->k, scales[i], name));
    offset += part.n;
    out->parts.push_back(std::move(part));
  }
  return {};
}

std::string layer_name(int64_t l, const char* what) { return "layers." + std::to_string(l) + "." + what; }

Status check_config(const ModelConfig& c) {
  LLMQ_RETURN_IF_ERROR(c.validate());
  return {};
}

int64_t model_bytes(const ModelConfig& c, bool bf16_linears) {
  const int64_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  const int64_t experts = c.is_moe() ? c.n_experts : 1;
  const int64_t per_layer = (q_dim + 2 * kv_dim) * c.dim + c.dim * q_dim + experts * 3 * c.hidden_dim * c.dim;
  const int64_t router = c.is_moe() ? c.n_layers * c.n_experts * c.dim * 2 : 0;  // BF16 whatever the experts
  return c.n_layers * per_layer * (bf16_linears ? 2 : 1) + router + 2 * c.vocab_size * c.dim * 2;
}

Status check_fits(const ModelConfig& c, bool bf16_linears, const std::string& precision) {
  int64_t free_b = 0, total_b = 0;
  LLMQ_RETURN_IF_ERROR(device_memory_info(&free_b, &total_b));
  const int64_t need = model_bytes(c, bf16_linears);
  if (need > free_b)
    return {StatusCode::kInvalidArgument, "model does not fit: " + precision + " weights need " + format_bytes(need) +
                                              ", the GPU has " + format_bytes(free_b) + " free of " + format_bytes(total_b)};
  return {};
}

Status scheme_act_mode(const Scheme& s, const std::string& name, GpuLinear* out) {
  QuantizedLinear ql;  // only its specs: act_mode reads them
  ql.quantize_input = s.quantize_activations;
  ql.input_spec = s.activation;
  Tensor static_scale(DType::kF32, {1, 1});
  static_scale.data_as<float>()[0] = 8.0f / 448.0f;  // synthetic activations stay well inside +-8
  ql.static_input_scale.scales = std::move(static_scale);
  return act_mode(ql, name, out);
}

Status quantize_part_on_device(const std::string& name, const TensorView& x, const QuantSpec& ws, LinearPart* part) {
  const int64_t n = x.shape[0], k = x.shape[1];
  part->n = n;
  part->w_dtype = ws.format;
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(n * k, name + ".weight", &part->w));
  BlockShape block;
  LLMQ_RETURN_IF_ERROR(resolve_block_shape(ws, n, k, &block));
  const int64_t srows = (n + block.rows - 1) / block.rows, scols = (k + block.cols - 1) / block.cols;
  DeviceAllocation raw_scales;
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(srows * scols * 4, name + ".weight_scale", &raw_scales));
  TensorView q{part->w.get(), ws.format, {n, k}, {}, Device::kCuda};
  TensorView sv{raw_scales.get(), DType::kF32, {srows, scols}, {}, Device::kCuda};
  const size_t ws_bytes = cuda_quantize_workspace_bytes(n, k, ws);
  DeviceAllocation qws;
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(static_cast<int64_t>(ws_bytes), name + " quantize workspace", &qws));
  CudaQuantizeOptions qo;
  qo.workspace = qws.get();
  qo.workspace_bytes = ws_bytes;
  LLMQ_RETURN_IF_ERROR(cuda_quantize(x, ws, q, sv, qo));
  std::vector<float> host(static_cast<size_t>(srows * scols));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), raw_scales.get(), host.size() * 4, cudaMemcpyDeviceToHost));
  if (ws.granularity == Granularity::kPerBlock) {
    part->scale_kind = WeightScale::kBlock128;
    part->w_scale = std::move(raw_scales);
    return finish_block_part(part, k, host, name);
  }
  part->scale_kind = WeightScale::kChannel;
  if (ws.granularity == Granularity::kPerTensor) host.assign(static_cast<size_t>(n), host[0]);
  part->uniform_scale = one_scale(host);
  return DeviceAllocation::upload(host.data(), n * 4, name + ".weight_scale", &part->w_scale);
}

}  // namespace runtime

using namespace runtime;  // the helpers above, in this file

Status GpuModel::from_float(const ModelWeights& w, DType linear_dtype, int device, std::unique_ptr<GpuModel>* out,
                            TensorParallelRank tp) {
  LLMQ_RETURN_IF_ERROR(check_config(w.config));
  ModelConfig local;
  LLMQ_RETURN_IF_ERROR(begin_tensor_parallel(w.config, tp, /*block_scales=*/false, &local));
  if (w.config.is_moe() && linear_dtype != DType::kBF16) return unsupported(kMoeNotF32);
  if (linear_dtype != DType::kF32 && linear_dtype != DType::kBF16)
    return invalid_argument(std::string("linear dtype: f32 or bf16, got ") + dtype_name(linear_dtype));
  LLMQ_RETURN_IF_ERROR(cuda::select_device(device));
  std::unique_ptr<GpuModel> m(new GpuModel());
  Impl& g = *m->impl_;
  g.config = local;
  g.full_config = w.config;
  g.tp = tp;
  g.precision = linear_dtype == DType::kF32 ? "f32" : "bf16";
  g.device = device;
  const Tensor& emb = w.token_embedding;
  g.embedding_f32 = linear_dtype == DType::kF32;
  LLMQ_RETURN_IF_ERROR(upload_as(emb.data_as<float>(), emb.numel(), linear_dtype, "embed_tokens", &g.embedding));
  LLMQ_RETURN_IF_ERROR(upload_f32(w.final_norm, "norm", &g.final_norm));
  LLMQ_RETURN_IF_ERROR(float_linear("lm_head", {&w.lm_head}, linear_dtype, &g.lm_head));
  LLMQ_RETURN_IF_ERROR(shard_lm_head(w.config, tp, &g.lm_head));
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    GpuLayer gl;
    const int64_t i = static_cast<int64_t>(l);
    LLMQ_RETURN_IF_ERROR(upload_f32(L.attn_norm, layer_name(i, "input_layernorm"), &gl.attn_norm));
    LLMQ_RETURN_IF_ERROR(upload_f32(L.ffn_norm, layer_name(i, "post_attention_layernorm"), &gl.ffn_norm));
    LLMQ_RETURN_IF_ERROR(upload_layer_extras(w.config, L, i, &gl));
    LLMQ_RETURN_IF_ERROR(float_linear(layer_name(i, "qkv"), {&L.q, &L.k, &L.v}, linear_dtype, &gl.qkv));
    LLMQ_RETURN_IF_ERROR(float_linear(layer_name(i, "o_proj"), {&L.o}, linear_dtype, &gl.o));
    if (w.config.is_moe()) {
      std::vector<const Linear*> gate_up, down;
      for (const Expert& ex : L.experts) {
        gate_up.insert(gate_up.end(), {&ex.gate, &ex.up});
        down.push_back(&ex.down);
      }
      LLMQ_RETURN_IF_ERROR(float_linear(layer_name(i, "router"), {&L.router}, DType::kBF16, &gl.moe.router));
      LLMQ_RETURN_IF_ERROR(float_linear(layer_name(i, "experts.gate_up"), gate_up, DType::kBF16, &gl.moe.gate_up));
      LLMQ_RETURN_IF_ERROR(float_linear(layer_name(i, "experts.down"), down, DType::kBF16, &gl.moe.down));
    } else {
      LLMQ_RETURN_IF_ERROR(float_linear(layer_name(i, "gate_up"), {&L.mlp.gate, &L.mlp.up}, linear_dtype, &gl.gate_up));
      LLMQ_RETURN_IF_ERROR(float_linear(layer_name(i, "down_proj"), {&L.mlp.down}, linear_dtype, &gl.down));
    }
    LLMQ_RETURN_IF_ERROR(shard_layer(w.config, tp, &gl));
    g.layers.push_back(std::move(gl));
  }
  *out = std::move(m);
  return {};
}

Status GpuModel::from_quantized(const QuantizedModel& q, int device, std::unique_ptr<GpuModel>* out, TensorParallelRank tp) {
  const ModelWeights& w = q.weights;
  LLMQ_RETURN_IF_ERROR(check_config(w.config));
  ModelConfig local;
  LLMQ_RETURN_IF_ERROR(begin_tensor_parallel(w.config, tp, has_weight_blocks(q.scheme), &local));
  LLMQ_RETURN_IF_ERROR(cuda::select_device(device));
  std::unique_ptr<GpuModel> m(new GpuModel());
  Impl& g = *m->impl_;
  g.config = local;
  g.full_config = w.config;
  g.tp = tp;
  g.precision = q.scheme.name;
  g.device = device;
  const ModelConfig& c = w.config;
  auto find = [&](const Linear& l, const QuantizedLinear** ql) -> Status {
    *ql = q.find(l.id.hf_name(c));
    if (*ql == nullptr) return invalid_argument("quantized model: no quantized weight for " + l.id.hf_name(c));
    return {};
  };
  LLMQ_RETURN_IF_ERROR(upload_as(w.token_embedding.data_as<float>(), w.token_embedding.numel(), DType::kBF16,
                                 "embed_tokens", &g.embedding));
  LLMQ_RETURN_IF_ERROR(upload_f32(w.final_norm, "norm", &g.final_norm));
  if (const QuantizedLinear* lm = q.find("lm_head")) {
    LLMQ_RETURN_IF_ERROR(quantized_linear("lm_head", {lm}, &g.lm_head));
  } else {
    LLMQ_RETURN_IF_ERROR(float_linear("lm_head", {&w.lm_head}, DType::kBF16, &g.lm_head));
  }
  LLMQ_RETURN_IF_ERROR(shard_lm_head(w.config, tp, &g.lm_head));
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    const int64_t i = static_cast<int64_t>(l);
    GpuLayer gl;
    LLMQ_RETURN_IF_ERROR(upload_f32(L.attn_norm, layer_name(i, "input_layernorm"), &gl.attn_norm));
    LLMQ_RETURN_IF_ERROR(upload_f32(L.ffn_norm, layer_name(i, "post_attention_layernorm"), &gl.ffn_norm));
    LLMQ_RETURN_IF_ERROR(upload_layer_extras(c, L, i, &gl));
    const QuantizedLinear *qq, *qk, *qv, *qo;
    LLMQ_RETURN_IF_ERROR(find(L.q, &qq));
    LLMQ_RETURN_IF_ERROR(find(L.k, &qk));
    LLMQ_RETURN_IF_ERROR(find(L.v, &qv));
    LLMQ_RETURN_IF_ERROR(find(L.o, &qo));
    LLMQ_RETURN_IF_ERROR(quantized_linear(layer_name(i, "qkv"), {qq, qk, qv}, &gl.qkv));
    LLMQ_RETURN_IF_ERROR(quantized_linear(layer_name(i, "o_proj"), {qo}, &gl.o));
    if (c.is_moe()) {
      // The router stays BF16 (as vLLM keeps it); the experts are stacked expert-major, each
      // expert's gate rows then its up rows, per-channel scales concatenated alike.
      if (q.find(L.router.id.hf_name(c)) != nullptr)
        return unsupported(L.router.id.hf_name(c) + ": a quantized router (the GPU runtime keeps routers BF16)");
      LLMQ_RETURN_IF_ERROR(float_linear(layer_name(i, "router"), {&L.router}, DType::kBF16, &gl.moe.router));
      std::vector<const QuantizedLinear*> gate_up, down;
      for (const Expert& ex : L.experts) {
        const QuantizedLinear *qg, *qu, *qd;
        LLMQ_RETURN_IF_ERROR(find(ex.gate, &qg));
        LLMQ_RETURN_IF_ERROR(find(ex.up, &qu));
        LLMQ_RETURN_IF_ERROR(find(ex.down, &qd));
        gate_up.insert(gate_up.end(), {qg, qu});
        down.push_back(qd);
      }
      LLMQ_RETURN_IF_ERROR(quantized_linear(layer_name(i, "experts.gate_up"), gate_up, &gl.moe.gate_up));
      LLMQ_RETURN_IF_ERROR(quantized_linear(layer_name(i, "experts.down"), down, &gl.moe.down));
      LLMQ_RETURN_IF_ERROR(check_moe_linear(gl.moe.gate_up));
      LLMQ_RETURN_IF_ERROR(check_moe_linear(gl.moe.down));
    } else {
      const QuantizedLinear *qg, *qu, *qd;
      LLMQ_RETURN_IF_ERROR(find(L.mlp.gate, &qg));
      LLMQ_RETURN_IF_ERROR(find(L.mlp.up, &qu));
      LLMQ_RETURN_IF_ERROR(find(L.mlp.down, &qd));
      LLMQ_RETURN_IF_ERROR(quantized_linear(layer_name(i, "gate_up"), {qg, qu}, &gl.gate_up));
      LLMQ_RETURN_IF_ERROR(quantized_linear(layer_name(i, "down_proj"), {qd}, &gl.down));
    }
    LLMQ_RETURN_IF_ERROR(shard_layer(w.config, tp, &gl));
    g.layers.push_back(std::move(gl));
  }
  *out = std::move(m);
  return {};
}

namespace {

struct SyntheticPlan {
  bool bf16 = true;
  Scheme scheme;
};

// A synthetic linear [n, k]: BF16 values ~ N(0, 1/k) generated on the device, then quantized there
// under the scheme's weight spec (cuda_quantize: bit for bit the CPU quantize of those BF16 values).
Status synthetic_linear(const std::string& name, int64_t n, int64_t k, const SyntheticPlan& plan, uint64_t seed,
                        GpuLinear* out) {
  out->name = name;
  out->n = n;
  out->k = k;
  LinearPart part;
  part.n = n;
  DeviceAllocation values;
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(n * k * 2, name + ".weight (bf16)", &values));
  LLMQ_RETURN_IF_ERROR(runtime::fill_random_bf16(values.as<uint16_t>(), n * k, 1.0f / std::sqrt(static_cast<float>(k)),
                                                 seed, nullptr));
  if (plan.bf16) {
    part.w_dtype = DType::kBF16;
    part.w = std::move(values);
    out->act = ActQuant::kNone;
    out->parts.push_back(std::move(part));
    return {};
  }
  LLMQ_RETURN_IF_ERROR(scheme_act_mode(plan.scheme, name, out));
  TensorView x{values.get(), DType::kBF16, {n, k}, {}, Device::kCuda};
  LLMQ_RETURN_IF_ERROR(quantize_part_on_device(name, x, plan.scheme.weight, &part));
  out->parts.push_back(std::move(part));
  return {};
}

Status synthetic_gains(int64_t dim, uint64_t seed, const std::string& what, DeviceAllocation* out, int outliers = 4) {
  // Gains near 1 with a few outlier channels, as real RMSNorm gains have (they feed outlier input
  // channels to the next linears, which is what makes per-tensor activation scales hard). The q/k
  // norms (per head, read by no linear) take none.
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(1.0f, 0.1f);
  std::vector<float> g(static_cast<size_t>(dim));
  for (float& v : g) v = normal(rng);
  for (int i = 0; i < outliers; ++i) g[rng() % static_cast<uint64_t>(dim)] = 8.0f;
  return DeviceAllocation::upload(g.data(), dim * 4, what, out);
}

// f32 [n] ~ N(0, std) on the device: a synthetic bias or sinks.
Status synthetic_vector(int64_t n, float std, uint64_t seed, const std::string& what, DeviceAllocation* out) {
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(n * 4, what, out));
  return runtime::fill_random_f32(out->as<float>(), n, 0.0f, std, seed, nullptr);
}

}  // namespace

Status GpuModel::synthetic(const ModelConfig& c, const GpuPrecision& p, uint64_t seed, int device,
                           std::unique_ptr<GpuModel>* out, const GpuProgressFn& progress, TensorParallelRank tp) {
  LLMQ_RETURN_IF_ERROR(check_config(c));
  if (p.kind == GpuPrecision::Kind::kF32) return invalid_argument("synthetic weights: bf16 or a scheme, not f32");
  const std::string precision = p.kind == GpuPrecision::Kind::kScheme ? p.scheme.name : "bf16";
  SyntheticPlan plan;
  if (p.kind == GpuPrecision::Kind::kScheme) {
    plan.bf16 = false;
    plan.scheme = p.scheme;
    if (!weights_quantize_on_device(p.scheme))
      return unsupported("synthetic " + precision + ": SmoothQuant and MSE-searched weights need a real model and calibration");
  }
  ModelConfig local;
  LLMQ_RETURN_IF_ERROR(begin_tensor_parallel(c, tp, !plan.bf16 && has_weight_blocks(plan.scheme), &local));
  LLMQ_RETURN_IF_ERROR(cuda::select_device(device));
  LLMQ_RETURN_IF_ERROR(check_fits(local, plan.bf16, precision));
  std::unique_ptr<GpuModel> m(new GpuModel());
  Impl& g = *m->impl_;
  g.config = local;
  g.full_config = c;
  g.tp = tp;
  g.precision = precision;
  g.device = device;
  const int64_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(c.vocab_size * c.dim * 2, "embed_tokens", &g.embedding));
  LLMQ_RETURN_IF_ERROR(runtime::fill_random_bf16(g.embedding.as<uint16_t>(), c.vocab_size * c.dim, 1.0f, seed, nullptr));
  LLMQ_RETURN_IF_ERROR(synthetic_gains(c.dim, seed + 1, "norm", &g.final_norm));
  SyntheticPlan bf16_plan;  // lm_head stays BF16, as the paper keeps it
  LLMQ_RETURN_IF_ERROR(synthetic_linear("lm_head", c.vocab_size, c.dim, bf16_plan, seed + 2, &g.lm_head));
  LLMQ_RETURN_IF_ERROR(shard_lm_head(c, tp, &g.lm_head));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (progress) progress(l, c.n_layers, "generating layer " + std::to_string(l));
    GpuLayer gl;
    const uint64_t ls = seed + 1000 * static_cast<uint64_t>(l + 1);
    LLMQ_RETURN_IF_ERROR(synthetic_gains(c.dim, ls, layer_name(l, "input_layernorm"), &gl.attn_norm));
    LLMQ_RETURN_IF_ERROR(synthetic_gains(c.dim, ls + 1, layer_name(l, "post_attention_layernorm"), &gl.ffn_norm));
    if (c.attention_bias) {
      LLMQ_RETURN_IF_ERROR(synthetic_vector(q_dim + 2 * kv_dim, 0.1f, ls + 2, layer_name(l, "qkv.bias"), &gl.qkv_bias));
      if (family_layout(c).o_bias) LLMQ_RETURN_IF_ERROR(synthetic_vector(c.dim, 0.1f, ls + 8, layer_name(l, "o_proj.bias"), &gl.o_bias));
    }
    if (c.qk_norm) {
      LLMQ_RETURN_IF_ERROR(synthetic_gains(c.head_dim, ls + 9, layer_name(l, "self_attn.q_norm"), &gl.q_norm, 0));
      LLMQ_RETURN_IF_ERROR(synthetic_gains(c.head_dim, ls + 10, layer_name(l, "self_attn.k_norm"), &gl.k_norm, 0));
    }
    if (c.attention_sinks) LLMQ_RETURN_IF_ERROR(synthetic_vector(c.n_heads, 1.0f, ls + 11, layer_name(l, "self_attn.sinks"), &gl.sinks));
    LLMQ_RETURN_IF_ERROR(synthetic_linear(layer_name(l, "qkv"), q_dim + 2 * kv_dim, c.dim, plan, ls + 3, &gl.qkv));
    LLMQ_RETURN_IF_ERROR(synthetic_linear(layer_name(l, "o_proj"), c.dim, q_dim, plan, ls + 4, &gl.o));
    if (c.is_moe()) {
      // All experts of a layer as one stacked matrix: per-channel scales are per row, so quantizing
      // the stack equals quantizing each expert.
      init_moe(c, &gl.moe);
      if (c.moe_bias) {
        LLMQ_RETURN_IF_ERROR(synthetic_vector(c.n_experts, 0.1f, ls + 12, layer_name(l, "router.bias"), &gl.moe.router_bias));
        LLMQ_RETURN_IF_ERROR(synthetic_vector(c.n_experts * 2 * c.hidden_dim, 0.1f, ls + 13, layer_name(l, "experts.gate_up.bias"),
                                              &gl.moe.gate_up_bias));
        LLMQ_RETURN_IF_ERROR(synthetic_vector(c.n_experts * c.dim, 0.1f, ls + 14, layer_name(l, "experts.down.bias"),
                                              &gl.moe.down_bias));
      }
      LLMQ_RETURN_IF_ERROR(synthetic_linear(layer_name(l, "router"), c.n_experts, c.dim, bf16_plan, ls + 7, &gl.moe.router));
      LLMQ_RETURN_IF_ERROR(synthetic_linear(layer_name(l, "experts.gate_up"), c.n_experts * 2 * c.hidden_dim, c.dim, plan,
                                            ls + 5, &gl.moe.gate_up));
      LLMQ_RETURN_IF_ERROR(synthetic_linear(layer_name(l, "experts.down"), c.n_experts * c.dim, c.hidden_dim, plan, ls + 6,
                                            &gl.moe.down));
      LLMQ_RETURN_IF_ERROR(check_moe_linear(gl.moe.gate_up));
      LLMQ_RETURN_IF_ERROR(check_moe_linear(gl.moe.down));
    } else {
      LLMQ_RETURN_IF_ERROR(synthetic_linear(layer_name(l, "gate_up"), 2 * c.hidden_dim, c.dim, plan, ls + 5, &gl.gate_up));
      LLMQ_RETURN_IF_ERROR(synthetic_linear(layer_name(l, "down_proj"), c.dim, c.hidden_dim, plan, ls + 6, &gl.down));
    }
    LLMQ_RETURN_IF_ERROR(shard_layer(c, tp, &gl));
    g.layers.push_back(std::move(gl));
  }
  LLMQ_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  if (progress) progress(c.n_layers, c.n_layers, "generated");
  *out = std::move(m);
  return {};
}

Status measure_copy_bandwidth(int device, int64_t bytes, double* bytes_per_second) {
  LLMQ_RETURN_IF_ERROR(cuda::select_device(device));
  DeviceAllocation a, b;
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(bytes, "copy source", &a));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(bytes, "copy destination", &b));
  LLMQ_RETURN_IF_ERROR(runtime::fill_random_bf16(a.as<uint16_t>(), bytes / 2, 1.0f, 1, nullptr));
  cudaEvent_t start = nullptr, stop = nullptr;
  std::vector<float> ms;
  auto timed = [&]() -> Status {
    LLMQ_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
    for (int i = 0; i < 12; ++i) {
      LLMQ_CUDA_RETURN_IF_ERROR(cudaEventRecord(start));
      LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.get(), a.get(), static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice));
      LLMQ_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop));
      LLMQ_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
      float t = 0.0f;
      LLMQ_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&t, start, stop));
      if (i >= 2) ms.push_back(t);  // two warm-up copies
    }
    return {};
  };
  const Status st = timed();
  if (start != nullptr) (void)cudaEventDestroy(start);
  if (stop != nullptr) (void)cudaEventDestroy(stop);
  LLMQ_RETURN_IF_ERROR(st);
  std::sort(ms.begin(), ms.end());
  *bytes_per_second = 2.0 * static_cast<double>(bytes) / (ms[ms.size() / 2] * 1e-3);
  return {};
}

Status gpu_memory_in_use(int device, int64_t* used_bytes, int64_t* total_bytes) {
  LLMQ_RETURN_IF_ERROR(cuda::select_device(device));
  int64_t f = 0;
  LLMQ_RETURN_IF_ERROR(runtime::device_memory_info(&f, total_bytes));
  *used_bytes = *total_bytes - f;
  return {};
}

}  // namespace llmq
