// Decode GEMM (include/llmq/cuda_decode_gemm.hpp): D[M, N] = A[M, K] * W[N, K]^T * scales for
// M <= 16 tokens and 8-bit weights, written to run at the speed of streaming W once.
//
// Work split. N is cut into tiles of 8 weight rows (the n8 of an mma tile). A grid of
// split_k x row_groups CTAs (one CTA of 8 warps per SM; its shared memory ring fills the SM) gives
// each row group a contiguous, balanced range of tiles, so every SM streams the same number of
// weight bytes; the split_k CTAs of a group form a thread-block cluster and each covers 1/split_k
// of K. Inside a CTA, warps_n warps take the range's tiles round robin and warps_k warps split each
// ring stage's K chunks (warps_k > 1 only when a CTA has fewer than 8 tiles). A warp holds FP32 (or
// INT32) accumulators for up to 4 tiles; a range with more tiles than the CTA can hold is swept
// over K more than once.
//
// Data path. A ring of `stages` shared-memory slots, each holding one stage of K
// (chunks_per_stage x 64 elements): every lane copies the 16-byte weight pieces it will later read
// itself (cp.async.cg; no L2 cache-policy operand, see copy_weights) and the CTA copies the
// stage's A rows [0, M) together (zero-filled past K).
// cp.async holds no registers, so stages-1 stages of weights are in flight while one is used.
// One __syncthreads per stage makes the shared A visible and frees the slot copied next.
//
// Products (tensor cores, tokens as the 16-row A side, weight rows as the 8 columns):
//   W8A16: mma.m16n8k16 bf16 -> fp32. A lane's 16 weight bytes (row g = lane / 4, K offset
//          16 * (lane % 4)) become 8 bf16x2 registers: E4M3 by moving sign, exponent and mantissa
//          into BF16 position (the value times 2^-120, exact) and one bf16x2 multiply by 2^120
//          (exact); INT8 as (128 + (b & 127)) - (128 or 256), two exact BF16 values. Both are
//          exact, so each product is the exact product of the BF16 activation and the weight code.
//   W8A8:  mma.m16n8k32 e4m3 -> fp32 or s8 -> s32, the 16 bytes used as they are.
// The reduction over K is a sum, so the order of K inside an mma is free: lane (g, q) supplies
// physical K [16q, 16q + 16) of its 64-wide chunk as mma K positions {2q, 2q+1, 2q+8, 2q+9} (k16)
// or {4q..4q+3, 16+4q..16+4q+3} (k32), and reads the A row segment at the same physical K; every
// lane with the same q maps an mma K position to the same physical K, which is all mma needs.
//
// Why not one 16-byte ld.global.nc per lane and FP32 FMAs with a warp-shuffle reduction: at full
// device-memory speed an H100/H200 SM receives ~18 weight bytes per clock, and 16 tokens need 16
// FMAs per weight, more than the SM's 128 FP32 FMAs per clock from about 7 tokens on; on the
// tensor cores the products cost almost nothing at any M <= 16, and the same kernel serves M = 1.
// And a register-held load pipeline deep enough for ~1 us of latency (several 16-byte loads per
// lane in flight) competes with the accumulators for registers; cp.async into shared memory does not.
//
// Reduction and epilogue. Partial tiles of the warps_k warps meet in shared memory; with
// split_k > 1 each CTA's partial goes to a double-buffered exchange area that the cluster's CTAs
// read through distributed shared memory (one cluster barrier per sweep), each CTA finishing
// 1/split_k of the outputs. Sums run in a fixed order (warps, then cluster ranks), so results are
// deterministic. Epilogue as in the CPU reference: acc * (a_scale[m] * w_scale[n]) (+ bias), one
// BF16 rounding.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda/cuda_check.cuh"
#include "llmq/cuda_decode_gemm.hpp"
#include "llmq/gemm.hpp"

