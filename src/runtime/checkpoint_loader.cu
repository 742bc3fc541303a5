// GpuModel::from_checkpoint: a Hugging Face checkpoint (config.json + safetensors, sharded or not)
// onto the device tensor by tensor, straight from the memory map: each weight is copied from the
// mapped file into device memory (the OS pages in what is read; nothing is copied into host
// buffers for BF16 and F32 tensors). An unquantized checkpoint is quantized there under the
// scheme; a quantized one (what `llmq quantize` writes) keeps its stored FP8/INT8 codes, read
// through QuantizedLinearReader exactly as load_quantized_checkpoint reads them. Host memory holds
// at most one converted tensor (F16 weights under "bf16") plus one linear's scales.
#include <cuda_runtime.h>

#include "cuda/cuda_check.cuh"
#include "cuda/device_facts.cuh"
#include "llmq/export.hpp"
#include "llmq/format.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/safetensors.hpp"
#include "runtime/shard_linear.hpp"
#include "runtime/gpu_model_build.hpp"
#include "runtime/gpu_model_impl.hpp"
#include "model/checkpoint/model_family.hpp"

namespace llmq {

using runtime::DeviceAllocation;
using runtime::GpuLayer;
using runtime::GpuLinear;
using runtime::LinearPart;
using runtime::WeightScale;

namespace {

struct Loader {
  const Checkpoint& ckpt;
  bool bf16 = true;  // linears in BF16, else quantized under `scheme`
  Scheme scheme;
  const CalibrationStats* stats = nullptr;  // static activation scales (schemes that need them)
  bool stored_quantized = false;  // the checkpoint's own FP8/INT8 linears, as stored
  QuantizedLinearReader* reader = nullptr;  // with stored_quantized: its quantization_config, parsed once

  // A stored 8-bit weight: codes from the memory map to the device, scales as the runtime keeps
  // them (per-channel, per-tensor expanded, or 128x128 blocks).
  Status stored_part(const std::string& label, const std::string& module, const QuantizedLinear& ql, GpuLinear* out,
                     LinearPart* part) const {
    const QuantizedTensor& w = ql.weight;
    if (w.spec.format != DType::kE4M3 && w.spec.format != DType::kI8)
      return unsupported(ckpt.dir() + ": " + module + ".weight is " + dtype_name(w.spec.format) +
                         " (the GPU runtime runs e4m3 and int8 weights)");
    TensorView v;
    LLMQ_RETURN_IF_ERROR(ckpt.view(module + ".weight", &v));
    part->n = w.rows;
    part->w_dtype = w.spec.format;
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::upload(v.data, v.numel(), module + ".weight", &part->w));
    std::vector<float> scales;
    LLMQ_RETURN_IF_ERROR(runtime::weight_scales(w, module, &part->scale_kind, &scales));
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::upload(scales.data(), static_cast<int64_t>(scales.size() * 4),
                                                  module + ".weight_scale", &part->w_scale));
    part->uniform_scale = part->scale_kind == WeightScale::kChannel && runtime::one_scale(scales);
    if (part->scale_kind == WeightScale::kBlock128) LLMQ_RETURN_IF_ERROR(runtime::finish_block_part(part, w.cols, scales, module));
    return runtime::act_mode(ql, label, out);
  }

  Status shape_of(const std::string& name, std::vector<int64_t>* shape, DType* dtype) const {
    const SafetensorsTensorInfo* info = ckpt.find(name);
    if (info == nullptr) return invalid_argument(ckpt.dir() + ": tensor " + name + " is missing");
    *shape = info->shape;
    *dtype = info->dtype;
    return {};
  }

