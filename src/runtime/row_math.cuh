// Small device helpers of the runtime's per-row kernels (row_kernels.cu) and its decoding and
// fill kernels (sampling_kernels.cu): BF16 access, CTA-wide sum / max, the 8-bit encoder. Internal
// header; CUDA sources only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace llmq::runtime {

__device__ __forceinline__ float bf16_at(const uint16_t* p, int64_t i) {
  return __bfloat162float(__ushort_as_bfloat16(p[i]));
}
__device__ __forceinline__ uint16_t to_bf16(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

// 8 BF16 in one 16-byte word (16-byte aligned), the lower index in the low half of each 32-bit word.
__device__ __forceinline__ void unpack_bf16x8(const uint4& u, float (&v)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}
__device__ __forceinline__ void load_bf16x8(const uint16_t* p, float (&v)[8]) {
  unpack_bf16x8(*reinterpret_cast<const uint4*>(p), v);
}
__device__ __forceinline__ void store_bf16x8(uint16_t* p, const float (&v)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = static_cast<uint32_t>(to_bf16(v[2 * i])) | (static_cast<uint32_t>(to_bf16(v[2 * i + 1])) << 16);
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

// Sum / max over the CTA, returned to every thread. `red` is 32 floats of shared memory; the
// barriers before and after keep consecutive calls from overwriting slots still being read.
__device__ inline float cta_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) s += red[w];
  return s;
}
__device__ inline float cta_max(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float m = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) m = fmaxf(m, red[w]);
  return m;
}

__device__ __forceinline__ uint8_t encode(float v, bool int8) {
  if (int8) {
    const int r = __float2int_rn(v);  // NaN -> 0, as the reference's INT8 encoder
    return static_cast<uint8_t>(static_cast<int8_t>(r < -128 ? -128 : (r > 127 ? 127 : r)));
  }
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// encode(__fmul_rn(v[i], inverse), int8) for 8 values, stored as 8 bytes (8-byte aligned). One
// branch for the 8 and E4M3 two values a conversion: the per-value form was ~7 instructions a value
// in the GLU kernel of many rows, which is bound by its instruction issue (ncu, H200).
__device__ __forceinline__ void store_codes8(uint8_t* p, const float (&v)[8], float inverse, bool int8) {
  uint32_t w[2];
  if (int8) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      w[h] = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) w[h] |= static_cast<uint32_t>(encode(__fmul_rn(v[4 * h + i], inverse), true)) << (8 * i);
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(v[4 * h], inverse), __fmul_rn(v[4 * h + 1], inverse)),
                                                   __NV_SATFINITE, __NV_E4M3);
      const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(v[4 * h + 2], inverse), __fmul_rn(v[4 * h + 3], inverse)),
                                                   __NV_SATFINITE, __NV_E4M3);
      w[h] = lo | (hi << 16);
    }
  }
  *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
}

// Grid-stride launches: 256-thread CTAs, at most 65536 of them.
inline unsigned grid_for(int64_t count) {
  const int64_t g = (count + 255) / 256;
  return static_cast<unsigned>(g < 65536 ? (g > 0 ? g : 1) : 65536);
}

}  // namespace llmq::runtime
