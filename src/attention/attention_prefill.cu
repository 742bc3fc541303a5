// Prefill attention (see attention.hpp): flash-attention-2 style forward over the paged KV cache.
//  * Tensor-core kernel (head_dim 32, 64, 128): a CTA of 4 warps takes 64 queries of one q head;
//    each warp owns 16 query rows whose Q fragments stay in registers for the whole loop. Key/value
//    tiles of 64 rows stream through shared memory with cp.async, double buffered (tile j+1 loads
//    while tile j is computed). S = Q K^T and O += P V are mma.sync m16n8k16 BF16 with FP32
//    accumulators; the softmax is online in FP32 (exp2 with the scale folded in), so S never
//    leaves registers. Shared rows are XOR-swizzled in 16-byte chunks so that ldmatrix reads are
//    free of bank conflicts. Causal CTAs walk their key tiles from the last one down: only the
//    first tiles met need the mask, and tiles entirely above the diagonal are never loaded.
//  * CUDA-core kernel (head_dim 8..256): one warp per query row; lanes take 32 keys at a time for
//    the scores, then own head_dim / 32 output dims for P V. The reference path and the fallback.
// Shared memory of the tensor-core kernel: Q 64 x d + 2 stages x (K + V) 64 x d, BF16
// (d = 128: 80 KiB, two CTAs per SM).
//  * E4M3 cache: the tensor-core kernel streams the raw codes (2 stages x (K + V) 64 x d bytes)
//    with cp.async and, once a tile has landed, widens it exactly into ONE BF16 K tile and ONE BF16
//    V tile (swizzled as above) that the unchanged ldmatrix / mma path reads: Q + K + V BF16 +
//    the raw ring is again 80 KiB at d = 128. The CUDA-core kernel widens codes as it reads them.
//    Both fold k_scale[kv head] into the softmax scale and multiply the normalised output by
//    v_scale[kv head].
//  * Sliding window: a tensor-core CTA starts at the tile holding its first row's oldest key (tiles
//    before every row's window are never loaded); tiles that reach below some row's window take
//    the mask. The CUDA-core kernel starts its key loop at the row's oldest key.
//  * Sinks: added to the row sum once, at the normalisation, against the row's final maximum.
//  * Paged cache: every key row is addressed through the sequence's block-table row (kv_pages.cuh),
//    one lookup per row a thread copies (the K and V copies of a row share it); a row past the keys
//    copies nothing and points at cache row 0. Only addresses change: the arithmetic, and so the
//    results, are those of a contiguous cache bit for bit.
//  * Both kernels take the two features as a template flag (kExtras: a window or sinks are set):
//    the plain instances compile to the PTX of the kernels without them (H200: with the window's
//    compares merely possible, the plain mma kernel ran 1-2.5% slower).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <set>
#include <string>

#include "cuda/cuda_check.cuh"
#include "attention/attention.hpp"
#include "attention/attention_mma.cuh"
#include "attention/attention_validate.hpp"
#include "attention/kv_pages.cuh"