  // The tensor on the device in its stored dtype (BF16 / F32) or, for F16 under a BF16 target,
  // converted on the host first. `elem_dtype` says what landed.
  Status upload(const std::string& name, DeviceAllocation* out, DType* elem_dtype) const {
    TensorView v;
    LLMQ_RETURN_IF_ERROR(ckpt.view(name, &v));
    if (v.dtype == DType::kBF16 || v.dtype == DType::kF32 || v.dtype == DType::kF16) {
      *elem_dtype = v.dtype;
      const int64_t bytes = v.numel() * static_cast<int64_t>(format_info(v.dtype).bits / 8);
      return DeviceAllocation::upload(v.data, bytes, name, out);
    }
    return unsupported(ckpt.dir() + ": " + name + " is " + dtype_name(v.dtype) +
                       ": from_checkpoint reads unquantized checkpoints (BF16, F16, F32); load quantized ones "
                       "through load_quantized_checkpoint + GpuModel::from_quantized");
  }

  Status small_f32(const std::string& name, DeviceAllocation* out) const { return stacked_f32({name}, name, out); }

  // Small f32 tensors (biases) concatenated, as one device vector `what`.
  Status stacked_f32(const std::vector<std::string>& names, const std::string& what, DeviceAllocation* out) const {
    std::vector<float> all;
    for (const std::string& name : names) {
      Tensor t;
      LLMQ_RETURN_IF_ERROR(ckpt.read_f32(name, &t));
      all.insert(all.end(), t.data_as<float>(), t.data_as<float>() + t.numel());
    }
    return DeviceAllocation::upload(all.data(), static_cast<int64_t>(all.size() * 4), what, out);
  }

  // One BF16 table (embeddings, lm_head): stored BF16 goes up as it is, anything else converts.
  Status bf16_table(const std::string& name, DeviceAllocation* out) const {
    std::vector<int64_t> shape;
    DType dt;
    LLMQ_RETURN_IF_ERROR(shape_of(name, &shape, &dt));
    if (dt == DType::kBF16) return upload(name, out, &dt);
    Tensor t;
    LLMQ_RETURN_IF_ERROR(ckpt.read_f32(name, &t));
    return runtime::upload_as(t.data_as<float>(), t.numel(), DType::kBF16, name, out);
  }

  // Linear `label` from the tensors `names`, concatenated along N (QKV, gate/up).
  Status linear(const std::string& label, const std::vector<std::string>& names, GpuLinear* out) const {
    out->name = label;
    out->n = 0;
    out->k = 0;
    out->parts.clear();
    std::vector<LinearPart> parts;
    int stored = 0;  // parts read as stored 8-bit codes
    out->static_scale = 0.0f;
    for (const std::string& name : names) {
      std::vector<int64_t> shape;
      DType dt;
      LLMQ_RETURN_IF_ERROR(shape_of(name, &shape, &dt));
      if (shape.size() != 2 || (out->k != 0 && shape[1] != out->k))
        return invalid_argument(ckpt.dir() + ": " + name + ": expected [out, " + std::to_string(out->k) + "]");
      out->k = shape[1];
      LinearPart part;
      part.n = shape[0];
      part.n_offset = out->n;
      QuantizedLinear ql;
      bool quantized = false;
      const std::string module = name.substr(0, name.size() - std::string(".weight").size());
      if (stored_quantized) LLMQ_RETURN_IF_ERROR(reader->read(module, false, &quantized, &ql));
      if (quantized) {
        const runtime::ActQuant act_before = out->act;
        const DType act_dtype_before = out->act_dtype;
        LLMQ_RETURN_IF_ERROR(stored_part(label, module, ql, out, &part));
        // One GEMM per fused linear (QKV, gate/up, a layer's experts) quantizes its input once: a
        // checkpoint whose parts are quantized differently (a mixed recipe splitting them, which
        // llmq never writes) is refused rather than run as another model.
        if (stored > 0 && (out->act != act_before || out->act_dtype != act_dtype_before ||
                           part.w_dtype != parts.front().w_dtype))
          return unsupported(ckpt.dir() + ": " + module + " is quantized differently from " + names.front() +
                             " (weights or activations); the GPU runtime runs " + label +
                             " as one GEMM with one activation quantization, so it cannot run this checkpoint");
        ++stored;
      } else if (bf16) {
        LLMQ_RETURN_IF_ERROR(bf16_table(name, &part.w));
        part.w_dtype = DType::kBF16;
      } else {
        DeviceAllocation values;
        DType elem;
        LLMQ_RETURN_IF_ERROR(upload(name, &values, &elem));
        TensorView x{values.get(), elem, {shape[0], shape[1]}, {}, Device::kCuda};
        LLMQ_RETURN_IF_ERROR(runtime::quantize_part_on_device(name, x, scheme.weight, &part));
      }
      out->n += part.n;
      parts.push_back(std::move(part));
    }
    if (stored != 0 && stored != static_cast<int>(names.size()))
      return unsupported(ckpt.dir() + ": " + label + " mixes 8-bit and float parts (" + names[0] + " ...)");
    if (stored != 0) {
      // act_mode set by stored_part
    } else if (bf16) {
      out->act = runtime::ActQuant::kNone;
    } else {
      LLMQ_RETURN_IF_ERROR(runtime::scheme_act_mode(scheme, label, out));
      if (out->act == runtime::ActQuant::kStaticTensor) LLMQ_RETURN_IF_ERROR(static_scale(names, out));
    }
    return merge(label, std::move(parts), out);
  }

