// The Hopper 8-bit flash attention (sm_90a): full-INT8 and FP8 at head_dim 128, the same
// arithmetic as the mma.sync kernel (int8_attention.cu, quantize_p_tile / fold_pv_tile shared),
// on warpgroup MMA fed by TMA.
//   CTA: 2 consumer warpgroups of 64 query rows each (128 rows of one head; 240 registers a thread)
//   and a producer warpgroup (24), of which one warp works.
//   Producer: per 128-key tile, TMA copies of the INT8/E4M3 K tile [128 keys x 128 B] and the V^T
//     tile [128 channels x 128 keys, already in the kappa key order of v_t], both 128-byte
//     swizzled, plus plain loads of the tile's key and V scales (V blocks of 128 keys: v_block),
//     into a 4-stage ring guarded by full / empty mbarriers.
//   Consumers: Q's A fragments stay in registers for the whole row block (read once from global);
//     S = Q K^T is wgmma m64n128k32 with A from registers, B the K tile; quantize_p_tile turns the
//     scores into P fragments in registers, which are the A operand of P V = wgmma m64n128k32 with
//     B the V^T tile (u8 x s8 -> INT32 exact, or E4M3 -> FP32 fresh per tile); fold_pv_tile adds
//     it to O with the tile's V scales one tile later, under the next tile's S = Q K^T. The query's
//     scale rides in the softmax's per-row exponent factor, so a score costs one FMA before it.
//   FP8 with V per channel (v_block 0, kVChannel): P V accumulates into O in the wgmma itself and
//     the tile's softmax runs under the previous tile's P V (FlashAttention-3's schedule); V's
//     scales multiply O once, in the epilogue.
//   Sliding window: the producer starts at the tile holding the CTA's first row's oldest key (tiles
//     before every row's window are never loaded); both consumer warpgroups start there too (the
//     ping-pong counts tiles from it), edge tiles take the mask. Sinks: sink_share in the epilogue.
// Only code compiled for sm_90a has a body (LLMQ_SM90A); the host launches it only on
// compute capability 9.0 when that code is present.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "attention/int8_attention_sm90.hpp"
#include "attention/int8_softmax.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/sm90_tma.cuh"
#include "cuda/sm90_wgmma.cuh"
#include "attention/attention_mma.cuh"