namespace llmq::attention {
namespace {

using namespace mma;  // attention/attention_mma.cuh

// Where query rows and key rows of one (sequence, head) are, and what the sequence sees. Key t of
// the kv head is at element rows.row(t) * n_kv_heads * head_dim + kv_off of the cache.
struct SequenceView {
  int64_t q_row0 = 0;  // first packed query row of the sequence
  int nq = 0;          // its query count
  int kv_len = 0;      // keys valid in the cache (clamped to the capacity)
  PagedRows rows;      // position -> cache row
  int64_t kv_off = 0;  // element offset of the kv head within a cache row
};

__device__ __forceinline__ SequenceView sequence_view(const PrefillAttentionArgs& a, int b, int kv_head, int head_dim) {
  SequenceView s;
  s.q_row0 = a.q_start[b];
  s.nq = a.q_start[b + 1] - a.q_start[b];
  s.kv_len = min(max(a.kv_len[b], 0), pages_capacity(a.pages));
  s.rows = paged_rows(a.pages, a.slot[b]);
  s.kv_off = static_cast<int64_t>(kv_head) * head_dim;
  return s;
}

// ---------------------------------------------------------------------------------------------
// Tensor-core kernel

// Keys [key0, key0 + 64) of a sequence, K and V, into two swizzled BF16 tiles (the layout
// load_tile_async writes). k_base / v_base point at the kv head in cache row 0; key t's row is
// rows.row(t), row_stride elements per cache row. Keys at or beyond key_end are zero-filled and
// their address is cache row 0 (valid whatever the table holds past the sequence).
template <int kHeadDim>
__device__ __forceinline__ void load_paged_kv_tiles_async(uint32_t k_tile, uint32_t v_tile, const uint16_t* k_base,
                                                          const uint16_t* v_base, int64_t row_stride,
                                                          const PagedRows& rows, int key0, int key_end) {
  using L = TileLayout<kHeadDim>;
  constexpr int kPerThread = kBlockKv * L::kChunks / kThreads;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int row = idx / L::kChunks, chunk = idx % L::kChunks;
    const bool valid = key0 + row < key_end;
    const int64_t src = static_cast<int64_t>(valid ? rows.row(key0 + row) : 0) * row_stride + chunk * 8;
    const uint32_t dst = L::offset_bytes(row, chunk);
    cp_async_16(k_tile + dst, k_base + src, valid ? 16 : 0);
    cp_async_16(v_tile + dst, v_base + src, valid ? 16 : 0);
  }
}

// E4M3 keys [key0, key0 + 64) of a sequence, K and V, into two unswizzled 64 x kHeadDim-byte tiles,
// 16 bytes at a time; addressing as load_paged_kv_tiles_async (row_stride_bytes per cache row),
// keys at or beyond key_end zero-filled (code 0 is +0).
template <int kHeadDim>
__device__ __forceinline__ void load_paged_raw_tiles_async(uint32_t k_tile, uint32_t v_tile, const uint8_t* k_base,
                                                           const uint8_t* v_base, int64_t row_stride_bytes,
                                                           const PagedRows& rows, int key0, int key_end) {
  constexpr int kPieces = kHeadDim / 16;  // per row
  constexpr int kPerThread = kBlockKv * kPieces / kThreads;
  static_assert(kPerThread * kThreads == kBlockKv * kPieces, "raw tile shape");
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int row = idx / kPieces, piece = idx % kPieces;
    const bool valid = key0 + row < key_end;
    const int64_t src = static_cast<int64_t>(valid ? rows.row(key0 + row) : 0) * row_stride_bytes + piece * 16;
    cp_async_16(k_tile + idx * 16, k_base + src, valid ? 16 : 0);
    cp_async_16(v_tile + idx * 16, v_base + src, valid ? 16 : 0);
  }
}

// Widens a raw E4M3 tile (generic pointer to shared memory) into a swizzled BF16 tile: each thread
// takes 8 codes (an 8-byte read; a warp reads 256 contiguous bytes) and writes one 16-byte chunk
// (8 consecutive threads fill the 8 chunks of one 128-byte line: no bank conflict).
template <int kHeadDim>
__device__ __forceinline__ void widen_tile(const unsigned char* raw, unsigned char* tile) {
  using L = TileLayout<kHeadDim>;
  constexpr int kPerThread = kBlockKv * L::kChunks / kThreads;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int row = idx / L::kChunks, chunk = idx % L::kChunks;
    const uint2 codes = *reinterpret_cast<const uint2*>(raw + idx * 8);
    uint4 w;
    w.x = e4m3x2_to_bf16x2(codes.x);
    w.y = e4m3x2_to_bf16x2(codes.x >> 16);
    w.z = e4m3x2_to_bf16x2(codes.y);
    w.w = e4m3x2_to_bf16x2(codes.y >> 16);
    *reinterpret_cast<uint4*>(tile + L::offset_bytes(row, chunk)) = w;
  }
}