  // A static activation scale from the statistics, as quantize_model computes it per module; the
  // largest of a fused linear's modules' (one GEMM quantizes its input once, as the host route's
  // act_mode merges them).
  Status static_scale(const std::vector<std::string>& names, GpuLinear* out) const {
    if (stats == nullptr)
      return Status(StatusCode::kInternal, out->name + ": a static activation scale without calibration statistics");
    out->static_scale = 0.0f;
    for (const std::string& name : names) {
      const std::string module = name.substr(0, name.size() - std::string(".weight").size());
      float scale = 1.0f;  // a unit scale needs no statistics (quantize_linear's rule)
      if (scheme.activation.method != ScaleMethod::kUnit) {
        const LinearStats* s = stats->find(module);
        if (s == nullptr || s->rows_seen == 0)
          return invalid_argument("--stats: no activation statistics for " + module + " (were they measured on this model?)");
        LLMQ_RETURN_IF_ERROR(static_activation_scale(*s, nullptr, scheme.activation, &scale));
      }
      out->static_scale = std::max(out->static_scale, scale);
    }
    return {};
  }

  // One part when the pieces concatenate (same kind; blocks only at multiples of 128 rows), so the
  // usual QKV / gate-up is one GEMM; else the parts stay apart.
  Status merge(const std::string& label, std::vector<LinearPart> parts, GpuLinear* out) const {
    bool mergeable = parts.size() > 1;
    for (size_t i = 0; i < parts.size(); ++i) {
      mergeable = mergeable && parts[i].w_dtype == parts[0].w_dtype && parts[i].scale_kind == parts[0].scale_kind;
      if (parts[i].scale_kind == WeightScale::kBlock128 && i + 1 < parts.size() && parts[i].n % 128 != 0) mergeable = false;
    }
    if (!mergeable) {
      out->parts = std::move(parts);
      return {};
    }
    const int64_t elem = parts[0].w_dtype == DType::kBF16 ? 2 : (parts[0].w_dtype == DType::kF32 ? 4 : 1);
    LinearPart m;
    m.n = out->n;
    m.w_dtype = parts[0].w_dtype;
    m.scale_kind = parts[0].scale_kind;
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(out->n * out->k * elem, label + ".weight", &m.w));
    std::vector<float> scales;
    for (const LinearPart& p : parts) {
      LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpy(m.w.as<char>() + p.n_offset * out->k * elem, p.w.get(),
                                           static_cast<size_t>(p.w.bytes()), cudaMemcpyDeviceToDevice));
      if (p.scale_kind != WeightScale::kNone) {
        std::vector<float> s(static_cast<size_t>(p.w_scale.bytes() / 4));
        LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpy(s.data(), p.w_scale.get(), s.size() * 4, cudaMemcpyDeviceToHost));
        scales.insert(scales.end(), s.begin(), s.end());
      }
    }
    if (m.scale_kind != WeightScale::kNone) {
      LLMQ_RETURN_IF_ERROR(DeviceAllocation::upload(scales.data(), static_cast<int64_t>(scales.size() * 4),
                                                    label + ".weight_scale", &m.w_scale));
      m.uniform_scale = m.scale_kind == WeightScale::kChannel && runtime::one_scale(scales);
      if (m.scale_kind == WeightScale::kBlock128) LLMQ_RETURN_IF_ERROR(runtime::finish_block_part(&m, out->k, scales, label));
    }
    out->parts.clear();
    out->parts.push_back(std::move(m));
    return {};
  }
};

