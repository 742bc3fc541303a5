// Decode GEMM (include/llmq/cuda_decode_gemm.hpp): D[M, N] = A[M, K] * W[N, K]^T * scales for
// M <= 16 tokens and 8-bit weights, written to run at the speed of streaming W once.
//
// Work split. N is cut into tiles of 16 weight rows (the 16 A rows of an mma tile). A CTA of 8
// warps owns tiles_per_cta consecutive tiles; K is cut into batches of kUnroll 64-wide steps and
// warp w takes batches w, w + 8, ..., so at any time the CTA's warps read neighbouring pieces of
// the same rows, and the activations a warp loads serve all of the CTA's tiles. With split_k > 1
// the split_k CTAs of a thread-block cluster share the tiles and each covers 1/split_k of K (for N
// too small to give every SM a CTA).
//
// Data path. Every lane loads its weights with 16-byte ld.global.nc straight into registers: lane
// (g = lane / 4, q = lane % 4) of a warp reads rows g and g + 8 of a tile at K offset 16 q of a
// step, so one warp load covers 64 contiguous bytes of 8 rows (whole 32-byte sectors). A warp
// issues the loads of a batch (8 x 16 weight bytes per lane) and the activation pieces the batch
// needs together, then multiplies; two CTAs per SM (registers) keep ~64 KB per SM requested.
// Measured on an H100 (bench_cuda_decode_gemm, with a plain read of the same bytes as the
// ceiling): with the activations loaded only after the weights had arrived, the kernel ran ~35%
// slower than the same loads without products (their L2 hits wait behind the weight stream: a
// second round trip per batch); requested together, the FP8 kernel reaches ~90% of the read and
// the INT8 one ~95%. A shared-memory cp.async ring with a __syncthreads per stage (the first
// design) reached ~45% of the copy bandwidth; a second register buffer (loads of batch j + 1 in
// flight during batch j's products) cost the occupancy it needed and was no faster.
//
// Products (tensor cores, weight rows as the mma's 16 A rows, tokens as its n8 columns: one mma
// per 16 rows x 32 K for M <= 8, two for M <= 16):
//   W8A16: mma.m16n8k16 bf16 -> fp32. A lane's 16 weight bytes of a row become 8 bf16x2
//          registers: E4M3 by moving sign, exponent and mantissa into BF16 position (the value
//          times 2^-120, exact) and one bf16x2 multiply by 2^120 (exact); INT8 as
//          (128 + (b & 127)) - (128 or 256), two exact BF16 values. Both are exact, so each
//          product is the exact product of the BF16 activation and the weight code.
//   W8A8:  mma.m16n8k32 e4m3 -> fp32 or s8 -> s32, the 16 bytes used as they are.
// The reduction over K is a sum, so the order of K inside an mma is free: lane (g, q) supplies
// physical K [16q, 16q + 16) of its 64-wide step as mma K positions {2q, 2q+1, 2q+8, 2q+9} (k16)
// or {4q..4q+3, 16+4q..16+4q+3} (k32), and reads the A row segment at the same physical K; every
// lane with the same q maps an mma K position to the same physical K, which is all mma needs.
//
// Reduction and epilogue. The warps' partial tiles meet in shared memory and are summed in warp
// order; with split_k > 1 each CTA's sums are read by the cluster's CTAs through distributed shared
// memory and summed in rank order, each CTA finishing 1/split_k of the outputs. Fixed orders, so
// results are deterministic. Epilogue as in the CPU reference: acc * (a_scale[m] * w_scale[n])
// (+ bias), one BF16 rounding.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda/cuda_check.cuh"
#include "cuda/device_facts.cuh"
#include "cuda/pdl.cuh"
#include "llmq/cuda_decode_gemm.hpp"
#include "llmq/gemm.hpp"
#include "moe/moe_decode_gemm.hpp"

namespace llmq {
namespace decode_gemm {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTileN = 16;         // weight rows per mma tile (the mma's 16 A rows)
constexpr int kStepK = 64;         // K elements one warp load covers: 4 lanes x 16 bytes
constexpr int kLoadsPerBatch = 8;  // 16-byte weight loads per lane in one batch

int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }
int64_t round_up(int64_t x, int64_t y) { return ceil_div(x, y) * y; }

// Everything the kernel reads, by value.
struct Params {
  const uint8_t* a;
  const uint8_t* w;
  const float* a_scale;
  const float* w_scale;
  const float* bias;
  uint16_t* d;
  int64_t a_stride;  // bytes between A rows
  int64_t w_stride;  // bytes between W rows
  int64_t d_stride;  // elements between D rows
  int64_t k;
  int64_t k_per_split;
  int m;
  int n;
  int a_scale_step;  // 0: one scale for the tensor, 1: one per row
  int w_scale_step;
  int split_k;
  // Grouped mode (MoE experts, src/moe/moe_decode_gemm.hpp); group_offsets null otherwise. The
  // experts' rows are cut into chunks of 16 (expert 0's chunks first); grid slice z takes chunk z,
  // and slices past the last chunk leave.
  const int32_t* group_offsets;
  const int32_t* group_rows;      // A row of each permuted row, or null (A is permuted already)
  int64_t w_group_stride;         // bytes between experts' weights
  int64_t w_scale_group_stride;   // floats between experts' scales
  int groups;                     // experts
  int scale_k_blocks;             // kBlock: ceil(K / 128), the scale grids' width
};

// Grouped mode: the expert and first row of chunk `z`, found by warp 0 (a warp-wide scan of the
// experts' chunk counts, 32 experts per step); *expert = -1 when z is past the last chunk.
__device__ __forceinline__ void find_group_chunk(const Params& p, int z, int lane, int* expert, int64_t* begin) {
  if (lane == 0) *expert = -1;
  __syncwarp();
  int base = 0;
  for (int e0 = 0; e0 < p.groups && base <= z; e0 += 32) {
    const int e = e0 + lane;
    const int rows = e < p.groups ? p.group_offsets[e + 1] - p.group_offsets[e] : 0;
    const int chunks = (rows + 15) / 16;
    int incl = chunks;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += v;
    }
    if (z >= base + incl - chunks && z < base + incl) {
      *expert = e;
      *begin = p.group_offsets[e] + 16 * static_cast<int64_t>(z - (base + incl - chunks));
    }
    base += __shfl_sync(0xffffffffu, incl, 31);
  }
}

