// Decode attention with a warp per GQA group (decode_plan.hpp): for large batches, where every
// sequence's keys fit one chunk and the groups alone fill the GPU. Each warp streams its own keys
// through its own ring of shared memory, with the per-warp arithmetic of decode_fragments.cuh, and
// writes its heads' outputs straight from registers: no barrier across warps and no merge through
// shared memory (a CTA's four groups are of one sequence, so their block-table lookups hit the same
// L1 lines). The CTA kernel (attention_decode_mma.cu) splits one group's keys four ways instead, which
// at 512 sequences of 256 keys spent as many instructions on its set-up and merge as on the keys
// (ncu, H100, E4M3: 14.3 k instructions a CTA, 47% of them in the key loop).
//
//  * Grid (1, ceil(groups / 4), batch); warp w of CTA (y, b) owns group 4y + w of sequence b.
//  * A tile is 16 keys (two m16n8 score tiles), 3 stages per warp: 12 KiB a warp for E4M3 (4 CTAs
//    an SM on sm_90), 24 KiB for BF16 (2 CTAs an SM on sm_90; fewer where shared memory is smaller). Lanes 0-15 look up a key's cache row each and pass it
//    by shuffle to the lanes that copy its 16-byte chunks (cp.async; keys past the end are zeros).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/attention_mma.cuh"
#include "attention/decode_fragments.cuh"
#include "attention/decode_merge.cuh"
#include "attention/decode_plan.hpp"
#include "attention/kv_pages.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/device_facts.cuh"
#include "cuda/pdl.cuh"

namespace llmq::attention {
namespace {

using decode_frag::kDimTiles;
using decode_frag::kHeadDim;
using decode_frag::kKSteps;
using mma::cp_async_16;
using mma::cp_async_commit;
using mma::cp_async_wait;
using mma::fast_exp2;
using mma::kLog2e;
using mma::smem_addr;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTileKeys = 16;
constexpr int kStages = 3;

template <bool kFp8>
struct WarpRing {
  static constexpr int kRowBytes = kHeadDim * (kFp8 ? 1 : 2);
  static constexpr int kChunksPerRow = kRowBytes / 16;                 // 8 or 16
  static constexpr int kTileBytes = kTileKeys * kRowBytes;             // K (or V) of a tile
  static constexpr int kWarpBytes = kStages * 2 * kTileBytes;          // 12 or 24 KiB
  static constexpr int kCopies = kTileKeys * kChunksPerRow / 32;       // chunks of K (and of V) per lane: 4 or 8
  static constexpr int kKeyStride = 32 / kChunksPerRow;                // keys between a lane's copies: 4 or 2
  static constexpr int kCtaBytes = kWarps * kWarpBytes;
};

template <bool kFp8>
__global__ void __launch_bounds__(kThreads, kFp8 ? 4 : 2)
    decode_attention_warp_kernel(DecodeAttentionArgs a, DecodePlan plan, float scale_log2) {
  using R = WarpRing<kFp8>;
  extern __shared__ __align__(16) unsigned char smem[];
  llmq::detail::pdl_wait();  // q, the cache and kv_len come from the kernels before this one
  llmq::detail::pdl_launch_dependents();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int group = static_cast<int>(blockIdx.y) * kWarps + warp;
  if (group * plan.heads_per_cta >= a.n_heads) return;  // no barrier across warps below
  const DecodeCta item = decode_item(a, plan, 0, static_cast<int>(blockIdx.z), group);
  const int b = item.b, head0 = item.head0, key_begin = item.key_begin, key_end = item.key_end;
  const int n_heads_here = plan.heads_per_cta;
  if (key_begin >= key_end) {  // an empty sequence: zeros, never NaN
    for (int i = lane; i < n_heads_here * kHeadDim; i += 32) a.out[(static_cast<int64_t>(b) * a.n_heads + head0) * kHeadDim + i] = 0;
    return;
  }

  const PagedRows rows = paged_rows(a.pages, a.slot[b]);
  const DecodeKvBases kv = decode_kv_bases<kFp8>(a, item.kv_head, R::kRowBytes);
  scale_log2 *= kv.k_scale * (kFp8 ? decode_frag::kScoreFromF16 : 1.f);
  const int n_tiles = (key_end - key_begin + kTileKeys - 1) / kTileKeys;
  unsigned char* ring = smem + warp * R::kWarpBytes;
  const uint32_t ring_addr = smem_addr(ring);

  // Lane l copies chunk l % kChunksPerRow of the tile's keys l / kChunksPerRow + i * kKeyStride.
  const int piece = lane % R::kChunksPerRow;
  const int key0 = lane / R::kChunksPerRow;
  const auto load_tile = [&](int tile, int stage) {
    const int key = key_begin + tile * kTileKeys + lane;
    const int my_row = lane < kTileKeys && key < key_end ? rows.row(key) : -1;
    const uint32_t k_dst = ring_addr + stage * 2 * R::kTileBytes, v_dst = k_dst + R::kTileBytes;
#pragma unroll
    for (int i = 0; i < R::kCopies; ++i) {
      const int k = key0 + i * R::kKeyStride;
      const int r = __shfl_sync(0xffffffffu, my_row, k);
      const uint32_t at = decode_frag::swizzled_offset<kFp8>(k, piece);
      const int64_t off = static_cast<int64_t>(r >= 0 ? r : 0) * kv.stride_bytes + piece * 16;
      cp_async_16(k_dst + at, kv.k + off, r >= 0 ? 16 : 0);
      cp_async_16(v_dst + at, kv.v + off, r >= 0 ? 16 : 0);
    }
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_tiles) load_tile(s, s);
    cp_async_commit();
  }

