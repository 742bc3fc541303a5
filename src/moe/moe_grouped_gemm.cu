// cuda_moe_grouped_gemm (include/llmq/cuda_moe.hpp): every expert's GEMM over its own permuted rows
// in one launch, the group sizes read on the device (no host sync, graph capturable).
//
// The wgmma kernel follows llmq's INT8 GEMM (src/cuda/int8_gemm_sm90.cu): persistent, warp-
// specialised, 384 threads; warpgroup 0 produces (one thread issues TMA copies of A [kBlockM x 128]
// and W [kBlockN x 128] E4M3 tiles, 128-byte swizzled, into a ring of 6 (128 x 128 tiles), 5
// (128 x 192) or 8 (64-row) stages), warpgroups 1 and 2 consume (128 rows: each 64 rows x 128 or
// 192 columns, 4 wgmma m64n128k32 / m64n192k32 per K block; 64 rows: each the 64 rows x 64
// columns, m64n64k32; Tile below). What is new:
//   * Tiles over variable groups. Each CTA reads expert_offsets once and builds in shared memory
//     the first tile of every expert: expert e has ceil(rows_e / kBlockM) M-blocks x ceil(n / kBlockN)
//     N-blocks. Tile t belongs to the last expert whose first tile is <= t (a binary search);
//     within an expert the M-blocks of one N-block are consecutive, so the CTAs running together
//     share the expert's weight panel in L2 (weights are the large operand at MoE sizes). Rows of
//     a tile past the expert's end belong to the next expert: computed, never stored. An expert
//     with no rows has no tiles.
//   * FP8 accumulation promoted to FP32 every K block: the tensor core's FP8 accumulator keeps
//     fewer bits than FP32 (DeepSeek-V3's report; cuBLASLt without FAST_ACCUM promotes too), so
//     each 128-wide K block is accumulated fresh in `part` and added to `acc` in FP32.
//     MoeGroupedGemm::fast_accumulation opts out: the tensor core accumulates over all of K with one
//     K block in flight (as cuBLASLt's FAST_ACCUM and CUTLASS's FP8FastAccum schedules do).
//   * Epilogue: acc * (a_scale[row] * w_scale[e, col]) rounded once to BF16, the CPU reference's
//     operation order.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda/cuda_check.cuh"
#include "cuda/device_facts.cuh"
#include "cuda/sm90_pipeline.cuh"
#include "cuda/sm90_tma.cuh"
#include "cuda/sm90_wgmma.cuh"
#include "llmq/cuda_moe.hpp"
#include "moe/moe_decode_gemm.hpp"
#include "core/int_math.hpp"

