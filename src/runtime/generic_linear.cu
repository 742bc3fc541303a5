// The plain linear kernel of the runtime (linear.hpp): one warp per output element, any shape, any
// operand combination the runtime stores. It exists for the shapes the fast kernels refuse (a tiny
// model's K = 172, F32 weights, N not a multiple of 16) and follows the CPU reference's arithmetic
// (gemm.hpp): K in segments on which both scales are constant (128 wide when either side has block
// scales, else all of K); inside a segment raw products are summed in FP32 (INT32 for INT8 x INT8);
// each segment's sum times scale_a * scale_b is added to an FP32 accumulator. Only the order of the
// FP32 additions differs from the CPU (lanes, then a tree across the warp).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "cuda/cuda_check.cuh"
#include "runtime/linear.hpp"

namespace llmq::runtime {
namespace {

constexpr int kWarpsPerCta = 8;
constexpr int kSegment = 128;

template <typename T>
__device__ __forceinline__ float load_value(const void* p, int64_t i);
template <>
__device__ __forceinline__ float load_value<float>(const void* p, int64_t i) {
  return static_cast<const float*>(p)[i];
}
template <>
__device__ __forceinline__ float load_value<__nv_bfloat16>(const void* p, int64_t i) {
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}
template <>
__device__ __forceinline__ float load_value<__nv_fp8_e4m3>(const void* p, int64_t i) {
  return static_cast<float>(static_cast<const __nv_fp8_e4m3*>(p)[i]);
}
template <>
__device__ __forceinline__ float load_value<int8_t>(const void* p, int64_t i) {
  return static_cast<float>(static_cast<const int8_t*>(p)[i]);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}
__device__ __forceinline__ int warp_sum(int v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

// kInt: both operands INT8, segment sums exact in INT32.
template <typename TA, typename TW, bool kInt>
__global__ void __launch_bounds__(kWarpsPerCta * 32) generic_linear_kernel(GenericLinearArgs p) {
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= p.m * p.n) return;
  const int64_t row = warp / p.n;
  const int64_t col = warp % p.n;
  const int64_t kb = (p.k + kSegment - 1) / kSegment;
  const bool blocked = p.a_block || p.w_block;
  const int64_t seg = blocked ? kSegment : p.k;
  const void* a_row = static_cast<const char*>(p.a) + row * p.k * static_cast<int64_t>(sizeof(TA));
  const void* w_row = static_cast<const char*>(p.w) + col * p.k * static_cast<int64_t>(sizeof(TW));
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < p.k; k0 += seg) {
    const int64_t k1 = k0 + seg < p.k ? k0 + seg : p.k;
    float seg_sum;
    if constexpr (kInt) {
      int s = 0;
      for (int64_t k = k0 + lane; k < k1; k += 32)
        s += static_cast<int>(static_cast<const int8_t*>(a_row)[k]) * static_cast<int>(static_cast<const int8_t*>(w_row)[k]);
      seg_sum = static_cast<float>(warp_sum(s));
    } else {
      float s = 0.0f;
      for (int64_t k = k0 + lane; k < k1; k += 32) s += load_value<TA>(a_row, k) * load_value<TW>(w_row, k);
      seg_sum = warp_sum(s);
    }
    float scale = 1.0f;
    const int64_t b = k0 / kSegment;
    if (p.a_scale != nullptr) scale = p.a_block ? p.a_scale[row * kb + b] : p.a_scale[row];
    if (p.w_scale != nullptr) scale *= p.w_block ? p.w_scale[(col / kSegment) * kb + b] : p.w_scale[col];
    acc += seg_sum * scale;
  }
  if (lane == 0) {
    if (p.y_f32) static_cast<float*>(p.y)[row * p.ldy + col] = acc;
    else static_cast<__nv_bfloat16*>(p.y)[row * p.ldy + col] = __float2bfloat16_rn(acc);
  }
}

template <typename TA, typename TW, bool kInt>
Status launch(const GenericLinearArgs& p, CudaStream stream) {
  const int64_t warps = p.m * p.n;
  const int64_t ctas = (warps + kWarpsPerCta - 1) / kWarpsPerCta;
  generic_linear_kernel<TA, TW, kInt><<<static_cast<unsigned>(ctas), kWarpsPerCta * 32, 0, stream>>>(p);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("generic_linear_kernel");
  return {};
}

}  // namespace

Status generic_linear(const GenericLinearArgs& p, CudaStream stream) {
  if (p.m < 0 || p.n < 0 || p.k <= 0) return invalid_argument("generic_linear: bad shape");
  if (p.m == 0 || p.n == 0) return {};
  if (p.a == nullptr || p.w == nullptr || p.y == nullptr) return invalid_argument("generic_linear: null operand");
  if (p.m * p.n / kWarpsPerCta >= (int64_t{1} << 31)) return invalid_argument("generic_linear: too many outputs");
  const DType a = p.a_dtype, w = p.w_dtype;
  if (a == DType::kBF16) {
    switch (w) {
      case DType::kF32: return launch<__nv_bfloat16, float, false>(p, stream);
      case DType::kBF16: return launch<__nv_bfloat16, __nv_bfloat16, false>(p, stream);
      case DType::kE4M3: return launch<__nv_bfloat16, __nv_fp8_e4m3, false>(p, stream);
      case DType::kI8: return launch<__nv_bfloat16, int8_t, false>(p, stream);
      default: break;
    }
  } else if (a == DType::kE4M3 && w == DType::kE4M3) {
    return launch<__nv_fp8_e4m3, __nv_fp8_e4m3, false>(p, stream);
  } else if (a == DType::kI8 && w == DType::kI8) {
    return launch<int8_t, int8_t, true>(p, stream);
  }
  return unsupported(std::string("generic_linear: activations ") + dtype_name(a) + " x weights " + dtype_name(w));
}

}  // namespace llmq::runtime
