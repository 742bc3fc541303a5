// INT8 GEMM (include/llmq/cuda_int8_gemm.hpp): the Hopper kernel and the host-side dispatch.
//
// Hopper kernel: persistent, warp-specialised, 384 threads = 3 warpgroups.
//   * warpgroup 0, producer: one thread walks the CTA's tiles and K blocks, waits for a free
//     slot of the shared-memory ring (empty barrier), announces the bytes on the slot's full barrier
//     and issues two TMA copies: A [BM x 128] and B [BN x 128] int8, 128-byte swizzled. It gives
//     its registers away (setmaxnreg 40).
//   * warpgroups 1 and 2, consumers (setmaxnreg 232). With BM = 128 each owns 64 rows of the
//     128 x BN tile and issues 4 wgmma m64nBNk32 per K block; with BM = 64 (few tokens) both take
//     the tile's 64 rows, each half of its BN columns (wgmma m64n(BN/2)k32). Each keeps one K
//     block's group in flight (wait_group 1) before releasing the previous slot. After the last K
//     block, the epilogue descales the INT32 accumulators from registers and stores BF16 (or INT32).
//   While the consumers run an epilogue, the producer is already filling the ring for their next
//   tile. Tiles are visited in groups of 16 M-blocks (all N-blocks of a group before the next) so
//   that the CTAs running at one time share A and B panels in L2.
//
// Shared memory: stages x (BM x 128 B + BN x 128 B) + 2 x stages mbarriers, 1024-byte aligned (the
// swizzle pattern repeats every 1024 bytes and the descriptors assume aligned atoms): as many
// stages as fit 192 KB, at most 8 (BM 128: BN 256 has 4, 128 has 6, 64 has 8).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda/cuda_check.cuh"
#include "cuda/device_facts.cuh"
#include "cuda/int8_gemm_epilogue.cuh"
#include "cuda/int8_gemm_mma_sync.cuh"
#include "cuda/sm90_pipeline.cuh"
#include "cuda/sm90_tma.cuh"
#include "cuda/sm90_wgmma.cuh"
#include "llmq/cuda_int8_gemm.hpp"
#include "llmq/gemm.hpp"
#include "core/int_math.hpp"

namespace llmq {
namespace int8_gemm {

using sm90::fence_registers;
using sm90::make_smem_desc_k_sw128;
using sm90::prefetch_tensor_map;
using sm90::setmaxnreg_dec;
using sm90::setmaxnreg_inc;
using sm90::smem_u32;
using sm90::tma_load_2d;
using sm90::wgmma_commit_group;
using sm90::wgmma_fence;
using sm90::wgmma_s8;
using sm90::wgmma_wait_group;

constexpr int kSm90BlockK = 128;  // one 128-byte swizzle row of int8
constexpr int kSm90Threads = 384;
constexpr int kRasterGroupM = 16;

// The ring of a BM x BN tile: as many stages as fit 192 KB, at most 8; and the dynamic shared
// memory: ring, barriers, and up to 1023 bytes lost to aligning the base. The host's plan and the
// kernel both take them from here.
constexpr int sm90_stages(int block_m, int block_n) {
  return 196608 / ((block_m + block_n) * kSm90BlockK) < 8 ? 196608 / ((block_m + block_n) * kSm90BlockK) : 8;
}
constexpr size_t sm90_smem_bytes(int block_m, int block_n) {
  return static_cast<size_t>(sm90_stages(block_m, block_n)) * (block_m + block_n) * kSm90BlockK +
         2 * sm90_stages(block_m, block_n) * 8 + 1024;
}

template <int kBlockM, int kBlockN>
struct Sm90Tile {
  static_assert(kBlockM == 128 || (kBlockM == 64 && kBlockN >= 128), "BM 128, or BM 64 with BN 128 / 256");
  static constexpr uint32_t kABytes = kBlockM * kSm90BlockK;
  static constexpr uint32_t kBBytes = kBlockN * kSm90BlockK;
  static constexpr uint32_t kStageBytes = kABytes + kBBytes;
  static constexpr int kStages = sm90_stages(kBlockM, kBlockN);
  // wgmma N of one consumer warpgroup, and the INT32 accumulators a consumer thread holds.
  static constexpr int kWgmmaN = kBlockM == 128 ? kBlockN : kBlockN / 2;
  static constexpr int kAcc = kWgmmaN / 2;
  static constexpr size_t kSmemBytes = sm90_smem_bytes(kBlockM, kBlockN);
  static_assert(kStageBytes % 1024 == 0, "every tile must start on a 1024-byte swizzle atom");
  static_assert(kSmemBytes <= 227 * 1024, "over the sm_90 shared-memory limit per block");
  static_assert(kAcc % 4 == 0, "the epilogue stores 8 columns (4 accumulators) at a time");
};

// Tile order: M-blocks fastest inside a group of kRasterGroupM M-blocks, then N-blocks, then groups.
struct TileScheduler {
  int num_m_blocks = 0;
  int num_n_blocks = 0;
  int num_tiles = 0;