namespace llmq::attention {
namespace {

using sm90::fence_barrier_init;
using sm90::fence_registers;
using sm90::make_smem_desc_k_sw128;
using sm90::mbarrier_arrive;
using sm90::mbarrier_arrive_expect_tx;
using sm90::mbarrier_init;
using sm90::mbarrier_wait;
using sm90::named_barrier_arrive;
using sm90::named_barrier_sync;
using sm90::smem_u32;
using sm90::tma_load_2d;
using sm90::wgmma_commit_group;
using sm90::wgmma_fence;
using sm90::wgmma_m64n128k32_e4m3_rs;
using sm90::wgmma_m64n128k32_s8_rs;
using sm90::wgmma_m64n128k32_u8s8_rs;
using sm90::wgmma_wait_group;

constexpr int kHeadDim = 128;
constexpr int kBlockN = 128;                       // keys per tile (= the specification's block_kv, v_block)
constexpr int kConsumers = 2;                      // warpgroups of 64 query rows
constexpr int kBlockM = 64 * kConsumers;           // query rows per CTA
constexpr int kStages = 4;
constexpr int kThreads = (kConsumers + 1) * 128;   // + the producer warpgroup (one warp of it works)
constexpr int kKTileBytes = kBlockN * kHeadDim;    // 128 keys of 128 B
constexpr int kVTileBytes = kHeadDim * kBlockN;    // 128 channels of 128 B (keys)

struct SharedStorage {
  alignas(1024) unsigned char k[kStages][kKTileBytes];   // 1024-aligned: the 128-byte swizzle's atom
  alignas(1024) unsigned char vt[kStages][kVTileBytes];
  // Per key / channel {scale, -1.5 * 2^23 * scale} (small_int_times' pair), written by the
  // producer: a consumer reads a column pair's four floats in one 16-byte load. FP8 needs no
  // magic product: the first half holds the plain scales (a column pair in one 8-byte load; the
  // pairs cost FP8 two 4-byte loads a pair, 64 a tile, measured in the SASS).
  float2 k_scale[kStages][kBlockN];
  float2 v_scale[kStages][kHeadDim];
  uint64_t full[kStages], empty[kStages];
};
constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;  // + alignment slack

struct Sm90Params {
  const int8_t* q;
  const float* q_scale;  // [heads, q_len]
  const float* k_scale;  // [kv_heads, kv_len]
  const float* v_scale;  // [kv_heads, kv_tiles, 128], or [kv_heads, 128] (kVChannel)
  uint16_t* out;
  int q_len, kv_len, heads, group, kv_tiles;
  float scale_log2;
  bool causal;
  const float* sinks;    // [heads] or null (read with kSinks)
  int window;            // 0, or below kv_len (read with kWindow)
};


// acc = A B over kSteps k steps of 32, as one commit group: A from register fragments, B from
// shared memory (its descriptor moves 32 bytes, 2 units, per step); the first step overwrites acc
// (kAccumulate, FP8 only: acc += A B).
// E4M3 x E4M3 (kFp8), else INT8 B times signed (kSignedA: Q) or unsigned (P) 8-bit A.
template <bool kFp8, bool kSignedA, typename Acc, int kSteps, bool kAccumulate = false>
__device__ __forceinline__ void wgmma_rs_product(Acc (&acc)[64], uint32_t (&a)[kSteps][4], uint64_t desc) {
  static_assert(kFp8 || !kAccumulate, "INT8 products are fresh per tile");
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < kSteps; ++k) {
    if constexpr (kFp8) {
      if (k == 0 && !kAccumulate) wgmma_m64n128k32_e4m3_rs<false>(acc, a[k], desc);
      else wgmma_m64n128k32_e4m3_rs<true>(acc, a[k], desc + 2 * k);
    } else if constexpr (kSignedA) {
      if (k == 0) wgmma_m64n128k32_s8_rs<false>(acc, a[k], desc);
      else wgmma_m64n128k32_s8_rs<true>(acc, a[k], desc + 2 * k);
    } else {
      if (k == 0) wgmma_m64n128k32_u8s8_rs<false>(acc, a[k], desc);
      else wgmma_m64n128k32_u8s8_rs<true>(acc, a[k], desc + 2 * k);
    }
  }
  wgmma_commit_group();
}

// Reinterprets a flat wgmma accumulator array as the [n-tile][4] view quantize_p_tile and
// fold_pv_tile take (same registers, same order).
template <typename T, int N>
__device__ __forceinline__ T (&as_tiles(T (&flat)[N]))[N / 4][4] {
  return *reinterpret_cast<T(*)[N / 4][4]>(&flat);
}

// kWindow: a sliding window is set (p.window > 0); kSinks: p.sinks is given. Instances of their
// own, so the plain kernel keeps every register (the consumers run at the limit: ptxas spills a
// few bytes more when the window's bounds or the sink epilogue are merely possible).
// kVChannel (FP8 only): V has one scale per channel for the whole sequence (v_block 0), so P V
// accumulates into O inside the wgmma itself, across tiles, and the scale is applied once at the
// end; the schedule is then FlashAttention-3's (see the consumer loop).
template <bool kFp8, bool kWindow, bool kSinks, bool kVChannel = false>
__global__ void __launch_bounds__(kThreads, 1)
    attention_sm90_kernel(const __grid_constant__ CUtensorMap tmap_k, const __grid_constant__ CUtensorMap tmap_v,
                          const Sm90Params p) {
#if LLMQ_SM90A
  extern __shared__ unsigned char smem_raw[];
  // Aligned by pointer arithmetic on smem_raw itself: through an integer cast the compiler loses
  // that `sh` is shared memory and reads the scales with generic loads (measured: LD.E in the SASS).
  SharedStorage& sh = *reinterpret_cast<SharedStorage*>(smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u));
  const int m_block = gridDim.x - 1 - blockIdx.x;  // heavy (late, causal) row blocks first
  const int head = blockIdx.y, kv_head = head / p.group;
  const int q0 = m_block * kBlockM;
  const int q_rows = min(kBlockM, p.q_len - q0);
  const int pos0 = p.kv_len - p.q_len + q0;  // position of the block's first query
  const int key_end = p.causal ? min(p.kv_len, pos0 + q_rows) : p.kv_len;
  const int n_tiles = (key_end + kBlockN - 1) / kBlockN;
  // Tiles tile_begin .. n_tiles - 1 are loaded: the first row's window starts lowest. Loop
  // counters below count from tile_begin (ring stages and phases included).
  const int window = kWindow ? p.window : 0;
  const int tile_begin = kWindow ? max(0, pos0 - window + 1) / kBlockN : 0;
  const int n_loaded = kWindow ? max(n_tiles - tile_begin, 0) : n_tiles;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(smem_u32(&sh.full[s]), 32);                 // the producer warp's lanes (+ TMA bytes)
      mbarrier_init(smem_u32(&sh.empty[s]), kConsumers * 128);  // every consumer thread (see release)
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (warp >= kConsumers * 4) {
    // Producer warpgroup: registers back to the consumers; its first warp loads.
    sm90::setmaxnreg_dec<24>();  // 2 x 128 x 240 + 128 x 24 = 384 x 168: the launch's pool
    if (warp != kConsumers * 4) return;
    // Lanes load the tile's scales (before waiting for the slot: the loads' latency hides behind
    // the wait), store them with their magic products, then arrive; lane 0 arrives last with the
    // TMA byte count and issues the two copies, so the phase completes when scales and tiles are in.
    const int64_t k_scale_row = static_cast<int64_t>(kv_head) * p.kv_len;
    constexpr int kPerLane = kBlockN / 32;
    static_assert(kHeadDim == kBlockN, "one loop loads a key's and a channel's scale per lane step");
    for (int it = 0; it < n_loaded; ++it) {
      const int s = it % kStages;
      const int key0 = (tile_begin + it) * kBlockN;
      const float* vs = p.v_scale + (static_cast<int64_t>(kv_head) * p.kv_tiles + tile_begin + it) * kHeadDim;
      float ks[kPerLane], sv[kPerLane];
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const int i = lane + 32 * j;
        ks[j] = key0 + i < p.kv_len ? p.k_scale[k_scale_row + key0 + i] : 0.f;
        sv[j] = kVChannel ? 0.f : vs[i];  // kVChannel: the consumers' epilogue reads V's scales
      }
      mbarrier_wait(smem_u32(&sh.empty[s]), ((it / kStages) & 1) ^ 1);
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        if constexpr (kFp8) {
          reinterpret_cast<float*>(sh.k_scale[s])[lane + 32 * j] = ks[j];
          if constexpr (!kVChannel) reinterpret_cast<float*>(sh.v_scale[s])[lane + 32 * j] = sv[j];
        } else {
          sh.k_scale[s][lane + 32 * j] = make_float2(ks[j], -kRoundMagic * ks[j]);
          sh.v_scale[s][lane + 32 * j] = make_float2(sv[j], -kRoundMagic * sv[j]);
        }
      }
      __syncwarp();
      if (lane == 0) {
        const uint32_t full = smem_u32(&sh.full[s]);
        mbarrier_arrive_expect_tx(full, kKTileBytes + kVTileBytes);
        tma_load_2d(smem_u32(sh.k[s]), &tmap_k, full, kv_head * kHeadDim, key0);
        tma_load_2d(smem_u32(sh.vt[s]), &tmap_v, full, key0, kv_head * kHeadDim);
      } else {
        mbarrier_arrive(smem_u32(&sh.full[s]));
      }
    }
    return;
  }

  // Consumers.
  sm90::setmaxnreg_inc<240>();
  // Broadcast from lane 0: ptxas then knows it is uniform in the warp, and loops bounded by it are
  // no divergent path for the wgmma in flight across them (else it serializes every wgmma).
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);
  const int g = lane / 4, t = lane % 4;
  const int row_lo = wg * 64 + (warp % 4) * 16 + g;  // block-local rows row_lo and row_lo + 8
  uint32_t q_frag[kHeadDim / 32][4];
  int pos_row[2], key_lo[2];  // key_lo: the row's oldest visible key (0 without a window)
  float row_scale[2];  // the query's scale times the softmax scale times log2(e): scores acc * sk * row_scale
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_lo + 8 * r;
    const bool valid = row < q_rows;
    pos_row[r] = pos0 + row;
    key_lo[r] = kWindow ? pos_row[r] - window + 1 : 0;
    // Rows past the queries: Q is zero, every score 0; scale 1 keeps masked scores at -inf, not NaN.
    row_scale[r] = (valid ? p.q_scale[static_cast<int64_t>(head) * p.q_len + q0 + row] : 1.f) * p.scale_log2;
    const int8_t* src = p.q + (static_cast<int64_t>(q0 + row) * p.heads + head) * kHeadDim;
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 32; ++ks) {
      q_frag[ks][r] = valid ? *reinterpret_cast<const uint32_t*>(src + 32 * ks + 4 * t) : 0u;
      q_frag[ks][2 + r] = valid ? *reinterpret_cast<const uint32_t*>(src + 32 * ks + 16 + 4 * t) : 0u;
    }
  }
  // Key tiles a warpgroup sees, counted from tile_begin: those past its last query position
  // (causal) are skipped.
  const auto active_tiles = [&](int w) {
    const int last_row = min(w * 64 + 63, q_rows - 1);
    const int key_end = w * 64 >= q_rows ? 0 : (p.causal ? min(p.kv_len, pos0 + last_row + 1) : p.kv_len);
    const int end_tile = (key_end + kBlockN - 1) / kBlockN;
    return kWindow ? max(end_tile - tile_begin, 0) : end_tile;
  };
  // Tiles below window_edge hold keys before some row's window of this warpgroup (-1: none does).
  const int window_edge = kWindow ? pos0 + wg * 64 + 64 - window : -1;

  using Acc = std::conditional_t<kFp8, float, int32_t>;
  float o[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, frame[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};

  // Per tile j: the softmax of S_j, P V_j issued, then S_{j+1} = Q K^T issued, and the fold of
  // P V_j into O while the tensor cores compute S_{j+1} (the other warpgroup's work fills the
  // rest). Every wait retires what the same iteration issued, but S_{j+1}, retired by a wait for
  // all at the top of the next: ptxas serializes every wgmma when a partial wait retires a product
  // issued in an earlier iteration. Holding S_{j+1} beside the softmax of S_j as well (a full
  // software pipeline) needs more than 232 registers a thread: it spilled.
  const int n_active = active_tiles(wg);
  // Ping-pong: the warpgroups take turns to issue their products (named barriers 1 and 2, one per
  // warpgroup), so one's softmax runs while the other's products do; for the tiles both see.
  // Warpgroup 1 lets warpgroup 0 go first, and skips its last hand-over (nobody waits for it).
  // Measured on an H200 at 8k: full-INT8 551 -> 625 TOP/s, FP8 667 -> 698.
  const int n_turns = min(n_active, active_tiles(1 - wg));
  if (wg == 1 && n_turns > 0) named_barrier_arrive<kConsumers * 128>(1);
  Acc sacc[kBlockN / 2];
  const auto issue_scores = [&](int tile) {
    const int stage = tile % kStages;
    mbarrier_wait(smem_u32(&sh.full[stage]), (tile / kStages) & 1);
    const uint64_t desc_k = make_smem_desc_k_sw128(smem_u32(sh.k[stage]));
    wgmma_rs_product<kFp8, true>(sacc, q_frag, desc_k);  // S = Q K^T (INT8 x INT8 or E4M3)
  };
  // Every thread arrives: an arrive releases only its own thread's earlier reads of the slot (the
  // scales), so one lane arriving for its warp leaves the others' reads unordered before the
  // producer's next writes (compute-sanitizer racecheck flagged exactly that). Still one warp
  // instruction.
  const auto release = [&](int stage) { mbarrier_arrive(smem_u32(&sh.empty[stage])); };
  // One tile; kHasNext: whether S_{it+1} is issued under the fold. Two instances, not a branch:
  // S's accumulators defined on one path only would be copied at the join, which makes ptxas wait
  // for the product there.
  // The scores of tile it (complete in sacc) turned into P (p_out) and the factors of its fold:
  // acc * sk, the mask, quantize_p_tile (which applies row_scale).
  const auto scores_to_p = [&](int it, uint32_t (&p_out)[kBlockN / 32][4], float (&corr)[2], float (&carry)[2]) {
    const int s = it % kStages;
    const int key0 = (tile_begin + it) * kBlockN;
    float sc[kBlockN / 8][4];
    const auto& st = as_tiles(sacc);
#pragma unroll
    for (int n = 0; n < kBlockN / 8; ++n) {
      if constexpr (kFp8) {
        const float2 k2 = *reinterpret_cast<const float2*>(reinterpret_cast<const float*>(sh.k_scale[s]) + n * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[n][e] = st[n][e] * (e & 1 ? k2.y : k2.x);  // keys 2t, 2t + 1
      } else {
        const float4 k4 = *reinterpret_cast<const float4*>(&sh.k_scale[s][n * 8 + 2 * t]);  // keys 2t, 2t + 1
#pragma unroll
        for (int e = 0; e < 4; ++e)  // |Q K^T| <= 128 * 127^2 < 2^22
          sc[n][e] = small_int_times(st[n][e], e & 1 ? k4.z : k4.x, e & 1 ? k4.w : k4.y);
      }
    }
    if (key0 + kBlockN > p.kv_len || (p.causal && key0 + kBlockN - 1 > pos0 + wg * 64) || (kWindow && key0 < window_edge)) {
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + n * 8 + 2 * t + (e & 1);
          const int limit = p.causal ? min(p.kv_len, pos_row[e / 2] + 1) : p.kv_len;
          if (key >= limit || (kWindow && key < key_lo[e / 2])) sc[n][e] = -INFINITY;
        }
    }
    quantize_p_tile<kBlockN, kFp8>(sc, row_scale, row_max, frame, row_sum, p_out, corr, carry);
  };
  // Ping-pong around turn `turn`'s products.
  const auto turn_begin = [&](int turn) {
    if (turn < n_turns) named_barrier_sync<kConsumers * 128>(1 + wg);
  };
  const auto turn_end = [&](int turn) {
    if (turn < n_turns && !(wg == 1 && turn == n_turns - 1)) named_barrier_arrive<kConsumers * 128>(2 - wg);
  };
  // One tile; kHasNext: whether S_{it+1} is issued under the fold. Two instances, not a branch:
  // S's accumulators defined on one path only would be copied at the join, which makes ptxas wait
  // for the product there.
  const auto step = [&](int it, auto has_next) {
    const int s = it % kStages;
    wgmma_wait_group<0>();  // S_it (and nothing else is in flight)
    fence_registers(sacc);
    float corr[2], carry[2];
    uint32_t p_frag[kBlockN / 32][4];
    scores_to_p(it, p_frag, corr, carry);

    // P V, fresh per tile (INT32 exact, or FP32: the two-level accumulation of FP8).
    Acc pv[kHeadDim / 2];
    const uint64_t desc_v = make_smem_desc_k_sw128(smem_u32(sh.vt[s]));
    fence_registers(p_frag);  // P complete before the fence (else ptxas injects one before each product)
    turn_begin(it);
    wgmma_rs_product<kFp8, false>(pv, p_frag, desc_v);  // P V (unsigned P x INT8 V, or E4M3)
    if constexpr (decltype(has_next)::value) issue_scores(it + 1);
    turn_end(it);
    if constexpr (decltype(has_next)::value) {
      wgmma_wait_group<1>();  // P V_it
    } else {
      wgmma_wait_group<0>();
    }
    fence_registers(pv);
    fence_registers(p_frag);  // read by P V_it until here
    if constexpr (kFp8) {
      fold_pv_tile<kHeadDim>(as_tiles(o), as_tiles(pv), corr, carry, reinterpret_cast<const float*>(sh.v_scale[s]), t);
    } else {
      fold_pv_tile<kHeadDim>(as_tiles(o), as_tiles(pv), corr, carry, sh.v_scale[s], t);  // the scale pairs
    }
    release(s);
  };
  if constexpr (kVChannel) {
    // O += P_j V_j by the wgmma itself (O in the frame of the running maximum, V unscaled). Per
    // iteration j (FlashAttention-3's intra-warpgroup overlap): issue S_j and P_{j-1} V_{j-1}
    // together, wait for S_j only, turn S_j into P_j while P_{j-1} V_{j-1} runs, then wait for it.
    // Both waits retire products issued in the same iteration. O takes P_{j-1}'s correction
    // (its frame change) before P_{j-1} V_{j-1} adds to it, when O is not in flight.
    if (n_active > 0) {
      // P alternates between two sets of registers: P_{j-1} is read by the product in flight while
      // P_j is written (a copy from one set to the other made ptxas serialize every wgmma).
      uint32_t p_even[kBlockN / 32][4], p_odd[kBlockN / 32][4];
      float corr[2], carry[2];
      issue_scores(0);
      wgmma_wait_group<0>();
      fence_registers(sacc);
      scores_to_p(0, p_even, corr, carry);
      // O takes P's correction, then P_tile V_tile is issued (after S_{tile+1} when there is one).
      const auto issue_pv = [&](int tile, uint32_t (&p_frag)[kBlockN / 32][4], auto with_scores) {
        if (!__all_sync(0xffffffffu, corr[0] == 1.f && corr[1] == 1.f)) {
#pragma unroll
          for (int i = 0; i < kHeadDim / 2; ++i) o[i] *= corr[(i / 2) % 2];  // row e / 2 of the [n][e] view
        }
        fence_registers(p_frag);
        turn_begin(tile);
        if constexpr (decltype(with_scores)::value) issue_scores(tile + 1);
        wgmma_rs_product<true, false, float, kBlockN / 32, true>(o, p_frag, make_smem_desc_k_sw128(smem_u32(sh.vt[tile % kStages])));
        turn_end(tile);
      };
      // Tile `tile` + 1's scores into P while P_tile V_tile runs.
      const auto overlap = [&](int tile, uint32_t (&p_cur)[kBlockN / 32][4], uint32_t (&p_next)[kBlockN / 32][4]) {
        issue_pv(tile, p_cur, std::true_type{});
        wgmma_wait_group<1>();  // S_{tile+1}
        fence_registers(sacc);
        scores_to_p(tile + 1, p_next, corr, carry);
        wgmma_wait_group<0>();  // P_tile V_tile
        fence_registers(o);
        fence_registers(p_cur);
        release(tile % kStages);
      };
      int it = 0;
      for (; it + 2 < n_active; it += 2) {
        overlap(it, p_even, p_odd);
        overlap(it + 1, p_odd, p_even);
      }
      if (it + 1 < n_active) {
        overlap(it, p_even, p_odd);
        issue_pv(it + 1, p_odd, std::false_type{});
      } else {
        issue_pv(it, p_even, std::false_type{});
      }
      wgmma_wait_group<0>();
      fence_registers(o);
      release((n_active - 1) % kStages);
    }
  } else if (n_active > 0) {
    issue_scores(0);
    for (int it = 0; it + 1 < n_active; ++it) step(it, std::true_type{});
    step(n_active - 1, std::false_type{});
  }
  // Tiles past the warpgroup's last key (causal): passed on, not computed.
  for (int it = n_active; it < n_loaded; ++it) {
    mbarrier_wait(smem_u32(&sh.full[it % kStages]), (it / kStages) & 1);
    release(it % kStages);
  }

  // O / l, BF16, straight from registers.
  uint16_t* out_row[2];
  float sink[2] = {0.f, 0.f};  // the sink's share of each row's denominator, against the frame
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    out_row[r] = row_lo + 8 * r < q_rows ? p.out + (static_cast<int64_t>(q0 + row_lo + 8 * r) * p.heads + head) * kHeadDim
                                         : nullptr;
    if constexpr (kSinks) sink[r] = sink_share<kFp8 ? kSinkFp8 : kSinkInt8>(p.sinks[head], frame[r]);
  }
  if constexpr (kVChannel) {  // V's per-channel scales, once: channels 8d + 2t, 8d + 2t + 1
    const float* vs = p.v_scale + static_cast<int64_t>(kv_head) * kHeadDim;
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d) {
      const float v0 = vs[d * 8 + 2 * t], v1 = vs[d * 8 + 2 * t + 1];  // 4-byte loads: v_scale is only 4-byte aligned
#pragma unroll
      for (int e = 0; e < 4; ++e) o[4 * d + e] *= e & 1 ? v1 : v0;
    }
  }
  store_normalized_rows<kHeadDim, kSinks>(as_tiles(o), row_sum, sink, out_row, t);
