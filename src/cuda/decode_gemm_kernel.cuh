// The decode GEMM's kernel (decode_gemm.cu has the design): its parameters, device helpers and the
// kernel template, instantiated by decode_gemm.cu's host side only. Internal; CUDA sources only.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/pdl.cuh"
#include "llmq/cuda_decode_gemm.hpp"

namespace llmq::decode_gemm {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTileN = 16;         // weight rows per mma tile (the mma's 16 A rows)
constexpr int kStepK = 64;         // K elements one warp load covers: 4 lanes x 16 bytes
constexpr int kLoadsPerBatch = 8;  // 16-byte weight loads per lane in one batch


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
// kTokenTiles: n8 tiles of tokens (1: M <= 8, 2: M <= 16, 4: M <= 32); kTiles: 16-row tiles per CTA; kPrefetch:
// .L2::256B on the weight loads.

// kW16 (with kInt8 = kABf16 = false): BF16 weights and BF16 activations, for MoE's BF16 experts.
// The W8A8 data path runs unchanged on bytes (the host passes K, strides and offsets in bytes), and
// each lane's 8 bytes per row and token become one mma.m16n8k16 bf16 instead of one k32 8-bit mma:
// the same registers, two BF16 per 32-bit word; no scales.
// kBlock (E4M3 W8A8 only): 128x128 weight-block scales w_scale[row / 128, k / 128] and 1x128
// activation-block scales a_scale[token, k / 128]; each 64-wide K step's products are taken fresh
// and added times both scales of their K block (a 16-row tile lies in one 128-row block).
template <bool kInt8, bool kABf16, int kTokenTiles, int kTiles, bool kPrefetch, bool kW16 = false, bool kBlock = false>
__global__ void __launch_bounds__(kThreads, 2) decode_gemm_kernel(const Params p) {
  using Acc = std::conditional_t<kInt8 && !kABf16, int32_t, float>;
  constexpr int kAElt = kABf16 ? 2 : 1;
  static_assert(kTokenTiles == 1 || kTokenTiles == 2 || kTokenTiles == 4, "1, 2 or 4 n8 tiles of tokens");
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
  // ... and the activations of tokens g + 8 j, the mma's n8 columns.
  // Four token tiles (never grouped: rows are plain) address their rows from one pointer, which
  // keeps the registers of three more 64-bit pointers for the loads in flight.
  bool has[kTokenTiles];
  const uint8_t* arow[kTokenTiles == 4 ? 1 : kTokenTiles];
#pragma unroll
  for (int j = 0; j < kTokenTiles; ++j) {
    has[j] = g + 8 * j < m_rows;
    if (kTokenTiles != 4 || j == 0) arow[j] = p.a + (has[j] ? a_row(g + 8 * j) : 0) * p.a_stride + q * 16 * kAElt;
  }
  auto a_piece = [&](int j) -> const uint8_t* {
    if constexpr (kTokenTiles == 4) return arow[0] + 8 * j * p.a_stride;
    else return arow[j];
  };
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
      for (int j = 0; j < kTokenTiles; ++j)
#pragma unroll
        for (int i = 0; i < kAElt; ++i)
          b.a[u][j * kAElt + i] = ok && has[j] ? load_activations(a_piece(j) + kk * kAElt + 16 * i) : zero;
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

}  // namespace llmq::decode_gemm
