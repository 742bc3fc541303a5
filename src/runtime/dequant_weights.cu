// dequantize_weights_bf16 (dequant_weights.hpp): 16 codes a thread, one 16-byte load and two
// 16-byte stores.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/cuda_check.cuh"
#include "runtime/dequant_weights.hpp"

namespace llmq::runtime {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float code_value(uint8_t code, bool int8) {
  if (int8) return static_cast<float>(static_cast<int8_t>(code));
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
  return __half2float(__half(h));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

__global__ void __launch_bounds__(kThreads) dequantize_kernel(const uint4* codes, bool int8, int64_t chunks, uint4* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= chunks) return;
  const uint4 raw = codes[i];
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t packed[8];
#pragma unroll
  for (int w = 0; w < 4; ++w)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint8_t b0 = static_cast<uint8_t>(words[w] >> (16 * h)), b1 = static_cast<uint8_t>(words[w] >> (16 * h + 8));
      packed[2 * w + h] = pack_bf16x2(code_value(b0, int8), code_value(b1, int8));
    }
  out[2 * i] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  out[2 * i + 1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
}

}  // namespace

Status dequantize_weights_bf16(const void* codes, DType code_dtype, int64_t rows, int64_t cols, uint16_t* out,
                               CudaStream stream) {
  if (code_dtype != DType::kE4M3 && code_dtype != DType::kI8)
    return invalid_argument(std::string("dequantize_weights_bf16: codes must be e4m3 or int8, got ") + dtype_name(code_dtype));
  if (rows < 0 || cols < 0 || cols % 16 != 0)
    return invalid_argument("dequantize_weights_bf16: " + std::to_string(rows) + " x " + std::to_string(cols) +
                            " (cols must be a multiple of 16)");
  if (reinterpret_cast<uintptr_t>(codes) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0)
    return invalid_argument("dequantize_weights_bf16: codes and out must be 16-byte aligned");
  const int64_t chunks = rows * cols / 16;
  if (chunks == 0) return {};
  const int64_t blocks = (chunks + kThreads - 1) / kThreads;
  if (blocks > 0x7FFFFFFF) return invalid_argument("dequantize_weights_bf16: too many elements");
  dequantize_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const uint4*>(codes), code_dtype == DType::kI8, chunks, reinterpret_cast<uint4*>(out));
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("dequantize_kernel");
  return {};
}

}  // namespace llmq::runtime
