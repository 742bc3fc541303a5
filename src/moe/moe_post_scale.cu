// cuda_moe_post_scale: the scaling pass after the dense MoE path's unscaled strided-batched GEMM.
// Memory bound: one read of y and one write of out. Eight elements per thread (16-byte BF16
// stores) when n_cols allows it, one otherwise.
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "cuda/cuda_check.cuh"
#include "llmq/cuda_moe.hpp"

namespace llmq {
namespace {

template <typename T>
__device__ __forceinline__ float load_f32(const T* p, int64_t i);
template <>
__device__ __forceinline__ float load_f32<float>(const float* p, int64_t i) { return p[i]; }
template <>
__device__ __forceinline__ float load_f32<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}

// Each thread scales `kVec` consecutive elements of one row (kVec divides n_cols).
template <typename T, int kVec>
__global__ void post_scale_kernel(const T* __restrict__ y, const float* __restrict__ token_scales,
                                  const float* __restrict__ expert_scales, bool per_channel, int64_t tokens,
                                  int64_t n_cols, int64_t total_vecs, __nv_bfloat16* __restrict__ out) {
  const int64_t vecs_per_row = n_cols / kVec;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < total_vecs;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = v / vecs_per_row;  // e * tokens + t
    const int64_t col = (v - row * vecs_per_row) * kVec;
    const int64_t e = row / tokens, t = row - e * tokens;
    const float ts = token_scales != nullptr ? token_scales[t] : 1.0f;
    const int64_t base = row * n_cols + col;
    __align__(16) __nv_bfloat16 r[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float es = per_channel ? expert_scales[e * n_cols + col + i] : expert_scales[e];
      // Same association as the GEMM epilogue: (acc * scale_a) * scale_b.
      r[i] = __float2bfloat16_rn(load_f32(y, base + i) * ts * es);
    }
    if constexpr (kVec == 8) {
      *reinterpret_cast<uint4*>(out + base) = *reinterpret_cast<const uint4*>(r);
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) out[base + i] = r[i];
    }
  }
}

template <typename T>
Status launch(const MoePostScale& p, CudaStream stream) {
  const int64_t total = p.experts * p.tokens * p.n_cols;
  const bool vec = p.n_cols % 8 == 0 && reinterpret_cast<uintptr_t>(p.out) % 16 == 0;
  const int64_t vecs = vec ? total / 8 : total;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((vecs + threads - 1) / threads, int64_t{1} << 16);
  const T* y = static_cast<const T*>(p.y);
  auto* out = static_cast<__nv_bfloat16*>(p.out);
  if (vec)
    post_scale_kernel<T, 8><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        y, p.token_scales, p.expert_scales, p.per_channel, p.tokens, p.n_cols, vecs, out);
  else
    post_scale_kernel<T, 1><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        y, p.token_scales, p.expert_scales, p.per_channel, p.tokens, p.n_cols, vecs, out);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("cuda_moe_post_scale");
  return {};
}

}  // namespace

Status cuda_moe_post_scale(const MoePostScale& p, CudaStream stream) {
  if (p.experts <= 0 || p.tokens <= 0 || p.n_cols <= 0)
    return invalid_argument("cuda_moe_post_scale: experts, tokens and n_cols must be positive, got " +
                            std::to_string(p.experts) + ", " + std::to_string(p.tokens) + ", " +
                            std::to_string(p.n_cols));
  if (p.y == nullptr || p.out == nullptr || p.expert_scales == nullptr)
    return invalid_argument("cuda_moe_post_scale: y, out and expert_scales are required");
  if (p.y_dtype != DType::kF32 && p.y_dtype != DType::kBF16)
    return invalid_argument(std::string("cuda_moe_post_scale: y must be f32 or bf16, got ") + dtype_name(p.y_dtype));
  if (p.y_dtype == DType::kF32 && p.y == p.out)
    return invalid_argument("cuda_moe_post_scale: an f32 y cannot be scaled in place into bf16");
  if (p.y_dtype == DType::kF32) return launch<float>(p, stream);
  return launch<__nv_bfloat16>(p, stream);
}

}  // namespace llmq