// ---------------------------------------------------------------------------------------------
// Device helpers

// 16 weight bytes, read once: not kept in L1; with kPrefetch L2 fetches the whole 256-byte block
// (a warp reads the next 64 bytes of each row at its next step).
template <bool kPrefetch>
__device__ __forceinline__ uint4 load_weights(const uint8_t* src) {
  uint4 v;
  if constexpr (kPrefetch)
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(src));
  else
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(src));
  return v;
}

// 16 activation bytes: every CTA reads them, so they stay in L1.
__device__ __forceinline__ uint4 load_activations(const uint8_t* src) {
  return __ldg(reinterpret_cast<const uint4*>(src));
}

__device__ __forceinline__ uint32_t permute(uint32_t x, uint32_t selector) {
  uint32_t r;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(x), "r"(selector));
  return r;
}

__device__ __forceinline__ uint32_t bf16x2_fma(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// Two E4M3 codes -> BF16x2, exact. prmt puts each selected byte in its 16-bit lane sign-extended
// (0x9180: bytes 0, 1; 0xB3A2: bytes 2, 3): s ssss ssss eeee mmm. Shifted left by 4 and masked
// with 0x87F0 this is s 0000eeee mmm0000: the BF16 with E4M3's exponent field in the low bits of
// BF16's, i.e. the value times 2^(7 - 127), subnormals included. One multiply by 2^120 (BF16
// 0x7B80; -0 addend keeps the sign of zero) restores it; every result is a normal BF16.
template <uint32_t kSelector>
__device__ __forceinline__ uint32_t widen_e4m3x2(uint32_t word) {
  const uint32_t x = (permute(word, kSelector) << 4) & 0x87F087F0u;
  return bf16x2_fma(x, 0x7B807B80u, 0x80008000u);
}

// Two INT8 codes -> BF16x2, exact: b = (128 + (b & 127)) - (b < 0 ? 256 : 128), both terms BF16
// values in [128, 256] built by OR-ing into 0x4300 (= 128), subtracted as x * -1 + y.
template <uint32_t kSelector>
__device__ __forceinline__ uint32_t widen_s8x2(uint32_t word) {
  const uint32_t x = permute(word, kSelector);  // byte in the low half of each lane, zero above
  const uint32_t magnitude = (x & 0x007F007Fu) | 0x43004300u;
  const uint32_t offset = (x & 0x00800080u) | 0x43004300u;
  return bf16x2_fma(offset, 0xBF80BF80u, magnitude);
}

template <bool kInt8, int kHalf>
__device__ __forceinline__ uint32_t widen(uint32_t word) {
  if constexpr (kInt8)
    return widen_s8x2<kHalf == 0 ? 0x4140u : 0x4342u>(word);
  else
    return widen_e4m3x2<kHalf == 0 ? 0x9180u : 0xB3A2u>(word);
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_8bit(int32_t (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_8bit(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  // Unreachable: the host refuses FP8 W8A8 unless this kernel was built for sm_89 or later.
  __trap();
#endif
}


// ---------------------------------------------------------------------------------------------
// The kernel. kInt8: weights INT8 (else E4M3); kABf16: W8A16 (else A has the weight's format);
// kM16: M > 8 (a second n8 tile of tokens 8..15); kTiles: 16-row tiles per CTA; kPrefetch:
// .L2::256B on the weight loads.

// kW16 (with kInt8 = kABf16 = false): BF16 weights and BF16 activations, for MoE's BF16 experts.
// The W8A8 data path runs unchanged on bytes (the host passes K, strides and offsets in bytes), and
// each lane's 8 bytes per row and token become one mma.m16n8k16 bf16 instead of one k32 8-bit mma:
// the same registers, two BF16 per 32-bit word; no scales.
// kBlock (E4M3 W8A8 only): 128x128 weight-block scales w_scale[row / 128, k / 128] and 1x128
// activation-block scales a_scale[token, k / 128]; each 64-wide K step's products are taken fresh
// and added times both scales of their K block (a 16-row tile lies in one 128-row block).
template <bool kInt8, bool kABf16, bool kM16, int kTiles, bool kPrefetch, bool kW16 = false, bool kBlock = false>
__global__ void __launch_bounds__(kThreads, 2) decode_gemm_kernel(const Params p) {
  using Acc = std::conditional_t<kInt8 && !kABf16, int32_t, float>;
  constexpr int kAElt = kABf16 ? 2 : 1;
  constexpr int kTokenTiles = kM16 ? 2 : 1;           // n8 tiles of tokens
  constexpr int kUnroll = kLoadsPerBatch / (2 * kTiles);  // steps per batch: 2 rows per tile per lane
  constexpr int kValues = kTiles * kTokenTiles * 32 * 4;  // accumulators of one warp
  // Partial sums of the warps, then the CTA's sums that the cluster reads.
  __shared__ Acc red[kWarps][kValues];
  __shared__ Acc exch[kValues];

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int rank = static_cast<int>(blockIdx.y);  // K range within the cluster
  // Grouped mode: which expert and rows this CTA serves, read before anything else (the offsets
  // come from the routing kernel, hence the programmatic-launch wait first). A slice past the last
  // chunk leaves at once, and no chunk belongs to an unrouted expert, whose weights are never read.
  // Every CTA of a cluster has the same z, so a cluster leaves together.
  const bool grouped = p.group_offsets != nullptr;
  const uint8_t* w_base = p.w;
  const float* w_scale = p.w_scale;
  uint16_t* d_base = p.d;
  int m_rows = p.m;
  int64_t group_begin = 0;
  if (grouped) {
    llmq::detail::pdl_wait();
    __shared__ int chunk_expert;
    __shared__ int64_t chunk_begin;
    if (warp == 0) find_group_chunk(p, static_cast<int>(blockIdx.z), lane, &chunk_expert, &chunk_begin);
    __syncthreads();
    const int e = chunk_expert;
    if (e < 0) return;  // the whole CTA (and its cluster: same z) leaves
    group_begin = chunk_begin;
    m_rows = min(kTileN, static_cast<int>(p.group_offsets[e + 1] - group_begin));
    w_base += e * p.w_group_stride;
    w_scale += e * p.w_scale_group_stride;
    d_base += group_begin * p.d_stride;
  }
  // The A row (and a_scale index) of output row i.
  auto a_row = [&](int i) -> int64_t {
    if (!grouped) return i;
    return p.group_rows != nullptr ? p.group_rows[group_begin + i] : group_begin + i;
  };
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTiles * kTileN;
  const int64_t k_begin = min(p.k, static_cast<int64_t>(rank) * p.k_per_split);
  const int64_t k_end = min(p.k, k_begin + p.k_per_split);
  const int steps = static_cast<int>((k_end - k_begin + kStepK - 1) / kStepK);
  // Batches of kUnroll steps; warp w takes batches w, w + 8, ...: at any time the CTA's warps read
  // neighbouring pieces of the same rows.
  auto batch_start = [&](int j) { return (warp + j * kWarps) * kUnroll; };

  // Lane (g, q) reads rows g and g + 8 of each tile (mma rows), at K offset 16 q of a step.
  const uint8_t* wrow[kTiles][2];
  bool row_ok[kTiles][2];
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + t * kTileN + g + 8 * h;
      row_ok[t][h] = row < p.n;
      wrow[t][h] = w_base + (row_ok[t][h] ? row * p.w_stride : 0) + q * 16;
    }
  // ... and the activations of tokens g (and g + 8), the mma's n8 columns.
  const bool has0 = g < m_rows, has1 = kM16 && g + 8 < m_rows;
  const uint8_t* arow0 = p.a + (has0 ? a_row(g) : 0) * p.a_stride + q * 16 * kAElt;
  const uint8_t* arow1 = p.a + (has1 ? a_row(g + 8) : 0) * p.a_stride + q * 16 * kAElt;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  // kBlock: this lane's tokens (mma columns 2q, 2q + 1 of each token tile) and their scale rows.
  const float* sa_row[kTokenTiles][2] = {};
  if constexpr (kBlock) {
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int tok = 8 * j + 2 * q + c;
        sa_row[j][c] = tok < m_rows ? p.a_scale + a_row(tok) * p.scale_k_blocks : nullptr;
      }
  }

  // kChains independent accumulators per (tile, token tile), used in turn by consecutive mma, so
  // that a warp with one tile does not wait for each mma before the next.
  // (Two measured as fast as four or eight: the mma latency is not what limits the kernel.)
  constexpr int kChains = kTiles == 1 ? 2 : 1;
  Acc acc[kTiles][kTokenTiles][kChains][4];
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j)
#pragma unroll
      for (int h = 0; h < kChains; ++h)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[t][j][h][c] = Acc(0);

  // One batch: the loads of kUnroll steps, weights of kTiles tiles and the activations they meet
  // (zeros past K, N and M). The activations are requested together with the weights: loaded
  // only once the weights have arrived they cost a second memory round trip per batch.
  constexpr int kAVecs = kAElt * kTokenTiles;  // 16-byte activation pieces per step
  struct Batch {
    uint4 w[kUnroll][kTiles][2];
    uint4 a[kUnroll][kAVecs];
  };
  // Weights and activations are separate requests so that the first batch's weights (which no
  // earlier kernel writes) can be asked for before the programmatic-launch wait below.
  auto load_batch_weights = [&](int s0, Batch& b) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t kk = k_begin + static_cast<int64_t>(s0 + u) * kStepK;
      const bool ok = s0 + u < steps && kk + q * 16 < k_end;
#pragma unroll
      for (int t = 0; t < kTiles; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          b.w[u][t][h] = ok && row_ok[t][h] ? load_weights<kPrefetch>(wrow[t][h] + kk) : zero;
    }
  };
  auto load_batch_activations = [&](int s0, Batch& b) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t kk = k_begin + static_cast<int64_t>(s0 + u) * kStepK;
      const bool ok = s0 + u < steps && kk + q * 16 < k_end;
#pragma unroll
      for (int i = 0; i < kAElt; ++i) {
        b.a[u][i] = ok && has0 ? load_activations(arow0 + kk * kAElt + 16 * i) : zero;
        if constexpr (kM16) b.a[u][kAElt + i] = ok && has1 ? load_activations(arow1 + kk * kAElt + 16 * i) : zero;
      }
    }
  };
  // The products of one batch, step by step. Weight rows g, g + 8 are the mma's A rows; the
  // tokens are its n8 columns.
  auto compute_batch = [&](int s0, const Batch& b) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (s0 + u < steps) {  // warp-uniform
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j) {
          if constexpr (kABf16) {
            // 16 bf16 of token g (+ 8 j): register r holds K 2r, 2r + 1 of the lane's 16.
            const uint4 a0 = b.a[u][2 * j], a1 = b.a[u][2 * j + 1];
            const uint32_t x[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
            for (int t = 0; t < kTiles; ++t) {
              const uint4 lo = b.w[u][t][0], hi = b.w[u][t][1];
              const uint32_t wl[4] = {lo.x, lo.y, lo.z, lo.w}, wh[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                // Word i holds K 4i..4i+3: mma K {2q, 2q+1} <- bytes 0, 1; {2q+8, 2q+9} <- bytes 2, 3.
                mma_bf16(acc[t][j][(u * 4 + i) % kChains], widen<kInt8, 0>(wl[i]), widen<kInt8, 0>(wh[i]),
                         widen<kInt8, 1>(wl[i]), widen<kInt8, 1>(wh[i]), x[2 * i], x[2 * i + 1]);
              }
            }
          } else {
            const uint4 x = b.a[u][j];
#pragma unroll
            for (int t = 0; t < kTiles; ++t) {
              const uint4 lo = b.w[u][t][0], hi = b.w[u][t][1];
              // Bytes 0-7: mma K {4q..4q+3, 16+4q..16+4q+3} of the first k32; bytes 8-15 of the second.
              if constexpr (kW16) {
                mma_bf16(acc[t][j][(u * 2) % kChains], lo.x, hi.x, lo.y, hi.y, x.x, x.y);
                mma_bf16(acc[t][j][(u * 2 + 1) % kChains], lo.z, hi.z, lo.w, hi.w, x.z, x.w);
              } else if constexpr (kBlock) {
                float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                mma_8bit(part, lo.x, hi.x, lo.y, hi.y, x.x, x.y);
                mma_8bit(part, lo.z, hi.z, lo.w, hi.w, x.z, x.w);
                const int64_t kb = (k_begin + static_cast<int64_t>(s0 + u) * kStepK) / 128;
                const float sw = w_scale[((row0 + t * kTileN) / 128) * p.scale_k_blocks + kb];
                const float f0 = sa_row[j][0] != nullptr ? __fmul_rn(sa_row[j][0][kb], sw) : 0.0f;
                const float f1 = sa_row[j][1] != nullptr ? __fmul_rn(sa_row[j][1][kb], sw) : 0.0f;
                acc[t][j][0][0] += part[0] * f0;
                acc[t][j][0][1] += part[1] * f1;
                acc[t][j][0][2] += part[2] * f0;
                acc[t][j][0][3] += part[3] * f1;
              } else {
                mma_8bit(acc[t][j][(u * 2) % kChains], lo.x, hi.x, lo.y, hi.y, x.x, x.y);
                mma_8bit(acc[t][j][(u * 2 + 1) % kChains], lo.z, hi.z, lo.w, hi.w, x.z, x.w);
              }
            }
          }
        }
      }
    }
  };
  // No second register buffer for the next batch: it would double the weight registers and halve
  // the CTAs per SM, which measured no faster; the other warps of the SM keep memory busy.
  // Programmatic dependent launch (pdl.cuh): this grid may start while the kernel that writes A
  // is still running. The first batch of weights is requested before waiting for it, so their
  // memory latency overlaps that kernel's tail; A (and every write) comes after the wait.
  Batch b;
  if (!grouped && batch_start(0) < steps) load_batch_weights(batch_start(0), b);
  llmq::detail::pdl_wait();
  llmq::detail::pdl_launch_dependents();
  for (int j = 0; batch_start(j) < steps; ++j) {
    if (j > 0 || grouped) load_batch_weights(batch_start(j), b);
    load_batch_activations(batch_start(j), b);
    compute_batch(batch_start(j), b);
  }

  // acc * (a_scale * w_scale) (+ bias), the CPU reference's float operations in its order; the
  // 0 + x turns a -0 product into the +0 the reference's zero-initialised accumulator gives.
  auto store = [&](int m, int64_t n, Acc v) {
    const float x = std::is_same_v<Acc, int32_t> ? __int2float_rn(static_cast<int>(v)) : static_cast<float>(v);
    float y;
    if constexpr (kW16 || kBlock) {
      y = __fadd_rn(0.0f, x);  // BF16: no scales; blocks: applied per K step
    } else {
      float scale = w_scale[n * p.w_scale_step];
      if constexpr (!kABf16) scale = __fmul_rn(p.a_scale[a_row(m) * p.a_scale_step], scale);
      y = __fadd_rn(0.0f, __fmul_rn(x, scale));
    }
    if (p.bias != nullptr) y = __fadd_rn(y, p.bias[n]);
    d_base[m * p.d_stride + n] = __bfloat16_as_ushort(__float2bfloat16_rn(y));
  };
  // Accumulator e of the warp's fragments: (tile t, token tile j, lane ln, register c), with
  // c0, c1 = weight row g, tokens 2q, 2q + 1 and c2, c3 = row g + 8.
  auto coordinates = [&](int e, int* m, int64_t* n) {
    const int c = e & 3, ln = (e >> 2) & 31, j = (e >> 7) % kTokenTiles, t = (e >> 7) / kTokenTiles;
    *m = 8 * j + 2 * (ln & 3) + (c & 1);
    *n = row0 + t * kTileN + (ln >> 2) + 8 * (c >> 1);
  };

