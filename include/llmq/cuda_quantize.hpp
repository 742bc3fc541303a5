// cuda_quantize: the CUDA version of llmq::quantize, bit for bit equal to the CPU reference
// (codes, scales and the clip count) for every granularity, FP8 format, INT8, input dtype and
// rounding mode it accepts. No CUDA headers here: the stream is llmq::CudaStream.
//
// Lifecycle (CUTLASS style): cuda_quantize_workspace_bytes(problem) and
// cuda_quantize_can_implement(problem) -> a Status saying why not; then cuda_quantize(..., options)
// as often as needed. It allocates nothing and never synchronizes: everything it needs beyond the
// tensors comes from the caller (workspace, stream), so it can be called in a loop or captured in
// a CUDA graph.
//
// What runs (details in src/cuda/quantize_kernels.cu; the rounding mode is compiled into each
// kernel instance, so RNE kernels carry no Philox code):
//  * dynamic per-token / per-channel / per-group / per-block scales: one pass, x read once (each
//    scale block is held in registers while its absmax is reduced);
//  * dynamic per-tensor: a partial-absmax pass, then quantize (x read twice, the second pass
//    backwards so that it starts on the tail of x the first pass left in L2; one pass when the
//    tensor is small enough for one CTA);
//  * static scales (and ScaleMethod::kUnit): one elementwise pass.
// Rows with cols % 16 == 0 and 16-byte aligned pointers use 16-byte vector loads and stores;
// anything else runs correct but slower scalar kernels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "llmq/cuda_stream.hpp"
#include "llmq/quant_spec.hpp"
#include "llmq/status.hpp"
#include "llmq/tensor.hpp"

namespace llmq {

struct CudaQuantizeOptions {
  // Optional SmoothQuant divisor, device float32 [cols], finite and > 0 (not checked on the
  // device): x is divided by it first (x / d, as the CPU does), and dynamic scales are measured on
  // the divided values.
  const float* smooth_divisor = nullptr;
  // Optional device counter, atomically incremented (never reset) by the number of elements that
  // clipped: QuantizedTensor::clipped of the reference (FP8: exceeds_range, i.e. round-to-nearest
  // would carry past max, Inf included, NaN not; INT8: the rounded value fell outside [-128, 127]).
  unsigned long long* clip_count = nullptr;
  // Device scratch of at least cuda_quantize_workspace_bytes(rows, cols, spec) bytes (4-byte
  // aligned); need not be zeroed. Only dynamic per-tensor specs need any.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  CudaStream stream = nullptr;  // nullptr: the legacy default stream
  // Ask the driver about every pointer (one cudaPointerGetAttributes each) and fail with
  // kInvalidArgument for host memory or another device's memory. Off by default: cuda_quantize
  // takes every pointer to be device (or managed) memory of the current device, as documented
  // below, and spends no host time verifying it; turn it on while debugging, or call
  // cuda_quantize_can_implement once up front, which always checks.
  bool check_pointers = false;
};

// Bytes of workspace cuda_quantize needs for this problem (0 for most specs).
size_t cuda_quantize_workspace_bytes(int64_t rows, int64_t cols, const QuantSpec& spec);

// Whether cuda_quantize can run this problem, and if not why. Arguments:
//  x       device tensor, F32 / BF16 / F16, read as a matrix [rows, cols] (rank 1 is [1, n];
//          leading dimensions flatten into rows); rows may be strided, columns must be contiguous.
//  spec    any granularity; formats e4m3, e5m2, e4m3_ieee, e4m3fnuz, e5m2fnuz, int8; RNE or
//          stochastic rounding (Philox counter r * cols + c, key spec.seed); dynamic absmax or unit
//          scales with any scale rounding, or static scales. Not supported (kUnsupported): int4,
//          asymmetric (zero-point) specs, dynamic MSE search, more than 32 hardware scales.
//  q       device tensor of dtype spec.format, contiguous, the shape of x.
//  scales  device F32, contiguous, [scale_rows, scale_cols] (or rank 1 of that many elements):
//          written for dynamic specs, read for static ones (finite and > 0, not checked).
// Also checks that the pointers (x, q, scales, and the non-null pointers of `options`) are device
// (or managed) memory of the current device, and for FP8 formats that the device is sm_89 or
// newer.
Status cuda_quantize_can_implement(const TensorView& x, const QuantSpec& spec, const TensorView& q,
                                   const TensorView& scales, const CudaQuantizeOptions& options = {});

// Quantize x into q (codes) and scales, on options.stream, asynchronously.
//
// The per-call host work is the shape and spec checks above (no allocation, no system call) and
// one kernel launch (two for large dynamic per-tensor problems). x.data, q.data, scales.data and
// the pointers in `options` must be device (or managed) memory of the current device: that is not
// verified here unless options.check_pointers is set (cuda_quantize_can_implement verifies it); a
// host pointer makes the kernel fault. The device's FP8 support is checked once per device.
//
// Where the CPU reference returns an error about the data it cannot see in advance (dynamic
// scales of a block containing +-Inf, or a scale that overflows float32), this writes that
// block's scale as computed (+Inf for an Inf block, whose codes are then those of x * 0: signed
// zeros, and NaN for the Inf elements) instead; check the scales if such data is possible.
Status cuda_quantize(const TensorView& x, const QuantSpec& spec, const TensorView& q,
                     const TensorView& scales, const CudaQuantizeOptions& options = {});

}  // namespace llmq
