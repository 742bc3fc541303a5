// Decode attention on tensor cores (decode_plan.hpp): the plan, grid, ring of key tiles, paged
// lookups and outputs of the CUDA-core kernel (attention_decode.cu), with the arithmetic of a tile
// on mma.sync. For a GQA group of 4 on CUDA cores every multiply-add of q . k and p * v came with
// about 1.5 more instructions (the 16-lane shuffle sums of each score, the softmax repeated on each
// of them, the unpacking), and at serving batch sizes the kernel was bound by them, not by the cache
// bytes (ncu, H200, 256 sequences of ~200 keys, E4M3 cache: 58 us a layer, 2.3x its bytes).
//
//  * A CTA's q heads (2..8) are the rows of a 16-row mma A operand (rows past them are zeros and
//    never written out). The four warps split each 32-key tile: warp w takes keys 8w..8w+7, so a
//    warp's scores are one m16n8 tile: S = Q K^T by 8 m16n8k16 steps over head_dim 128.
//  * Each warp keeps its own running max and sum per head (the four lanes of a row meet by two
//    shuffles), rescales its O and adds P V as O^T += V^T P^T: 8 m16n8k8 steps over head_dim, the
//    heads in the n8 columns, so that the accumulators are 32 registers (O's own 16 m16n8 tiles
//    would be 64, half of them padding rows) and 4 CTAs fit an SM. P^T's B fragment is the S
//    accumulator a lane already holds. The warps are merged at the end like the CUDA-core kernel's
//    key lanes.
//  * Operands are BF16: q as stored, unscaled (the softmax scale multiplies the FP32 scores); BF16
//    K and V as stored, E4M3 ones converted exactly (every E4M3 value is a BF16 value); P rounded to
//    BF16 (FlashAttention's choice: 2^-9 relative per weight, far inside the test's 1e-2).
//  * Shared tiles: rows of head_dim elements, 16-byte chunk c of row r at chunk c ^ (r & 7), so the
//    8 rows a fragment load touches fall in 8 bank groups (K by rows, V by columns).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/attention_mma.cuh"
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
using mma::fast_exp2;
using mma::pack_bf16x2;
using mma::smem_addr;

constexpr int kHeadDim = 128;
constexpr int kThreads = kDecodeThreads;
constexpr int kTileKeys = kDecodeTileBytes / (2 * kHeadDim);  // 32: the plan's tile
constexpr int kWarps = kThreads / 32;
constexpr int kKeysPerWarp = kTileKeys / kWarps;  // 8: one n8 score tile
constexpr int kDimTiles = kHeadDim / 16;          // 8 m16 tiles of O^T
static_assert(kKeysPerWarp == 8, "a warp's keys of a tile are one m16n8 score tile");

// c (16x8 FP32) += a (16x8 BF16, row: a0 rows 0-7, a1 rows 8-15) * b (8x8 BF16, col)
__device__ __forceinline__ void mma_bf16_1688(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(b0));
}
__device__ __forceinline__ uint32_t lds_u32(const unsigned char* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ uint32_t lds_u16(const unsigned char* p) { return *reinterpret_cast<const uint16_t*>(p); }

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
  const int64_t kv_stride_bytes = a.n_kv_heads * kRowBytes;
  const int64_t kv_base_bytes = static_cast<int64_t>(kv_head) * kRowBytes;
  const unsigned char* k_base;
  const unsigned char* v_base;
  float v_scale = 1.f;
  if constexpr (kFp8) {
    k_base = a.k_cache8 + kv_base_bytes;
    v_base = a.v_cache8 + kv_base_bytes;
    scale_log2 *= a.k_scale[kv_head];
    v_scale = a.v_scale[kv_head];
  } else {
    k_base = reinterpret_cast<const unsigned char*>(a.k_cache) + kv_base_bytes;
    v_base = reinterpret_cast<const unsigned char*>(a.v_cache) + kv_base_bytes;
  }
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
      const uint32_t at = row * kRowBytes + ((piece ^ (row & 7)) * 16);
      const bool valid = r[i] >= 0;
      const int64_t off = static_cast<int64_t>(valid ? r[i] : 0) * kv_stride_bytes + piece * 16;
      cp_async_16(k_dst + at, k_base + off, valid ? 16 : 0);
      cp_async_16(v_dst + at, v_base + off, valid ? 16 : 0);
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
  // Q as A fragments of the 8 k-steps: row g = head g of the CTA (zero past its heads), columns
  // 16kk + 2t, +1 (qa[kk][0]) and 16kk + 8 + 2t, +1 (qa[kk][1]); rows 8-15 are zeros.
  uint32_t qa[kHeadDim / 16][2];
  {
    const uint16_t* q = a.q + (static_cast<int64_t>(b) * a.n_heads + head0 + g) * kHeadDim;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      qa[kk][0] = g < n_heads_here ? *reinterpret_cast<const uint32_t*>(q + 16 * kk + 2 * t) : 0u;
      qa[kk][1] = g < n_heads_here ? *reinterpret_cast<const uint32_t*>(q + 16 * kk + 8 + 2 * t) : 0u;
    }
  }
  // O^T fragments: o[i] = O[heads 2t, 2t + 1][dims 16i + g] (0, 1) and [dims 16i + 8 + g] (2, 3).
  float o[kDimTiles][4];