// An MoE layer: the router BF16 (refused when the checkpoint stores it quantized: the runtime keeps
// routers BF16), the experts stacked as GpuMoe wants them (expert e's w1 and w3 rows for gate/up,
// its w2 for down), each expert tensor quantized on its own, so a per-tensor scale stays per expert.
Status load_moe(const Loader& load, const ModelConfig& c, int64_t l, runtime::GpuMoe* moe) {
  auto weight = [&](LinearRole role, int64_t expert) { return LinearId{l, role, expert}.hf_name(c) + ".weight"; };
  const std::string router = LinearId{l, LinearRole::kRouter, -1}.hf_name(c);
  if (load.stored_quantized) {
    QuantizedLinear ql;
    bool quantized = false;
    LLMQ_RETURN_IF_ERROR(load.reader->read(router, false, &quantized, &ql));
    if (quantized) return unsupported(load.ckpt.dir() + ": " + router + " is quantized (the GPU runtime keeps routers BF16)");
  }
  Loader bf16 = load;
  bf16.bf16 = true;
  bf16.stored_quantized = false;
  runtime::init_moe(c, moe);
  LLMQ_RETURN_IF_ERROR(bf16.linear(runtime::layer_name(l, "router"), {router + ".weight"}, &moe->router));
  std::vector<std::string> gate_up, down;
  for (int64_t e = 0; e < c.n_experts; ++e) {
    gate_up.push_back(weight(LinearRole::kGate, e));
    gate_up.push_back(weight(LinearRole::kUp, e));
    down.push_back(weight(LinearRole::kDown, e));
  }
  if (c.moe_bias) {  // the checkpoint check asked for every router and expert bias
    auto biases = [](std::vector<std::string> names) {
      for (std::string& n : names) n.replace(n.size() - std::string("weight").size(), std::string::npos, "bias");
      return names;
    };
    LLMQ_RETURN_IF_ERROR(load.stacked_f32({router + ".bias"}, router + ".bias", &moe->router_bias));
    LLMQ_RETURN_IF_ERROR(load.stacked_f32(biases(gate_up), runtime::layer_name(l, "experts.gate_up.bias"), &moe->gate_up_bias));
    LLMQ_RETURN_IF_ERROR(load.stacked_f32(biases(down), runtime::layer_name(l, "experts.down.bias"), &moe->down_bias));
  }
  LLMQ_RETURN_IF_ERROR(load.linear(runtime::layer_name(l, "experts.gate_up"), gate_up, &moe->gate_up));
  LLMQ_RETURN_IF_ERROR(load.linear(runtime::layer_name(l, "experts.down"), down, &moe->down));
  LLMQ_RETURN_IF_ERROR(runtime::check_moe_linear(moe->gate_up));
  return runtime::check_moe_linear(moe->down);
}

}  // namespace