namespace llmq {
namespace decode_gemm {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTileN = 8;             // weight rows per mma tile
constexpr int kChunkK = 64;           // K elements one warp load covers: 4 lanes x 16 bytes
constexpr int kWarpPieceBytes = 512;  // one warp load: 32 lanes x 16 bytes
constexpr int kMaxTilesPerWarp = 4;   // accumulator tiles per warp (16 registers)
constexpr int kMaxChunksPerStage = 16;
constexpr int kMaxStages = 4;
// A stage should carry about this many weight bytes per CTA: enough that (stages - 1) stages in
// flight cover the device-memory latency (~1 us at ~32 GB/s per SM), few enough to fit 4 stages.
constexpr int64_t kTargetStageBytes = 24 * 1024;

int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }
int64_t round_up(int64_t x, int64_t y) { return ceil_div(x, y) * y; }

// Everything the kernel reads, by value (a __grid_constant__-sized struct).
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
  int tiles;         // ceil(n / 8)
  int groups;
  int split_k;
  int warps_k;
  int warps_n;
  int tiles_per_warp;
  int sweep_tiles;   // most tiles one sweep over K takes (<= warps_n * tiles_per_warp)
  int chunks_per_stage;
  int stages;
  int a_row_smem;    // bytes between A rows in a ring slot (padded against bank conflicts)
  int w_slot_bytes;  // weight part of a slot
  int slot_bytes;
  int red_offset;    // cross-warp partials [kWarps][tiles_per_warp][32 lanes][4]
  int exch_offset;   // cluster exchange [2][sweep_tiles][128]
  int pair_store;    // d 4-byte aligned and d_stride even: two outputs per 32-bit store
  int l2_prefetch;
};

