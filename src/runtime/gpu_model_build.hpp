// The pieces GpuModel's loaders share (gpu_model.cu defines them; checkpoint_loader.cu uses them
// too): the "does it fit" check, uploads, and quantizing a weight on the device.
#pragma once

#include <string>
#include <vector>

#include "llmq/model.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/scheme.hpp"
#include "llmq/tensor.hpp"
#include "cuda/device_memory.hpp"
#include "runtime/linear.hpp"

namespace llmq::runtime {

// Why an F32 MoE model is refused on the GPU.
extern const char* const kMoeNotF32;

// Whether the device quantizes a scheme's weights itself (absmax scales; SmoothQuant needs
// calibration statistics, MSE-searched scales the host search): what the synthetic and checkpoint
// routes take, and what GpuModel::load sends to the host otherwise.
inline bool weights_quantize_on_device(const Scheme& s) {
  return s.smooth_alpha < 0.0f && s.weight.method == ScaleMethod::kAbsmax;
}
// What from_checkpoint quantizes while it streams: such weights, with dynamic activations, or with
// static per-tensor activation scales when calibration statistics are given (`have_stats`) and the
// model is dense (an MoE expert no calibration token reached has no scale, and the host route gives
// it a dynamic one). GpuModel::load sends every other scheme through the host.
inline bool scheme_streams_from_checkpoint(const Scheme& s, bool have_stats = false, bool moe = false) {
  if (!weights_quantize_on_device(s)) return false;
  if (!s.needs_statistics()) return true;
  return have_stats && !moe && s.quantize_activations && s.activation.source == ScaleSource::kStatic &&
         s.activation.granularity == Granularity::kPerTensor;
}
Status check_config(const ModelConfig& c);
// Device bytes of the weights (linears BF16 or 8-bit, embeddings and lm_head BF16).
int64_t model_bytes(const ModelConfig& c, bool bf16_linears);
// An error with the bytes needed and free when the weights cannot fit on the current device.
Status check_fits(const ModelConfig& c, bool bf16_linears, const std::string& precision);
std::string layer_name(int64_t layer, const char* what);  // "layers.3.qkv"
Status upload_f32(const Tensor& t, const std::string& what, DeviceAllocation* out);
// float32 host values to the device as `dtype` (kF32 or kBF16, round to nearest even).
Status upload_as(const float* data, int64_t count, DType dtype, const std::string& what, DeviceAllocation* out);
// The activation side of a linear under a dynamic scheme (static schemes get 8/448 per tensor).
Status scheme_act_mode(const Scheme& s, const std::string& name, GpuLinear* out);
// x: device [n, k] (F32, BF16 or F16) quantized by cuda_quantize under `ws` (bit for bit the CPU
// quantize of the same values) into part's codes and per-channel (per-tensor expanded) or 128x128
// block scales.
Status quantize_part_on_device(const std::string& name, const TensorView& x, const QuantSpec& ws, LinearPart* part);
// The activation side of a stored quantized linear (its input spec and static scale).
Status act_mode(const QuantizedLinear& ql, const std::string& name, GpuLinear* out);
// A stored weight's scales as the runtime keeps them: per-channel [n] (per-tensor expanded) or
// 128x128 blocks.
Status weight_scales(const QuantizedTensor& w, const std::string& name, WeightScale* kind, std::vector<float>* out);
Status finish_block_part(LinearPart* part, int64_t k, const std::vector<float>& scales, const std::string& name);

}  // namespace llmq::runtime