// kFp8: the cache holds E4M3 codes (k_cache8 / v_cache8) with per-kv-head scales. kExtras: a
// window or sinks are set (else a.window and a.sinks are not read).
template <int kHeadDim, bool kFp8, bool kExtras>
__global__ void __launch_bounds__(kThreads, 2)
    prefill_attention_mma_kernel(PrefillAttentionArgs a, float scale_log2) {
  using L = TileLayout<kHeadDim>;
  constexpr int kKSteps = kHeadDim / 16;    // k-steps of S = Q K^T
  constexpr int kDimTiles = kHeadDim / 8;   // n-tiles of O
  constexpr int kKeyTiles = kBlockKv / 8;   // n-tiles of S
  constexpr int kTileBytes = kBlockKv * kHeadDim * 2;
  constexpr int kRawBytes = kBlockKv * kHeadDim;  // an E4M3 tile
  extern __shared__ __align__(128) unsigned char smem[];
  // BF16 cache: Q, then K of stage 0 and 1, then V of stage 0 and 1.
  // E4M3 cache: Q, K, V (BF16, written by widen_tile), then raw K and V of stage 0, of stage 1.
  const uint32_t q_tile = smem_addr(smem);
  const auto k_tile = [&](int stage) { return q_tile + (kFp8 ? 1 : 1 + stage) * kTileBytes; };
  const auto v_tile = [&](int stage) { return q_tile + (kFp8 ? 2 : 3 + stage) * kTileBytes; };
  constexpr int kRawOffset = 3 * kTileBytes;
  const auto raw_k_tile = [&](int stage) { return q_tile + kRawOffset + 2 * stage * kRawBytes; };
  const auto raw_v_tile = [&](int stage) { return raw_k_tile(stage) + kRawBytes; };
  static_assert(3 * kTileBytes + 4 * kRawBytes == 5 * kTileBytes, "the E4M3 layout takes the BF16 layout's bytes");

  // Heavy (late, causal) query blocks first: they take the most key tiles.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y, b = blockIdx.z;
  const int group = static_cast<int>(a.n_heads / a.n_kv_heads);
  const SequenceView seq = sequence_view(a, b, head / group, kHeadDim);
  const int q0 = m_block * kBlockQ;
  if (q0 >= seq.nq) return;
  const int q_rows = min(kBlockQ, seq.nq - q0);
  const int pos0 = seq.kv_len - seq.nq + q0;  // position of the CTA's first query
  // Key tiles any row of this CTA sees: tile_begin .. n_tiles - 1 (keys before key_end). The
  // window (host-clamped below capacity, or 0) starts lowest for the first row.
  const int window = kExtras ? static_cast<int>(a.window) : 0;
  const int key_end = a.causal ? min(seq.kv_len, pos0 + q_rows) : seq.kv_len;
  const int n_tiles = key_end > 0 ? (key_end + kBlockKv - 1) / kBlockKv : 0;
  const int tile_begin = window > 0 ? max(0, pos0 - window + 1) / kBlockKv : 0;
  const int n_iters = kExtras ? max(n_tiles - tile_begin, 0) : n_tiles;
  // Tiles below window_edge hold keys before some row's window (-1: no window, no tile does).
  const int window_edge = window > 0 ? pos0 + kBlockQ - window : -1;

  const int64_t q_stride = a.n_heads * kHeadDim, kv_stride = a.n_kv_heads * kHeadDim;  // elements
  const uint16_t* q_base = a.q + (seq.q_row0 + q0) * q_stride + static_cast<int64_t>(head) * kHeadDim;
  // Loads key tile j (both K and V) into stage `stage`: BF16 straight into the swizzled tiles,
  // E4M3 into the raw ring.
  const auto load_kv = [&](int j, int stage) {
    if constexpr (kFp8) {
      load_paged_raw_tiles_async<kHeadDim>(raw_k_tile(stage), raw_v_tile(stage), a.k_cache8 + seq.kv_off,
                                           a.v_cache8 + seq.kv_off, kv_stride, seq.rows, j * kBlockKv, key_end);
    } else {
      load_paged_kv_tiles_async<kHeadDim>(k_tile(stage), v_tile(stage), a.k_cache + seq.kv_off, a.v_cache + seq.kv_off,
                                          kv_stride, seq.rows, j * kBlockKv, key_end);
    }
  };
  float v_scale = 1.f;
  if constexpr (kFp8) {
    const int kv_head = head / group;
    scale_log2 *= a.k_scale[kv_head];  // scores of the dequantized keys: q . (code * k_scale)
    v_scale = a.v_scale[kv_head];
  }

  load_tile_async<kHeadDim>(q_tile, q_base, q_stride, 0, q_rows);
  if (n_iters > 0) load_kv(n_tiles - 1, 0);
  cp_async_commit();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates: row group, thread in group
  const int row_lo = warp * 16 + g;      // this thread's two rows within the CTA: row_lo, row_lo + 8
  const int pos_row[2] = {pos0 + row_lo, pos0 + row_lo + 8};
  // Each row's oldest visible key (0 without a window: no key lies below it).
  const int key_lo[2] = {window > 0 ? pos_row[0] - window + 1 : 0, window > 0 ? pos_row[1] - window + 1 : 0};

  float o_acc[kDimTiles][4];
#pragma unroll
  for (int i = 0; i < kDimTiles; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // raw (unscaled) scores
  float row_sum[2] = {0.f, 0.f};              // this thread's share of the row sum
  uint32_t q_frag[kKSteps][4];

  for (int it = 0; it < n_iters; ++it) {
    const int j = n_tiles - 1 - it;  // key tile, last first
    const int stage = it & 1;
    if (it + 1 < n_iters) {
      load_kv(j - 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if constexpr (kFp8) {
      // The previous tile's readers of the BF16 K / V tiles passed the barrier ending the last
      // iteration; this tile's raw codes are visible after the barrier above.
      widen_tile<kHeadDim>(smem + kRawOffset + 2 * stage * kRawBytes, smem + kTileBytes);
      widen_tile<kHeadDim>(smem + kRawOffset + (2 * stage + 1) * kRawBytes, smem + 2 * kTileBytes);
      __syncthreads();
    }
    if (it == 0) {
      // ldmatrix.x4 quads: rows 0-7 / 8-15 of the warp's 16, chunk 2ks / 2ks+1 -> a0..a3.
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
        ldmatrix_x4(q_frag[ks], q_tile + L::offset_bytes(warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2), 2 * ks + lane / 16));
    }

    // S = Q K^T (16 x 64 per warp).
    float s[kKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int np = 0; np < kKeyTiles / 2; ++np) {
        // Matrices: keys np*16 + 0-7 / 8-15 (lane / 16) x dims chunk 2ks / 2ks+1 ((lane / 8) % 2):
        // b0, b1 of key tile 2np, then b0, b1 of key tile 2np + 1.
        uint32_t kb[4];
        ldmatrix_x4(kb, k_tile(stage) + L::offset_bytes(np * 16 + (lane % 8) + 8 * (lane / 16), 2 * ks + (lane / 8) % 2));
        mma_bf16_16816(s[2 * np], q_frag[ks], kb[0], kb[1]);
        mma_bf16_16816(s[2 * np + 1], q_frag[ks], kb[2], kb[3]);
      }
    }

    // Mask keys past the sequence, (causal) above the diagonal and before the window; only edge
    // tiles need it.
    const int key0 = j * kBlockKv;
    const bool needs_mask =
        key0 + kBlockKv > seq.kv_len || (a.causal && key0 + kBlockKv - 1 > pos0) || (kExtras && key0 < window_edge);
    if (needs_mask) {
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + n * 8 + 2 * t + (e & 1);
          const int limit = a.causal ? min(seq.kv_len, pos_row[e / 2] + 1) : seq.kv_len;
          if (key >= limit || (kExtras && key < key_lo[e / 2])) s[n][e] = -INFINITY;
        }
    }

    // Online softmax and O += P V (attention_mma.cuh).
    softmax_pv_step<kHeadDim, false>(s, row_max, row_sum, o_acc, scale_log2, v_tile(stage), lane);
    __syncthreads();  // the next iteration's loads overwrite this stage
  }
  if (n_iters == 0) cp_async_wait<0>();
  const float* sinks = kExtras ? a.sinks : nullptr;
  const float sink_log2 = sinks != nullptr ? sinks[head] * kLog2e : 0.f;

  // Normalise and store: each quad writes 16 contiguous bytes of a row per dim tile.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    // The sink in P's units: 2^(s_h log2(e) - m), m the row's maximum in log2 units as
    // softmax_pv_step subtracts it (row_max is quad-uniform).
    if (sinks != nullptr && row_max[r] != -INFINITY) sum += fast_exp2(sink_log2 - row_max[r] * scale_log2);
    // A row that saw no key writes zeros; v_scale turns the weighted codes into values.
    const float inv = sum > 0.f ? (kFp8 ? v_scale / sum : 1.f / sum) : 0.f;
    const int row = row_lo + 8 * r;
    if (row < q_rows) {
      uint16_t* out_row = a.out + (seq.q_row0 + q0 + row) * q_stride + static_cast<int64_t>(head) * kHeadDim;
#pragma unroll
      for (int d = 0; d < kDimTiles; ++d)
        *reinterpret_cast<uint32_t*>(out_row + d * 8 + 2 * t) = pack_bf16x2(o_acc[d][2 * r] * inv, o_acc[d][2 * r + 1] * inv);
    }
  }
}