namespace llmq {
namespace moe {

using sm90::fence_registers;
using sm90::make_smem_desc_k_sw128;
using sm90::prefetch_tensor_map;
using sm90::smem_u32;
using sm90::tma_load_2d;
using sm90::wgmma_commit_group;
using sm90::wgmma_fence;
using sm90::wgmma_bf16;
using sm90::wgmma_e4m3;
using sm90::wgmma_wait_group;

constexpr int kBlockK = 128;  // one 128-byte swizzle row of E4M3
constexpr int kThreads = 384;
constexpr int kMaxExperts = 1024;

// A tile is kBlockM rows x 128 columns. 128 rows: each consumer warpgroup takes 64 rows and every
// column. 64 rows, for experts that average at most 64 rows (decode steps of many-expert models:
// Qwen3-30B-A3B's 512 tokens x top-8 over 128 experts are 32 rows an expert): each warpgroup takes
// the 64 rows and half the columns, so an expert's padding rows cost half the tensor work and the
// A bytes of a 128-row tile.
// 192 columns (128-row tiles of per-channel FP8 experts at prefill sizes): each warpgroup's 64 x
// 192 block reads the shared A rows once per 192 columns instead of 128, and a tile's ring stage
// moves 40 KiB for 1.5x the products of a 32 KiB one.
template <int kBlockM, int kBlockN = 128>
struct Tile {
  static_assert(kBlockM == 128 || kBlockM == 64, "tiles of 128 or 64 rows");
  static_assert(kBlockN == 128 || (kBlockN == 192 && kBlockM == 128), "128 columns, or 192 with 128 rows");
  static constexpr int kWgCols = kBlockM == 128 ? kBlockN : 64;  // the columns one consumer warpgroup owns
  static constexpr uint32_t kABytes = kBlockM * kBlockK;
  static constexpr uint32_t kBBytes = kBlockN * kBlockK;
  static constexpr uint32_t kStageBytes = kABytes + kBBytes;
  static constexpr int kStages = 204800 / kStageBytes < 8 ? 204800 / kStageBytes : 8;  // 6, 8 or 5
  // 192 columns keep the epilogue's column scales in shared memory, 192 floats a warpgroup (in
  // registers they would be 48 a thread on top of 192 accumulators).
  static constexpr bool kScalesInSmem = kWgCols > 128;
  static constexpr uint32_t kScaleBytes = kScalesInSmem ? 2 * kWgCols * sizeof(float) : 0;
  // Consumer warpgroup c's A rows and B rows (bytes into a stage).
  static __device__ __forceinline__ uint32_t a_offset(int c) { return kBlockM == 128 ? c * 64u * kBlockK : 0u; }
  static __device__ __forceinline__ uint32_t b_offset(int c) { return kBlockM == 128 ? 0u : c * 64u * kBlockK; }
};

// Ring, barriers, the expert table (offsets and first tiles, [experts + 1] each) and the 1024
// bytes lost to aligning the base.
template <int kBlockM, int kBlockN>
size_t smem_bytes(int64_t experts) {
  using S = Tile<kBlockM, kBlockN>;
  return S::kStages * S::kStageBytes + 2 * S::kStages * 8 + S::kScaleBytes + 2 * sizeof(int32_t) * (experts + 1) + 1024;
}

struct GroupedParams {
  const int32_t* expert_offsets;
  const float* a_scale;
  const float* w_scale;
  uint16_t* d;
  int experts;
  int n;
  int k;
  int n_blocks;
  int scale_k_blocks;  // kBlock: 128-wide K blocks of the scale grids (ceil(k / 128))
};

// kBf16: BF16 experts (A and W BF16, k counts bytes, no scales); else E4M3 with scales: per row x
// per channel in the epilogue, or (kBlock) 1x128 activation blocks x 128x128 weight blocks applied
// at each K block's promotion (a tile's 128 columns lie in one weight block: n % 128 == 0). kFast: E4M3
// accumulated in the tensor core over all of K (no promotion), the BF16 form's loop.
template <bool kBf16, bool kBlock, bool kFast, int kBlockM, int kBlockN>
__global__ void __launch_bounds__(kThreads, 1)
    moe_grouped_gemm_sm90_kernel(const __grid_constant__ CUtensorMap tmap_a,
                                 const __grid_constant__ CUtensorMap tmap_w, GroupedParams p) {
#if LLMQ_SM90A
  constexpr int kConsumerWarps = 8;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  using S = Tile<kBlockM, kBlockN>;
  static_assert(!S::kScalesInSmem || !(kBf16 || kBlock), "192 columns: per-channel FP8 experts only");
  constexpr int kStages = S::kStages;
  constexpr uint32_t kABytes = S::kABytes, kStageBytes = S::kStageBytes;
  constexpr int kWgCols = S::kWgCols;
  using Ring = sm90::StageRing<kStages>;
  const Ring ring{base + kStages * kStageBytes};
  auto stage_a = [&](int s) { return base + static_cast<uint32_t>(s) * kStageBytes; };
  // The column scales (192 columns) and the expert table live after the barriers (generic pointers
  // for ordinary loads and stores).
  float* col_scales = reinterpret_cast<float*>(smem_raw + (ring.bars + Ring::kBarrierBytes - smem_u32(smem_raw)));
  int32_t* offsets = reinterpret_cast<int32_t*>(reinterpret_cast<uint8_t*>(col_scales) + S::kScaleBytes);
  int32_t* first_tile = offsets + p.experts + 1;

  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  const int thread_in_group = static_cast<int>(threadIdx.x) % 128;
  for (int e = static_cast<int>(threadIdx.x); e <= p.experts; e += kThreads) offsets[e] = p.expert_offsets[e];
  if (threadIdx.x == 0) {
    prefetch_tensor_map(&tmap_a);
    prefetch_tensor_map(&tmap_w);
    ring.init(1, kConsumerWarps);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0;
    for (int e = 0; e < p.experts; ++e) {
      first_tile[e] = run;
      run += (offsets[e + 1] - offsets[e] + kBlockM - 1) / kBlockM * p.n_blocks;
    }
    first_tile[p.experts] = run;
  }
  __syncthreads();
  const int num_tiles = first_tile[p.experts];
  // Tile -> (expert, M-block, N-block).
  auto coords = [&](int tile, int* e, int* mb, int* nb) {
    int lo = 0, hi = p.experts - 1;  // the last e with first_tile[e] <= tile
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (first_tile[mid] <= tile) lo = mid; else hi = mid - 1;
    }
    const int m_blocks = (offsets[lo + 1] - offsets[lo] + kBlockM - 1) / kBlockM;
    const int local = tile - first_tile[lo];
    *e = lo;
    *mb = local % m_blocks;
    *nb = local / m_blocks;
  };
  const int k_blocks = (p.k + kBlockK - 1) / kBlockK;

