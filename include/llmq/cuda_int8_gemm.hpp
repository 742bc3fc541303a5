// INT8 GEMM on CUDA with INT32 accumulation and a fused per-token x per-channel dequantization:
//   D[M, N] = bf16( float(acc[m, n]) * (scale_a[m] * scale_b[n]) (+ bias[n]) ),
//   acc[m, n] = sum_k A[m, k] * B[n, k]   (exact in INT32),
// with A int8 [M, K] row-major (activations, one scale per token) and B int8 [N, K] row-major
// (weights in nn.Linear layout, one scale per output channel): both operands K-major. The float
// arithmetic is that of the CPU reference llmq::quantized_gemm for a per-token x per-channel INT8
// problem (one segment over K), so the BF16 output matches it bit for bit.
//
// Two kernels: on sm_90 (H100 / H200) a warp-specialised persistent kernel (TMA loads into a
// shared-memory ring guarded by mbarriers, wgmma m64nNk32 s8 in two consumer warpgroups); on any
// other sm_80+ GPU an mma.sync m16n8k32 kernel. No CUDA headers here; all pointers are device
// pointers and every call is asynchronous on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "llmq/cuda_stream.hpp"
#include "llmq/status.hpp"

namespace llmq {

enum class Int8GemmKernel {
  kAuto,      // wgmma on sm_90, mma.sync elsewhere
  kWgmma,     // the Hopper TMA + wgmma kernel (sm_90 only; kUnsupported elsewhere)
  kMmaSync,   // the portable mma.sync kernel (sm_80+)
};

struct Int8GemmConfig {
  Int8GemmKernel kernel = Int8GemmKernel::kAuto;
  // wgmma CTA tile width along N: 64, 128 or 256; 0 picks one from the shape (fewest waves,
  // weighted by the per-tile cost); naming only block_n leaves block_m to the chooser. kMmaSync
  // takes 0 or 128 (its tile is 128 x 128).
  int block_n = 0;
  // wgmma tile height along M (tokens): 128, or 64 (with block_n 128 or 256); 0 picks one with
  // block_n (64 where 128-row tiles would leave SMs idle: the few-token GEMMs of decode). kMmaSync
  // takes 0 or 128.
  int block_m = 0;
};

// What a call with this shape and config runs on the current device.
struct Int8GemmPlan {
  Int8GemmKernel kernel = Int8GemmKernel::kAuto;  // never kAuto once planned
  int block_m = 0;
  int block_n = 0;
  int block_k = 0;
  int stages = 0;          // shared-memory pipeline depth
  int threads = 0;         // per CTA
  int grid = 0;            // CTAs launched (persistent kernel: min(tiles, SMs))
  int64_t tiles = 0;       // output tiles
  size_t smem_bytes = 0;   // dynamic shared memory per CTA
};

// Why (m, n, k) cannot run, or ok: K > 0 and a multiple of 16 (TMA and 16-byte copies need
// 16-byte aligned rows), K <= kMaxInt8SegmentK (131071) so that INT32 accumulators cannot
// overflow, m and n in [0, 2^31). M and N need no alignment (tiles overhang and are masked).
Status cuda_int8_gemm_can_implement(int64_t m, int64_t n, int64_t k);

// The kernel, tile and grid a call would use on the current device.
Status cuda_int8_gemm_plan(int64_t m, int64_t n, int64_t k, const Int8GemmConfig& config,
                           Int8GemmPlan* plan);

// D (BF16 bits, [M, N] row-major) = descaled A * B^T (+ bias). a and b must be 16-byte aligned;
// scale_a [M] and scale_b [N] are float32; bias [N] float32 or null.
Status cuda_int8_gemm(const int8_t* a, const int8_t* b, const float* scale_a, const float* scale_b,
                      const float* bias, uint16_t* d_bf16, int64_t m, int64_t n, int64_t k,
                      CudaStream stream, const Int8GemmConfig& config = {});

// The raw INT32 accumulators D[M, N] = A * B^T (row-major), for exact tests and for callers that
// apply their own epilogue.
Status cuda_int8_gemm_s32(const int8_t* a, const int8_t* b, int32_t* d_s32, int64_t m, int64_t n,
                          int64_t k, CudaStream stream, const Int8GemmConfig& config = {});

const char* int8_gemm_kernel_name(Int8GemmKernel kernel);  // "auto", "wgmma", "mma_sync"

}  // namespace llmq