#endif
}

using Sm90Kernel = void (*)(const CUtensorMap, const CUtensorMap, const Sm90Params);
template <bool kFp8, bool kVChannel = false> Sm90Kernel sm90_kernel_for(bool window, bool sinks) {
  if (window)
    return sinks ? attention_sm90_kernel<kFp8, true, true, kVChannel> : attention_sm90_kernel<kFp8, true, false, kVChannel>;
  return sinks ? attention_sm90_kernel<kFp8, false, true, kVChannel> : attention_sm90_kernel<kFp8, false, false, kVChannel>;
}
Sm90Kernel sm90_kernel_for(bool fp8, bool v_channel, bool window, bool sinks) {
  if (v_channel) return sm90_kernel_for<true, true>(window, sinks);
  return fp8 ? sm90_kernel_for<true>(window, sinks) : sm90_kernel_for<false>(window, sinks);
}

// Whether the loaded code of the kernel is the sm_90a build (not the compute_80 PTX fallback,
// where its body is empty). Asked once per process.
bool sm90_code_present() {
  static const bool present = [] {
    cudaFuncAttributes attr{};
    return cudaFuncGetAttributes(&attr, attention_sm90_kernel<false, false, false>) == cudaSuccess && attr.binaryVersion == 90;
  }();
  return present;
}

}  // namespace

