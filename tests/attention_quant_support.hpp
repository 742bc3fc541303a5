// Host-side quantization of attention inputs exactly as the CPU specification (quant_attention.hpp)
// quantizes them, in the layouts the 8-bit attention kernels read (cuda_attention_int8.hpp): shared
// by the kernel tests and the fused-quantize test.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "llmq/cuda_attention_int8.hpp"
#include "llmq/format.hpp"

namespace llmq::testing::attention {

// 8-bit code of x * (1 / scale), as the specification makes it: INT8 or E4M3, RNE, saturating.
inline int8_t code8(float x, float inv, bool fp8) {
  if (fp8) return static_cast<int8_t>(float_to_fp8(x * inv, DType::kE4M3));
  return static_cast<int8_t>(encode_int(x * inv, DType::kI8));
}
inline float max_code(bool fp8) { return fp8 ? 448.f : 127.f; }

// Per-row codes (rows of d) with scale absmax / max_code, and the scales transposed to the kernels'
// head-major layout: row r = token * heads + head -> scales[head * tokens + token].
inline void quantize_rows(const std::vector<float>& x, int64_t tokens, int64_t heads, int64_t d, bool fp8,
                   std::vector<int8_t>* codes, std::vector<float>* head_major_scales) {
  codes->resize(x.size());
  head_major_scales->resize(static_cast<size_t>(tokens * heads));
  for (int64_t r = 0; r < tokens * heads; ++r) {
    float m = 0.f;
    for (int64_t c = 0; c < d; ++c) m = std::max(m, std::fabs(x[r * d + c]));
    const float s = m > 0.f ? m / max_code(fp8) : 1.f, inv = 1.f / s;
    (*head_major_scales)[(r % heads) * tokens + r / heads] = s;
    for (int64_t c = 0; c < d; ++c) (*codes)[r * d + c] = code8(x[r * d + c], inv, fp8);
  }
}

// V codes with one scale per (block-key tile, kv head, channel), scales [kv_heads, tiles, d].
inline void quantize_v_blocks(const std::vector<float>& v, int64_t kv_len, int64_t kv_heads, int64_t d, bool fp8, std::vector<int8_t>* codes,
                       std::vector<float>* scales, int64_t block = 64) {
  const int64_t tiles = (kv_len + block - 1) / block;
  codes->resize(v.size());
  scales->resize(static_cast<size_t>(kv_heads * tiles * d));
  for (int64_t h = 0; h < kv_heads; ++h)
    for (int64_t j = 0; j < tiles; ++j)
      for (int64_t ch = 0; ch < d; ++ch) {
        const int64_t t0 = j * block, t1 = std::min(kv_len, j * block + block);
        float m = 0.f;
        for (int64_t t = t0; t < t1; ++t) m = std::max(m, std::fabs(v[(t * kv_heads + h) * d + ch]));
        const float sc = m > 0.f ? m / max_code(fp8) : 1.f, inv = 1.f / sc;
        (*scales)[(h * tiles + j) * d + ch] = sc;
        for (int64_t t = t0; t < t1; ++t) (*codes)[(t * kv_heads + h) * d + ch] = code8(v[(t * kv_heads + h) * d + ch], inv, fp8);
      }
}

// INT8/E4M3 V codes [kv_len, kv_heads, d] -> the kernels' transposed layout v_t
// [kv_heads, d, attention_v_t_stride(kv_len)] (zeros past kv_len).
inline std::vector<int8_t> transpose_v_codes(const std::vector<int8_t>& v, int64_t kv_len, int64_t kv_heads, int64_t d) {
  const int64_t stride = attention_v_t_stride(kv_len);
  std::vector<int8_t> vt(static_cast<size_t>(kv_heads * d * stride), 0);
  for (int64_t t = 0; t < kv_len; ++t)
    for (int64_t g = 0; g < kv_heads; ++g)
      for (int64_t c = 0; c < d; ++c)
        vt[static_cast<size_t>((g * d + c) * stride + attention_v_t_column(t))] = v[static_cast<size_t>((t * kv_heads + g) * d + c)];
  return vt;
}

}  // namespace llmq::testing::attention
