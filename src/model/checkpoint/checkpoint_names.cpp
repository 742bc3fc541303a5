// The on-disk names and scale shapes of quantized linears (see checkpoint_names.hpp): the writer's
// table and the readers' one lookup.
#include "model/checkpoint/checkpoint_names.hpp"

#include <cmath>

#include "core/int_math.hpp"  // ceil_div: weight_block_size may be near INT64_MAX

namespace llmq {
namespace {

std::string where(const Checkpoint& ckpt, const std::string& name) { return ckpt.dir() + ": tensor '" + name + "': "; }

// [], [1], [1, 1]: one value for the whole tensor.
bool is_scalar_shape(const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;  // each d is 1 when numel stays 1 (0 ends it at 0)
  return numel == 1 && shape.size() <= 2;
}

}  // namespace

std::string attention_module_name(const ModelConfig& config, int64_t layer) {
  LinearId q;
  q.layer = layer;
  q.role = LinearRole::kQ;
  const std::string name = q.hf_name(config);
  return name.substr(0, name.rfind('.'));
}

const char* scale_layout_name(ScaleLayout layout) {
  switch (layout) {
    case ScaleLayout::kTensor: return "per-tensor";
    case ScaleLayout::kChannel: return "per-channel";
    case ScaleLayout::kBlock: return "block";
  }
  return "?";
}

const char* quant_method_name(ExportFormat format) {
  for (const WrittenLinear& w : kWrittenLinears)
    if (w.format == format) return w.quant_method;
  return "";
}

Status scale_layout_of(const QuantSpec& weight, ScaleLayout* out) {
  switch (weight.granularity) {
    case Granularity::kPerTensor: *out = ScaleLayout::kTensor; return {};
    case Granularity::kPerChannel: *out = ScaleLayout::kChannel; return {};
    case Granularity::kPerBlock: *out = ScaleLayout::kBlock; return {};
    default: break;
  }
  return unsupported("no checkpoint format holds weight scales of this granularity (tensor, channel or block)");
}

std::vector<int64_t> written_scale_shape(ScaleLayout layout, int64_t n, int64_t k, int64_t block_rows,
                                         int64_t block_cols) {
  switch (layout) {
    case ScaleLayout::kTensor: return {1};
    case ScaleLayout::kChannel: return {n, 1};
    case ScaleLayout::kBlock: break;
  }
  return {ceil_div(n, block_rows), ceil_div(k, block_cols)};
}

Status written_linear_tensors(ExportFormat format, const QuantSpec& weight, bool static_input,
                              const std::string& module, int64_t n, int64_t k, std::vector<DiskTensor>* out) {
  ScaleLayout layout;
  LLMQ_RETURN_IF_ERROR(scale_layout_of(weight, &layout));
  for (const WrittenLinear& w : kWrittenLinears) {
    if (w.format != format || w.layout != layout) continue;
    if (static_input && !w.static_input)
      return unsupported(std::string("quant_method '") + w.quant_method + "' with " + scale_layout_name(layout) +
                         " weights carries no static input scale");
    out->clear();
    out->push_back({module + kWeightSuffix, weight.format, {n, k}});
    out->push_back({module + w.scale_suffix, DType::kF32,
                    written_scale_shape(layout, n, k, weight.block_rows, weight.block_cols)});
    if (static_input) out->push_back({module + kInputScaleSuffix, DType::kF32, {1}});
    return {};
  }
  return unsupported(std::string("no checkpoint format writes ") + scale_layout_name(layout) + " weights as quant_method '" +
                     quant_method_name(format) + "'");
}

Status classify_weight_scale(const WeightScaleName& name, const std::string& tensor_name,
                             const std::vector<int64_t>& shape, int64_t n, int64_t k, int64_t block_rows,
                             int64_t block_cols, ScaleLayout* out) {
  const int64_t grid_rows = ceil_div(n, block_rows), grid_cols = ceil_div(k, block_cols);
  if (name.tensor && is_scalar_shape(shape)) {
    *out = ScaleLayout::kTensor;
  } else if (name.channel && ((shape.size() == 1 && shape[0] == n) || (shape.size() == 2 && shape[0] == n && shape[1] == 1))) {
    *out = ScaleLayout::kChannel;
  } else if (name.block && shape.size() == 2 && shape[0] == grid_rows && shape[1] == grid_cols) {
    *out = ScaleLayout::kBlock;
  } else {
    std::string expected;
    if (name.tensor) expected += "[], [1], [1, 1], ";
    if (name.channel) expected += "[" + std::to_string(n) + "], [" + std::to_string(n) + ", 1], ";
    if (name.block)
      expected += shape_string({grid_rows, grid_cols}) + " (" + std::to_string(block_rows) + "x" +
                  std::to_string(block_cols) + " blocks)";
    return invalid_argument("tensor '" + tensor_name + "': shape " + shape_string(shape) +
                            " fits no scale layout of weight " + shape_string({n, k}) + ": expected " + expected);
  }
  return {};
}

Status find_weight_scale(const Checkpoint& ckpt, const std::string& module, int64_t n, int64_t k,
                         int64_t block_rows, int64_t block_cols, FoundWeightScale* out) {
  const WeightScaleName* found = nullptr;
  std::string names;  // every candidate, for the messages
  for (const WeightScaleName& s : kWeightScaleNames) {
    names += (names.empty() ? "" : " nor ") + module + s.suffix;
    if (ckpt.find(module + s.suffix) == nullptr) continue;
    if (found != nullptr)
      return invalid_argument(where(ckpt, module + s.suffix) + "both " + module + found->suffix + " and " + module +
                              s.suffix + " exist; engines differ on which one wins, so the file is ambiguous");
    found = &s;
  }
  const std::string weight_name = module + kWeightSuffix;
  if (found == nullptr) {
    const SafetensorsTensorInfo* w = ckpt.find(weight_name);
    return invalid_argument(where(ckpt, weight_name) + "stored as " +
                            (w != nullptr ? safetensors_dtype_name(w->dtype) : "8 bits") + " but neither " + names +
                            " exists");
  }
  FoundWeightScale f;
  f.name = module + found->suffix;
  f.info = ckpt.find(f.name);
  if (!is_high_precision(f.info->dtype))
    return invalid_argument(where(ckpt, f.name) + "scales must be F32/F64/F16/BF16, got " +
                            safetensors_dtype_name(f.info->dtype));
  if (Status st = classify_weight_scale(*found, f.name, f.info->shape, n, k, block_rows, block_cols, &f.layout); !st.ok())
    return Status(st.code(), ckpt.dir() + ": " + st.message());
  *out = std::move(f);
  return {};
}

Status read_weight_scale(const Checkpoint& ckpt, const FoundWeightScale& found, Tensor* out) {
  Tensor s;
  LLMQ_RETURN_IF_ERROR(ckpt.read_f32(found.name, &s));
  const float* p = s.data_as<float>();
  for (int64_t i = 0; i < s.numel(); ++i)
    if (!std::isfinite(p[i]))
      return invalid_argument(where(ckpt, found.name) + "element " + std::to_string(i) + " is not finite");
  *out = std::move(s);
  return {};
}

Status read_input_scale(const Checkpoint& ckpt, const std::string& module, float* out) {
  const std::string name = module + kInputScaleSuffix;
  const SafetensorsTensorInfo* info = ckpt.find(name);
  if (info == nullptr) return invalid_argument(ckpt.dir() + ": missing " + name);
  if (!is_high_precision(info->dtype))
    return invalid_argument(where(ckpt, name) + "scales must be F32/F64/F16/BF16, got " +
                            safetensors_dtype_name(info->dtype));
  // Per tensor only: taking the first of several values would be a guess.
  if (!is_scalar_shape(info->shape))
    return invalid_argument(where(ckpt, name) + "shape " + shape_string(info->shape) +
                            " is not one per-tensor value: expected [], [1] or [1, 1]");
  Tensor s;
  LLMQ_RETURN_IF_ERROR(ckpt.read_f32(name, &s));
  const float v = s.data_as<float>()[0];
  if (!std::isfinite(v)) return invalid_argument(where(ckpt, name) + "is not finite");
  *out = v;
  return {};
}

}  // namespace llmq
