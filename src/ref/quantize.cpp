// CPU reference of quantize / dequantize: the specification the CUDA quantize kernels match bit
// for bit. Per element: v = x * (1 / s) in float32 (after the optional SmoothQuant division),
// then the saturating conversion of llmq/format.hpp (RNE or stochastic), then for integers + zp.
#include "llmq/quantize_tensor.hpp"

#include <cmath>
#include <string>

#include "core/element.hpp"

namespace llmq {

float ScaleSet::scale(int64_t r, int64_t c) const {
  return scales.data_as<float>()[(r / block.rows) * scale_cols() + c / block.cols];
}

int32_t ScaleSet::zero_point(int64_t r, int64_t c) const {
  if (zero_points.numel() == 0 || zero_points.shape().empty()) return 0;
  return zero_points.data_as<int32_t>()[(r / block.rows) * scale_cols() + c / block.cols];
}

namespace {

Status check_static_scales(const ScaleSet& s, const BlockShape& block, int64_t rows, int64_t cols,
                           const QuantSpec& spec) {
  const int64_t want_r = std::max<int64_t>((rows + block.rows - 1) / block.rows, 1);
  const int64_t want_c = std::max<int64_t>((cols + block.cols - 1) / block.cols, 1);
  if (s.scales.dtype() != DType::kF32 || s.scale_rows() != want_r || s.scale_cols() != want_c ||
      s.block.rows != block.rows || s.block.cols != block.cols)
    return invalid_argument("static_scales: expected float32 [" + std::to_string(want_r) + ", " +
                            std::to_string(want_c) + "] over " + std::to_string(block.rows) + "x" +
                            std::to_string(block.cols) + " blocks for " + describe(spec));
  const float* p = s.scales.data_as<float>();
  for (int64_t i = 0; i < want_r * want_c; ++i)
    if (!(p[i] > 0.0f) || std::isinf(p[i]))
      return invalid_argument("static_scales: scale " + std::to_string(i) + " is " +
                              std::to_string(p[i]) + "; scales must be finite and > 0");
  if (!spec.symmetric && s.zero_points.numel() != want_r * want_c)
    return invalid_argument("static_scales: an asymmetric spec needs zero_points of the scales' shape");
  return {};
}

// Store code q of element (r, c) into the output buffer of `format`.
void store_code(Tensor* data, DType format, int64_t cols, int64_t r, int64_t c, int32_t q) {
  const int64_t i = r * cols + c;
  if (format == DType::kI4) {
    uint8_t& byte = data->data_as<uint8_t>()[i / 2];
    const uint8_t nibble = static_cast<uint8_t>(static_cast<uint32_t>(q) & 0xFu);
    byte = (i % 2 == 0) ? static_cast<uint8_t>((byte & 0xF0u) | nibble)
                        : static_cast<uint8_t>((byte & 0x0Fu) | (nibble << 4));
  } else if (format == DType::kI8) {
    data->data_as<int8_t>()[i] = static_cast<int8_t>(q);
  } else {
    data->data_as<uint8_t>()[i] = static_cast<uint8_t>(q);
  }
}

int32_t load_code(const QuantizedTensor& q, int64_t r, int64_t c) {
  const int64_t i = r * q.cols + c;
  switch (q.spec.format) {
    case DType::kI4: return unpack_int4(q.data.data_as<uint8_t>()[i / 2], static_cast<int>(i % 2));
    case DType::kI8: return q.data.data_as<int8_t>()[i];
    default: return q.data.data_as<uint8_t>()[i];
  }
}

}  // namespace

Status quantize(const TensorView& x, const QuantSpec& spec, QuantizedTensor* out,
                const ScaleSet* static_scales, const float* smooth_divisor) {
  if (out == nullptr) return invalid_argument("out: null");
  MatrixView m;
  LLMQ_RETURN_IF_ERROR(as_matrix(x, "x", &m));
  if (!is_high_precision(m.dtype))
    return invalid_argument(std::string("x: dtype ") + dtype_name(m.dtype) +
                            " cannot be quantized; expected f32, f64, bf16 or f16");
  BlockShape block;
  LLMQ_RETURN_IF_ERROR(resolve_block_shape(spec, m.rows, m.cols, &block));
  if (smooth_divisor != nullptr)
    for (int64_t c = 0; c < m.cols; ++c)
      if (!(smooth_divisor[c] > 0.0f) || std::isinf(smooth_divisor[c]))
        return invalid_argument("smooth_divisor: element " + std::to_string(c) + " is " +
                                std::to_string(smooth_divisor[c]) + "; must be finite and > 0");

  QuantizedTensor q;
  q.spec = spec;
  q.rows = m.rows;
  q.cols = m.cols;
  if (spec.source == ScaleSource::kStatic) {
    if (static_scales == nullptr)
      return invalid_argument("static_scales: the spec is static (calibrated) but no scales were given");
    LLMQ_RETURN_IF_ERROR(check_static_scales(*static_scales, block, m.rows, m.cols, spec));
    q.scales = *static_scales;
  } else {
    if (static_scales != nullptr)
      return invalid_argument("static_scales: given, but the spec is dynamic; set spec.source = kStatic");
    if (smooth_divisor == nullptr) {
      LLMQ_RETURN_IF_ERROR(compute_scale(x, spec, &q.scales));
    } else {
      // Dynamic scales are measured on the smoothed values the quantizer will actually see.
      Tensor smoothed(DType::kF32, {m.rows, m.cols});
      float* s = smoothed.data_as<float>();
      for (int64_t r = 0; r < m.rows; ++r)
        for (int64_t c = 0; c < m.cols; ++c) s[r * m.cols + c] = load_float(m, r, c) / smooth_divisor[c];
      LLMQ_RETURN_IF_ERROR(compute_scale(smoothed.view(), spec, &q.scales));
    }
  }

  q.data = Tensor(spec.format, {m.rows, m.cols});
  // One reciprocal per block, exactly as the kernels hold it in a register.
  const int64_t scale_count = q.scales.scales.numel();
  std::vector<float> inverse(static_cast<size_t>(scale_count));
  for (int64_t i = 0; i < scale_count; ++i)
    inverse[static_cast<size_t>(i)] = detail::reciprocal(q.scales.scales.data_as<float>()[i]);

  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) {
      float xv = load_float(m, r, c);
      if (smooth_divisor != nullptr) xv = xv / smooth_divisor[c];
      if (std::isnan(xv)) ++q.nan_count;
      const int64_t si = (r / block.rows) * q.scales.scale_cols() + c / block.cols;
      const float v = xv * inverse[static_cast<size_t>(si)];
      const uint32_t random_bits = spec.rounding == Rounding::kStochastic
                                       ? philox_random_u32(spec.seed, static_cast<uint64_t>(r * m.cols + c))
                                       : 0u;
      bool clipped = false;
      const int32_t code = detail::encode_scaled(v, spec.format, q.scales.zero_point(r, c),
                                                 spec.rounding, random_bits, &clipped);
      q.clipped += clipped ? 1 : 0;
      store_code(&q.data, spec.format, m.cols, r, c, code);
    }
  }
  *out = std::move(q);
  return {};
}

