// QuantSpec validation, block shapes and names.
#include "llmq/quant_spec.hpp"

#include <cmath>
#include <sstream>

namespace llmq {

QuantSpec QuantSpec::per_tensor(DType format) {
  QuantSpec s;
  s.format = format;
  s.granularity = Granularity::kPerTensor;
  return s;
}
QuantSpec QuantSpec::per_token(DType format) {
  QuantSpec s = per_tensor(format);
  s.granularity = Granularity::kPerToken;
  return s;
}
QuantSpec QuantSpec::per_channel(DType format) {
  QuantSpec s = per_tensor(format);
  s.granularity = Granularity::kPerChannel;
  return s;
}
QuantSpec QuantSpec::per_block(DType format, int64_t block_rows, int64_t block_cols) {
  QuantSpec s = per_tensor(format);
  s.granularity = Granularity::kPerBlock;
  s.block_rows = block_rows;
  s.block_cols = block_cols;
  return s;
}
QuantSpec QuantSpec::per_group(DType format, int64_t group_size) {
  QuantSpec s = per_tensor(format);
  s.granularity = Granularity::kPerGroup;
  s.group_size = group_size;
  return s;
}

const char* granularity_name(Granularity g) {
  switch (g) {
    case Granularity::kPerTensor: return "per-tensor";
    case Granularity::kPerToken: return "per-token";
    case Granularity::kPerChannel: return "per-channel";
    case Granularity::kPerInputChannel: return "per-input-channel";
    case Granularity::kPerBlock: return "per-block";
    case Granularity::kPerGroup: return "per-group";
  }
  return "?";
}

const char* scale_method_name(ScaleMethod m) {
  switch (m) {
    case ScaleMethod::kAbsmax: return "absmax";
    case ScaleMethod::kUnit: return "unit";
    case ScaleMethod::kMseSearch: return "mse";
  }
  return "?";
}

Status validate_spec(const QuantSpec& spec) {
  if (!is_quantized(spec.format))
    return invalid_argument(std::string("spec.format: ") + dtype_name(spec.format) +
                            " is not a quantized format (e4m3, e4m3_ieee, e5m2, e4m3fnuz, e5m2fnuz, int8, int4)");
  if (!(spec.backoff > 0.0f && spec.backoff <= 1.0f))
    return invalid_argument("spec.backoff: must be in (0, 1], got " + std::to_string(spec.backoff));
  if (!(spec.min_scale >= 0.0f) || std::isinf(spec.min_scale))
    return invalid_argument("spec.min_scale: must be finite and >= 0, got " + std::to_string(spec.min_scale));
  if (spec.granularity == Granularity::kPerBlock && (spec.block_rows <= 0 || spec.block_cols <= 0))
    return invalid_argument("spec.block_rows/block_cols: must be positive, got " +
                            std::to_string(spec.block_rows) + " x " + std::to_string(spec.block_cols));
  if (spec.granularity == Granularity::kPerGroup && spec.group_size <= 0)
    return invalid_argument("spec.group_size: must be positive, got " + std::to_string(spec.group_size));
  if (spec.pow2_min_exp > spec.pow2_max_exp || spec.pow2_min_exp < -149 || spec.pow2_max_exp > 127)
    return invalid_argument("spec.pow2_min_exp/pow2_max_exp: need -149 <= min <= max <= 127");
  const bool needs_set = spec.scale_rounding == ScaleRounding::kHardwareSet ||
                         (spec.method == ScaleMethod::kMseSearch && spec.candidates == CandidateSet::kHardwareSet);
  if (needs_set && spec.hardware_scales.empty())
    return invalid_argument("spec.hardware_scales: empty, but the spec rounds to or searches a hardware scale set");
  for (float s : spec.hardware_scales)
    if (!(s > 0.0f) || std::isinf(s))
      return invalid_argument("spec.hardware_scales: every scale must be finite and > 0, got " + std::to_string(s));
  for (float s : spec.explicit_candidates)
    if (!(s > 0.0f) || std::isinf(s))
      return invalid_argument("spec.explicit_candidates: every scale must be finite and > 0, got " + std::to_string(s));
  if (spec.method == ScaleMethod::kMseSearch && spec.candidates == CandidateSet::kGrid &&
      (spec.grid_points < 1 || !(spec.grid_min > 0.0f && spec.grid_min <= 1.0f)))
    return invalid_argument("spec.grid_points/grid_min: need grid_points >= 1 and grid_min in (0, 1]");
  if (!spec.symmetric && is_fp8(spec.format))
    return invalid_argument("spec.symmetric: asymmetric (zero-point) quantization is for int8/int4 only");
  if (!spec.symmetric && spec.method == ScaleMethod::kMseSearch)
    return unsupported("spec.method: MSE search is implemented for symmetric scales only");
  if (spec.source == ScaleSource::kStatic && spec.granularity == Granularity::kPerToken)
    return invalid_argument("spec.source: static scales cannot be per-token (tokens are unknown at calibration)");
  return {};
}

Status resolve_block_shape(const QuantSpec& spec, int64_t rows, int64_t cols, BlockShape* out) {
  LLMQ_RETURN_IF_ERROR(validate_spec(spec));
  const int64_t all_rows = std::max<int64_t>(rows, 1), all_cols = std::max<int64_t>(cols, 1);
  BlockShape b;
  switch (spec.granularity) {
    case Granularity::kPerTensor: b = {all_rows, all_cols}; break;
    case Granularity::kPerToken:
    case Granularity::kPerChannel: b = {1, all_cols}; break;
    case Granularity::kPerInputChannel: b = {all_rows, 1}; break;
    case Granularity::kPerBlock: b = {spec.block_rows, spec.block_cols}; break;
    case Granularity::kPerGroup:
      if (cols % spec.group_size != 0)
        return invalid_argument("spec.group_size: " + std::to_string(spec.group_size) +
                                " does not divide the " + std::to_string(cols) + " columns (K)");
      b = {1, spec.group_size};
      break;
  }
  if (spec.format == DType::kI4 && cols % 2 != 0)
    return invalid_argument("x: int4 packs two values per byte, so cols must be even, got " + std::to_string(cols));
  *out = b;
  return {};
}

float effective_min_scale(const QuantSpec& spec) {
  if (spec.min_scale > 0.0f) return spec.min_scale;
  return static_cast<float>(1.0 / (format_info(spec.format).max_finite * 512.0));
}

std::string describe(const QuantSpec& spec) {
  std::ostringstream os;
  os << dtype_name(spec.format) << " " << granularity_name(spec.granularity);
  if (spec.granularity == Granularity::kPerBlock) os << " " << spec.block_rows << "x" << spec.block_cols;
  if (spec.granularity == Granularity::kPerGroup) os << " g" << spec.group_size;
  os << " " << scale_method_name(spec.method);
  if (spec.backoff != 1.0f) os << " beta=" << spec.backoff;
  if (spec.scale_rounding == ScaleRounding::kPowerOfTwo) os << " pow2";
  if (spec.scale_rounding == ScaleRounding::kHardwareSet) os << " hw-set";
  if (!spec.symmetric) os << " asym";
  os << (spec.source == ScaleSource::kStatic ? " static" : " dynamic");
  if (spec.rounding == Rounding::kStochastic) os << " stochastic";
  return os.str();
}

}  // namespace llmq
