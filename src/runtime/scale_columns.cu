// scale_columns_to_bf16 (scale_columns.hpp): one element a thread, grid-stride over rows x cols
// (any cols: a part's N need not be a multiple of anything).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/cuda_check.cuh"
#include "runtime/scale_columns.hpp"

namespace llmq::runtime {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) scale_columns_kernel(const float* in, int64_t rows, int64_t cols,
                                                                 const float* scale, uint16_t* out, int64_t ld_out) {
  const int64_t total = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = i / cols, c = i % cols;
    const float y = __fadd_rn(0.0f, __fmul_rn(in[i], scale[c]));
    out[r * ld_out + c] = __bfloat16_as_ushort(__float2bfloat16_rn(y));
  }
}

}  // namespace

Status scale_columns_to_bf16(const float* in, int64_t rows, int64_t cols, const float* scale, uint16_t* out,
                             int64_t ld_out, CudaStream stream) {
  if (rows < 0 || cols < 0 || ld_out < cols)
    return invalid_argument("scale_columns_to_bf16: " + std::to_string(rows) + " x " + std::to_string(cols) +
                            " with output rows " + std::to_string(ld_out) + " apart");
  if (rows == 0 || cols == 0) return {};
  const int64_t blocks = std::min<int64_t>((rows * cols + kThreads - 1) / kThreads, int64_t{1} << 20);
  scale_columns_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(in, rows, cols, scale, out, ld_out);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("scale_columns_kernel");
  return {};
}

}  // namespace llmq::runtime