// ---------------------------------------------------------------------------------------------
// Device helpers

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; src_bytes 0 writes zeros and reads nothing.
//
// No L2 cache-policy operand (createpolicy + .L2::cache_hint): CUDA 13.0/13.1 ptxas miscompiles
// that pair for sm_90 (it drops the createpolicy and the LDGSTS reads an uninitialised uniform
// register as its cache descriptor), which traps at run time with "an illegal instruction was
// encountered" (see IST-DASLab/marlin#44; fixed in ptxas 13.4). The evict-first hint only kept the
// small A a little safer in L2; plain .cg copies are as fast for a stream read once.
__device__ __forceinline__ void copy_weights(uint32_t dst, const void* src, int src_bytes, bool prefetch_256) {
  if (prefetch_256)
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void copy_activations(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Wait until at most `pending` of this thread's copy groups are outstanding (0..2).
__device__ __forceinline__ void copy_wait(int pending) {
  if (pending <= 0)
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  else if (pending == 1)
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
  else
    asm volatile("cp.async.wait_group 2;\n" ::: "memory");
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
// kM16: M > 8 (mma rows 8..15 carry tokens; else they are zero registers).

// Where one (sweep, stage) step of the loop stands; advanced one step at a time so that the loop
// does no division (one per sweep, for the tile range).
struct Cursor {
  int sweep = 0;        // pass over K
  int stage = 0;        // stage of K within the sweep
  int slot = 0;         // ring slot = step % stages
  int sweep_begin = 0;  // first tile of the sweep
  int sweep_tiles = 0;  // tiles in the sweep
  int warp_tiles = 0;   // of which this warp holds
};

template <bool kInt8, bool kABf16, bool kM16>
__global__ void __launch_bounds__(kThreads, 1) decode_gemm_kernel(const Params p) {
  using Acc = std::conditional_t<kInt8 && !kABf16, int32_t, float>;
  constexpr int kAElt = kABf16 ? 2 : 1;
  extern __shared__ __align__(128) uint8_t smem[];

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int kg = warp / p.warps_n;        // which chunks of a stage this warp takes
  const int wn = warp - kg * p.warps_n;   // which tiles of a sweep
  const int rank = static_cast<int>(blockIdx.x);   // K range within the cluster
  const int group = static_cast<int>(blockIdx.y);  // row range

  const int t_begin = static_cast<int>(static_cast<int64_t>(group) * p.tiles / p.groups);
  const int t_end = static_cast<int>(static_cast<int64_t>(group + 1) * p.tiles / p.groups);
  const int nt = t_end - t_begin;
  if (nt <= 0) return;  // uniform over the cluster: its CTAs share the group
  const int nsweeps = (nt + p.sweep_tiles - 1) / p.sweep_tiles;  // each of <= sweep_tiles tiles
  const int64_t k_begin = min(p.k, static_cast<int64_t>(rank) * p.k_per_split);
  const int64_t k_end = min(p.k, k_begin + p.k_per_split);
  const int stage_k = p.chunks_per_stage * kChunkK;
  const int nstages = max(1, static_cast<int>((k_end - k_begin + stage_k - 1) / stage_k));
  const int total_steps = nsweeps * nstages;
  const int cpw = p.chunks_per_stage / p.warps_k;  // chunks per warp per stage
  // Weights in a slot: [tile of the sweep][chunk of the stage][lane] x 16 bytes. This warp's tile i
  // is sweep tile wn + i * warps_n, its chunk cw is stage chunk kg + cw * warps_k.
  const int w_tile_stride = p.chunks_per_stage * kWarpPieceBytes;
  const int w_lane_offset = (wn * p.chunks_per_stage + kg) * kWarpPieceBytes + lane * 16;
  const int w_tile_step = p.warps_n * w_tile_stride;  // from this warp's tile i to i + 1
  const int w_chunk_step = p.warps_k * kWarpPieceBytes;  // from chunk cw to cw + 1
  const int a_pieces_per_row = stage_k * kAElt / 16;  // a power of two
  const int a_pieces_shift = __ffs(a_pieces_per_row) - 1;
  const int a_pieces = p.m * a_pieces_per_row;
  const uint32_t smem_base = shared_address(smem);

  auto start_sweep = [&](Cursor& c, int s) {
    c.sweep = s;
    c.stage = 0;
    c.sweep_begin = t_begin + static_cast<int>(static_cast<int64_t>(s) * nt / nsweeps);
    c.sweep_tiles = t_begin + static_cast<int>(static_cast<int64_t>(s + 1) * nt / nsweeps) - c.sweep_begin;
    // This warp holds sweep tiles wn, wn + warps_n, ...
    c.warp_tiles = c.sweep_tiles > wn ? (c.sweep_tiles - wn + p.warps_n - 1) / p.warps_n : 0;
  };
  auto advance = [&](Cursor& c) {
    if (++c.slot == p.stages) c.slot = 0;
    if (++c.stage == nstages) start_sweep(c, c.sweep + 1);
  };

  // Start the copies of the step at `c` into its ring slot; always commits a group (empty past
  // the end) so that the group count stays uniform.
  auto issue = [&](const Cursor& c) {
    if (c.sweep < nsweeps) {
      const uint32_t slot = smem_base + static_cast<uint32_t>(c.slot * p.slot_bytes);
      const int64_t k0 = k_begin + static_cast<int64_t>(c.stage) * stage_k;
      // Weights: this lane's 16-byte pieces, into the places it will read them from itself.
      const uint32_t wdst = slot + static_cast<uint32_t>(w_lane_offset);
      for (int i = 0; i < c.warp_tiles; ++i) {
        const int row = (c.sweep_begin + wn + i * p.warps_n) * kTileN + g;
        const bool row_ok = row < p.n;
        const uint8_t* wrow = p.w + (row_ok ? static_cast<int64_t>(row) * p.w_stride : 0);
        for (int cw = 0; cw < cpw; ++cw) {
          const int64_t kk = k0 + static_cast<int64_t>(kg + cw * p.warps_k) * kChunkK + q * 16;
          const bool ok = row_ok && kk < k_end;
          copy_weights(wdst + static_cast<uint32_t>(i * w_tile_step + cw * w_chunk_step), ok ? wrow + kk : p.w,
                       ok ? 16 : 0, p.l2_prefetch != 0);
        }
      }
      // Activations: rows [0, m) of the stage, shared by the CTA.
      const uint32_t adst = slot + static_cast<uint32_t>(p.w_slot_bytes);
      for (int idx = tid; idx < a_pieces; idx += kThreads) {
        const int r = idx >> a_pieces_shift, piece = idx & (a_pieces_per_row - 1);
        const int64_t kk = k0 + static_cast<int64_t>(piece) * (16 / kAElt);
        const bool ok = kk < k_end;
        copy_activations(adst + static_cast<uint32_t>(r * p.a_row_smem + piece * 16),
                         ok ? p.a + r * p.a_stride + kk * kAElt : p.a, ok ? 16 : 0);
      }
    }
    copy_commit();
  };

  Acc acc[kMaxTilesPerWarp][4];
#pragma unroll
  for (int i = 0; i < kMaxTilesPerWarp; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[i][c] = Acc(0);

  auto compute = [&](const Cursor& c) {
    const int tw = c.warp_tiles;
    if (tw == 0) return;  // warp-uniform
    const uint8_t* slot = smem + c.slot * p.slot_bytes;
    const uint8_t* wsrc = slot + w_lane_offset;
    const uint8_t* arow0 = slot + p.w_slot_bytes + g * p.a_row_smem;
    const uint8_t* arow1 = arow0 + 8 * p.a_row_smem;
    const bool has0 = g < p.m;
    const bool has1 = kM16 && g + 8 < p.m;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int cw = 0; cw < cpw; ++cw) {
      const int aoff = ((kg + cw * p.warps_k) * kChunkK + q * 16) * kAElt;
      const uint8_t* wchunk = wsrc + cw * w_chunk_step;
      if constexpr (kABf16) {
        // Row segments of 16 bf16: register r holds K 2r, 2r + 1 of the lane's 16.
        const uint4 x0 = has0 ? *reinterpret_cast<const uint4*>(arow0 + aoff) : zero;
        const uint4 x1 = has0 ? *reinterpret_cast<const uint4*>(arow0 + aoff + 16) : zero;
        const uint4 y0 = has1 ? *reinterpret_cast<const uint4*>(arow1 + aoff) : zero;
        const uint4 y1 = has1 ? *reinterpret_cast<const uint4*>(arow1 + aoff + 16) : zero;
        const uint32_t lo[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        const uint32_t hi[8] = {y0.x, y0.y, y0.z, y0.w, y1.x, y1.y, y1.z, y1.w};
#pragma unroll
        for (int i = 0; i < kMaxTilesPerWarp; ++i) {
          if (i < tw) {
            const uint4 wv = *reinterpret_cast<const uint4*>(wchunk + i * w_tile_step);
            const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
            for (int t = 0; t < 4; ++t) {
              // Word t holds K 4t..4t+3: mma K {2q, 2q+1} <- bytes 0, 1; {2q+8, 2q+9} <- bytes 2, 3.
              mma_bf16(acc[i], lo[2 * t], hi[2 * t], lo[2 * t + 1], hi[2 * t + 1], widen<kInt8, 0>(words[t]),
                       widen<kInt8, 1>(words[t]));
            }
          }
        }
      } else {
        const uint4 x = has0 ? *reinterpret_cast<const uint4*>(arow0 + aoff) : zero;
        const uint4 y = has1 ? *reinterpret_cast<const uint4*>(arow1 + aoff) : zero;
#pragma unroll
        for (int i = 0; i < kMaxTilesPerWarp; ++i) {
          if (i < tw) {
            const uint4 wv = *reinterpret_cast<const uint4*>(wchunk + i * w_tile_step);
            // Bytes 0-7: mma K {4q..4q+3, 16+4q..16+4q+3} of the first k32; bytes 8-15 of the second.
            mma_8bit(acc[i], x.x, y.x, x.y, y.y, wv.x, wv.y);
            mma_8bit(acc[i], x.z, y.z, x.w, y.w, wv.z, wv.w);
          }
        }
      }
    }
  };

  // acc * (a_scale * w_scale) (+ bias), the CPU reference's float operations in its order; the
  // 0 + x turns a -0 product into the +0 the reference's zero-initialised accumulator gives.
  auto output = [&](int m, int n, Acc v) -> uint16_t {
    const float x = std::is_same_v<Acc, int32_t> ? __int2float_rn(static_cast<int>(v)) : static_cast<float>(v);
    float scale = p.w_scale[static_cast<int64_t>(n) * p.w_scale_step];
    if constexpr (!kABf16) scale = __fmul_rn(p.a_scale[m * p.a_scale_step], scale);
    float y = __fadd_rn(0.0f, __fmul_rn(x, scale));
    if (p.bias != nullptr) y = __fadd_rn(y, p.bias[n]);
    return __bfloat16_as_ushort(__float2bfloat16_rn(y));
  };
  auto store = [&](int m, int n, Acc v) { p.d[m * p.d_stride + n] = output(m, n, v); };

  // End of a sweep: reduce the partial tiles (warps, then cluster ranks) and write D.
  auto finish_sweep = [&](const Cursor& cur) {
    const int sb = cur.sweep_begin, ns = cur.sweep_tiles, tw = cur.warp_tiles;
    if (p.warps_k == 1 && p.split_k == 1) {
      // Each warp owns whole outputs: c0, c1 = (row g, cols 2q, 2q + 1); c2, c3 = row g + 8.
#pragma unroll
      for (int i = 0; i < kMaxTilesPerWarp; ++i) {
        if (i < tw) {
          const int n0 = (sb + wn + i * p.warps_n) * kTileN + 2 * q;
#pragma unroll
          for (int half = 0; half < (kM16 ? 2 : 1); ++half) {
            const int m = g + 8 * half;
            if (m < p.m && n0 < p.n) {
              if (p.pair_store && n0 + 1 < p.n) {
                const uint32_t pair = static_cast<uint32_t>(output(m, n0, acc[i][2 * half])) |
                                      (static_cast<uint32_t>(output(m, n0 + 1, acc[i][2 * half + 1])) << 16);
                *reinterpret_cast<uint32_t*>(p.d + m * p.d_stride + n0) = pair;
              } else {
                store(m, n0, acc[i][2 * half]);
                if (n0 + 1 < p.n) store(m, n0 + 1, acc[i][2 * half + 1]);
              }
            }
          }
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[i][c] = Acc(0);
      }
      return;
    }
    Acc* red = reinterpret_cast<Acc*>(smem + p.red_offset);
#pragma unroll
    for (int i = 0; i < kMaxTilesPerWarp; ++i) {
      if (i < tw) {
        Acc* dst = red + ((warp * p.tiles_per_warp + i) * 32 + lane) * 4;
#pragma unroll
        for (int c = 0; c < 4; ++c) dst[c] = acc[i][c];
      }
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][c] = Acc(0);
    }
    __syncthreads();
    Acc* exch = reinterpret_cast<Acc*>(smem + p.exch_offset) + (cur.sweep & 1) * p.sweep_tiles * 128;
    const int elems = ns * 128;  // per tile: 32 lanes x 4 accumulators
    for (int e = tid; e < elems; e += kThreads) {
      const int tile = e >> 7, ln = (e >> 2) & 31, c = e & 3;
      const int m = (ln >> 2) + 8 * (c >> 1);
      if (m >= p.m) continue;
      const int j = tile % p.warps_n, i = tile / p.warps_n;
      Acc v = Acc(0);
      for (int kw = 0; kw < p.warps_k; ++kw)
        v += red[(((kw * p.warps_n + j) * p.tiles_per_warp + i) * 32 + ln) * 4 + c];
      if (p.split_k == 1) {
        const int n = (sb + tile) * kTileN + 2 * (ln & 3) + (c & 1);
        if (n < p.n) store(m, n, v);
      } else {
        exch[e] = v;
      }
    }
    if (p.split_k == 1) {
      __syncthreads();  // red is rewritten at the next sweep's end
      return;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // After this barrier every rank's exch for this sweep is complete and visible, and this CTA's
    // reads of red are done. exch alternates by sweep, so a rank still reading this sweep's buffer
    // cannot see it overwritten before the next cluster barrier.
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    cluster.sync();
    const int per_rank = (elems + p.split_k - 1) / p.split_k;
    const int e_end = min(elems, (rank + 1) * per_rank);
    for (int e = rank * per_rank + tid; e < e_end; e += kThreads) {
      const int tile = e >> 7, ln = (e >> 2) & 31, c = e & 3;
      const int m = (ln >> 2) + 8 * (c >> 1);
      const int n = (sb + tile) * kTileN + 2 * (ln & 3) + (c & 1);
      if (m >= p.m || n >= p.n) continue;
      Acc v = Acc(0);
      for (int r = 0; r < p.split_k; ++r) v += *cluster.map_shared_rank(exch + e, r);
      store(m, n, v);
    }
#endif
  };

  // The pipeline: `ahead` is stages - 1 steps in front of `cur`.
  Cursor cur, ahead;
  start_sweep(cur, 0);
  start_sweep(ahead, 0);
  for (int s = 0; s < p.stages - 1; ++s) {
    issue(ahead);
    advance(ahead);
  }
  for (int step = 0; step < total_steps; ++step) {
    copy_wait(p.stages - 2);  // this thread's copies for `step` have landed
    __syncthreads();          // everyone's have (A is shared); the slot of step - 1 is free again
    issue(ahead);
    advance(ahead);
    compute(cur);
    if (cur.stage == nstages - 1) finish_sweep(cur);
    advance(cur);
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Keep this CTA's shared memory alive until every rank has read its exchange area.
  if (p.split_k > 1) cooperative_groups::this_cluster().sync();
#endif
}

// ---------------------------------------------------------------------------------------------
// Host side: kernels, device facts, plan

using KernelFn = void (*)(Params);

KernelFn select_kernel(bool int8, bool a_bf16, bool m16) {
  if (int8) {
    if (a_bf16) return m16 ? decode_gemm_kernel<true, true, true> : decode_gemm_kernel<true, true, false>;
    return m16 ? decode_gemm_kernel<true, false, true> : decode_gemm_kernel<true, false, false>;
  }
  if (a_bf16) return m16 ? decode_gemm_kernel<false, true, true> : decode_gemm_kernel<false, true, false>;
  return m16 ? decode_gemm_kernel<false, false, true> : decode_gemm_kernel<false, false, false>;
}

struct DeviceFacts {
  int device = 0;
  int sms = 0;
  int major = 0;
  int minor = 0;
  int64_t smem_optin = 0;  // largest dynamic shared memory one block may ask for
};

Status query_device(DeviceFacts* f) {
  LLMQ_CUDA_RETURN_IF_ERROR(cudaGetDevice(&f->device));
  int v = 0;
  LLMQ_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&f->sms, cudaDevAttrMultiProcessorCount, f->device));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&f->major, cudaDevAttrComputeCapabilityMajor, f->device));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&f->minor, cudaDevAttrComputeCapabilityMinor, f->device));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, f->device));
  f->smem_optin = v;
  return {};
}