  __device__ __forceinline__ void coords(int tile, int* mb, int* nb) const {
    const int per_group = kRasterGroupM * num_n_blocks;
    const int group = tile / per_group;
    const int first_m = group * kRasterGroupM;
    const int group_m = min(num_m_blocks - first_m, kRasterGroupM);
    const int local = tile - group * per_group;
    *mb = first_m + local % group_m;
    *nb = local / group_m;
  }
};

template <int kBlockM, int kBlockN, OutputKind kOut>
__global__ void __launch_bounds__(kSm90Threads, 1)
    int8_gemm_sm90_kernel(const __grid_constant__ CUtensorMap tmap_a,
                          const __grid_constant__ CUtensorMap tmap_b, EpilogueParams p,
                          TileScheduler sched, int k) {
#if LLMQ_SM90A
  using Tile = Sm90Tile<kBlockM, kBlockN>;
  constexpr int kStages = Tile::kStages;
  constexpr int kAcc = Tile::kAcc;
  constexpr int kConsumerWarps = 8;  // each consumer warp releases a slot once (lane 0)
  // Register budget after the split: 128 x 40 + 256 x 232 = 64512 of the SM's 65536.
  constexpr int kProducerRegisters = 40;
  constexpr int kConsumerRegisters = 232;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  // full[s]: the slot's TMA bytes have landed; empty[s]: all 8 consumer warps are done with it.
  using Ring = sm90::StageRing<kStages>;
  const Ring ring{base + kStages * Tile::kStageBytes};
  auto stage_a = [&](int s) { return base + static_cast<uint32_t>(s) * Tile::kStageBytes; };

  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  const int thread_in_group = static_cast<int>(threadIdx.x) % 128;
  if (threadIdx.x == 0) {
    prefetch_tensor_map(&tmap_a);
    prefetch_tensor_map(&tmap_b);
    ring.init(1, kConsumerWarps);
  }
  __syncthreads();

  const int k_blocks = (k + kSm90BlockK - 1) / kSm90BlockK;

  if (warpgroup == 0) {
    // Producer. One elected thread issues every copy; the other 127 threads simply finish.
    setmaxnreg_dec<kProducerRegisters>();
    if (thread_in_group == 0) {
      int stage = 0;
      uint32_t phase = 0;
      for (int tile = static_cast<int>(blockIdx.x); tile < sched.num_tiles;
           tile += static_cast<int>(gridDim.x)) {
        int mb, nb;
        sched.coords(tile, &mb, &nb);
        for (int kb = 0; kb < k_blocks; ++kb) {
          ring.wait_empty(stage, phase);
          ring.arrive_full_expect_tx(stage, Tile::kStageBytes);
          tma_load_2d(stage_a(stage), &tmap_a, ring.full(stage), kb * kSm90BlockK, mb * kBlockM);
          tma_load_2d(stage_a(stage) + Tile::kABytes, &tmap_b, ring.full(stage), kb * kSm90BlockK,
                      nb * kBlockN);
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1u;
          }
        }
      }
    }
  } else {
    // Consumers. BM 128: warpgroup 1 takes tile rows 0-63, warpgroup 2 rows 64-127. BM 64: both
    // take the 64 rows, warpgroup 1 columns [0, BN/2), warpgroup 2 [BN/2, BN).
    setmaxnreg_inc<kConsumerRegisters>();
    const int consumer = warpgroup - 1;
    const int warp = thread_in_group / 32;
    const int lane = thread_in_group % 32;
    const uint32_t a_offset = kBlockM == 128 ? static_cast<uint32_t>(consumer) * 64u * kSm90BlockK : 0u;
    const uint32_t b_offset = kBlockM == 128 ? 0u : static_cast<uint32_t>(consumer) * (kBlockN / 2) * kSm90BlockK;
    int stage = 0;
    uint32_t phase = 0;
    int32_t acc[kAcc];

    for (int tile = static_cast<int>(blockIdx.x); tile < sched.num_tiles;
         tile += static_cast<int>(gridDim.x)) {
      int mb, nb;
      sched.coords(tile, &mb, &nb);
      int prev_stage = 0;
      for (int kb = 0; kb < k_blocks; ++kb) {
        ring.wait_full(stage, phase);
        const uint32_t a_tile = stage_a(stage) + a_offset;
        const uint32_t b_tile = stage_a(stage) + Tile::kABytes + b_offset;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kSm90BlockK / 32; ++kk) {
          // K steps of 32 bytes inside the swizzled 128-byte rows: only the start address moves.
          wgmma_s8<Tile::kWgmmaN>(acc, make_smem_desc_k_sw128(a_tile + 32u * kk),
                                  make_smem_desc_k_sw128(b_tile + 32u * kk), (kb > 0 || kk > 0) ? 1 : 0);
        }
        wgmma_commit_group();
        // One group stays in flight; the one before it has finished reading its slot.
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

      // Epilogue from registers: acc[4j + 0, 1] are row r, columns 8j + 2t, +1; acc[4j + 2, 3]
      // row r + 8 (r = 16 warp + lane / 4, t = lane % 4), the wgmma D fragment layout.
      const int64_t row0 =
          static_cast<int64_t>(mb) * kBlockM + (kBlockM == 128 ? consumer * 64 : 0) + warp * 16 + lane / 4;
      const float sa0 = load_row_scale<kOut>(p, row0);
      const float sa1 = load_row_scale<kOut>(p, row0 + 8);
      const int64_t col0 =
          static_cast<int64_t>(nb) * kBlockN + (kBlockM == 128 ? 0 : consumer * (kBlockN / 2)) + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < kAcc / 4; ++j) {
        store_acc_pairs<kOut>(p, row0, col0 + 8 * j, acc[4 * j], acc[4 * j + 1], acc[4 * j + 2],
                              acc[4 * j + 3], sa0, sa1);
      }
    }
  }
#else
  // Compiled for another target: the host launches this kernel only on sm_90.
  __trap();
#endif
}