// BF16: Q + 2 x (K + V). E4M3: Q + K + V in BF16 + 2 x (K + V) in codes: the same bytes.
template <int kHeadDim> constexpr int mma_smem_bytes() { return 5 * kBlockKv * kHeadDim * 2; }

// ---------------------------------------------------------------------------------------------
// CUDA-core kernel: one warp per (query row, q head), 4 rows of one head per CTA.

constexpr int kRowsPerCta = 4;
constexpr int kMaxHeadDim = 256;

template <int kHeadDim, bool kFp8, bool kExtras>
__global__ void __launch_bounds__(kRowsPerCta * 32)
    prefill_attention_simt_kernel(PrefillAttentionArgs a, float scale_log2) {
  constexpr int kDimsPerLane = (kHeadDim + 31) / 32;
  __shared__ float q_row[kRowsPerCta][kHeadDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int head = blockIdx.y, b = blockIdx.z;
  const int group = static_cast<int>(a.n_heads / a.n_kv_heads);
  const SequenceView seq = sequence_view(a, b, head / group, kHeadDim);
  const int qi = blockIdx.x * kRowsPerCta + warp;
  if (qi >= seq.nq) return;  // whole warps leave; no CTA-wide barrier follows
  const int pos = seq.kv_len - seq.nq + qi;
  const int key_end = a.causal ? min(seq.kv_len, pos + 1) : seq.kv_len;
  const int key_begin = kExtras && a.window > 0 ? max(0, pos - static_cast<int>(a.window) + 1) : 0;  // the window's oldest key

  const int64_t q_stride = a.n_heads * kHeadDim, kv_stride = a.n_kv_heads * kHeadDim;
  const uint16_t* q_ptr = a.q + (seq.q_row0 + qi) * q_stride + static_cast<int64_t>(head) * kHeadDim;
  float v_scale = 1.f;
  if constexpr (kFp8) {
    scale_log2 *= a.k_scale[head / group];  // scores of the dequantized keys
    v_scale = a.v_scale[head / group];
  }
  for (int d = lane; d < kHeadDim; d += 32) q_row[warp][d] = bf16_to_float(q_ptr[d]) * scale_log2;
  __syncwarp();

  float acc[kDimsPerLane];
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) acc[i] = 0.f;
  float m = -INFINITY, lane_sum = 0.f;  // scores in log2 units (scale folded into q)
  for (int key0 = key_begin; key0 < key_end; key0 += 32) {
    const int key = key0 + lane;
    float s = -INFINITY;
    // This lane's key's cache row, looked up once: the P V loop below takes each key's from its lane.
    int key_row = 0;
    if (key < key_end) {
      key_row = seq.rows.row(key);
      const int64_t k_off = seq.kv_off + static_cast<int64_t>(key_row) * kv_stride;
      float dot = 0.f;
      if constexpr (kFp8) {
        const uint8_t* k_row = a.k_cache8 + k_off;
#pragma unroll
        for (int d = 0; d < kHeadDim; d += 8) {
          const uint2 raw = *reinterpret_cast<const uint2*>(k_row + d);  // 8 codes, 8-byte aligned
          const auto add_pair = [&](uint32_t two_codes, int i) {  // dims d + i, d + i + 1 (low byte first)
            const float2 k = e4m3x2_to_float2(two_codes);
            dot = __fmaf_rn(q_row[warp][d + i], k.x, dot);
            dot = __fmaf_rn(q_row[warp][d + i + 1], k.y, dot);
          };
          add_pair(raw.x, 0);
          add_pair(raw.x >> 16, 2);
          add_pair(raw.y, 4);
          add_pair(raw.y >> 16, 6);
        }
      } else {
        const uint16_t* k_row = a.k_cache + k_off;
#pragma unroll
        for (int d = 0; d < kHeadDim; d += 8) {
          const uint4 raw = *reinterpret_cast<const uint4*>(k_row + d);
          const auto add_pair = [&](uint32_t w, int i) {  // w: dims d + i, d + i + 1 (low half first)
            dot = __fmaf_rn(q_row[warp][d + i], __uint_as_float(w << 16), dot);
            dot = __fmaf_rn(q_row[warp][d + i + 1], __uint_as_float(w & 0xffff0000u), dot);
          };
          add_pair(raw.x, 0);
          add_pair(raw.y, 2);
          add_pair(raw.z, 4);
          add_pair(raw.w, 6);
        }
      }
      s = dot;
    }
    float m_new = s;
#pragma unroll
    for (int o = 16; o > 0; o /= 2) m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, o));
    m_new = fmaxf(m_new, m);  // finite: key0 < key_end, so some lane has a key
    const float corr = fast_exp2(m - m_new);
    const float p = fast_exp2(s - m_new);
    m = m_new;
    lane_sum = __fmaf_rn(lane_sum, corr, p);
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) acc[i] *= corr;
    const int n_keys = min(32, key_end - key0);
    for (int j = 0; j < n_keys; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      const int64_t v_off = seq.kv_off + static_cast<int64_t>(__shfl_sync(0xffffffffu, key_row, j)) * kv_stride;
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < kHeadDim) {
          const float v = kFp8 ? e4m3x2_to_float2(a.v_cache8[v_off + d]).x : bf16_to_float(a.v_cache[v_off + d]);
          acc[i] = __fmaf_rn(pj, v, acc[i]);
        }
      }
    }
  }
  float sum = lane_sum;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  // The sink joins the denominator in P's units against the final maximum m (log2 units).
  if (kExtras && a.sinks != nullptr && m != -INFINITY) sum += fast_exp2(__fmaf_rn(a.sinks[head], kLog2e, -m));
  const float inv = sum > 0.f ? (kFp8 ? v_scale / sum : 1.f / sum) : 0.f;  // v_scale: codes to values
  uint16_t* out_row = a.out + (seq.q_row0 + qi) * q_stride + static_cast<int64_t>(head) * kHeadDim;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < kHeadDim) {
      const __nv_bfloat16 v = __float2bfloat16_rn(acc[i] * inv);
      out_row[d] = *reinterpret_cast<const uint16_t*>(&v);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Host side

Status validate(const PrefillAttentionArgs& a) {
  const std::string f = "prefill_attention: ";
  if (a.q == nullptr) return invalid_argument(f + "q is null");
  if (a.out == nullptr) return invalid_argument(f + "out is null");
  if (a.q_start == nullptr) return invalid_argument(f + "q_start is null");
  if (a.kv_len == nullptr) return invalid_argument(f + "kv_len is null");
  if (a.slot == nullptr) return invalid_argument(f + "slot is null");
  LLMQ_RETURN_IF_ERROR(validate_kv_cache_and_alignment(a, f));
  if (a.batch < 0 || a.batch > 65535) return invalid_argument(f + "batch " + std::to_string(a.batch) + " not in [0, 65535]");
  if (a.max_q_len < 0 || a.max_q_len > (int64_t{1} << 30))
    return invalid_argument(f + "max_q_len " + std::to_string(a.max_q_len) + " not in [0, 2^30]");
  if (a.n_heads <= 0 || a.n_heads > 65535) return invalid_argument(f + "n_heads " + std::to_string(a.n_heads) + " not in [1, 65535]");
  if (a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0)
    return invalid_argument(f + "n_heads " + std::to_string(a.n_heads) + " is not a multiple of n_kv_heads " +
                            std::to_string(a.n_kv_heads));
  const int64_t d = a.head_dim;
  if (d != 8 && d != 16 && d != 32 && d != 64 && d != 128 && d != 256)
    return invalid_argument(f + "head_dim " + std::to_string(d) + " not one of 8, 16, 32, 64, 128, 256");
  if (a.kernel == PrefillKernel::kTensorCore && d != 32 && d != 64 && d != 128)
    return invalid_argument(f + "head_dim " + std::to_string(d) + ": the tensor-core kernel takes 32, 64 or 128");
  LLMQ_RETURN_IF_ERROR(validate_kv_pages(a.pages, f.c_str()));
  if (!(a.softmax_scale > 0.f) || !(a.softmax_scale < INFINITY))
    return invalid_argument(f + "softmax_scale " + std::to_string(a.softmax_scale) + " is not a positive finite number");
  LLMQ_RETURN_IF_ERROR(validate_window(a.window, a.causal, f));
  return {};
}

// Opts a kernel into more than 48 KiB of dynamic shared memory, once per (device, kernel).
Status allow_dynamic_smem(const void* kernel, int bytes) {
  static std::mutex mu;
  static std::set<std::pair<int, const void*>> done;
  int device = 0;
  LLMQ_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  if (done.count({device, kernel}) != 0) return {};
  LLMQ_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.insert({device, kernel});
  return {};
}

// Whether the window or the sinks are set (the window already clamped: 0 when it masks nothing).
bool has_extras(const PrefillAttentionArgs& a) { return a.window > 0 || a.sinks != nullptr; }

template <int kHeadDim> Status launch_mma(const PrefillAttentionArgs& a, float scale_log2, cudaStream_t stream) {
  constexpr int kSmem = mma_smem_bytes<kHeadDim>();
  const bool fp8 = a.kv_dtype == KvCacheDType::kE4M3;
  const auto kernel = has_extras(a) ? (fp8 ? prefill_attention_mma_kernel<kHeadDim, true, true>
                                           : prefill_attention_mma_kernel<kHeadDim, false, true>)
                                    : (fp8 ? prefill_attention_mma_kernel<kHeadDim, true, false>
                                           : prefill_attention_mma_kernel<kHeadDim, false, false>);
  LLMQ_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kSmem));
  const dim3 grid(static_cast<unsigned>((a.max_q_len + kBlockQ - 1) / kBlockQ), static_cast<unsigned>(a.n_heads),
                  static_cast<unsigned>(a.batch));
  kernel<<<grid, kThreads, kSmem, stream>>>(a, scale_log2);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("prefill_attention_mma_kernel");
  return {};
}

