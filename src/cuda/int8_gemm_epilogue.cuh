// The INT8 GEMM epilogue shared by its kernels: INT32 accumulators -> float32 descale by
// scale_a[m] * scale_b[n] (+ bias[n]) -> BF16, or the raw INT32 sums. Both kernels hold their
// accumulators as pairs of adjacent columns in two rows (r, r + 8), the mma / wgmma fragment shape.
// Internal; CUDA sources only.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace llmq::int8_gemm {

enum class OutputKind { kBf16Scaled, kS32 };

struct EpilogueParams {
  const float* scale_a = nullptr;  // [M], per token
  const float* scale_b = nullptr;  // [N], per output channel
  const float* bias = nullptr;     // [N] or null
  void* d = nullptr;               // [M, N] row-major: BF16 bits (uint16_t) or int32
  int64_t m = 0;
  int64_t n = 0;
  // N even and d aligned for the pair: two adjacent columns go out as one 4-byte (BF16) or
  // 8-byte (INT32) store. Otherwise element by element.
  bool pair_aligned = false;
};

// The descale of src/ref/gemm.cpp, operation for operation: the INT32 sum is rounded to float32
// (RNE), multiplied by the combined descale formed first in float32, added to a float32
// accumulator that starts at +0 (so a -0 product becomes +0, as there), then the bias is added.
// __fmul_rn / __fadd_rn keep the compiler from contracting these into an FMA.
__device__ __forceinline__ float dequantize_acc(int32_t acc, float descale, float bias,
                                                bool has_bias) {
  float v = __fadd_rn(0.0f, __fmul_rn(__int2float_rn(acc), descale));
  if (has_bias) v = __fadd_rn(v, bias);
  return v;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const uint32_t l = __bfloat16_as_ushort(__float2bfloat16_rn(lo));
  const uint32_t h = __bfloat16_as_ushort(__float2bfloat16_rn(hi));
  return l | (h << 16);
}

// Stores columns (col, col + 1) of rows row0 and row1 = row0 + 8 from accumulators
// v00, v01 (row0) and v10, v11 (row1); sa0 / sa1 are the rows' scale_a (unused for INT32 output).
// Out-of-range rows and columns are skipped, so tiles may overhang M and N.
template <OutputKind kOut>
__device__ __forceinline__ void store_acc_pairs(const EpilogueParams& p, int64_t row0, int64_t col,
                                                int32_t v00, int32_t v01, int32_t v10,
                                                int32_t v11, float sa0, float sa1) {
  if (col >= p.n) return;
  const int64_t row1 = row0 + 8;
  const bool has_second = col + 1 < p.n;
  if constexpr (kOut == OutputKind::kS32) {
    int32_t* d = static_cast<int32_t*>(p.d);
    if (has_second && p.pair_aligned) {
      if (row0 < p.m) *reinterpret_cast<int2*>(d + row0 * p.n + col) = make_int2(v00, v01);
      if (row1 < p.m) *reinterpret_cast<int2*>(d + row1 * p.n + col) = make_int2(v10, v11);
    } else {
      if (row0 < p.m) {
        d[row0 * p.n + col] = v00;
        if (has_second) d[row0 * p.n + col + 1] = v01;
      }
      if (row1 < p.m) {
        d[row1 * p.n + col] = v10;
        if (has_second) d[row1 * p.n + col + 1] = v11;
      }
    }
  } else {
    const bool has_bias = p.bias != nullptr;
    const float sb0 = __ldg(p.scale_b + col);
    const float sb1 = has_second ? __ldg(p.scale_b + col + 1) : 0.0f;
    const float bias0 = has_bias ? __ldg(p.bias + col) : 0.0f;
    const float bias1 = has_bias && has_second ? __ldg(p.bias + col + 1) : 0.0f;
    uint16_t* d = static_cast<uint16_t*>(p.d);
    if (row0 < p.m) {
      const float x0 = dequantize_acc(v00, __fmul_rn(sa0, sb0), bias0, has_bias);
      const float x1 = dequantize_acc(v01, __fmul_rn(sa0, sb1), bias1, has_bias);
      const uint32_t packed = pack_bf16x2(x0, x1);
      if (has_second && p.pair_aligned) {
        *reinterpret_cast<uint32_t*>(d + row0 * p.n + col) = packed;
      } else {
        d[row0 * p.n + col] = static_cast<uint16_t>(packed & 0xFFFFu);
        if (has_second) d[row0 * p.n + col + 1] = static_cast<uint16_t>(packed >> 16);
      }
    }
    if (row1 < p.m) {
      const float x0 = dequantize_acc(v10, __fmul_rn(sa1, sb0), bias0, has_bias);
      const float x1 = dequantize_acc(v11, __fmul_rn(sa1, sb1), bias1, has_bias);
      const uint32_t packed = pack_bf16x2(x0, x1);
      if (has_second && p.pair_aligned) {
        *reinterpret_cast<uint32_t*>(d + row1 * p.n + col) = packed;
      } else {
        d[row1 * p.n + col] = static_cast<uint16_t>(packed & 0xFFFFu);
        if (has_second) d[row1 * p.n + col + 1] = static_cast<uint16_t>(packed >> 16);
      }
    }
  }
}

// scale_a of a row, or 0 past M (the row is never stored) and for INT32 output (never read).
template <OutputKind kOut>
__device__ __forceinline__ float load_row_scale(const EpilogueParams& p, int64_t row) {
  if constexpr (kOut == OutputKind::kS32) {
    return 0.0f;
  } else {
    return row < p.m ? __ldg(p.scale_a + row) : 0.0f;
  }
}

}  // namespace llmq::int8_gemm