// Per (device, kernel): the PTX target the loaded code was built for (90 on H100 / H200: the
// sm_90a cubin; 80 where the compute_80 PTX fallback is JIT-compiled), after raising the kernel's
// dynamic shared memory limit to the device's. Cached: these are driver calls.
Status prepare_kernel(KernelFn fn, const DeviceFacts& dev, int* ptx_version) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, int> cache;
  const std::pair<int, const void*> key{dev.device, reinterpret_cast<const void*>(fn)};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) {
    *ptx_version = it->second;
    return {};
  }
  cudaFuncAttributes attr{};
  LLMQ_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attr, fn));
  LLMQ_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dev.smem_optin)));
  cache[key] = attr.ptxVersion;
  *ptx_version = attr.ptxVersion;
  return {};
}

// How many clusters of `split_k` CTAs with `smem` bytes each can be resident at once (GPC sizes
// make this less than SMs / split_k). Cached per (device, kernel, split_k, smem).
Status max_active_clusters(KernelFn fn, const DeviceFacts& dev, int split_k, int64_t smem, int* out) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, int64_t>, int> cache;
  const auto key = std::make_tuple(dev.device, reinterpret_cast<const void*>(fn), split_k, smem);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) {
    *out = it->second;
    return {};
  }
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(split_k);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(static_cast<unsigned>(split_k), 1, 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  LLMQ_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveClusters(&clusters, fn, &cfg));
  cache[key] = clusters;
  *out = clusters;
  return {};
}