  if (warpgroup == 0) {
    sm90::setmaxnreg_dec<40>();
    if (thread_in_group == 0) {
      int stage = 0;
      uint32_t phase = 0;
      for (int tile = static_cast<int>(blockIdx.x); tile < num_tiles; tile += static_cast<int>(gridDim.x)) {
        int e, mb, nb;
        coords(tile, &e, &mb, &nb);
        const int a_row = offsets[e] + mb * kBlockM;
        const int w_row = e * p.n + nb * kBlockN;
        for (int kb = 0; kb < k_blocks; ++kb) {
          ring.wait_empty(stage, phase);
          ring.arrive_full_expect_tx(stage, kStageBytes);
          tma_load_2d(stage_a(stage), &tmap_a, ring.full(stage), kb * kBlockK, a_row);
          tma_load_2d(stage_a(stage) + kABytes, &tmap_w, ring.full(stage), kb * kBlockK, w_row);
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1u;
          }
        }
      }
    }
  } else {
    sm90::setmaxnreg_inc<232>();
    const int consumer = warpgroup - 1;
    const int warp = thread_in_group / 32;
    const int lane = thread_in_group % 32;
    const uint32_t a_offset = S::a_offset(consumer), b_offset = S::b_offset(consumer);
    int stage = 0;
    uint32_t phase = 0;
    float acc[kWgCols / 2];
    float part[kWgCols / 2];
    for (int tile = static_cast<int>(blockIdx.x); tile < num_tiles; tile += static_cast<int>(gridDim.x)) {
      int e, mb, nb;
      coords(tile, &e, &mb, &nb);
      // The epilogue's operands, requested before the K loop so that their latency hides behind it
      // (loaded after it, each tile's 32 dependent scale loads a thread stalled the tensor core:
      // ncu, Mixtral shapes at 4096 tokens, long-scoreboard stalls 2.3 cycles an instruction).
      // acc[4j + 0, 1]: row r, columns 8j + 2t, +1; acc[4j + 2, 3]: row r + 8 (r = 16 warp +
      // lane / 4, t = lane % 4), the wgmma D fragment layout.
      const int rows_e = offsets[e + 1] - offsets[e];
      const int r0 = mb * kBlockM + (kBlockM == 128 ? consumer * 64 : 0) + warp * 16 + lane / 4;
      const int col0 = nb * kBlockN + (kBlockM == 128 ? 0 : consumer * 64) + 2 * (lane % 4);
      const int64_t prow0 = offsets[e] + r0;
      const bool ok0 = r0 < rows_e, ok1 = r0 + 8 < rows_e;
      constexpr bool kUnscaled = kBf16 || kBlock;  // scales applied per K block (block) or none (BF16)
      constexpr int kSbRegs = S::kScalesInSmem ? 1 : kWgCols / 8;  // column-scale pairs held in registers
      float sa0 = 1.0f, sa1 = 1.0f;
      float sb[kSbRegs][2];
#pragma unroll
      for (int j = 0; j < kSbRegs; ++j) sb[j][0] = sb[j][1] = 1.0f;
      if constexpr (!kUnscaled) {
        sa0 = ok0 ? p.a_scale[prow0] : 0.0f;
        sa1 = ok1 ? p.a_scale[prow0 + 8] : 0.0f;
        const float* ws = p.w_scale + static_cast<int64_t>(e) * p.n;
        if constexpr (S::kScalesInSmem) {
          // Two of the tile's columns a thread (thread_in_group and + 128), stored to the
          // warpgroup's shared scales after the K loop, when the loads have long arrived.
          const int c0 = nb * kBlockN + thread_in_group, c1 = c0 + 128;
          sb[0][0] = c0 < p.n ? ws[c0] : 0.0f;
          sb[0][1] = thread_in_group + 128 < kWgCols && c1 < p.n ? ws[c1] : 0.0f;
        } else {
#pragma unroll
          for (int j = 0; j < kWgCols / 8; ++j) {
            const int col = col0 + 8 * j;
            sb[j][0] = col < p.n ? ws[col] : 0.0f;
            sb[j][1] = col + 1 < p.n ? ws[col + 1] : 0.0f;
          }
        }
      }
      if constexpr (kBf16 || kFast) {
        // BF16 accumulates in FP32 in the tensor core (and E4M3 under kFast in the tensor core's own
        // accumulator): straight into acc, one K block's group in flight (wait_group 1) while the
        // slot before it is released, as the INT8 GEMM does.
        int prev_stage = 0;
        for (int kb = 0; kb < k_blocks; ++kb) {
          ring.wait_full(stage, phase);
          const uint32_t a_tile = stage_a(stage) + a_offset;
          const uint32_t b_tile = stage_a(stage) + kABytes + b_offset;
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < kBlockK / 32; ++kk) {  // 32 bytes of K per instruction: 16 BF16 or 32 E4M3
            const int accumulate = (kb > 0 || kk > 0) ? 1 : 0;
            if constexpr (kBf16)
              wgmma_bf16<kWgCols>(acc, make_smem_desc_k_sw128(a_tile + 32u * kk), make_smem_desc_k_sw128(b_tile + 32u * kk),
                                accumulate);
            else
              wgmma_e4m3<kWgCols>(acc, make_smem_desc_k_sw128(a_tile + 32u * kk), make_smem_desc_k_sw128(b_tile + 32u * kk),
                                accumulate);
          }
          wgmma_commit_group();
          wgmma_wait_group<1>();
          fence_registers(acc);
          if (kb > 0 && lane == 0) ring.release(prev_stage);
          prev_stage = stage;
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1u;
          }
        }
        wgmma_wait_group<0>();
        fence_registers(acc);
        if (lane == 0) ring.release(prev_stage);
      } else if constexpr (kBlock) {
        // Block scales: K block kb's partial sums times a_scale[row, kb] * w_scale[expert's
        // 128-row block nb, kb], added in FP32. The scales are requested before the block's wgmma
        // so their latency hides behind it.
        const float* sa0p = p.a_scale + prow0 * p.scale_k_blocks;
        const float* sa1p = sa0p + 8 * p.scale_k_blocks;
        const float* swp = p.w_scale + (static_cast<int64_t>(e) * p.n_blocks + nb) * p.scale_k_blocks;
#pragma unroll
        for (int i = 0; i < kWgCols / 2; ++i) acc[i] = 0.0f;
        for (int kb = 0; kb < k_blocks; ++kb) {
          const float sw = swp[kb];
          const float ba0 = ok0 ? sa0p[kb] : 0.0f, ba1 = ok1 ? sa1p[kb] : 0.0f;
          ring.wait_full(stage, phase);
          const uint32_t a_tile = stage_a(stage) + a_offset;
          const uint32_t b_tile = stage_a(stage) + kABytes + b_offset;
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < kBlockK / 32; ++kk)
            wgmma_e4m3<kWgCols>(part, make_smem_desc_k_sw128(a_tile + 32u * kk), make_smem_desc_k_sw128(b_tile + 32u * kk),
                              kk > 0 ? 1 : 0);
          wgmma_commit_group();
          wgmma_wait_group<0>();
          fence_registers(part);
          if (lane == 0) ring.release(stage);
          const float f0 = __fmul_rn(ba0, sw), f1 = __fmul_rn(ba1, sw);
#pragma unroll
          for (int j = 0; j < kWgCols / 8; ++j) {
            acc[4 * j] += part[4 * j] * f0;
            acc[4 * j + 1] += part[4 * j + 1] * f0;
            acc[4 * j + 2] += part[4 * j + 2] * f1;
            acc[4 * j + 3] += part[4 * j + 3] * f1;
          }
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1u;
          }
        }
      } else {
        // FP8: each K block accumulated fresh in `part`, waited for, and added to acc in FP32.
        // (Measured on an H200: keeping a block in flight between promotions, or promoting every
        // 2 or 4 blocks in that form, ran 20-35% slower at 4096 tokens than this plain loop.)
#pragma unroll
        for (int i = 0; i < kWgCols / 2; ++i) acc[i] = 0.0f;
        for (int kb = 0; kb < k_blocks; ++kb) {
          ring.wait_full(stage, phase);
          const uint32_t a_tile = stage_a(stage) + a_offset;
          const uint32_t b_tile = stage_a(stage) + kABytes + b_offset;
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < kBlockK / 32; ++kk)  // 32 E4M3 (32 bytes) of K per instruction
            wgmma_e4m3<kWgCols>(part, make_smem_desc_k_sw128(a_tile + 32u * kk), make_smem_desc_k_sw128(b_tile + 32u * kk),
                              kk > 0 ? 1 : 0);
          wgmma_commit_group();
          wgmma_wait_group<0>();
          fence_registers(part);
          if (lane == 0) ring.release(stage);
#pragma unroll
          for (int i = 0; i < kWgCols / 2; ++i) acc[i] += part[i];
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1u;
          }
        }
      }
      // 192 columns: the warpgroup's scales to shared memory. The first barrier waits for every
      // thread of the warpgroup to leave the previous tile's epilogue (which read these), the
      // second makes the stores visible before this one's.
      float* wg_scales = col_scales + consumer * kWgCols;
      if constexpr (S::kScalesInSmem) {
        sm90::named_barrier_sync<128>(1 + consumer);
        wg_scales[thread_in_group] = sb[0][0];
        if (thread_in_group + 128 < kWgCols) wg_scales[thread_in_group + 128] = sb[0][1];
        sm90::named_barrier_sync<128>(1 + consumer);
      }
