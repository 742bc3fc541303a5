// CPU reference of compute_scale: one scale (and, for asymmetric integer specs, one zero point)
// per block of a high-precision matrix, from the spec's method, backoff, floor and rounding.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "core/element.hpp"
#include "llmq/format.hpp"
#include "llmq/quantize_tensor.hpp"
#include "llmq/scale.hpp"

namespace llmq {
namespace {

// Asymmetric: nudging s up by ulps removes the one-code overshoot that float rounding of
// x * (1 / s) can cause at the range ends; one step is enough in practice.
constexpr int kMaxRangeNudges = 8;

struct BlockRange {
  double min = 0.0;
  double max = 0.0;
};

// min / max over a block, NaN ignored, then widened to include 0 so that 0 (padding, ReLU
// zeros) is exactly representable: its code is the zero point itself.
BlockRange block_range(const MatrixView& m, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  BlockRange b;
  for (int64_t r = r0; r < r0 + nr; ++r)
    for (int64_t c = c0; c < c0 + nc; ++c) {
      const double v = static_cast<double>(load_float(m, r, c));
      if (v < b.min) b.min = v;  // comparisons are false for NaN
      if (v > b.max) b.max = v;
    }
  return b;
}

std::string block_name(int64_t br, int64_t bc) {
  return "block (" + std::to_string(br) + ", " + std::to_string(bc) + ")";
}

std::string format_scale(float s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(s));  // to_string prints 1e-40 as 0
  return buf;
}

Status inf_error(int64_t br, int64_t bc) {
  return invalid_argument("x: " + block_name(br, bc) + " contains Inf; no finite scale represents it");
}

// Round-to-nearest-even of v, exactly as detail::encode_scaled rounds an integer target.
double rne(float v) { return std::nearbyint(static_cast<double>(v)); }

// Asymmetric integer scale and zero point: the range [min, max] maps onto [qmin, qmax]
// (backoff leaves headroom at both ends), zero_point = qmin - round(min / s).
void asymmetric_scale(const BlockRange& b, const QuantSpec& spec, float* scale, int32_t* zero_point) {
  const FormatInfo& f = format_info(spec.format);
  const double levels = static_cast<double>(f.qmax - f.qmin);
  float s = 1.0f;
  if (spec.method != ScaleMethod::kUnit) {
    const float floor_scale = effective_min_scale(spec);
    const double exact = (b.max - b.min) / (levels * static_cast<double>(spec.backoff));
    s = exact > static_cast<double>(floor_scale) ? static_cast<float>(exact) : floor_scale;
    // The codes of min and max are round(min / s) + zp and round(max / s) + zp, computed in float
    // as quantize computes them; their distance must fit in qmax - qmin or max would clip.
    const float lo = static_cast<float>(b.min), hi = static_cast<float>(b.max);
    for (int i = 0; i < kMaxRangeNudges && std::isfinite(s); ++i) {
      const float inverse = detail::reciprocal(s);
      if (rne(hi * inverse) - rne(lo * inverse) <= levels) break;
      s = std::nextafter(s, std::numeric_limits<float>::infinity());
    }
    s = round_scale(s, spec);
  }
  // Same float product as quantize, so the block minimum encodes exactly to qmin.
  const double zp = static_cast<double>(f.qmin) - rne(static_cast<float>(b.min) * detail::reciprocal(s));
  *scale = s;
  *zero_point = static_cast<int32_t>(
      std::clamp(zp, static_cast<double>(f.qmin), static_cast<double>(f.qmax)));
}

}  // namespace

Status compute_scale(const TensorView& x, const QuantSpec& spec, ScaleSet* out) {
  if (out == nullptr) return invalid_argument("out: null");
  MatrixView m;
  LLMQ_RETURN_IF_ERROR(as_matrix(x, "x", &m));
  if (!is_high_precision(m.dtype))
    return invalid_argument(std::string("x: dtype ") + dtype_name(m.dtype) +
                            " has no scale to compute; expected f32, f64, bf16 or f16");
  BlockShape block;
  LLMQ_RETURN_IF_ERROR(resolve_block_shape(spec, m.rows, m.cols, &block));

  // (scale_rows, scale_cols): ceil(rows / block_rows) x ceil(cols / block_cols), at least 1 x 1 so
  // that an empty tensor still has a well-formed ScaleSet.
  const int64_t scale_rows = std::max<int64_t>((m.rows + block.rows - 1) / block.rows, 1);
  const int64_t scale_cols = std::max<int64_t>((m.cols + block.cols - 1) / block.cols, 1);
  ScaleSet result;
  result.block = block;
  result.scales = Tensor(DType::kF32, {scale_rows, scale_cols});
  if (!spec.symmetric) result.zero_points = Tensor(DType::kI32, {scale_rows, scale_cols});
  float* scales = result.scales.data_as<float>();

  for (int64_t br = 0; br < scale_rows; ++br) {
    for (int64_t bc = 0; bc < scale_cols; ++bc) {
      // Edge blocks are partial; an empty tensor gives one empty block.
      const int64_t r0 = br * block.rows, c0 = bc * block.cols;
      const int64_t nr = std::clamp<int64_t>(m.rows - r0, 0, block.rows);
      const int64_t nc = std::clamp<int64_t>(m.cols - c0, 0, block.cols);
      float s = 1.0f;
      if (!spec.symmetric) {
        const BlockRange range = block_range(m, r0, nr, c0, nc);
        if (std::isinf(range.min) || std::isinf(range.max)) return inf_error(br, bc);
        int32_t zp = 0;
        asymmetric_scale(range, spec, &s, &zp);
        result.zero_points.data_as<int32_t>()[br * scale_cols + bc] = zp;
      } else if (spec.method != ScaleMethod::kUnit) {
        // kUnit reads no data: its scale is 1 whatever the block holds (Inf then saturates).
        const double absmax = block_absmax(m, r0, nr, c0, nc);
        if (std::isinf(absmax)) return inf_error(br, bc);
        s = spec.method == ScaleMethod::kMseSearch ? mse_optimal_scale(m, r0, nr, c0, nc, spec)
                                                   : absmax_scale(absmax, spec);
        s = round_scale(s, spec);
      }
      // Finite data can still ask for a scale beyond float range (tiny backoff), or one so small
      // its reciprocal overflows (a tiny spec.min_scale): either would turn values into Inf/NaN.
      if (!std::isfinite(s) || !(s > 0.0f) || std::isinf(detail::reciprocal(s)))
        return invalid_argument("x: " + block_name(br, bc) + " gets scale " + format_scale(s) +
                                ", which is not a usable float32 scale (check spec.backoff, "
                                "spec.min_scale and the data's magnitude)");
      scales[br * scale_cols + bc] = s;
    }
  }
  *out = std::move(result);
  return {};
}

}  // namespace llmq
