// quantized_gemm: C[M, N] = A[M, K] * B[N, K]^T (+ bias[N]), the scaled 8-bit GEMM of Figure 3 of
// the FP8 paper. A is activations, B is weights in nn.Linear layout. Either operand may be
// quantized (any granularity, FP8 or INT8) or high precision (W8A16: A in BF16/F16/F32).
//
// Accumulation follows the hardware: K is split into segments on which both operands' scales are
// constant (the whole of K for tensor/token/channel scales, 128-wide pieces for 1x128 and 128x128
// blocks, g-wide for groups, single elements for per-input-channel scales). Within a segment the
// raw products are summed exactly as the tensor cores do: FP8 products in FP32, INT8 in INT32.
// Each segment's sum is multiplied by scale_a * scale_b (the combined descale) and added to an
// FP32 accumulator. Output is rounded once to BF16 or stored as FP32.
#pragma once

#include "llmq/quantize_tensor.hpp"
#include "llmq/status.hpp"
#include "llmq/tensor.hpp"

namespace llmq {

// One GEMM operand: either a quantized tensor or a high-precision view.
struct GemmOperand {
  const QuantizedTensor* quantized = nullptr;
  TensorView dense;  // used when quantized == nullptr
  static GemmOperand of(const QuantizedTensor& q) { return {&q, {}}; }
  static GemmOperand of(const TensorView& v) { return {nullptr, v}; }
};

struct GemmOptions {
  const float* bias = nullptr;  // length N, added in FP32 after the descale
};

// `out` is F32 or BF16 [M, N]. Errors name the operand ("a", "b", "out", "bias").
Status quantized_gemm(const GemmOperand& a, const GemmOperand& b, const TensorView& out,
                      const GemmOptions& options = {});

// Why a problem cannot run (empty when it can): shape and dtype checks, INT32 overflow bound.
Status gemm_can_implement(const GemmOperand& a, const GemmOperand& b, const TensorView& out);

// Largest K for which an INT8 x INT8 segment sum cannot overflow INT32: (2^31 - 1) / (128 * 128).
inline constexpr int64_t kMaxInt8SegmentK = ((int64_t{1} << 31) - 1) / (128 * 128);

}  // namespace llmq