#pragma unroll
      for (int j = 0; j < kWgCols / 8; ++j) {
        const int col = col0 + 8 * j;
        if (col >= p.n) continue;
        const bool two = col + 1 < p.n;
        float sb0, sb1;
        if constexpr (S::kScalesInSmem) {
          sb0 = wg_scales[col - nb * kBlockN];
          sb1 = wg_scales[col - nb * kBlockN + 1];
        } else {
          sb0 = sb[j][0];
          sb1 = sb[j][1];
        }
        auto put = [&](int64_t row, float sa, float v0, float v1) {
          const uint16_t b0 = __bfloat16_as_ushort(__float2bfloat16_rn(v0 * __fmul_rn(sa, sb0)));
          uint16_t* dst = p.d + row * p.n + col;
          if (two && (p.n % 2 == 0)) {
            const uint16_t b1 = __bfloat16_as_ushort(__float2bfloat16_rn(v1 * __fmul_rn(sa, sb1)));
            *reinterpret_cast<uint32_t*>(dst) = static_cast<uint32_t>(b0) | (static_cast<uint32_t>(b1) << 16);
          } else {
            dst[0] = b0;
            if (two) dst[1] = __bfloat16_as_ushort(__float2bfloat16_rn(v1 * __fmul_rn(sa, sb1)));
          }
        };
        if (ok0) put(prow0, sa0, acc[4 * j], acc[4 * j + 1]);
        if (ok1) put(prow0 + 8, sa1, acc[4 * j + 2], acc[4 * j + 3]);
      }
    }
  }