#pragma unroll
  for (int i = 0; i < kDimTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m = -INFINITY, l = 0.f;  // row g's running max (log2 units) and this lane's part of its sum

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

    // S (16 x 8) = Q K^T over this warp's 8 keys.
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    const unsigned char* k_at = k_tile + k_row * kRowBytes;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t b0, b1;
      if constexpr (kFp8) {  // dims 16kk.. are chunk kk; bytes 2t and 8 + 2t of it
        const unsigned char* c = k_at + ((kk ^ (k_row & 7)) * 16);
        b0 = mma::e4m3x2_to_bf16x2(lds_u16(c + 2 * t));
        b1 = mma::e4m3x2_to_bf16x2(lds_u16(c + 8 + 2 * t));
      } else {  // dims 16kk.. are chunks 2kk and 2kk + 1; 4 bytes at 4t of each
        b0 = lds_u32(k_at + (((2 * kk) ^ (k_row & 7)) * 16) + 4 * t);
        b1 = lds_u32(k_at + (((2 * kk + 1) ^ (k_row & 7)) * 16) + 4 * t);
      }
      const uint32_t afrag[4] = {qa[kk][0], 0u, qa[kk][1], 0u};
      mma::mma_bf16_16816(s, afrag, b0, b1);
    }
    // Scores of keys key0 + 2t, + 1 for head g, in log2 units; keys past the chunk masked.
    const int key = key_begin + tile * kTileKeys + warp * kKeysPerWarp + 2 * t;
    const float s0 = key < key_end ? s[0] * scale_log2 : -INFINITY;
    const float s1 = key + 1 < key_end ? s[1] * scale_log2 : -INFINITY;
    float m_tile = fmaxf(s0, s1);
    m_tile = fmaxf(m_tile, __shfl_xor_sync(0xffffffffu, m_tile, 1));
    m_tile = fmaxf(m_tile, __shfl_xor_sync(0xffffffffu, m_tile, 2));
    const float m_new = fmaxf(m, m_tile);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no key yet: exp2 gives 0, not NaN
    const float corr = fast_exp2(m - m_use);
    m = m_new;
    const float p0 = fast_exp2(s0 - m_use), p1 = fast_exp2(s1 - m_use);
    const uint32_t pa = pack_bf16x2(p0, p1);
    // The sum counts the P that P V uses (BF16-rounded).
    l = __fmaf_rn(l, corr, __uint_as_float(pa << 16) + __uint_as_float(pa & 0xffff0000u));

    // O^T = O^T * corr + V^T P^T (m16n8k8: A = V^T, 16 dims x this warp's 8 keys; B = P^T, whose
    // fragment is this lane's (p0, p1) of head g). Columns 2t, 2t + 1 of O^T are heads 2t, 2t + 1:
    // their corrections come from the lanes that own those rows of S.
    const float corr_lo = __shfl_sync(0xffffffffu, corr, 8 * t), corr_hi = __shfl_sync(0xffffffffu, corr, 8 * t + 4);
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i) {
      o[i][0] *= corr_lo;
      o[i][1] *= corr_hi;
      o[i][2] *= corr_lo;
      o[i][3] *= corr_hi;
      uint32_t a0, a1;  // V[v_row, v_row + 1][16i + g] and [16i + 8 + g]
      if constexpr (kFp8) {  // dims 16i.. are chunk i: bytes g and 8 + g
        const unsigned char* r0 = v_tile + v_row * kRowBytes + ((i ^ (v_row & 7)) * 16);
        const unsigned char* r1 = v_tile + (v_row + 1) * kRowBytes + ((i ^ ((v_row + 1) & 7)) * 16);
        a0 = mma::e4m3x2_to_bf16x2(uint32_t{r0[g]} | (uint32_t{r1[g]} << 8));
        a1 = mma::e4m3x2_to_bf16x2(uint32_t{r0[8 + g]} | (uint32_t{r1[8 + g]} << 8));
      } else {  // dims 16i.. are chunks 2i and 2i + 1: bytes 2g of each
        const unsigned char* r0 = v_tile + v_row * kRowBytes + 2 * g;
        const unsigned char* r1 = v_tile + (v_row + 1) * kRowBytes + 2 * g;
        a0 = lds_u16(r0 + (((2 * i) ^ (v_row & 7)) * 16)) | (lds_u16(r1 + (((2 * i) ^ ((v_row + 1) & 7)) * 16)) << 16);
        a1 = lds_u16(r0 + (((2 * i + 1) ^ (v_row & 7)) * 16)) |
             (lds_u16(r1 + (((2 * i + 1) ^ ((v_row + 1) & 7)) * 16)) << 16);
      }
      mma_bf16_1688(o[i], a0, a1, pa);
    }
    __syncthreads();  // the next iteration's load overwrites the stage read here
  }
  cp_async_wait<0>();
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  __syncthreads();

  // Merge the warps: [warp][head][dim] accumulators (16 KiB), then [warp][head] maxima and sums.
  float* red_acc = reinterpret_cast<float*>(smem);
  float* red_m = red_acc + kWarps * kDecodeMaxHeadsPerCta * kHeadDim;
  float* red_l = red_m + kWarps * kDecodeMaxHeadsPerCta;
#pragma unroll
  for (int i = 0; i < kDimTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = 2 * t + (e & 1), d = 16 * i + g + (e >> 1) * 8;
      if (h < n_heads_here) red_acc[(warp * kDecodeMaxHeadsPerCta + h) * kHeadDim + d] = o[i][e];
    }
  if (g < n_heads_here && t == 0) {
    red_m[warp * kDecodeMaxHeadsPerCta + g] = m;
    red_l[warp * kDecodeMaxHeadsPerCta + g] = l;
  }
  __syncthreads();
  decode_merge_and_store<kHeadDim, kWarps, kDecodeMaxHeadsPerCta, kFp8>(a, plan, ws, red_acc, red_m, red_l, b, head0, cta.chunk,
                                                                       v_scale);
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