  const int g = lane / 4, t = lane % 4;  // fragment row (head) and column pair
  decode_frag::WarpSoftmax<kFp8> sm;  // row g = head g of the group (Q zeros past its heads)
  sm.start(g < n_heads_here ? a.q + (static_cast<int64_t>(b) * a.n_heads + head0 + g) * kHeadDim : nullptr, t);

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int stage = tile % kStages;
    if (tile + kStages - 1 < n_tiles) load_tile(tile + kStages - 1, (tile + kStages - 1) % kStages);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncwarp();  // every lane's copies of this stage have landed
    const unsigned char* k_tile = ring + stage * 2 * R::kTileBytes;
    const unsigned char* v_tile = k_tile + R::kTileBytes;

    // Two m16n8 score tiles: keys 8j + 2t, + 1 of the tile for head g, in log2 units.
    float sc[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float s[4] = {0.f, 0.f, 0.f, 0.f};
      decode_frag::score_8_keys<kFp8>(s, sm.qa, k_tile, 8 * j + g, t);
      const int key = key_begin + tile * kTileKeys + 8 * j + 2 * t;
      sc[j][0] = key < key_end ? s[0] * scale_log2 : -INFINITY;
      sc[j][1] = key + 1 < key_end ? s[1] * scale_log2 : -INFINITY;
    }
    uint32_t pa[2];
    sm.step(sc, pa, t);
#pragma unroll
    for (int j = 0; j < 2; ++j) decode_frag::accumulate_pv_8_keys<kFp8>(sm.o, v_tile, 8 * j + 2 * t, g, pa[j]);
    __syncwarp();  // the next iteration's copies overwrite the stage read here
  }
  cp_async_wait<0>();

  // Heads 2t and 2t + 1: their maxima and sums live in the lanes of rows 2t, 2t + 1 of S (8t, 8t + 4).
  sm.finish_sum();
  const float m_h[2] = {__shfl_sync(0xffffffffu, sm.m, 8 * t), __shfl_sync(0xffffffffu, sm.m, 8 * t + 4)};
  const float l_h[2] = {__shfl_sync(0xffffffffu, sm.l, 8 * t), __shfl_sync(0xffffffffu, sm.l, 8 * t + 4)};
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int h = 2 * t + e;
    if (h >= n_heads_here) continue;
    const float denom = a.sinks != nullptr ? l_h[e] + fast_exp2(__fmaf_rn(a.sinks[head0 + h], kLog2e, -m_h[e])) : l_h[e];
    uint16_t* out = a.out + (static_cast<int64_t>(b) * a.n_heads + head0 + h) * kHeadDim + 16 * g;
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // dims 16g + 8 half + i, i = 0..7: one 16-byte store
      float v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = kFp8 ? sm.o[i][e + 2 * half] / denom * kv.v_scale : sm.o[i][e + 2 * half] / denom;
      uint4 packed;
      packed.x = mma::pack_bf16x2(v[0], v[1]);
      packed.y = mma::pack_bf16x2(v[2], v[3]);
      packed.z = mma::pack_bf16x2(v[4], v[5]);
      packed.w = mma::pack_bf16x2(v[6], v[7]);
      *reinterpret_cast<uint4*>(out + 8 * half) = packed;
    }
  }
}

}  // namespace

bool decode_warp_applies(const DecodeAttentionArgs& a, const DecodePlan& plan, int64_t sms) {
  const int64_t groups = plan.heads_per_cta > 0 ? a.n_heads / plan.heads_per_cta : 0;
  return a.head_dim == kHeadDim && plan.heads_per_cta >= 2 && plan.heads_per_cta <= kDecodeMaxHeadsPerCta &&
         plan.n_chunks == 1 && a.batch * groups >= kDecodeWarpGroupsPerSm * sms;
}

Status launch_decode_warp(const DecodeAttentionArgs& a, const DecodePlan& plan, float scale_log2, cudaStream_t stream) {
  if (plan.n_chunks != 1 || a.head_dim != kHeadDim || plan.heads_per_cta < 2 || plan.heads_per_cta > kDecodeMaxHeadsPerCta)
    return invalid_argument("decode attention (warp): one chunk, head_dim 128 and 2..8 heads per group only");
  const int64_t groups = a.n_heads / plan.heads_per_cta;
  const dim3 grid(1u, static_cast<unsigned>((groups + kWarps - 1) / kWarps), static_cast<unsigned>(a.batch));
  const bool fp8 = a.kv_dtype == KvCacheDType::kE4M3;
  const auto kernel = fp8 ? decode_attention_warp_kernel<true> : decode_attention_warp_kernel<false>;
  const int smem = fp8 ? WarpRing<true>::kCtaBytes : WarpRing<false>::kCtaBytes;
  if (smem > 48 * 1024) {
    int device = 0;
    LLMQ_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    LLMQ_RETURN_IF_ERROR(cuda::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem, device));
  }
  LLMQ_CUDA_RETURN_IF_ERROR(llmq::detail::launch_pdl(kernel, grid, dim3(kThreads), smem, stream, a, plan, scale_log2));
  return {};
}

}  // namespace llmq::attention
