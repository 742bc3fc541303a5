// Decode attention on tensor cores (decode_plan.hpp): the plan, grid, ring of key tiles, paged
// lookups and outputs of the CUDA-core kernel (attention_decode.cu), with the arithmetic of a tile
// on mma.sync. For a GQA group of 4 on CUDA cores every multiply-add of q . k and p * v came with
// about 1.5 more instructions (the 16-lane shuffle sums of each score, the softmax repeated on each
// of them, the unpacking), and at serving batch sizes the kernel was bound by them, not by the cache
// bytes (ncu, H200, 256 sequences of ~200 keys, E4M3 cache: 58 us a layer, 2.3x its bytes).
//
//  * The four warps split each 32-key tile: warp w takes keys 8w..8w+7, its scores one m16n8 tile
//    (decode_fragments.cuh has the per-warp arithmetic). Each warp keeps its own running max and
//    sum per head (the four lanes of a row meet by two shuffles); the warps are merged at the end like
//    the CUDA-core kernel's key lanes.
//  * At large batches of short sequences the merge and the per-CTA set-up cost as much as the keys;
//    there attention_decode_warp.cu (a warp per GQA group, no merge) takes over.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/attention_mma.cuh"
#include "attention/decode_fragments.cuh"
#include "attention/decode_merge.cuh"
#include "attention/decode_plan.hpp"
#include "attention/kv_pages.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/pdl.cuh"

namespace llmq::attention {
namespace {

using mma::cp_async_16;
using mma::cp_async_commit;
using mma::cp_async_wait;
using mma::smem_addr;

using decode_frag::kDimTiles;
using decode_frag::kHeadDim;
using decode_frag::kKSteps;
constexpr int kThreads = kDecodeThreads;
constexpr int kTileKeys = kDecodeTileBytes / (2 * kHeadDim);  // 32: the plan's tile
constexpr int kWarps = kThreads / 32;
constexpr int kKeysPerWarp = kTileKeys / kWarps;  // 8: one n8 score tile
static_assert(kKeysPerWarp == 8, "a warp's keys of a tile are one m16n8 score tile");
// The warps' accumulators meet in shared memory at [warp][head][dim % 16][dim / 16], head stride
// 132: the 32 lanes of one store (dims 16g + i, heads 2t, 2t + 1) then hit 32 banks (8t + g).
constexpr int kAccHeadStride = kHeadDim + 4;
struct MmaAccAt {
  static __device__ __forceinline__ int at(int warp, int h, int d) {
    return (warp * kDecodeMaxHeadsPerCta + h) * kAccHeadStride + (d % 16) * 8 + d / 16;
  }
};

template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 4)
    decode_attention_mma_kernel(DecodeAttentionArgs a, DecodePlan plan, DecodeWorkspace ws, float scale_log2) {
  constexpr int kElemBytes = kFp8 ? 1 : 2;
  constexpr int kRowBytes = kHeadDim * kElemBytes;         // 256 (BF16) or 128 (E4M3)
  constexpr int kChunksPerRow = kRowBytes / 16;            // 16 or 8
  constexpr int kTileBytesHere = kTileKeys * kRowBytes;    // K (or V) bytes of a tile
  constexpr int kStages = kDecodeSmemBytes / (2 * kTileBytesHere);  // 3 or 6
  constexpr int kRowsPerThread = kTileKeys * kChunksPerRow / kThreads;  // 4 or 2
  static_assert(kThreads % kChunksPerRow == 0 && kStages >= 3, "ring shape");
  extern __shared__ __align__(16) unsigned char smem[];

  llmq::detail::pdl_wait();  // q, the cache and kv_len come from the kernels before this one
  llmq::detail::pdl_launch_dependents();
  const DecodeCta cta = decode_cta(a, plan);
  if (decode_cta_has_no_keys<kHeadDim>(a, plan, cta)) return;
  const int b = cta.b, head0 = cta.head0, kv_head = cta.kv_head, key_begin = cta.key_begin, key_end = cta.key_end;
  const int n_heads_here = plan.heads_per_cta;

  const PagedRows rows = paged_rows(a.pages, a.slot[b]);
  const DecodeKvBases kv = decode_kv_bases<kFp8>(a, kv_head, kRowBytes);
  scale_log2 *= kv.k_scale * (kFp8 ? decode_frag::kScoreFromF16 : 1.f);
  const int n_tiles = (key_end - key_begin + kTileKeys - 1) / kTileKeys;
  const uint32_t ring = smem_addr(smem);

  // Copy i of a tile by this thread: row threadIdx.x / kChunksPerRow + i * (kThreads /
  // kChunksPerRow), chunk threadIdx.x % kChunksPerRow, written at the row's swizzled chunk.
  const int piece = static_cast<int>(threadIdx.x) % kChunksPerRow;
  const int row0 = static_cast<int>(threadIdx.x) / kChunksPerRow;
  const auto tile_rows = [&](int tile, int (&r)[kRowsPerThread]) {
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int key = key_begin + tile * kTileKeys + row0 + i * (kThreads / kChunksPerRow);
      r[i] = key < key_end ? rows.row(key) : -1;
    }
  };
  const auto load_tile = [&](const int (&r)[kRowsPerThread], int stage) {
    const uint32_t k_dst = ring + 2 * stage * kTileBytesHere, v_dst = k_dst + kTileBytesHere;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int row = row0 + i * (kThreads / kChunksPerRow);
      const uint32_t at = row * kRowBytes + ((piece ^ decode_frag::swizzle<kFp8>(row)) * 16);
      const bool valid = r[i] >= 0;
      const int64_t off = static_cast<int64_t>(valid ? r[i] : 0) * kv.stride_bytes + piece * 16;
      cp_async_16(k_dst + at, kv.k + off, valid ? 16 : 0);
      cp_async_16(v_dst + at, kv.v + off, valid ? 16 : 0);
    }
  };
  int next_rows[kRowsPerThread];
  {
    int first_rows[kStages][kRowsPerThread];
#pragma unroll
    for (int s = 0; s < kStages; ++s) tile_rows(s, first_rows[s]);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < n_tiles) load_tile(first_rows[s], s);
      cp_async_commit();
    }
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) next_rows[i] = first_rows[kStages - 1][i];
  }

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;  // fragment row (head) and column pair
  decode_frag::WarpSoftmax<kFp8> sm;  // row g = head g of the CTA (Q zeros past its heads)
  sm.start(g < n_heads_here ? a.q + (static_cast<int64_t>(b) * a.n_heads + head0 + g) * kHeadDim : nullptr, t);

  const int k_row = warp * kKeysPerWarp + g;       // the key of this lane's K fragment
  const int v_row = warp * kKeysPerWarp + 2 * t;   // the keys (v_row, v_row + 1) of its V fragment
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int stage = tile % kStages;
    if (tile + kStages - 1 < n_tiles) load_tile(next_rows, (tile + kStages - 1) % kStages);
    cp_async_commit();
    tile_rows(tile + kStages, next_rows);
    cp_async_wait<kStages - 1>();
    __syncthreads();
    const unsigned char* k_tile = smem + 2 * stage * kTileBytesHere;
    const unsigned char* v_tile = k_tile + kTileBytesHere;

    // S (16 x 8) = Q K^T over this warp's 8 keys: keys key0 + 2t, + 1 for head g, in log2 units,
    // keys past the chunk masked.
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    decode_frag::score_8_keys<kFp8>(s, sm.qa, k_tile, k_row, t);
    const int key = key_begin + tile * kTileKeys + warp * kKeysPerWarp + 2 * t;
    const float sc[1][2] = {{key < key_end ? s[0] * scale_log2 : -INFINITY, key + 1 < key_end ? s[1] * scale_log2 : -INFINITY}};
    uint32_t pa[1];
    sm.step(sc, pa, t);
    decode_frag::accumulate_pv_8_keys<kFp8>(sm.o, v_tile, v_row, g, pa[0]);
    __syncthreads();  // the next iteration's load overwrites the stage read here
  }
  cp_async_wait<0>();
  sm.finish_sum();
  __syncthreads();

  // Merge the warps: accumulators at MmaAccAt (17 KiB), then [warp][head] maxima and sums.
  float* red_acc = reinterpret_cast<float*>(smem);
  float* red_m = red_acc + kWarps * kDecodeMaxHeadsPerCta * kAccHeadStride;
  float* red_l = red_m + kWarps * kDecodeMaxHeadsPerCta;