#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        Acc v = acc[t][j][0][c];
#pragma unroll
        for (int h = 1; h < kChains; ++h) v += acc[t][j][h][c];
        red[warp][((t * kTokenTiles + j) * 32 + lane) * 4 + c] = v;
      }
  __syncthreads();
  for (int e = tid; e < kValues; e += kThreads) {
    int m;
    int64_t n;
    coordinates(e, &m, &n);
    if (m >= m_rows || n >= p.n) continue;
    Acc v = Acc(0);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += red[w][e];
    if (p.split_k == 1)
      store(m, n, v);
    else
      exch[e] = v;
  }
  if (p.split_k == 1) return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // After this barrier every rank's exch is complete and visible; each rank finishes the values
  // whose index is its rank modulo split_k, and the second barrier keeps every CTA's shared memory
  // alive until all ranks have read it.
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  cluster.sync();
  for (int e = tid; e < kValues; e += kThreads) {
    int m;
    int64_t n;
    coordinates(e, &m, &n);
    if (m >= m_rows || n >= p.n || e % p.split_k != rank) continue;
    Acc v = Acc(0);
    for (int r = 0; r < p.split_k; ++r) v += *cluster.map_shared_rank(&exch[e], r);
    store(m, n, v);
  }
  cluster.sync();