// ---------------------------------------------------------------------------------------------
// Host side


// The device's facts are cuda::current_device_facts' (cached: this runs per GEMM).
using cuda::DeviceFacts;
inline bool has_wgmma(const DeviceFacts& dev) { return cuda::has_sm90a(dev); }

void fill_sm90_plan(int64_t m, int64_t n, int block_m, int block_n, int sms, Int8GemmPlan* plan) {
  plan->kernel = Int8GemmKernel::kWgmma;
  plan->block_m = block_m;
  plan->block_n = block_n;
  plan->block_k = kSm90BlockK;
  plan->stages = sm90_stages(block_m, block_n);
  plan->threads = kSm90Threads;
  plan->tiles = ceil_div(m, int64_t{block_m}) * ceil_div(n, int64_t{block_n});
  plan->grid = static_cast<int>(std::min<int64_t>(plan->tiles, sms));
  plan->smem_bytes = sm90_smem_bytes(block_m, block_n);
}

// Width along N with the least estimated time for GEMMs whose 128-row tiles fill the SMs: waves
// of tiles x tile cost. A narrower tile does less work but reads more shared memory per MMA (A is
// re-read for every BN columns), which the factors charge: 1.0 for 256, 1.1 for 128, 1.4 for 64
// (64 sits at the shared-memory bandwidth).
int choose_block_n(int64_t m, int64_t n, int sms) {
  int best = 256;
  double best_time = 0.0;
  for (int width : {256, 128, 64}) {
    const int64_t tiles = ceil_div(m, int64_t{128}) * ceil_div(n, int64_t{width});
    const double factor = width == 256 ? 1.0 : width == 128 ? 1.1 : 1.4;
    const double time = static_cast<double>(ceil_div(tiles, int64_t{sms})) * width * factor;
    if (width == 256 || time < best_time) {
      best = width;
      best_time = time;
    }
  }
  return best;
}