bool sm90_attention_runs(int64_t head_dim, const cuda::DeviceFacts& dev) {
  return head_dim == kHeadDim && cuda::has_sm90a(dev) && dev.smem_optin >= kSmemBytes && sm90_code_present();
}

bool sm90_attention_applies(const FullInt8AttentionArgs& f, const cuda::DeviceFacts& dev) {
  return f.v_t != nullptr && (f.v_block == kBlockN || f.v_block == 0) && sm90_attention_runs(f.qk.head_dim, dev);
}

Status sm90_8bit_attention(const FullInt8AttentionArgs& f, bool fp8, float scale_log2, const cuda::DeviceFacts& dev,
                           CudaStream stream) {
  const HalfInt8AttentionArgs& a = f.qk;
  CUtensorMap tmap_k, tmap_v;
  // K as an INT8 matrix [kv_len, kv_heads * 128]: a box is one kv head's 128 keys.
  LLMQ_RETURN_IF_ERROR(int8_gemm::encode_u8_tensor_map(&tmap_k, a.k, a.kv_len, a.kv_heads * kHeadDim,
                                                       a.kv_heads * kHeadDim, kBlockN, kHeadDim, 128));
  // V^T as [kv_heads * 128, attention_v_t_stride(kv_len)]: a box is one kv head's 128 channels x 128
  // key columns. All stride columns, not kv_len: the kappa order moves keys of the last tile past
  // column kv_len (and v_t holds zeros where no key is).
  const int64_t vt_stride = attention_v_t_stride(a.kv_len);
  LLMQ_RETURN_IF_ERROR(int8_gemm::encode_u8_tensor_map(&tmap_v, f.v_t, a.kv_heads * kHeadDim, vt_stride, vt_stride,
                                                       kHeadDim, kBlockN, 128));
  Sm90Params p;
  p.q = a.q;
  p.q_scale = a.q_scale;
  p.k_scale = a.k_scale;
  p.v_scale = f.v_scale;
  p.out = a.out;
  p.q_len = static_cast<int>(a.q_len);
  p.kv_len = static_cast<int>(a.kv_len);
  p.heads = static_cast<int>(a.heads);
  p.group = static_cast<int>(a.heads / a.kv_heads);
  p.kv_tiles = static_cast<int>((a.kv_len + kBlockN - 1) / kBlockN);
  p.scale_log2 = scale_log2;
  p.causal = a.causal;
  p.sinks = a.sinks;
  p.window = a.window < a.kv_len ? static_cast<int>(a.window) : 0;  // a longer window masks nothing
  const auto kernel = sm90_kernel_for(fp8, f.v_block == 0, p.window > 0, p.sinks != nullptr);
  LLMQ_RETURN_IF_ERROR(cuda::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kSmemBytes, dev.ordinal));
  const dim3 grid(static_cast<unsigned>((a.q_len + kBlockM - 1) / kBlockM), static_cast<unsigned>(a.heads));
  kernel<<<grid, kThreads, kSmemBytes, static_cast<cudaStream_t>(stream)>>>(tmap_k, tmap_v, p);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("attention_sm90_kernel");
  return {};
}

}  // namespace llmq::attention
