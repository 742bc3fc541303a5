// Dequantize 8-bit weights to BF16 on the device, for the GEMMs no 8-bit kernel takes: W8A16
// (8-bit weights, BF16 activations) at prefill sizes, where cuBLASLt BF16 on the dequantized copy
// beats streaming the 8-bit weights once per 16 rows through the decode GEMM (linear.cu). Internal;
// no CUDA headers.
#pragma once

#include <cstdint>

#include "llmq/cuda_stream.hpp"
#include "llmq/dtype.hpp"
#include "llmq/status.hpp"

namespace llmq::runtime {

// out[r, c] = bf16(value(codes[r, c])) for r < rows, c < cols (row-major, rows cols apart): codes
// E4M3 or INT8, whose every value BF16 holds exactly, so the copy is exact; the channel scales come
// after the GEMM (scale_columns.hpp), in the reference's order.
// cols % 16 == 0 and 16-byte aligned codes and out (16 codes a thread).
Status dequantize_weights_bf16(const void* codes, DType code_dtype, int64_t rows, int64_t cols, uint16_t* out,
                               CudaStream stream);

}  // namespace llmq::runtime