#endif
}

// ---------------------------------------------------------------------------------------------
// Host side: kernels, device facts, plan

using KernelFn = void (*)(Params);

template <bool kInt8, bool kABf16, bool kM16, bool kPrefetch, bool kW16 = false, bool kBlock = false>
KernelFn kernel_for_tiles(int tiles) {
  if (tiles == 4) return decode_gemm_kernel<kInt8, kABf16, kM16, 4, kPrefetch, kW16, kBlock>;
  if (tiles == 2) return decode_gemm_kernel<kInt8, kABf16, kM16, 2, kPrefetch, kW16, kBlock>;
  return decode_gemm_kernel<kInt8, kABf16, kM16, 1, kPrefetch, kW16, kBlock>;
}

template <bool kM16, bool kPrefetch>
KernelFn kernel_for(bool int8, bool a_bf16, bool w16, bool block, int tiles) {
  if (w16) return kernel_for_tiles<false, false, kM16, kPrefetch, true>(tiles);
  if (block) return kernel_for_tiles<false, false, kM16, kPrefetch, false, true>(tiles);
  if (int8)
    return a_bf16 ? kernel_for_tiles<true, true, kM16, kPrefetch>(tiles) : kernel_for_tiles<true, false, kM16, kPrefetch>(tiles);
  return a_bf16 ? kernel_for_tiles<false, true, kM16, kPrefetch>(tiles) : kernel_for_tiles<false, false, kM16, kPrefetch>(tiles);
}