#else
  __trap();  // compiled for another target: the host launches this kernel only on sm_90
#endif
}


// The device's facts are cuda::current_device_facts' (cached: this runs per expert linear per layer).
using cuda::DeviceFacts;

template <bool kBf16, bool kBlock, bool kFast, int kBlockM, int kBlockN = 128>
Status launch_tiles(const MoeGroupedGemm& g, const DeviceFacts& dev, cudaStream_t stream) {
  // Rows as bytes: TMA copies them whatever the element type.
  const int64_t k_bytes = g.k * (kBf16 ? 2 : 1);
  CUtensorMap map_a, map_w;
  LLMQ_RETURN_IF_ERROR(int8_gemm::encode_int8_tensor_map(&map_a, g.a, g.rows, k_bytes, kBlockM, kBlockK));
  LLMQ_RETURN_IF_ERROR(int8_gemm::encode_int8_tensor_map(&map_w, g.w, g.experts * g.n, k_bytes, kBlockN, kBlockK));
  GroupedParams p;
  p.expert_offsets = g.expert_offsets;
  p.a_scale = g.a_scale;
  p.w_scale = g.w_scale;
  p.d = g.d;
  p.experts = static_cast<int>(g.experts);
  p.n = static_cast<int>(g.n);
  p.k = static_cast<int>(k_bytes);
  p.n_blocks = static_cast<int>(ceil_div(g.n, kBlockN));
  p.scale_k_blocks = static_cast<int>(ceil_div(g.k, 128));
  const size_t smem = smem_bytes<kBlockM, kBlockN>(g.experts);
  const auto kernel = moe_grouped_gemm_sm90_kernel<kBf16, kBlock, kFast, kBlockM, kBlockN>;
  LLMQ_RETURN_IF_ERROR(cuda::allow_dynamic_smem(reinterpret_cast<const void*>(kernel),
                                                static_cast<int>(smem_bytes<kBlockM, kBlockN>(kMaxExperts)), dev.ordinal));
  // Upper bound on tiles: each expert adds at most one partial M-block to ceil(rows / kBlockM).
  const int64_t max_tiles = (ceil_div(g.rows, kBlockM) + g.experts) * p.n_blocks;
  const int grid = static_cast<int>(std::min<int64_t>(max_tiles, dev.sms));
  kernel<<<grid, kThreads, smem, stream>>>(map_a, map_w, p);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("moe_grouped_gemm_sm90_kernel");
  return {};
}