double quantized_value(const QuantizedTensor& q, int64_t r, int64_t c) {
  return detail::decode_scaled(load_code(q, r, c), q.spec.format, q.scales.zero_point(r, c));
}

Status dequantize(const QuantizedTensor& q, const TensorView& out) {
  if (out.device != Device::kCpu) return invalid_argument("out: must be a host tensor, got " + out.describe());
  if (!is_high_precision(out.dtype))
    return invalid_argument(std::string("out: dtype ") + dtype_name(out.dtype) +
                            " is not f32, f64, bf16 or f16");
  MatrixView m;
  LLMQ_RETURN_IF_ERROR(as_matrix(out, "out", &m));
  if (m.rows != q.rows || m.cols != q.cols)
    return invalid_argument("out: shape " + out.describe() + " does not match the quantized [" +
                            std::to_string(q.rows) + ", " + std::to_string(q.cols) + "]");
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t c = 0; c < q.cols; ++c) {
      // (q - zp) * s in float32: the product the GEMM epilogue and dequantize kernels compute.
      const float v = static_cast<float>(quantized_value(q, r, c)) * q.scales.scale(r, c);
      const int64_t i = r * m.row_stride + c * m.col_stride;
      void* base = const_cast<void*>(m.data);
      switch (m.dtype) {
        case DType::kF32: static_cast<float*>(base)[i] = v; break;
        case DType::kF64: static_cast<double*>(base)[i] = v; break;
        case DType::kBF16: static_cast<uint16_t*>(base)[i] = float_to_bf16_bits(v); break;
        case DType::kF16: static_cast<uint16_t*>(base)[i] = float_to_fp16_bits(v); break;
        default: break;
      }
    }
  }
  return {};
}

}  // namespace llmq
