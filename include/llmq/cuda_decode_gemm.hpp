// Decode GEMM on CUDA: 1 to 32 tokens against 8-bit weights, streamed once from device memory.
//
//   D[M, N] (bf16) = A[M, K] * W[N, K]^T * scales (+ bias[N]),   1 <= M <= 32,
//
// with W FP8 E4M3 or INT8, row-major [N, K] (nn.Linear layout), one float scale per output
// channel (w_scale[N]) or one per tensor, and A either
//   * BF16 (W8A16): each weight code is widened to BF16 in registers (exact: every E4M3 and INT8
//     value is a BF16 value), products are exact in FP32 and summed in FP32; the sum is multiplied
//     by the channel's scale once at the end;
//   * the weight's own 8-bit format (W8A8: E4M3 x E4M3 or INT8 x INT8) with per-token scales
//     a_scale[M] (or one per tensor): FP8 products summed in FP32, INT8 products summed exactly in
//     INT32, then acc * (a_scale[m] * w_scale[n]) (+ bias) as in the CPU reference
//     llmq::quantized_gemm. The INT8 W8A8 output equals the reference bit for bit.
// At these M the time is the weight bytes over the memory bandwidth, so the kernel is built to
// keep device memory busy: every lane streams its weights with 16-byte loads straight into
// registers, eight of them in flight before the first product (no shared-memory staging, no
// barrier in the loop), a CTA's eight warps split K, and the tensor cores (mma.sync m16n8k16 /
// m16n8k32) do the products with 16 weight rows as the mma's A side and the tokens as its 8
// columns (two mma for M > 8).
// When N is too small to give every SM a CTA, a thread-block cluster splits K further and
// reduces its partial sums through distributed shared memory (sm_90; no workspace, no atomics, one
// launch). The E4M3 NaN codes 0x7F / 0xFF in W are read as +-480 (weights hold no NaN); NaN and
// Inf in A propagate.
//
// All pointers are device pointers; every call is asynchronous on `stream`. No CUDA headers here.
#pragma once

#include <cstdint>
#include <string>

#include "llmq/cuda_stream.hpp"
#include "llmq/dtype.hpp"
#include "llmq/status.hpp"

namespace llmq {

// The most tokens one call takes: up to four n8 tiles of tokens against each 16 weight rows.
inline constexpr int64_t kMaxDecodeGemmM = 32;
// Grouped mode (MoE experts): the rows of one grid slice, an expert's chunk.
inline constexpr int64_t kDecodeGemmGroupRows = 16;
// W8A16 (bf16 activations, twice the activation registers) takes at most this many tokens.
inline constexpr int64_t kDecodeGemmW8A16MaxM = 16;
// Up to how many tokens the decode GEMM beats cuBLASLt for these operands: a planner's rule (the
// runtime's linears, src/runtime/linear.cu), not a limit (can_implement takes up to kMaxDecodeGemmM
// W8A8 tokens). The numbers and their measurement are in decode_gemm.cu.
int64_t decode_gemm_preferred_max_tokens(DType a_dtype, DType w_dtype);

struct DecodeGemmProblem {
  int64_t m = 0;  // tokens, 0..kMaxDecodeGemmM (W8A16 ..kDecodeGemmW8A16MaxM); 0 or n == 0: nothing to do
  int64_t n = 0;  // output channels
  int64_t k = 0;  // input channels, a positive multiple of 16 (16-byte loads)

  const void* a = nullptr;          // [M, K] activations, 16-byte aligned
  DType a_dtype = DType::kBF16;     // kBF16 (W8A16) or w_dtype (W8A8)
  int64_t a_row_stride = 0;         // elements between rows; 0 means K (rows 16-byte aligned)
  const float* a_scale = nullptr;   // W8A8: [M] per token, or [1]; W8A16: must be null
  bool a_scale_per_tensor = false;

  const void* w = nullptr;          // [N, K] weights, 16-byte aligned
  DType w_dtype = DType::kE4M3;     // kE4M3 or kI8
  int64_t w_row_stride = 0;         // elements (= bytes) between rows; 0 means K
  const float* w_scale = nullptr;   // [N] per output channel, or [1]
  bool w_scale_per_tensor = false;

  const float* bias = nullptr;      // optional [N], added in FP32 after the scales
  void* d = nullptr;                // [M, N] BF16 output
  int64_t d_row_stride = 0;         // elements; 0 means N
};

// Tuning knobs; 0 / defaults let the planner choose. Results do not depend on them except through
// the FP32 summation order (INT8 W8A8 is exact whatever they are).
struct DecodeGemmConfig {
  int split_k = 0;        // CTAs of one cluster that share a row range, each on 1/split_k of K:
                          // 1, 2, 4 or 8 (> 1 needs sm_90)
  int tiles_per_cta = 0;  // 16-row tiles one CTA streams together: 1, 2, 3 or 4; only 2 past 16
                          // tokens (more tiles share each activation load; fewer give more CTAs)
  bool l2_prefetch = true;  // weight loads ask L2 for the whole 256-byte block (.L2::256B)
};

// What a call would launch on the current device (see cuda_decode_gemm_plan).
struct DecodeGemmPlan {
  int split_k = 1;          // cluster size; the grid is split_k x row_ctas CTAs
  int row_ctas = 0;         // CTAs along N, each owning tiles_per_cta 8-row tiles
  int tiles_per_cta = 1;
  int warps = 8;            // warps of one CTA; they split the CTA's K range
  int k_unroll = 1;         // 64-wide K steps whose loads a warp issues before its first product
  int64_t k_per_split = 0;  // K elements each CTA of a cluster covers
  int threads = 0;          // per CTA
  int64_t smem_bytes = 0;   // static shared memory per CTA (cross-warp and cluster reduction)
};

// Why the problem cannot run (ok when it can), without touching the device: shapes (M up to
// kMaxDecodeGemmM, W8A16 up to kDecodeGemmW8A16MaxM), dtypes, null pointers, 16-byte alignment of
// A and W rows, scale arguments, and for INT8 W8A8 the INT32 bound K <= kMaxInt8SegmentK. Errors name the field ("k: ...", "a_scale: ...").
Status cuda_decode_gemm_can_implement(const DecodeGemmProblem& p);

// The launch a call with this problem and config would make on the current device (also checks
// what needs the device: FP8 W8A8 needs sm_89+, split_k > 1 needs sm_90).
Status cuda_decode_gemm_plan(const DecodeGemmProblem& p, const DecodeGemmConfig& config,
                             DecodeGemmPlan* plan);

// Enqueues D = A * W^T * scales (+ bias) on `stream` (the current device's).
Status cuda_decode_gemm(const DecodeGemmProblem& p, CudaStream stream,
                        const DecodeGemmConfig& config = {});

// "decode gemm w8a16 M=1 N=14336 K=4096 w=e4m3/channel a=bf16 bias"
std::string describe(const DecodeGemmProblem& p);
// "split_k=1 ctas=896 tiles/cta=2 warps=8 unroll=4 k/split=4096 smem=..."
std::string describe(const DecodeGemmPlan& plan);

}  // namespace llmq