// Cycles one CTA takes per K block of a BM x BN tile when every SM runs one: measured on an H200
// (bench_cuda_int8_gemm, Llama-3-8B projections at 16-256 tokens, 2026-11-28). Below 128 x 256 a
// tile's K block is bound by the ring's latency rather than by its tensor work, so the 64 x 128
// tile streams its weights fastest: 64 x 128 537, 64 x 256 893, 128 x 64 750, 128 x 128 820,
// 128 x 256 1500.
double k_block_cycles_one_wave(int block_m, int block_n) {
  if (block_m == 64) return block_n == 128 ? 537.0 : 893.0;
  return block_n == 64 ? 750.0 : block_n == 128 ? 820.0 : 1500.0;
}

// The tile a call runs: the config's where it names one; else choose_block_n's 128-row tile when
// its tiles fill the SMs (prefill) or M is past the few-token range the cycles were measured in;
// else (the few-token GEMMs of decode, where a 128-row tile of 64 tokens is half padding and too
// few tiles leave SMs idle) the fewest waves x k_block_cycles_one_wave over 128 x {64, 128, 256}
// and 64 x {128, 256}. Split-K was tried here and never won
// (bench/results/2026-11-28-h200-int8-small-m-tiles.json).
constexpr int64_t kFewTokensMaxM = 256;
struct Sm90Choice {
  int block_m = 128, block_n = 256;
};
Sm90Choice choose_sm90(int64_t m, int64_t n, const Int8GemmConfig& config, int sms) {
  if (config.block_m != 0 && config.block_n != 0) return {config.block_m, config.block_n};
  if (config.block_m != 64) {
    const int bn = config.block_n != 0 ? config.block_n : choose_block_n(m, n, sms);
    if (config.block_m == 128 || m > kFewTokensMaxM || ceil_div(m, int64_t{128}) * ceil_div(n, int64_t{bn}) >= sms)
      return {128, bn};
  }
  Sm90Choice best;
  double best_time = 0.0;
  bool have = false;
  for (int bm : {128, 64})
    for (int bn : {256, 128, 64}) {
      if ((config.block_m != 0 && bm != config.block_m) || (config.block_n != 0 && bn != config.block_n) ||
          (bm == 64 && bn == 64))
        continue;
      const int64_t tiles = ceil_div(m, int64_t{bm}) * ceil_div(n, int64_t{bn});
      const double time = static_cast<double>(ceil_div(tiles, int64_t{sms})) * k_block_cycles_one_wave(bm, bn);
      if (!have || time < best_time) {
        have = true;
        best_time = time;
        best = {bm, bn};
      }
    }
  return best;
}

Status make_plan(int64_t m, int64_t n, const Int8GemmConfig& config, const DeviceFacts& dev, Int8GemmPlan* plan) {
  *plan = Int8GemmPlan{};
  Int8GemmKernel kernel = config.kernel;
  if (kernel == Int8GemmKernel::kAuto)
    kernel = has_wgmma(dev) ? Int8GemmKernel::kWgmma : Int8GemmKernel::kMmaSync;
  if (kernel == Int8GemmKernel::kWgmma) {
    if (!has_wgmma(dev))
      return unsupported("config.kernel: the wgmma INT8 kernel needs an sm_90 GPU, this one is sm_" +
                         std::to_string(dev.major) + std::to_string(dev.minor));
    if (config.block_m != 0 && config.block_m != 64 && config.block_m != 128)
      return invalid_argument("config.block_m: the wgmma kernel takes 0 (choose), 64 or 128, got " +
                              std::to_string(config.block_m));
    if (config.block_n != 0 && config.block_n != 64 && config.block_n != 128 && config.block_n != 256)
      return invalid_argument("config.block_n: the wgmma kernel takes 0 (choose), 64, 128 or 256, got " +
                              std::to_string(config.block_n));
    if (config.block_m == 64 && config.block_n == 64)
      return invalid_argument("config.block_n: with block_m 64 the wgmma kernel takes 128 or 256, got 64");
    const Sm90Choice c = choose_sm90(m, n, config, dev.sms);
    fill_sm90_plan(m, n, c.block_m, c.block_n, dev.sms, plan);
    return {};
  }
  if (kernel != Int8GemmKernel::kMmaSync) return invalid_argument("config.kernel: unknown kernel");
  if (dev.major < 8)
    return unsupported("config.kernel: the INT8 mma.sync kernel needs sm_80 or later, this GPU is sm_" +
                       std::to_string(dev.major) + std::to_string(dev.minor));
  if (config.block_n != 0 && config.block_n != kMmaBlockN)
    return invalid_argument("config.block_n: the mma_sync kernel's tile is 128 wide, got " +
                            std::to_string(config.block_n));
  if (config.block_m != 0 && config.block_m != kMmaBlockM)
    return invalid_argument("config.block_m: the mma_sync kernel's tile is 128 high, got " +
                            std::to_string(config.block_m));
  if (ceil_div(m, kMmaBlockM) > 65535)
    return unsupported("m: the mma_sync kernel's grid covers at most 65535 x 128 rows, got " +
                       std::to_string(m));
  plan->kernel = Int8GemmKernel::kMmaSync;
  plan->block_m = kMmaBlockM;
  plan->block_n = kMmaBlockN;
  plan->block_k = kMmaBlockK;
  plan->stages = 2;
  plan->threads = kMmaThreads;
  plan->tiles = ceil_div(m, kMmaBlockM) * ceil_div(n, kMmaBlockN);
  plan->grid = static_cast<int>(plan->tiles);
  plan->smem_bytes = 0;  // static shared memory only
  return {};
}