// The shared-memory layout for a CTA with `tiles` tiles over `k_range` of K.
struct Layout {
  int warps_k = 1, warps_n = kWarps, tiles_per_warp = 1, sweeps = 1, sweep_tiles = 1;
  int chunks = 1, stages = 2;
  int a_row_smem = 0, w_slot_bytes = 0, slot_bytes = 0, red_offset = 0, exch_offset = 0;
  int64_t smem = 0;
};

// Fills *out and returns true when a layout fits `smem_limit`; honours fixed config values.
bool make_layout(int tiles, int64_t k_range, int split_k, int m, int a_elt, const DecodeGemmConfig& cfg,
                 int64_t smem_limit, Layout* out) {
  Layout L;
  const int64_t chunks_total = std::max<int64_t>(1, ceil_div(k_range, kChunkK));
  L.warps_k = tiles >= 8 ? 1 : tiles >= 4 ? 2 : tiles >= 2 ? 4 : 8;
  while (L.warps_k > 1 && L.warps_k > chunks_total) L.warps_k /= 2;
  L.warps_n = kWarps / L.warps_k;
  L.sweeps = static_cast<int>(ceil_div(tiles, L.warps_n * kMaxTilesPerWarp));
  const int sweep_tiles = static_cast<int>(ceil_div(tiles, L.sweeps));
  L.tiles_per_warp = static_cast<int>(ceil_div(sweep_tiles, L.warps_n));
  L.sweep_tiles = sweep_tiles;

  int chunks = L.warps_k;
  if (cfg.chunks_per_stage > 0) {
    chunks = std::max(cfg.chunks_per_stage, L.warps_k);  // every warp needs a chunk of each stage
  } else {
    while (chunks < kMaxChunksPerStage &&
           static_cast<int64_t>(sweep_tiles) * kTileN * chunks * kChunkK < kTargetStageBytes &&
           chunks * kChunkK < round_up(k_range, kChunkK))
      chunks *= 2;
  }
  for (;;) {
    int a_row = chunks * kChunkK * a_elt;
    // Lanes g = 0, 1 read rows 0 and 1 in one quarter-warp phase: put row 1 on the other banks.
    a_row += a_elt == 1 ? (a_row % 128 == 0 ? 64 : 0) : 16;
    const int w_slot = sweep_tiles * chunks * kWarpPieceBytes;
    const int slot = static_cast<int>(round_up(w_slot + static_cast<int64_t>(m) * a_row, 128));
    const int red = (L.warps_k > 1 || split_k > 1) ? kWarps * L.tiles_per_warp * kWarpPieceBytes : 0;
    const int exch = split_k > 1 ? 2 * sweep_tiles * kWarpPieceBytes : 0;
    const int max_stages = cfg.stages > 0 ? cfg.stages : kMaxStages;
    const int min_stages = cfg.stages > 0 ? cfg.stages : 2;
    for (int st = max_stages; st >= min_stages; --st) {
      const int64_t smem = static_cast<int64_t>(st) * slot + red + exch;
      if (smem <= smem_limit) {
        L.chunks = chunks;
        L.stages = st;
        L.a_row_smem = a_row;
        L.w_slot_bytes = w_slot;
        L.slot_bytes = slot;
        L.red_offset = st * slot;
        L.exch_offset = L.red_offset + red;
        L.smem = smem;
        *out = L;
        return true;
      }
    }
    if (cfg.chunks_per_stage > 0 || chunks / 2 < L.warps_k) return false;
    chunks /= 2;
  }
}