int64_t block_rows_for(const MoeGroupedGemm& g) {
  return g.wgmma_block_rows != 0 ? g.wgmma_block_rows : moe_wgmma_block_rows(g.rows, g.experts);
}

// E4M3 experts and activations with per-channel (not block) scales: what 192-column tiles and the
// tensor core's own accumulator take.
bool per_channel_fp8(const MoeGroupedGemm& g) {
  return g.w_dtype == DType::kE4M3 && g.a_dtype == DType::kE4M3 && !g.block_scales;
}

// 192 columns take per-channel FP8 in 128-row tiles (check() refuses the rest when asked for).
int64_t block_cols_for(const MoeGroupedGemm& g) {
  if (g.wgmma_block_cols != 0) return g.wgmma_block_cols;
  return per_channel_fp8(g) && block_rows_for(g) == 128 ? moe_wgmma_block_cols(g.rows, g.experts, g.n) : 128;
}

template <bool kBf16, bool kBlock = false, bool kFast = false>
Status launch_wgmma(const MoeGroupedGemm& g, const DeviceFacts& dev, cudaStream_t stream) {
  if (block_rows_for(g) == 64) return launch_tiles<kBf16, kBlock, kFast, 64>(g, dev, stream);
  if constexpr (!kBf16 && !kBlock)
    if (block_cols_for(g) == 192) return launch_tiles<kBf16, kBlock, kFast, 128, 192>(g, dev, stream);
  return launch_tiles<kBf16, kBlock, kFast, 128>(g, dev, stream);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

Status check(const MoeGroupedGemm& g) {
  constexpr int64_t kMax = (int64_t{1} << 31) - 1;
  if (g.rows < 0 || g.rows > kMax) return invalid_argument("rows: must be in [0, 2^31), got " + std::to_string(g.rows));
  if (g.experts < 1 || g.experts > kMaxExperts)
    return invalid_argument("experts: must be in [1, " + std::to_string(kMaxExperts) + "], got " + std::to_string(g.experts));
  if (g.n <= 0 || g.n * g.experts > kMax)
    return invalid_argument("n: must be > 0 with experts x n < 2^31, got " + std::to_string(g.n));
  if (g.k <= 0 || g.k % 16 != 0 || g.k > kMax)
    return invalid_argument("k: must be a positive multiple of 16 (16-byte rows), got " + std::to_string(g.k));
  if (g.max_rows_per_expert < 0) return invalid_argument("max_rows_per_expert: must be >= 0");
  if (g.a_dtype != DType::kE4M3 && g.a_dtype != DType::kBF16)
    return invalid_argument(std::string("a_dtype: must be e4m3 (W8A8) or bf16 (W8A16), got ") + dtype_name(g.a_dtype));
  if (g.w_dtype != DType::kE4M3 && g.w_dtype != DType::kBF16)
    return invalid_argument(std::string("w_dtype: must be e4m3 or bf16, got ") + dtype_name(g.w_dtype));
  const bool bf16 = g.w_dtype == DType::kBF16;
  if (bf16 && (g.a_dtype != DType::kBF16 || g.a_scale != nullptr || g.w_scale != nullptr))
    return invalid_argument("w_dtype: BF16 experts take BF16 activations and no scales (a_scale and w_scale null)");
  if (g.wgmma_block_rows != 0 && g.wgmma_block_rows != 64 && g.wgmma_block_rows != 128)
    return invalid_argument("wgmma_block_rows: 0 (the kernel's choice), 64 or 128, got " + std::to_string(g.wgmma_block_rows));
  if (g.wgmma_block_cols != 0 && g.wgmma_block_cols != 128 && g.wgmma_block_cols != 192)
    return invalid_argument("wgmma_block_cols: 0 (the kernel's choice), 128 or 192, got " + std::to_string(g.wgmma_block_cols));
  if (g.wgmma_block_cols == 192 && (!per_channel_fp8(g) || block_rows_for(g) == 64))
    return invalid_argument("wgmma_block_cols: 192 takes per-channel FP8 (e4m3) experts and activations in 128-row tiles");
  if (g.fast_accumulation && !per_channel_fp8(g))
    return invalid_argument("fast_accumulation: per-channel FP8 (e4m3) experts and activations only");
  if (g.rows == 0) return {};
  if (g.expert_offsets == nullptr) return invalid_argument("expert_offsets: null device pointer");
  if (g.a == nullptr) return invalid_argument("a: null device pointer");
  if (g.w == nullptr) return invalid_argument("w: null device pointer");
  if (!bf16 && g.w_scale == nullptr) return invalid_argument("w_scale: null device pointer");
  if (g.d == nullptr) return invalid_argument("d: null device pointer");
  if (g.a_dtype == DType::kE4M3 && g.a_scale == nullptr) return invalid_argument("a_scale: null device pointer (W8A8)");
  if (g.a_dtype == DType::kBF16 && g.a_scale != nullptr) return invalid_argument("a_scale: must be null for bf16 A");
  if (bf16 && 2 * g.k > kMax) return invalid_argument("k: too large for BF16 rows in bytes");
  if (reinterpret_cast<uintptr_t>(g.d) % 4 != 0) return invalid_argument("d: must be 4-byte aligned (paired BF16 stores)");
  if (g.block_scales) {
    if (bf16 || g.a_dtype != DType::kE4M3) return invalid_argument("block_scales: FP8 (e4m3) experts and activations only");
    if (g.n % 128 != 0)
      return invalid_argument("n: block-scaled experts need whole 128-row weight blocks per expert, got n = " + std::to_string(g.n));
  }
  if (g.a_rows != nullptr && g.a_rows_count <= 0)
    return invalid_argument("a_rows_count: must be > 0 when a_rows is given");
  if (!aligned16(g.a) || !aligned16(g.w)) return invalid_argument(std::string(aligned16(g.a) ? "w" : "a") + ": must be 16-byte aligned");
  return {};
}

MoeGemmKernel pick(const MoeGroupedGemm& g, const DeviceFacts& dev) {
  // E4M3 x E4M3 or BF16 x BF16: the wgmma kernel's operand types.
  return moe_gemm_kernel_for(g.max_rows_per_expert, g.a_rows != nullptr, g.a_dtype == g.w_dtype, dev.major, dev.minor);
}

}  // namespace moe

