// Decode GEMM (include/llmq/cuda_decode_gemm.hpp): D[M, N] = A[M, K] * W[N, K]^T * scales for
// M <= 32 tokens and 8-bit weights, written to run at the speed of streaming W once.
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
// per 16 rows x 32 K for M <= 8, two for M <= 16, four for M <= 32):
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
#include "cuda/decode_gemm_grouped.hpp"
#include "cuda/decode_gemm_kernel.cuh"
#include "core/int_math.hpp"

namespace llmq {
namespace decode_gemm {

// ---------------------------------------------------------------------------------------------
// Host side: kernels, device facts, plan

using KernelFn = void (*)(Params);

// Four token tiles take two weight tiles a CTA: more and the warps' partial sums (kWarps x tiles x
// token tiles x 512 bytes) pass the 48 KiB of static shared memory; one holds four steps of four
// activation pieces in registers, which spilled (ptxas: 576 bytes).
template <int kTokenTiles>
constexpr int kMaxTilesFor = kTokenTiles == 4 ? 2 : 4;
template <int kTokenTiles>
constexpr int kMinTilesFor = kTokenTiles == 4 ? 2 : 1;

template <bool kInt8, bool kABf16, int kTokenTiles, bool kPrefetch, bool kW16 = false, bool kBlock = false>
KernelFn kernel_for_tiles(int tiles) {
  if constexpr (kMaxTilesFor<kTokenTiles> == 4) {
    if (tiles == 4) return decode_gemm_kernel<kInt8, kABf16, kTokenTiles, 4, kPrefetch, kW16, kBlock>;
    if (tiles == 3) return decode_gemm_kernel<kInt8, kABf16, kTokenTiles, 3, kPrefetch, kW16, kBlock>;
  }
  if constexpr (kMinTilesFor<kTokenTiles> == 1)
    if (tiles == 1) return decode_gemm_kernel<kInt8, kABf16, kTokenTiles, 1, kPrefetch, kW16, kBlock>;
  return decode_gemm_kernel<kInt8, kABf16, kTokenTiles, 2, kPrefetch, kW16, kBlock>;
}

// Null for a form that has no kernel at these tokens (W8A16: can_implement refuses it; block scales
// and BF16 experts: grouped mode only, whose launches take at most 16 rows).
template <int kTokenTiles, bool kPrefetch>
KernelFn kernel_for(bool int8, bool a_bf16, bool w16, bool block, int tiles) {
  if constexpr (kTokenTiles == 4) {  // W8A8 only: W8A16's activations, block scales and BF16 experts stay at M <= 16
    if (w16 || block || a_bf16) return nullptr;
    return int8 ? kernel_for_tiles<true, false, 4, kPrefetch>(tiles) : kernel_for_tiles<false, false, 4, kPrefetch>(tiles);
  } else {
    if (w16) return kernel_for_tiles<false, false, kTokenTiles, kPrefetch, true>(tiles);
    if (block) return kernel_for_tiles<false, false, kTokenTiles, kPrefetch, false, true>(tiles);
    if (int8)
      return a_bf16 ? kernel_for_tiles<true, true, kTokenTiles, kPrefetch>(tiles)
                    : kernel_for_tiles<true, false, kTokenTiles, kPrefetch>(tiles);
    return a_bf16 ? kernel_for_tiles<false, true, kTokenTiles, kPrefetch>(tiles)
                  : kernel_for_tiles<false, false, kTokenTiles, kPrefetch>(tiles);
  }
}

// The n8 tiles of tokens M needs: 1 (M <= 8), 2 (M <= 16) or 4 (M <= 32); rows past M are zero
// registers and their A rows are never loaded.
int token_tiles(int64_t m) { return m <= 8 ? 1 : (m <= 16 ? 2 : 4); }

KernelFn select_kernel(bool int8, bool a_bf16, int64_t m, int tiles, bool prefetch, bool w16 = false, bool block = false) {
  switch (token_tiles(m)) {
    case 1: return prefetch ? kernel_for<1, true>(int8, a_bf16, w16, block, tiles) : kernel_for<1, false>(int8, a_bf16, w16, block, tiles);
    case 2: return prefetch ? kernel_for<2, true>(int8, a_bf16, w16, block, tiles) : kernel_for<2, false>(int8, a_bf16, w16, block, tiles);
    default: return prefetch ? kernel_for<4, true>(int8, a_bf16, w16, block, tiles) : kernel_for<4, false>(int8, a_bf16, w16, block, tiles);
  }
}

static_assert(kDecodeGemmGroupRows == kTileN, "grouped mode: a slice's chunk is one tile's rows (find_group_chunk)");

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
  if (cfg.tiles_per_cta < 0 || cfg.tiles_per_cta > 4)
    return invalid_argument("config.tiles_per_cta: must be 0 (choose), 1, 2, 3 or 4, got " +
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
  // stays at 1 tile (256 CTAs, one wave; 2 and 4 tiles measured slower). Three tiles (six loads
  // per lane per batch instead of eight) fill the waves of gpt-oss's experts: N = 5760 / 2880 at
  // four routed experts give 480 / 240 CTAs at 3 tiles (91% of two / one waves of 264) where 4
  // tiles leave 360 / 180 (68%).
  const bool four = token_tiles(p.m) == 4;
  const int min_tiles = four ? kMinTilesFor<4> : kMinTilesFor<1>, max_tiles = four ? kMaxTilesFor<4> : kMaxTilesFor<1>;
  if (cfg.tiles_per_cta != 0 && (cfg.tiles_per_cta < min_tiles || cfg.tiles_per_cta > max_tiles))
    return invalid_argument("config.tiles_per_cta: " + std::to_string(min_tiles) + ".." + std::to_string(max_tiles) +
                            " for " + std::to_string(p.m) + " tokens, got " + std::to_string(cfg.tiles_per_cta));
  if (select_kernel(int8, a_bf16, p.m, max_tiles, cfg.l2_prefetch, w16, block) == nullptr)
    return unsupported("decode gemm: no kernel for " + std::to_string(p.m) + " tokens in this form (W8A8 only past " +
                       std::to_string(kDecodeGemmGroupRows) + ")");
  int tiles_per_cta = cfg.tiles_per_cta;
  if (tiles_per_cta == 0) {
    int64_t best_waves = 0;
    for (int t = min_tiles; t <= max_tiles; ++t) {
      int per_sm = 0;
      LLMQ_RETURN_IF_ERROR(ctas_per_sm(select_kernel(int8, a_bf16, p.m, t, cfg.l2_prefetch, w16, block), dev, &per_sm));
      const int64_t waves = ceil_div(ceil_div(tiles, t) * slices, per_sm * int64_t{dev.sms});
      if (tiles_per_cta == 0 || waves < best_waves) {
        best_waves = waves;
        tiles_per_cta = t;
      }
    }
  }
  const KernelFn fn = select_kernel(int8, a_bf16, p.m, tiles_per_cta, cfg.l2_prefetch, w16, block);
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

// Measured on an H200 in Llama-3-8B decode steps (bench/results/2026-11-28-h200-decode-gemm-32-tokens.json),
// where cuBLASLt's FP8 / INT8 kernels run the N = 4096 projections on 32 CTAs: four token tiles
// took INT8 W8A8 at 24 / 32 rows from 5.79 / 5.87 to 4.38 / 4.68 ms a step. E4M3 W8A8 stops at 8:
// with its tiles searched (CudaGemmOptions::tile_search_max_m, the runtime's default) cuBLASLt's
// FP8 GEMM runs a decode step of 12 / 16 / 24 rows in 3.34 / 3.42 / 3.51 ms where the decode GEMM
// takes 3.58 / 3.67 / 4.77, and loses only at 8 (3.28 against 3.13; H200, same session,
// bench/results/2026-11-28-h200-gemm-tile-search.json). Everything else keeps the two token tiles
// every form has.
int64_t decode_gemm_preferred_max_tokens(DType a_dtype, DType w_dtype) {
  if (a_dtype == DType::kI8 && w_dtype == DType::kI8) return 32;
  if (a_dtype == DType::kE4M3 && w_dtype == DType::kE4M3) return 8;
  return 16;
}

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
  if (w8a16 && p.m > kDecodeGemmW8A16MaxM)
    return unsupported("m: W8A16 (bf16 activations) takes at most " + std::to_string(kDecodeGemmW8A16MaxM) +
                       " tokens, got " + std::to_string(p.m));
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

Status launch(const DecodeGemmProblem& p, CudaStream stream, const DecodeGemmConfig& config, const GroupLaunch* group) {
  LLMQ_RETURN_IF_ERROR(cuda_decode_gemm_can_implement(p));
  if (p.m == 0 || p.n == 0) return {};
  if (group != nullptr && p.m > kDecodeGemmGroupRows)  // a slice's rows are one chunk (kTileN)
    return invalid_argument("grouped decode gemm: m must be at most " + std::to_string(kDecodeGemmGroupRows) + ", got " +
                            std::to_string(p.m));
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
