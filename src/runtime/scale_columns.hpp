// The epilogue of the W8A16 dequantized GEMM (linear.cu): FP32 sums times their output channel's
// scale, rounded once to BF16, the operation order of the CPU reference (llmq::quantized_gemm and
// the decode GEMM: acc * w_scale[n], one rounding). Internal; no CUDA headers.
#pragma once

#include <cstdint>

#include "llmq/cuda_stream.hpp"
#include "llmq/status.hpp"

namespace llmq::runtime {

// out[r * ld_out + c] = bf16(0 + in[r * cols + c] * scale[c]) for r < rows, c < cols (the 0 + turns
// a -0 product into the +0 a zero-initialised accumulator gives, as the decode GEMM does).
Status scale_columns_to_bf16(const float* in, int64_t rows, int64_t cols, const float* scale, uint16_t* out,
                             int64_t ld_out, CudaStream stream);

}  // namespace llmq::runtime