Status GpuModel::from_checkpoint(const std::string& dir, const GpuPrecision& p, int device,
                                 std::unique_ptr<GpuModel>* out, const GpuProgressFn& progress, TensorParallelRank tp,
                                 const CalibrationStats* stats) {
  const std::string precision = p.name();
  std::unique_ptr<Checkpoint> ckpt;
  ModelConfig c;
  LLMQ_RETURN_IF_ERROR(open_hf_checkpoint(dir, &ckpt, &c));  // the checks every loader makes
  LLMQ_RETURN_IF_ERROR(runtime::check_config(c));
  Loader load{*ckpt};
  std::string label = precision;
  std::unique_ptr<QuantizedLinearReader> reader;  // outlives every copy of `load`
  if (is_quantized_checkpoint(*ckpt)) {
    // 8-bit codes run as stored: quantizing them again under another scheme would add a second
    // rounding on top of the first.
    const std::string stored = quantized_checkpoint_scheme(*ckpt);
    if (p.kind != GpuPrecision::Kind::kAsStored && precision != stored)
      return invalid_argument(dir + " is a quantized checkpoint (" + stored + "): it runs as stored (precision 'checkpoint'), not as '" +
                              precision + "'; quantize the unquantized model to get another scheme");
    LLMQ_RETURN_IF_ERROR(QuantizedLinearReader::open(*ckpt, &reader));
    load.stored_quantized = true;
    load.reader = reader.get();
    load.bf16 = true;  // linears the checkpoint keeps in float stay BF16
    label = stored;
  } else if (p.kind == GpuPrecision::Kind::kAsStored || p.kind == GpuPrecision::Kind::kBF16) {
    label = "bf16";  // an unquantized checkpoint as stored: BF16 linears
  } else if (p.kind == GpuPrecision::Kind::kF32) {
    return unsupported(dir + ": f32 linears are not streamed from a checkpoint (GpuModel::load reads them on the host)");
  } else {
    load.bf16 = false;
    load.scheme = p.scheme;
    if (!runtime::scheme_streams_from_checkpoint(load.scheme, stats != nullptr, c.is_moe()))
      return unsupported("--scheme " + precision + " on the GPU from a checkpoint: " +
                         (stats == nullptr || c.is_moe() || !runtime::weights_quantize_on_device(load.scheme)
                              ? "static, SmoothQuant and MSE schemes need calibration statistics and the host's "
                                "quantizer (GpuModel::load with stats); quantize with `llmq quantize --stats` first, or use "
                                "a dynamic scheme"
                              : "its activation scales are not static per-tensor ones"));
    if (load.scheme.needs_statistics()) {
      LLMQ_RETURN_IF_ERROR(stats->check_matches(c));
      load.stats = stats;
    }
  }
  LLMQ_RETURN_IF_ERROR(cuda::select_device(device));
  ModelConfig local;
  bool block_scales = !load.bf16 && runtime::has_weight_blocks(load.scheme);
  if (load.stored_quantized) {
    Scheme stored;
    block_scales = find_scheme(label, &stored).ok() && runtime::has_weight_blocks(stored);
  }
  LLMQ_RETURN_IF_ERROR(runtime::begin_tensor_parallel(c, tp, block_scales, &local));
  LLMQ_RETURN_IF_ERROR(runtime::check_fits(local, load.bf16 && !load.stored_quantized, label));
  std::unique_ptr<GpuModel> m(new GpuModel());
  Impl& g = *m->impl_;
  g.config = local;
  g.full_config = c;
  g.tp = tp;
  g.precision = label;
  g.device = device;
  bool kv_declared = false;
  std::vector<float> k_scales, v_scales;  // [layers * the whole model's KV heads]
  LLMQ_RETURN_IF_ERROR(read_kv_cache_scales(*ckpt, c, &kv_declared, &k_scales, &v_scales));
  if (kv_declared) {  // this rank's KV heads (all of them when they are not split)
    const int64_t first = local.n_kv_heads < c.n_kv_heads ? tp.rank * local.n_kv_heads : 0;
    for (int64_t l = 0; l < c.n_layers; ++l)
      for (int64_t h = 0; h < local.n_kv_heads; ++h) {
        g.kv_k_scales.push_back(k_scales[static_cast<size_t>(l * c.n_kv_heads + first + h)]);
        g.kv_v_scales.push_back(v_scales[static_cast<size_t>(l * c.n_kv_heads + first + h)]);
      }
  }
  LLMQ_RETURN_IF_ERROR(load.bf16_table("model.embed_tokens.weight", &g.embedding));
  LLMQ_RETURN_IF_ERROR(load.small_f32("model.norm.weight", &g.final_norm));
  Loader head = load;
  head.bf16 = true;  // lm_head stays BF16, as the export keeps it
  const bool tied = c.tie_embeddings;
  LLMQ_RETURN_IF_ERROR(head.linear("lm_head", {tied ? "model.embed_tokens.weight" : "lm_head.weight"}, &g.lm_head));
  LLMQ_RETURN_IF_ERROR(runtime::shard_lm_head(c, tp, &g.lm_head));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (progress) progress(l, c.n_layers, "loading layer " + std::to_string(l));
    const std::string p = "model.layers." + std::to_string(l) + ".";
    // Linear names from LinearId::hf_name, the one place that spells them per family.
    auto module = [&](LinearRole role) { return LinearId{l, role, -1}.hf_name(c); };
    GpuLayer gl;
    LLMQ_RETURN_IF_ERROR(load.small_f32(p + "input_layernorm.weight", &gl.attn_norm));
    LLMQ_RETURN_IF_ERROR(load.small_f32(p + "post_attention_layernorm.weight", &gl.ffn_norm));
    if (c.attention_bias) {
      std::vector<float> bias;
      for (LinearRole r : {LinearRole::kQ, LinearRole::kK, LinearRole::kV}) {
        Tensor t;
        LLMQ_RETURN_IF_ERROR(ckpt->read_f32(module(r) + ".bias", &t));
        bias.insert(bias.end(), t.data_as<float>(), t.data_as<float>() + t.numel());
      }
      LLMQ_RETURN_IF_ERROR(DeviceAllocation::upload(bias.data(), static_cast<int64_t>(bias.size() * 4), p + "qkv.bias",
                                                    &gl.qkv_bias));
      if (family_layout(c).o_bias) LLMQ_RETURN_IF_ERROR(load.small_f32(module(LinearRole::kO) + ".bias", &gl.o_bias));
    }
    if (c.qk_norm) {
      LLMQ_RETURN_IF_ERROR(load.small_f32(p + "self_attn.q_norm.weight", &gl.q_norm));
      LLMQ_RETURN_IF_ERROR(load.small_f32(p + "self_attn.k_norm.weight", &gl.k_norm));
    }
    if (c.attention_sinks) LLMQ_RETURN_IF_ERROR(load.small_f32(p + "self_attn.sinks", &gl.sinks));
    LLMQ_RETURN_IF_ERROR(load.linear(runtime::layer_name(l, "qkv"),
                                     {module(LinearRole::kQ) + ".weight", module(LinearRole::kK) + ".weight",
                                      module(LinearRole::kV) + ".weight"},
                                     &gl.qkv));
    LLMQ_RETURN_IF_ERROR(load.linear(runtime::layer_name(l, "o_proj"), {module(LinearRole::kO) + ".weight"}, &gl.o));
    if (c.is_moe()) {
      LLMQ_RETURN_IF_ERROR(load_moe(load, c, l, &gl.moe));
    } else {
      LLMQ_RETURN_IF_ERROR(load.linear(runtime::layer_name(l, "gate_up"),
                                       {module(LinearRole::kGate) + ".weight", module(LinearRole::kUp) + ".weight"}, &gl.gate_up));
      LLMQ_RETURN_IF_ERROR(load.linear(runtime::layer_name(l, "down_proj"), {module(LinearRole::kDown) + ".weight"}, &gl.down));
    }
    LLMQ_RETURN_IF_ERROR(runtime::shard_layer(c, tp, &gl));
    g.layers.push_back(std::move(gl));
  }
  LLMQ_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  if (progress) progress(c.n_layers, c.n_layers, "loaded");
  *out = std::move(m);
  return {};
}

}  // namespace llmq