// kM16: M > 8 (mma rows 8..15 carry tokens; else they are zero registers and A rows 8..15 are
// never loaded).
KernelFn select_kernel(bool int8, bool a_bf16, bool m16, int tiles, bool prefetch, bool w16 = false, bool block = false) {
  if (m16)
    return prefetch ? kernel_for<true, true>(int8, a_bf16, w16, block, tiles) : kernel_for<true, false>(int8, a_bf16, w16, block, tiles);
  return prefetch ? kernel_for<false, true>(int8, a_bf16, w16, block, tiles) : kernel_for<false, false>(int8, a_bf16, w16, block, tiles);
}

using cuda::DeviceFacts;  // queried once per device (every decode call plans, once per token)

// Per (device, kernel): the PTX target the loaded code was built for (90 on H100 / H200: the
// sm_90a cubin; 80 where the compute_80 PTX fallback is JIT-compiled) and its static shared memory.
// Cached: these are driver calls.
Status kernel_facts(KernelFn fn, const DeviceFacts& dev, int* ptx_version, int64_t* smem) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, std::pair<int, int64_t>> cache;
  const std::pair<int, const void*> key{dev.ordinal, reinterpret_cast<const void*>(fn)};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) {
    cudaFuncAttributes attr{};
    LLMQ_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attr, fn));
    it = cache.emplace(key, std::make_pair(attr.ptxVersion, static_cast<int64_t>(attr.sharedSizeBytes))).first;
  }
  *ptx_version = it->second.first;
  *smem = it->second.second;
  return {};
}

// Per (device, kernel): how many CTAs of it one SM holds at once (registers decide: two). Cached.
Status ctas_per_sm(KernelFn fn, const DeviceFacts& dev, int* out) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, int> cache;
  const std::pair<int, const void*> key{dev.ordinal, reinterpret_cast<const void*>(fn)};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) {
    int n = 0;
    LLMQ_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, kThreads, 0));
    it = cache.emplace(key, std::max(1, n)).first;
  }
  *out = it->second;
  return {};
}

struct FullPlan {
  DecodeGemmPlan plan;
  KernelFn fn = nullptr;
};

bool is_w8a16(const DecodeGemmProblem& p) { return p.a_dtype == DType::kBF16; }