template <int kBlockM, int kBlockN, OutputKind kOut>
Status launch_sm90(const int8_t* a, const int8_t* b, const EpilogueParams& p, int64_t k,
                   const Int8GemmPlan& plan, const DeviceFacts& dev, cudaStream_t stream) {
  CUtensorMap map_a;
  CUtensorMap map_b;
  LLMQ_RETURN_IF_ERROR(encode_int8_tensor_map(&map_a, a, p.m, k, kBlockM, kSm90BlockK));
  LLMQ_RETURN_IF_ERROR(encode_int8_tensor_map(&map_b, b, p.n, k, kBlockN, kSm90BlockK));
  TileScheduler sched;
  sched.num_m_blocks = static_cast<int>(ceil_div(p.m, int64_t{kBlockM}));
  sched.num_n_blocks = static_cast<int>(ceil_div(p.n, int64_t{kBlockN}));
  sched.num_tiles = static_cast<int>(plan.tiles);
  auto kernel = int8_gemm_sm90_kernel<kBlockM, kBlockN, kOut>;
  LLMQ_RETURN_IF_ERROR(cuda::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), static_cast<int>(plan.smem_bytes),
                                                dev.ordinal));
  kernel<<<plan.grid, kSm90Threads, plan.smem_bytes, stream>>>(map_a, map_b, p, sched, static_cast<int>(k));
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("int8_gemm_sm90_kernel");
  return {};
}

template <OutputKind kOut>
Status run(const int8_t* a, const int8_t* b, const EpilogueParams& p, int64_t k,
           const Int8GemmConfig& config, cudaStream_t stream) {
  DeviceFacts dev;
  LLMQ_RETURN_IF_ERROR(cuda::current_device_facts(&dev));
  Int8GemmPlan plan;
  LLMQ_RETURN_IF_ERROR(make_plan(p.m, p.n, config, dev, &plan));
  if (plan.kernel == Int8GemmKernel::kWgmma) {
    if (plan.block_m == 64)
      return plan.block_n == 128 ? launch_sm90<64, 128, kOut>(a, b, p, k, plan, dev, stream)
                                 : launch_sm90<64, 256, kOut>(a, b, p, k, plan, dev, stream);
    switch (plan.block_n) {
      case 64: return launch_sm90<128, 64, kOut>(a, b, p, k, plan, dev, stream);
      case 128: return launch_sm90<128, 128, kOut>(a, b, p, k, plan, dev, stream);
      default: return launch_sm90<128, 256, kOut>(a, b, p, k, plan, dev, stream);
    }
  }
  const dim3 grid(static_cast<unsigned>(ceil_div(p.n, kMmaBlockN)),
                  static_cast<unsigned>(ceil_div(p.m, kMmaBlockM)));
  int8_gemm_mma_sync_kernel<kOut><<<grid, kMmaThreads, 0, stream>>>(a, b, p, k);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("int8_gemm_mma_sync_kernel");
  return {};
}

