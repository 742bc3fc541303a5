// The two data movements around the grouped expert GEMMs: cuda_moe_gather (token rows into the
// expert-major permuted order, for the wgmma kernel whose TMA reads contiguous rows) and
// cuda_moe_combine (the un-permute: each token's top_k expert outputs, weighted and summed).
// Both are memory bound: 16-byte accesses, one CTA per row.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda/cuda_check.cuh"
#include "cuda/pdl.cuh"
#include "llmq/cuda_moe.hpp"

namespace llmq {
namespace {

__global__ void moe_gather_kernel(MoeGatherArgs a) {
  const int64_t p = blockIdx.x;
  const int64_t src = a.sorted_slots[p] / a.top_k;
  const uint4* s = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(a.src_codes) + src * a.k);
  uint4* d = reinterpret_cast<uint4*>(static_cast<uint8_t*>(a.dst_codes) + p * a.k);
  for (int64_t i = threadIdx.x; i < a.k / 16; i += blockDim.x) d[i] = s[i];
  if (a.src_scales != nullptr)
    for (int64_t i = threadIdx.x; i < a.scales_per_row; i += blockDim.x)
      a.dst_scales[p * a.scales_per_row + i] = a.src_scales[src * a.scales_per_row + i];
}

// Eight columns per thread (n % 8 == 0) or one.
template <int kVec>
__global__ void moe_combine_kernel(MoeCombineArgs a) {
  llmq::detail::pdl_wait();  // y and the routing come from the kernels before this one
  llmq::detail::pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  constexpr int kMaxTopK = 16;
  // The token's slots, read once for the CTA into shared memory (per-thread arrays indexed by the
  // runtime slot lived in local memory: 320 bytes of stack a thread, read in every column step).
  __shared__ int64_t rows[kMaxTopK];
  __shared__ float w[kMaxTopK];
  __shared__ const float* bias[kMaxTopK];  // each slot's expert's bias row, or null
  if (threadIdx.x < a.top_k) {
    const int s = static_cast<int>(threadIdx.x);
    rows[s] = a.slot_rows[t * a.top_k + s];
    w[s] = a.topk_weights[t * a.top_k + s];
    bias[s] = nullptr;
    if (a.bias != nullptr) {
      const int64_t e = a.topk_ids[t * a.top_k + s] - a.bias_first;
      if (e >= 0 && e < a.bias_experts) bias[s] = a.bias + e * a.n;
    }
  }
  __syncthreads();
  const __nv_bfloat16* y = reinterpret_cast<const __nv_bfloat16*>(a.y);
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(a.out);
  const int64_t first = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * kVec;
  for (int64_t c = first; c < a.n; c += static_cast<int64_t>(gridDim.y) * blockDim.x * kVec) {
    float acc[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] = 0.0f;
    // Unrolled, the slots' loads run ahead of the adds, which stay in slot order (the CPU's).
#pragma unroll 4
    for (int s = 0; s < a.top_k; ++s) {
      __align__(16) __nv_bfloat16 v[kVec];
      if constexpr (kVec == 8)
        *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(y + rows[s] * a.n + c);
      else
        v[0] = y[rows[s] * a.n + c];
      float y_f[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) y_f[i] = __bfloat162float(v[i]);
      if (bias[s] != nullptr)  // the expert's output is y + its bias, then weighted (CPU order)
#pragma unroll
        for (int i = 0; i < kVec; ++i) y_f[i] = __fadd_rn(y_f[i], bias[s][c + i]);
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(w[s], y_f[i]));
    }
    __align__(16) __nv_bfloat16 r[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) r[i] = __float2bfloat16_rn(acc[i]);
    if constexpr (kVec == 8)
      *reinterpret_cast<uint4*>(out + t * a.n + c) = *reinterpret_cast<const uint4*>(r);
    else
      out[t * a.n + c] = r[0];
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

Status cuda_moe_gather(const MoeGatherArgs& a, CudaStream stream) {
  if (a.rows < 0 || a.rows > (int64_t{1} << 31) - 1)
    return invalid_argument("rows: must be in [0, 2^31), got " + std::to_string(a.rows));
  if (a.top_k < 1) return invalid_argument("top_k: must be >= 1, got " + std::to_string(a.top_k));
  if (a.k <= 0 || a.k % 16 != 0)
    return invalid_argument("k: must be a positive multiple of 16 bytes, got " + std::to_string(a.k));
  if (a.rows == 0) return {};
  if (a.src_codes == nullptr || a.dst_codes == nullptr || a.sorted_slots == nullptr)
    return invalid_argument(std::string(a.src_codes == nullptr ? "src_codes" : a.dst_codes == nullptr ? "dst_codes" : "sorted_slots") +
                            ": null device pointer");
  if (a.scales_per_row < 1) return invalid_argument("scales_per_row: must be >= 1, got " + std::to_string(a.scales_per_row));
  if ((a.src_scales == nullptr) != (a.dst_scales == nullptr))
    return invalid_argument("src_scales, dst_scales: give both or neither");
  if (!aligned16(a.src_codes) || !aligned16(a.dst_codes))
    return invalid_argument("src_codes, dst_codes: must be 16-byte aligned");
  moe_gather_kernel<<<static_cast<unsigned>(a.rows), 128, 0, static_cast<cudaStream_t>(stream)>>>(a);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("moe_gather_kernel");
  return {};
}

Status cuda_moe_combine(const MoeCombineArgs& a, CudaStream stream) {
  if (a.tokens < 0 || a.tokens > (int64_t{1} << 31) - 1)
    return invalid_argument("tokens: must be in [0, 2^31), got " + std::to_string(a.tokens));
  if (a.top_k < 1 || a.top_k > 16) return invalid_argument("top_k: must be in [1, 16], got " + std::to_string(a.top_k));
  if (a.n <= 0) return invalid_argument("n: must be > 0, got " + std::to_string(a.n));
  if (a.tokens == 0) return {};
  if (a.y == nullptr || a.topk_weights == nullptr || a.slot_rows == nullptr || a.out == nullptr)
    return invalid_argument(std::string(a.y == nullptr ? "y" : a.topk_weights == nullptr ? "topk_weights" : a.slot_rows == nullptr ? "slot_rows" : "out") +
                            ": null device pointer");
  if (a.bias != nullptr && (a.topk_ids == nullptr || a.bias_experts < 0))
    return invalid_argument("bias: needs topk_ids and bias_experts >= 0");
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  // A CTA per token; at decode sizes (few tokens) the columns are spread over several CTAs of 128
  // threads as well, so that a token's row is not one SM's latency-bound loop.
  const bool few = a.tokens <= 16;
  if (a.n % 8 == 0 && aligned16(a.y) && aligned16(a.out)) {
    const int threads = few ? 128 : static_cast<int>(std::min<int64_t>(512, (a.n / 8 + 31) / 32 * 32));
    const unsigned split = few ? static_cast<unsigned>((a.n / 8 + threads - 1) / threads) : 1u;
    LLMQ_CUDA_RETURN_IF_ERROR(detail::launch_pdl(moe_combine_kernel<8>, dim3(static_cast<unsigned>(a.tokens), split), dim3(threads), 0, s, a));
  } else {
    const unsigned split = few ? static_cast<unsigned>(std::min<int64_t>(64, (a.n + 255) / 256)) : 1u;
    LLMQ_CUDA_RETURN_IF_ERROR(detail::launch_pdl(moe_combine_kernel<1>, dim3(static_cast<unsigned>(a.tokens), split), dim3(256), 0, s, a));
  }
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("moe_combine_kernel");
  return {};
}

}  // namespace llmq