// w16: the problem is the byte view of a BF16 x BF16 GEMM (see kW16). slices: grouped mode's
// grid slices expected to hold rows (each a copy of the N-range's CTAs), for the wave count.
Status make_plan(const DecodeGemmProblem& p, const DecodeGemmConfig& cfg, FullPlan* out, bool w16 = false,
                 int64_t slices = 1, bool block = false) {
  if (cfg.split_k != 0 && cfg.split_k != 1 && cfg.split_k != 2 && cfg.split_k != 4 && cfg.split_k != 8)
    return invalid_argument("config.split_k: must be 0 (choose), 1, 2, 4 or 8, got " + std::to_string(cfg.split_k));
  if (cfg.tiles_per_cta != 0 && cfg.tiles_per_cta != 1 && cfg.tiles_per_cta != 2 && cfg.tiles_per_cta != 4)
    return invalid_argument("config.tiles_per_cta: must be 0 (choose), 1, 2 or 4, got " +
                            std::to_string(cfg.tiles_per_cta));
  DeviceFacts dev;
  LLMQ_RETURN_IF_ERROR(cuda::current_device_facts(&dev));
  const bool int8 = p.w_dtype == DType::kI8;
  const bool a_bf16 = is_w8a16(p);
  const int64_t tiles = ceil_div(p.n, kTileN);

  // Tiles per CTA: the fewest waves of CTAs (a partial last wave leaves SMs idle while it drains),
  // then the fewest tiles (the most CTAs). Measured on an H100 inside Llama-3-8B's decode step at
  // M = 1 (two CTAs per SM): QKV N = 6144 -> 2 tiles (192 CTAs, one wave instead of 384 in 1.45)
  // saved 1.2 us per layer; gate/up N = 28672 -> 4 tiles (2 waves instead of 3.4) 1.2 us; N = 4096
  // stays at 1 tile (256 CTAs, one wave; 2 and 4 tiles measured slower).
  int tiles_per_cta = cfg.tiles_per_cta;
  if (tiles_per_cta == 0) {
    int64_t best_waves = 0;
    for (const int t : {1, 2, 4}) {
      int per_sm = 0;
      LLMQ_RETURN_IF_ERROR(ctas_per_sm(select_kernel(int8, a_bf16, p.m > 8, t, cfg.l2_prefetch, w16, block), dev, &per_sm));
      const int64_t waves = ceil_div(ceil_div(tiles, t) * slices, per_sm * int64_t{dev.sms});
      if (tiles_per_cta == 0 || waves < best_waves) {
        best_waves = waves;
        tiles_per_cta = t;
      }
    }
  }
  const KernelFn fn = select_kernel(int8, a_bf16, p.m > 8, tiles_per_cta, cfg.l2_prefetch, w16, block);
  int ptx_version = 0;
  int64_t smem = 0;
  LLMQ_RETURN_IF_ERROR(kernel_facts(fn, dev, &ptx_version, &smem));
  if (!w16 && !int8 && !a_bf16 && (dev.major * 10 + dev.minor < 89 || ptx_version < 89))
    return unsupported("a_dtype: FP8 x FP8 products need an sm_89+ GPU and code built for it (device sm_" +
                       std::to_string(dev.major) + std::to_string(dev.minor) + ", code compute_" +
                       std::to_string(ptx_version) + ")");
  const bool clusters_ok = dev.major >= 9 && ptx_version >= 90;
  if (cfg.split_k > 1 && !clusters_ok)
    return unsupported("config.split_k: " + std::to_string(cfg.split_k) +
                       " needs thread-block clusters (sm_90); this device/code is sm_" +
                       std::to_string(dev.major) + std::to_string(dev.minor));

  const int64_t row_ctas = ceil_div(tiles, tiles_per_cta);
  // Split K over a cluster only while there are fewer CTAs than SMs (a split costs a cluster
  // barrier and an exchange, which measured slower whenever every SM had a CTA), as long as each
  // warp keeps a batch of steps (K / split_k >= 8 warps x 8 steps x 64).
  int split_k = cfg.split_k;
  if (split_k == 0) {
    split_k = 1;
    while (clusters_ok && split_k < 8 && row_ctas * slices * split_k < dev.sms &&
           p.k / (2 * split_k) >= int64_t{kWarps} * kLoadsPerBatch * kStepK)
      split_k *= 2;
  }
  DecodeGemmPlan& plan = out->plan;
  plan.split_k = split_k;
  plan.row_ctas = static_cast<int>(row_ctas);
  plan.tiles_per_cta = tiles_per_cta;
  plan.warps = kWarps;
  plan.k_unroll = kLoadsPerBatch / (2 * tiles_per_cta);
  plan.k_per_split = round_up(ceil_div(p.k, split_k), kStepK);
  plan.threads = kThreads;
  plan.smem_bytes = smem;
  out->fn = fn;
  return {};
}

bool aligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(bytes) == 0;
}

}  // namespace decode_gemm

// ---------------------------------------------------------------------------------------------
// Public API