int64_t moe_wgmma_block_rows(int64_t rows, int64_t experts) {
  return experts > 0 && ceil_div(rows, experts) <= 64 ? 64 : 128;
}

// H200, bench_cuda_moe_sparse against 128 columns in one session: 4096 tokens (512 / 1024 rows an
// expert) gpt-oss-20b 307 -> 276 us, Mixtral-8x7B 954 -> 895; at 512 tokens (128 rows an expert,
// Mixtral) 2% slower, so prefill-sized experts only.
int64_t moe_wgmma_block_cols(int64_t rows, int64_t experts, int64_t n) {
  return experts > 0 && ceil_div(rows, experts) >= 256 && n >= 192 ? 192 : 128;
}

MoeGemmKernel moe_gemm_kernel_for(int64_t max_rows_per_expert, bool rows_in_place, bool same_types, int sm_major,
                                  int sm_minor) {
  const bool wgmma_ok = compute_capability_has_sm90a(sm_major, sm_minor) && !rows_in_place && same_types;
  if (!wgmma_ok || max_rows_per_expert <= kMoeDecodeMaxRows) return MoeGemmKernel::kDecode;
  return MoeGemmKernel::kWgmma;
}

Status cuda_moe_grouped_gemm(const MoeGroupedGemm& g, CudaStream stream, MoeGemmKernel kernel) {
  LLMQ_RETURN_IF_ERROR(moe::check(g));
  if (g.rows == 0 || g.max_rows_per_expert == 0) return {};
  cuda::DeviceFacts dev;
  LLMQ_RETURN_IF_ERROR(cuda::current_device_facts(&dev));
  if (kernel == MoeGemmKernel::kAuto) kernel = moe::pick(g, dev);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (kernel == MoeGemmKernel::kWgmma) {
    if (!cuda::has_sm90a(dev))
      return unsupported("kernel: the wgmma grouped GEMM needs an sm_90 GPU, this one is sm_" +
                         std::to_string(dev.major) + std::to_string(dev.minor));
    if (g.a_rows != nullptr) return invalid_argument("a_rows: the wgmma kernel reads contiguous rows (gather first)");
    if (g.a_dtype != g.w_dtype) return invalid_argument("a_dtype: the wgmma kernel takes A in the weights' type (e4m3 or bf16)");
    if (g.block_scales) return moe::launch_wgmma<false, true>(g, dev, s);  // a_rows refused above
    if (g.w_dtype == DType::kBF16) return moe::launch_wgmma<true>(g, dev, s);
    return g.fast_accumulation ? moe::launch_wgmma<false, false, true>(g, dev, s) : moe::launch_wgmma<false>(g, dev, s);
  }
  return moe::decode_grouped_gemm(g, stream);
}

MoeGemmKernel cuda_moe_grouped_gemm_kernel(const MoeGroupedGemm& g) {
  cuda::DeviceFacts dev;
  if (!cuda::current_device_facts(&dev).ok()) return MoeGemmKernel::kDecode;
  return moe::pick(g, dev);
}

const char* moe_gemm_kernel_name(MoeGemmKernel kernel) {
  switch (kernel) {
    case MoeGemmKernel::kAuto: return "auto";
    case MoeGemmKernel::kDecode: return "decode";
    case MoeGemmKernel::kWgmma: return "wgmma";
  }
  return "unknown";
}

}  // namespace llmq
