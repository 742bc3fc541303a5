// The quantization API (RFC 0003, generalised): compute_scale / quantize / dequantize over a tensor
// view and a QuantSpec. CPU reference implementations; the CUDA kernels match them bit for bit.
#pragma once

#include <cstdint>

#include "llmq/quant_spec.hpp"
#include "llmq/status.hpp"
#include "llmq/tensor.hpp"

namespace llmq {

// Scales of one tensor: float32 [scale_rows, scale_cols] and, for asymmetric integer formats,
// int32 zero points of the same shape. Dequantized value = (q - zero_point) * scale.
struct ScaleSet {
  Tensor scales;
  Tensor zero_points;  // empty when symmetric
  BlockShape block;    // the block each scale covers
  int64_t scale_rows() const { return scales.shape().empty() ? 0 : scales.shape()[0]; }
  int64_t scale_cols() const { return scales.shape().size() < 2 ? 0 : scales.shape()[1]; }
  float scale(int64_t r, int64_t c) const;  // scale of element (r, c)
  int32_t zero_point(int64_t r, int64_t c) const;
};

struct QuantizedTensor {
  Tensor data;  // format dtype, [rows, cols] (INT4 packed along cols)
  ScaleSet scales;
  QuantSpec spec;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t clipped = 0;  // elements whose scaled magnitude exceeded r_q and saturated
  int64_t nan_count = 0;  // NaN inputs (FP8 keeps them NaN; integers store 0)
};

// Scales from the data in `x` (F32/F64/BF16/F16) for `spec` (method, backoff, rounding, floor).
// NaN elements are ignored by absmax; +-Inf makes the block's absmax Inf, which is an error
// ("x: block (r, c) contains Inf") because no finite scale represents it.
Status compute_scale(const TensorView& x, const QuantSpec& spec, ScaleSet* out);

// Quantize with dynamic scales (computed here) or static ones (spec.source == kStatic and
// `static_scales` given; a static spec without scales, or per-token static, is an error).
// `smooth_divisor` (optional, length cols) divides each column first: the fused SmoothQuant step.
Status quantize(const TensorView& x, const QuantSpec& spec, QuantizedTensor* out,
                const ScaleSet* static_scales = nullptr, const float* smooth_divisor = nullptr);

// Dequantize into `out` (F32, F64, BF16 or F16, shape [rows, cols]).
Status dequantize(const QuantizedTensor& q, const TensorView& out);

// Read one quantized element as a real number in the scaled domain (q - zp), without the scale.
double quantized_value(const QuantizedTensor& q, int64_t r, int64_t c);

}  // namespace llmq