Status cuda_decode_gemm_can_implement(const DecodeGemmProblem& p) {
  using decode_gemm::aligned;
  constexpr int64_t kMaxExtent = (int64_t{1} << 31) - 1;
  if (p.m < 0 || p.m > kMaxDecodeGemmM)
    return invalid_argument("m: must be in [0, " + std::to_string(kMaxDecodeGemmM) + "] tokens, got " +
                            std::to_string(p.m));
  if (p.n < 0 || p.n > kMaxExtent) return invalid_argument("n: must be in [0, 2^31), got " + std::to_string(p.n));
  if (p.k <= 0 || p.k % 16 != 0 || p.k > kMaxExtent)
    return invalid_argument("k: must be a positive multiple of 16 (16-byte loads of 8-bit rows), got " +
                            std::to_string(p.k));
  if (p.w_dtype != DType::kE4M3 && p.w_dtype != DType::kI8)
    return invalid_argument(std::string("w_dtype: must be e4m3 or int8, got ") + dtype_name(p.w_dtype));
  const bool w8a16 = p.a_dtype == DType::kBF16;
  if (!w8a16 && p.a_dtype != p.w_dtype)
    return invalid_argument(std::string("a_dtype: must be bf16 (W8A16) or the weight format ") +
                            dtype_name(p.w_dtype) + " (W8A8), got " + dtype_name(p.a_dtype));
  if (!w8a16 && p.w_dtype == DType::kI8 && p.k > kMaxInt8SegmentK)
    return unsupported("k: " + std::to_string(p.k) + " exceeds kMaxInt8SegmentK = " +
                       std::to_string(kMaxInt8SegmentK) + " (INT32 accumulators could overflow)");
  const int64_t a_elt = w8a16 ? 2 : 1;
  const int64_t lda = p.a_row_stride == 0 ? p.k : p.a_row_stride;
  const int64_t ldw = p.w_row_stride == 0 ? p.k : p.w_row_stride;
  const int64_t ldd = p.d_row_stride == 0 ? p.n : p.d_row_stride;
  if (lda < p.k || (lda * a_elt) % 16 != 0)
    return invalid_argument("a_row_stride: must be >= k and a multiple of 16 bytes, got " + std::to_string(lda));
  if (ldw < p.k || ldw % 16 != 0)
    return invalid_argument("w_row_stride: must be >= k and a multiple of 16 bytes, got " + std::to_string(ldw));
  if (ldd < p.n) return invalid_argument("d_row_stride: must be >= n, got " + std::to_string(ldd));
  if (p.m == 0 || p.n == 0) return {};
  if (p.a == nullptr) return invalid_argument("a: null device pointer");
  if (p.w == nullptr) return invalid_argument("w: null device pointer");
  if (p.d == nullptr) return invalid_argument("d: null device pointer");
  if (p.w_scale == nullptr) return invalid_argument("w_scale: null device pointer");
  if (!aligned(p.a, 16)) return invalid_argument("a: must be 16-byte aligned (16-byte loads)");
  if (!aligned(p.w, 16)) return invalid_argument("w: must be 16-byte aligned (16-byte loads)");
  if (!aligned(p.d, 2)) return invalid_argument("d: must be 2-byte aligned (bf16)");
  if (!aligned(p.w_scale, 4)) return invalid_argument("w_scale: must be 4-byte aligned (float)");
  if (p.bias != nullptr && !aligned(p.bias, 4)) return invalid_argument("bias: must be 4-byte aligned (float)");
  if (w8a16) {
    if (p.a_scale != nullptr)
      return invalid_argument("a_scale: must be null for bf16 activations (W8A16 has no activation scale)");
  } else {
    if (p.a_scale == nullptr) return invalid_argument("a_scale: null device pointer (W8A8 needs per-token scales)");
    if (!aligned(p.a_scale, 4)) return invalid_argument("a_scale: must be 4-byte aligned (float)");
  }
  return {};
}


Status cuda_decode_gemm_plan(const DecodeGemmProblem& p, const DecodeGemmConfig& config, DecodeGemmPlan* plan) {
  if (plan == nullptr) return invalid_argument("plan: null");
  LLMQ_RETURN_IF_ERROR(cuda_decode_gemm_can_implement(p));
  if (p.m == 0 || p.n == 0) {
    *plan = DecodeGemmPlan{};
    return {};
  }
  decode_gemm::FullPlan full;
  LLMQ_RETURN_IF_ERROR(decode_gemm::make_plan(p, config, &full));
  *plan = full.plan;
  return {};
}

namespace decode_gemm {

// What grouped mode adds to a launch (moe::decode_grouped_gemm).
struct GroupLaunch {
  const int32_t* offsets = nullptr;
  const int32_t* rows = nullptr;
  int64_t w_stride = 0;
  int64_t w_scale_stride = 0;
  int experts = 0;
  int slices = 0;  // grid z: at least the number of 16-row chunks any routing can make
  int64_t busy_slices = 1;  // of which at least this many hold rows (plans the waves)
  bool w16 = false;  // BF16 x BF16, the problem in bytes (kW16)
  bool block = false;  // 128x128 / 1x128 block scales (kBlock)
  int scale_k_blocks = 0;
};

Status launch(const DecodeGemmProblem& p, CudaStream stream, const DecodeGemmConfig& config, const GroupLaunch* group) {
  LLMQ_RETURN_IF_ERROR(cuda_decode_gemm_can_implement(p));
  if (p.m == 0 || p.n == 0) return {};
  FullPlan full;
  LLMQ_RETURN_IF_ERROR(make_plan(p, config, &full, group != nullptr && group->w16,
                                 group != nullptr ? group->busy_slices : 1, group != nullptr && group->block));
  const DecodeGemmPlan& plan = full.plan;
  const bool w8a16 = is_w8a16(p);

  Params k{};
  k.a = static_cast<const uint8_t*>(p.a);
  k.w = static_cast<const uint8_t*>(p.w);
  k.a_scale = p.a_scale;
  k.w_scale = p.w_scale;
  k.bias = p.bias;
  k.d = static_cast<uint16_t*>(p.d);
  k.a_stride = (p.a_row_stride == 0 ? p.k : p.a_row_stride) * (w8a16 ? 2 : 1);
  k.w_stride = p.w_row_stride == 0 ? p.k : p.w_row_stride;
  k.d_stride = p.d_row_stride == 0 ? p.n : p.d_row_stride;
  k.k = p.k;
  k.k_per_split = plan.k_per_split;
  k.m = static_cast<int>(p.m);
  k.n = static_cast<int>(p.n);
  k.a_scale_step = p.a_scale_per_tensor ? 0 : 1;
  k.w_scale_step = p.w_scale_per_tensor ? 0 : 1;
  k.split_k = plan.split_k;
  unsigned slices = 1;
  if (group != nullptr) {
    k.group_offsets = group->offsets;
    k.group_rows = group->rows;
    k.w_group_stride = group->w_stride;
    k.w_scale_group_stride = group->w_scale_stride;
    k.groups = group->experts;
    k.scale_k_blocks = group->scale_k_blocks;
    slices = static_cast<unsigned>(group->slices);
  }

  // Row CTAs along x (up to 2^31 - 1), the cluster's K ranks along y, expert chunks along z.
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[2];
  attr[0] = llmq::detail::pdl_attribute();  // the kernel waits before it reads A (pdl.cuh)
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = 1;
  attr[1].val.clusterDim.y = static_cast<unsigned>(plan.split_k);
  attr[1].val.clusterDim.z = 1;
  cfg.gridDim = dim3(static_cast<unsigned>(plan.row_ctas), static_cast<unsigned>(plan.split_k), slices);
  cfg.blockDim = dim3(static_cast<unsigned>(plan.threads), 1, 1);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = plan.split_k > 1 ? 2 : 1;  // no cluster attribute: runs on pre-sm_90 GPUs too
  LLMQ_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&cfg, full.fn, k));
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("decode_gemm_kernel");
  return {};
}

}  // namespace decode_gemm

