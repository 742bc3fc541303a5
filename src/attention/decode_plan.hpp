// The split of decode attention (attention_decode.cu plans it; its kernels, there and in
// attention_decode_mma.cu, follow it) and the split-K workspace. Internal.
#pragma once

#include <cuda_runtime.h>

#include "attention/attention.hpp"

namespace llmq::attention {

// The CUDA-core and the CTA tensor-core kernels: 128 threads, a 48 KiB ring of key tiles (tile: 8 KiB of BF16 K and as much V
// whatever head_dim is; an E4M3 tile holds the same keys in half the bytes), and the q heads of one
// GQA group per CTA, at most 8.
constexpr int kDecodeThreads = 128;
constexpr int kDecodeTileBytes = 8192;
constexpr int kDecodeSmemBytes = 3 * 2 * kDecodeTileBytes;
constexpr int kDecodeMaxHeadsPerCta = 8;

// The split, identical on the host (grid, workspace offsets) and the device.
struct DecodePlan {
  int n_chunks = 1;
  int chunk_keys = 0;      // multiple of the tile's key count
  int heads_per_cta = 1;   // divides the GQA group, <= kDecodeMaxHeadsPerCta
};

// Partial outputs [batch, n_heads, n_chunks, head_dim] FP32, then log2-sum-exp [batch, n_heads,
// n_chunks] FP32 (n_chunks > 1 only).
struct DecodeWorkspace {
  float* partial_out;
  float* partial_lse;
};

// The tensor-core kernel (attention_decode_mma.cu): head_dim 128 and 2..8 q heads per CTA (GQA),
// either cache type. Scores and P V on mma.sync (BF16 operands, FP32 accumulation), where the
// CUDA-core kernel spends about 2.5 instructions per multiply-add on shuffles and softmax.
bool decode_mma_applies(const DecodeAttentionArgs& a, const DecodePlan& plan);
Status launch_decode_mma(const DecodeAttentionArgs& a, const DecodePlan& plan, DecodeWorkspace ws, float scale_log2,
                         cudaStream_t stream);

// Which kernel decode_attention runs for these arguments on the current device (one rule: tests
// assert it, launches follow it).
enum class DecodeKernel { kCudaCore, kCtaMma, kWarpMma };
Status decode_kernel_choice(const DecodeAttentionArgs& a, DecodeKernel* out);

// The warp kernel (attention_decode_warp.cu): a warp per GQA group, for one chunk (large batches)
// when the groups alone give every SM kDecodeWarpGroupsPerSm warps; head_dim 128, 2..8 q heads a group.
constexpr int64_t kDecodeWarpGroupsPerSm = 8;
bool decode_warp_applies(const DecodeAttentionArgs& a, const DecodePlan& plan, int64_t sms);
Status launch_decode_warp(const DecodeAttentionArgs& a, const DecodePlan& plan, float scale_log2, cudaStream_t stream);

}  // namespace llmq::attention