bool aligned(const void* ptr, size_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

Status check_operands(const int8_t* a, const int8_t* b, const void* d, int64_t m, int64_t n,
                      int64_t k) {
  LLMQ_RETURN_IF_ERROR(cuda_int8_gemm_can_implement(m, n, k));
  if (m == 0 || n == 0) return {};
  if (a == nullptr || b == nullptr || d == nullptr)
    return invalid_argument(std::string(a == nullptr ? "a" : b == nullptr ? "b" : "d") +
                            ": null device pointer");
  if (!aligned(a, 16) || !aligned(b, 16))
    return invalid_argument(std::string(!aligned(a, 16) ? "a" : "b") +
                            ": must be 16-byte aligned (TMA and 16-byte copies)");
  return {};
}

}  // namespace int8_gemm

// ---------------------------------------------------------------------------------------------
// Public API

Status cuda_int8_gemm_can_implement(int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kMaxExtent = (int64_t{1} << 31) - 1;
  if (m < 0 || m > kMaxExtent) return invalid_argument("m: must be in [0, 2^31), got " + std::to_string(m));
  if (n < 0 || n > kMaxExtent) return invalid_argument("n: must be in [0, 2^31), got " + std::to_string(n));
  if (k <= 0 || k % 16 != 0)
    return invalid_argument("k: must be a positive multiple of 16 (16-byte aligned rows for TMA), got " +
                            std::to_string(k));
  if (k > kMaxInt8SegmentK)
    return unsupported("k: " + std::to_string(k) + " exceeds kMaxInt8SegmentK = " +
                       std::to_string(kMaxInt8SegmentK) + " (the INT32 accumulators could overflow)");
  // The persistent scheduler counts tiles in int (the smallest tiles are 128 x 64 and 64 x 128).
  if (std::max(ceil_div(m, 128) * ceil_div(n, 64), ceil_div(m, 64) * ceil_div(n, 128)) > kMaxExtent)
    return invalid_argument("m, n: too many output tiles for one launch");
  return {};
}

Status cuda_int8_gemm_plan(int64_t m, int64_t n, int64_t k, const Int8GemmConfig& config,
                           Int8GemmPlan* plan) {
  if (plan == nullptr) return invalid_argument("plan: null");
  LLMQ_RETURN_IF_ERROR(cuda_int8_gemm_can_implement(m, n, k));
  cuda::DeviceFacts dev;
  LLMQ_RETURN_IF_ERROR(cuda::current_device_facts(&dev));
  return int8_gemm::make_plan(m, n, config, dev, plan);
}

Status cuda_int8_gemm(const int8_t* a, const int8_t* b, const float* scale_a, const float* scale_b,
                      const float* bias, uint16_t* d_bf16, int64_t m, int64_t n, int64_t k,
                      CudaStream stream, const Int8GemmConfig& config) {
  LLMQ_RETURN_IF_ERROR(int8_gemm::check_operands(a, b, d_bf16, m, n, k));
  if (m == 0 || n == 0) return {};
  if (scale_a == nullptr || scale_b == nullptr)
    return invalid_argument(std::string(scale_a == nullptr ? "scale_a" : "scale_b") + ": null device pointer");
  int8_gemm::EpilogueParams p;
  p.scale_a = scale_a;
  p.scale_b = scale_b;
  p.bias = bias;
  p.d = d_bf16;
  p.m = m;
  p.n = n;
  p.pair_aligned = n % 2 == 0 && int8_gemm::aligned(d_bf16, 4);
  return int8_gemm::run<int8_gemm::OutputKind::kBf16Scaled>(a, b, p, k, config, stream);
}

Status cuda_int8_gemm_s32(const int8_t* a, const int8_t* b, int32_t* d_s32, int64_t m, int64_t n,
                          int64_t k, CudaStream stream, const Int8GemmConfig& config) {
  LLMQ_RETURN_IF_ERROR(int8_gemm::check_operands(a, b, d_s32, m, n, k));
  if (m == 0 || n == 0) return {};
  int8_gemm::EpilogueParams p;
  p.d = d_s32;
  p.m = m;
  p.n = n;
  p.pair_aligned = n % 2 == 0 && int8_gemm::aligned(d_s32, 8);
  return int8_gemm::run<int8_gemm::OutputKind::kS32>(a, b, p, k, config, stream);
}

const char* int8_gemm_kernel_name(Int8GemmKernel kernel) {
  switch (kernel) {
    case Int8GemmKernel::kAuto: return "auto";
    case Int8GemmKernel::kWgmma: return "wgmma";
    case Int8GemmKernel::kMmaSync: return "mma_sync";
  }
  return "unknown";
}

}  // namespace llmq