Status cuda_decode_gemm(const DecodeGemmProblem& p, CudaStream stream, const DecodeGemmConfig& config) {
  return decode_gemm::launch(p, stream, config, nullptr);
}

namespace moe {

Status decode_grouped_gemm(const MoeGroupedGemm& g, CudaStream stream) {
  // Chunks of 16 rows over all experts: sum of ceil(rows_e / 16) <= rows / 16 + (experts with
  // rows). The grid has one slice per possible
  // chunk, so that CTAs of empty experts are never launched (at gpt-oss's 32 experts and 64 tokens
  // the empty (expert, chunk) slices of a per-expert grid cost more than the GEMM).
  // Both bounds come from `rows` (always valid), not from max_rows_per_expert (a caller's promise).
  const int64_t slices = g.rows / kMaxDecodeGemmM + std::min(g.experts, g.rows);
  if (slices > 65535)
    return unsupported("max_rows_per_expert: " + std::to_string(g.max_rows_per_expert) + " rows x " +
                       std::to_string(g.experts) + " experts is past the decode kernel's grid (use the wgmma kernel)");
  DecodeGemmProblem p;
  p.m = std::min(g.rows, kMaxDecodeGemmM);  // picks the variant (> 8: 16-row chunks); rows come from offsets
  p.n = g.n;
  p.k = g.k;
  p.a = g.a;
  p.a_dtype = g.a_dtype;
  p.a_scale = g.a_scale;
  p.w = g.w;
  p.w_dtype = DType::kE4M3;
  p.w_scale = g.w_scale;
  p.d = g.d;
  decode_gemm::GroupLaunch group;
  group.offsets = g.expert_offsets;
  group.rows = g.a_rows;
  group.w_stride = g.n * g.k;
  group.w_scale_stride = g.n;
  if (g.w_dtype == DType::kBF16) {
    // BF16 x BF16 as its byte view (kW16): K and the weight stride in bytes, no scales (the kernel
    // reads none; the W8A8 checks want pointers, so they get a valid device one).
    p.k = 2 * g.k;
    p.a_dtype = DType::kE4M3;
    p.a_scale = reinterpret_cast<const float*>(g.expert_offsets);
    p.w_scale = reinterpret_cast<const float*>(g.expert_offsets);
    group.w_stride = 2 * g.n * g.k;
    group.w_scale_stride = 0;
    group.w16 = true;
  }
  if (g.block_scales) {
    // Block scales: the grids [n / 128, ceil(k / 128)] per expert, [rows of A, ceil(k / 128)].
    group.block = true;
    group.scale_k_blocks = static_cast<int>((g.k + 127) / 128);
    group.w_scale_stride = (g.n / 128) * group.scale_k_blocks;
  }
  group.experts = static_cast<int>(g.experts);
  group.slices = static_cast<int>(slices);
  // The planner counts the CTAs that will run: one N-range per expert the rows can reach
  // (min(experts, rows); at decode each routed expert is about one chunk). Measured on an H200
  // (scripts/gpu-moe-tune): planning for one slice chose 1-2 tiles per CTA where 4 ran 15-22%
  // faster (gpt-oss-20b, 1-64 tokens), and left a down projection's few CTAs unsplit.
  group.busy_slices = std::max<int64_t>(1, std::min(g.experts, g.rows));
  // LLMQ_MOE_DECODE_TILES (1, 2, 4): a tuning aid for benchmarks; the planner chooses otherwise.
  static const int tiles_override = [] {
    const char* v = std::getenv("LLMQ_MOE_DECODE_TILES");
    return v != nullptr ? std::atoi(v) : 0;
  }();
  DecodeGemmConfig cfg;
  cfg.tiles_per_cta = tiles_override;
  return decode_gemm::launch(p, stream, cfg, &group);
}

}  // namespace moe

std::string describe(const DecodeGemmProblem& p) {
  const bool w8a16 = p.a_dtype == DType::kBF16;
  std::string s = std::string("decode gemm ") + (w8a16 ? "w8a16" : "w8a8") + " M=" + std::to_string(p.m) +
                  " N=" + std::to_string(p.n) + " K=" + std::to_string(p.k) + " w=" + dtype_name(p.w_dtype) +
                  (p.w_scale_per_tensor ? "/tensor" : "/channel") + " a=" + dtype_name(p.a_dtype);
  if (!w8a16) s += p.a_scale_per_tensor ? "/tensor" : "/token";
  if (p.bias != nullptr) s += " bias";
  return s;
}

std::string describe(const DecodeGemmPlan& plan) {
  return "split_k=" + std::to_string(plan.split_k) + " ctas=" + std::to_string(plan.row_ctas) +
         " tiles/cta=" + std::to_string(plan.tiles_per_cta) + " warps=" + std::to_string(plan.warps) +
         " unroll=" + std::to_string(plan.k_unroll) + " k/split=" + std::to_string(plan.k_per_split) +
         " smem=" + std::to_string(plan.smem_bytes);
}

}  // namespace llmq