struct FullPlan {
  DecodeGemmPlan plan;
  Layout layout;
  KernelFn fn = nullptr;
};

bool is_w8a16(const DecodeGemmProblem& p) { return p.a_dtype == DType::kBF16; }

Status make_plan(const DecodeGemmProblem& p, const DecodeGemmConfig& cfg, FullPlan* out) {
  DeviceFacts dev;
  LLMQ_RETURN_IF_ERROR(query_device(&dev));
  const bool int8 = p.w_dtype == DType::kI8;
  const bool a_bf16 = is_w8a16(p);
  const KernelFn fn = select_kernel(int8, a_bf16, p.m > 8);
  int ptx_version = 0;
  LLMQ_RETURN_IF_ERROR(prepare_kernel(fn, dev, &ptx_version));
  if (!int8 && !a_bf16 && (dev.major * 10 + dev.minor < 89 || ptx_version < 89))
    return unsupported("a_dtype: FP8 x FP8 products need an sm_89+ GPU and code built for it (device sm_" +
                       std::to_string(dev.major) + std::to_string(dev.minor) + ", code compute_" +
                       std::to_string(ptx_version) + ")");
  const bool clusters_ok = dev.major >= 9 && ptx_version >= 90;
  if (cfg.split_k != 0 && cfg.split_k != 1 && cfg.split_k != 2 && cfg.split_k != 4 && cfg.split_k != 8)
    return invalid_argument("config.split_k: must be 0 (choose), 1, 2, 4 or 8, got " + std::to_string(cfg.split_k));
  if (cfg.split_k > 1 && !clusters_ok)
    return unsupported("config.split_k: " + std::to_string(cfg.split_k) +
                       " needs thread-block clusters (sm_90); this device/code is sm_" +
                       std::to_string(dev.major) + std::to_string(dev.minor));
  if (cfg.stages != 0 && (cfg.stages < 2 || cfg.stages > kMaxStages))
    return invalid_argument("config.stages: must be 0 (choose) or 2..4, got " + std::to_string(cfg.stages));
  const int c = cfg.chunks_per_stage;
  if (c != 0 && (c < 1 || c > kMaxChunksPerStage || (c & (c - 1)) != 0))
    return invalid_argument("config.chunks_per_stage: must be 0 (choose) or a power of two 1..16, got " +
                            std::to_string(c));

  const int64_t tiles = ceil_div(p.n, kTileN);
  const int a_elt = a_bf16 ? 2 : 1;
  bool found = false;
  double best_cost = 0;
  for (int split_k : {1, 2, 4, 8}) {
    if (cfg.split_k > 0 ? split_k != cfg.split_k : (split_k > 1 && !clusters_ok)) continue;
    const int64_t k_per_split = round_up(ceil_div(p.k, split_k), kChunkK);
    // Automatic choice: every rank gets some K (a forced split may leave ranks empty; they add 0).
    if (cfg.split_k == 0 && split_k > 1 && k_per_split * (split_k - 1) >= p.k) continue;
    const int64_t guess = split_k == 1 ? dev.sms : std::max(1, dev.sms / split_k);
    Layout L;
    if (!make_layout(static_cast<int>(ceil_div(tiles, std::min<int64_t>(guess, tiles))), k_per_split, split_k,
                     static_cast<int>(p.m), a_elt, cfg, dev.smem_optin, &L))
      continue;
    int resident = dev.sms;  // one CTA per SM: the ring fills the SM's shared memory
    if (split_k > 1) {
      LLMQ_RETURN_IF_ERROR(max_active_clusters(fn, dev, split_k, L.smem, &resident));
      if (resident < 1) continue;
    }
    const int64_t groups = std::min<int64_t>(resident, tiles);
    const int64_t tiles_per_group = ceil_div(tiles, groups);
    if (!make_layout(static_cast<int>(tiles_per_group), k_per_split, split_k, static_cast<int>(p.m), a_elt, cfg,
                     dev.smem_optin, &L))
      continue;
    // Time ~ the busiest CTA's weight bytes; A is re-read from L2 by every CTA (once per sweep),
    // counted at half weight (L2 outruns device memory about twice); a cluster barrier per sweep
    // costs about what 16 KB of streaming takes one SM.
    const double cost = static_cast<double>(tiles_per_group * kTileN * k_per_split) +
                        0.5 * static_cast<double>(L.sweeps * p.m * k_per_split * a_elt) +
                        (split_k > 1 ? 16384.0 * L.sweeps : 0.0);
    if (!found || cost < best_cost) {
      found = true;
      best_cost = cost;
      DecodeGemmPlan& plan = out->plan;
      plan.split_k = split_k;
      plan.row_groups = static_cast<int>(groups);
      plan.tiles_per_group = static_cast<int>(tiles_per_group);
      plan.warps_k = L.warps_k;
      plan.warps_n = L.warps_n;
      plan.tiles_per_warp = L.tiles_per_warp;
      plan.sweeps = L.sweeps;
      plan.chunks_per_stage = L.chunks;
      plan.stages = L.stages;
      plan.k_per_split = k_per_split;
      plan.smem_bytes = L.smem;
      plan.threads = kThreads;
      out->layout = L;
      out->fn = fn;
    }
  }
  if (!found)
    return unsupported("config: no layout of " + std::to_string(p.m) + " tokens fits the device's " +
                       std::to_string(dev.smem_optin) + " bytes of shared memory per block with these settings");
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

Status cuda_decode_gemm(const DecodeGemmProblem& p, CudaStream stream, const DecodeGemmConfig& config) {
  using namespace decode_gemm;
  LLMQ_RETURN_IF_ERROR(cuda_decode_gemm_can_implement(p));
  if (p.m == 0 || p.n == 0) return {};
  FullPlan full;
  LLMQ_RETURN_IF_ERROR(make_plan(p, config, &full));
  const Layout& L = full.layout;
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
  k.tiles = static_cast<int>(ceil_div(p.n, kTileN));
  k.groups = plan.row_groups;
  k.split_k = plan.split_k;
  k.warps_k = L.warps_k;
  k.warps_n = L.warps_n;
  k.tiles_per_warp = L.tiles_per_warp;
  k.sweep_tiles = L.sweep_tiles;
  k.chunks_per_stage = L.chunks;
  k.stages = L.stages;
  k.a_row_smem = L.a_row_smem;
  k.w_slot_bytes = L.w_slot_bytes;
  k.slot_bytes = L.slot_bytes;
  k.red_offset = L.red_offset;
  k.exch_offset = L.exch_offset;
  k.pair_store = aligned(p.d, 4) && k.d_stride % 2 == 0;
  k.l2_prefetch = config.l2_prefetch ? 1 : 0;

  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(plan.split_k);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(static_cast<unsigned>(plan.split_k), static_cast<unsigned>(plan.row_groups), 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = static_cast<size_t>(plan.smem_bytes);
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = plan.split_k > 1 ? 1 : 0;  // no cluster attribute: runs on pre-sm_90 GPUs too
  LLMQ_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&cfg, full.fn, k));
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("decode_gemm_kernel");
  return {};
}

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
  return "split_k=" + std::to_string(plan.split_k) + " groups=" + std::to_string(plan.row_groups) +
         " tiles/group=" + std::to_string(plan.tiles_per_group) + " warps=" + std::to_string(plan.warps_k) + "x" +
         std::to_string(plan.warps_n) + " tiles/warp=" + std::to_string(plan.tiles_per_warp) +
         " sweeps=" + std::to_string(plan.sweeps) + " chunks=" + std::to_string(plan.chunks_per_stage) +
         " stages=" + std::to_string(plan.stages) + " k/split=" + std::to_string(plan.k_per_split) +
         " smem=" + std::to_string(plan.smem_bytes);
}

}  // namespace llmq