#pragma unroll
  for (int i = 0; i < kDimTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = 2 * t + (e & 1), d = 16 * g + i + (e >> 1) * 8;
      if (h < n_heads_here) red_acc[MmaAccAt::at(warp, h, d)] = sm.o[i][e];
    }
  if (g < n_heads_here && t == 0) {
    red_m[warp * kDecodeMaxHeadsPerCta + g] = sm.m;
    red_l[warp * kDecodeMaxHeadsPerCta + g] = sm.l;
  }
  __syncthreads();
  decode_merge_and_store<kHeadDim, kWarps, kDecodeMaxHeadsPerCta, kFp8, MmaAccAt>(a, plan, ws, red_acc, red_m, red_l, b, head0,
                                                                                  cta.chunk, kv.v_scale);
}

}  // namespace

bool decode_mma_applies(const DecodeAttentionArgs& a, const DecodePlan& plan) {
  return a.head_dim == kHeadDim && plan.heads_per_cta >= 2 && plan.heads_per_cta <= kDecodeMaxHeadsPerCta &&
         plan.chunk_keys % kTileKeys == 0;
}

Status launch_decode_mma(const DecodeAttentionArgs& a, const DecodePlan& plan, DecodeWorkspace ws, float scale_log2,
                         cudaStream_t stream) {
  if (!decode_mma_applies(a, plan)) return invalid_argument("decode attention (mma): head_dim 128 and 2..8 heads per CTA only");
  const dim3 grid(static_cast<unsigned>(plan.n_chunks), static_cast<unsigned>(a.n_heads / plan.heads_per_cta),
                  static_cast<unsigned>(a.batch));
  const auto kernel = a.kv_dtype == KvCacheDType::kE4M3 ? decode_attention_mma_kernel<true> : decode_attention_mma_kernel<false>;
  LLMQ_CUDA_RETURN_IF_ERROR(llmq::detail::launch_pdl(kernel, grid, dim3(kThreads), kDecodeSmemBytes, stream, a, plan, ws, scale_log2));
  return {};
}

}  // namespace llmq::attention