template <int kHeadDim> Status launch_simt(const PrefillAttentionArgs& a, float scale_log2, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((a.max_q_len + kRowsPerCta - 1) / kRowsPerCta),
                  static_cast<unsigned>(a.n_heads), static_cast<unsigned>(a.batch));
  const bool fp8 = a.kv_dtype == KvCacheDType::kE4M3;
  const auto kernel = has_extras(a) ? (fp8 ? prefill_attention_simt_kernel<kHeadDim, true, true>
                                           : prefill_attention_simt_kernel<kHeadDim, false, true>)
                                    : (fp8 ? prefill_attention_simt_kernel<kHeadDim, true, false>
                                           : prefill_attention_simt_kernel<kHeadDim, false, false>);
  kernel<<<grid, kRowsPerCta * 32, 0, stream>>>(a, scale_log2);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("prefill_attention_simt_kernel");
  return {};
}

}  // namespace

Status prefill_attention(const PrefillAttentionArgs& args, CudaStream stream) {
  LLMQ_RETURN_IF_ERROR(validate(args));
  if (args.batch == 0 || args.max_q_len == 0) return {};
  const float scale_log2 = args.softmax_scale * kLog2e;
  // Positions are below the capacity, so a window of capacity or more masks nothing: the plain path
  // (and the kernels' window arithmetic stays in int).
  PrefillAttentionArgs a = args;
  if (a.window >= a.pages.capacity()) a.window = 0;
  const bool tensor_core = a.kernel != PrefillKernel::kCudaCore && (a.head_dim == 32 || a.head_dim == 64 || a.head_dim == 128);
  if (tensor_core) {
    switch (a.head_dim) {
      case 32: return launch_mma<32>(a, scale_log2, stream);
      case 64: return launch_mma<64>(a, scale_log2, stream);
      default: return launch_mma<128>(a, scale_log2, stream);
    }
  }
  switch (a.head_dim) {
    case 8: return launch_simt<8>(a, scale_log2, stream);
    case 16: return launch_simt<16>(a, scale_log2, stream);
    case 32: return launch_simt<32>(a, scale_log2, stream);
    case 64: return launch_simt<64>(a, scale_log2, stream);
    case 128: return launch_simt<128>(a, scale_log2, stream);
    default: return launch_simt<kMaxHeadDim>(a, scale_log2, stream);
  }
}

}  // namespace llmq::attention
