// cuda_half_int8_attention and cuda_full_int8_attention (include/llmq/cuda_attention_int8.hpp): the
// runtime's mma.sync flash attention (attention/attention_prefill.cu) with S = Q K^T in INT8. A CTA of
// 4 warps takes 64 queries of one head, each warp 16 rows whose INT8 Q fragments stay in registers;
// 64-key tiles of INT8 K, their scales and V stream through shared memory with cp.async, double
// buffered. S is mma.sync m16n8k32 s8 -> s32 (exact), turned into scores by acc * sq[row] * sk[key].
//   half-INT8: the BF16 kernel's online softmax, P (BF16; the row sum taken from the BF16 P, as the
//     specification does) and P V (m16n8k16 BF16): the S accumulators' layout is the same for k32
//     INT8 and k16 BF16 products, so P goes to P V from registers unchanged.
//   full-INT8: P = rint(255 * 2^(s - m_tile)) unsigned against the tile's row maximum, V INT8 with
//     a scale per (tile, channel), P V as u8 x s8 m16n8k32 in INT32 (full_int8_pv_step); V is
//     transposed into shared memory in the key order the P fragments need (transpose_v_tile).
// Sliding window and sinks as the BF16 kernel has them: tiles before the CTA's first row's window
// are never loaded, edge tiles take the mask; the sink joins the row sum once, in the epilogue
// (sink_share). Both as a template flag (kExtras): the plain instances compile to the PTX of the
// kernels without them (H200: with the window's compares merely possible, FP8 ran 2.5% slower).
// Shared memory at d = 128: half 48 KB (Q, 2 K, 2 BF16 V, key scales); full 57 KB (Q, 2 K, 2 raw
// INT8 V, key and V scales, the transposed V).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "cuda/cuda_check.cuh"
#include "llmq/cuda_attention_int8.hpp"
#include "attention/int8_attention_sm90.hpp"
#include "attention/int8_mma.cuh"
#include "attention/int8_softmax.cuh"
#include "attention/attention_mma.cuh"

namespace llmq {
namespace {

using namespace attention::mma;
using namespace attention;

struct Params {
  HalfInt8AttentionArgs a;
  const int8_t* v8;       // full-INT8 V, token-major (transposed per tile in shared memory) ...
  const int8_t* vt;       // ... or already transposed (FullInt8AttentionArgs::v_t), preferred when given
  const float* v_scale;   // [kv_heads, ceil(kv_len / 64), head_dim]
  int64_t vt_stride;      // attention_v_t_stride(kv_len)
};

// Full-INT8 P V. P (unsigned, 0..255) goes to the k32 mma's A operand from the S accumulators,
// whose C layout gives lane (g, t) keys {2t, 2t+1, 8+2t, 9+2t} (and + 16) of each 32-key step where
// the A fragment wants K positions {4t..4t+3} (and + 16): so mma position kappa of a 32-key group
// stands for physical key pi(kappa), and V is written transposed into shared memory in that order,
// Vt[channel][kappa] = V[pi(kappa)][channel]: the B fragment then reads 4 contiguous bytes.
// kappa of physical key p in [0, 32): 16 (p / 16) + 4 ((p % 8) / 2) + 2 ((p % 16) / 8) + p % 2, so
// kappa quad q holds keys 16 (q / 4) + 2 (q % 4) + {0, 1, 8, 9} (transpose_v_tile).

// Raw INT8 V tile [64 keys][kHeadDim] (unswizzled, generic pointer) -> Vt [kHeadDim][64] in the
// kappa order, 16-byte chunks XOR-swizzled as a 64-byte-row tile (TileLayout<32>). A work item is
// 4 consecutive kappa (physical keys {2q, 2q+1, 8+2q, 9+2q} of a 16-key half) x 4 channels: four
// word loads, a 4x4 byte transpose in registers (prmt), four word stores. Consecutive threads take
// consecutive channel quads, so the loads are contiguous rows.
template <int kHeadDim>
__device__ __forceinline__ void transpose_v_tile(const unsigned char* raw, unsigned char* vt) {
  using LT = TileLayout<32>;
  constexpr int kQuads = kHeadDim / 4;
  for (int idx = threadIdx.x; idx < (kBlockKv / 4) * kQuads; idx += kThreads) {
    const int c4 = (idx % kQuads) * 4, kq = idx / kQuads;  // kappa quad: kappa = 4 kq .. 4 kq + 3
    const int base = (kq / 4) * 16 + 2 * (kq % 4);        // physical keys base, base+1, base+8, base+9
    const uint32_t w0 = *reinterpret_cast<const uint32_t*>(raw + (base + 0) * kHeadDim + c4);
    const uint32_t w1 = *reinterpret_cast<const uint32_t*>(raw + (base + 1) * kHeadDim + c4);
    const uint32_t w2 = *reinterpret_cast<const uint32_t*>(raw + (base + 8) * kHeadDim + c4);
    const uint32_t w3 = *reinterpret_cast<const uint32_t*>(raw + (base + 9) * kHeadDim + c4);
    const uint32_t lo01 = __byte_perm(w0, w1, 0x5140), hi01 = __byte_perm(w0, w1, 0x7362);
    const uint32_t lo23 = __byte_perm(w2, w3, 0x5140), hi23 = __byte_perm(w2, w3, 0x7362);
    const uint32_t out[4] = {__byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632),
                             __byte_perm(hi01, hi23, 0x5410), __byte_perm(hi01, hi23, 0x7632)};
    const int kappa = 4 * kq;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      *reinterpret_cast<uint32_t*>(vt + LT::offset_bytes(c4 + j, kappa / 16) + kappa % 16) = out[j];
  }
}

// Full-INT8 / FP8 P V of one key tile (int8_softmax.cuh makes P), mma.sync: P from registers in the
// kappa order (see transpose_v_tile), V^T from shared memory, fresh accumulators folded into O.
template <int kHeadDim, bool kFp8>
__device__ __forceinline__ void full_int8_pv_step(float (&s)[kBlockKv / 8][4], float (&row_max)[2], float (&frame)[2],
                                                  float (&row_sum)[2],
                                                  float (&o_acc)[kHeadDim / 8][4], float scale_log2, uint32_t vt_tile,
                                                  const float* v_scale, int lane) {
  constexpr int kDimTiles = kHeadDim / 8;
  using LT = TileLayout<32>;
  float corr[2], carry[2];
  uint32_t p_frag[kBlockKv / 32][4];
  const float row_scale[2] = {scale_log2, scale_log2};  // s already holds the scores
  quantize_p_tile<kBlockKv, kFp8>(s, row_scale, row_max, frame, row_sum, p_frag, corr, carry);
  using PvAcc = std::conditional_t<kFp8, float, int32_t>;
  PvAcc pv[kDimTiles][4];
#pragma unroll
  for (int d = 0; d < kDimTiles; ++d) pv[d][0] = pv[d][1] = pv[d][2] = pv[d][3] = PvAcc(0);
#pragma unroll
  for (int kk = 0; kk < kBlockKv / 32; ++kk) {
#pragma unroll
    for (int dp = 0; dp < kDimTiles / 2; ++dp) {
      // Matrices: channels dp*16 + 0-7 / 8-15 (lane / 16) x kappa chunk 2kk / 2kk+1 ((lane / 8) % 2).
      uint32_t vb[4];
      ldmatrix_x4(vb, vt_tile + LT::offset_bytes(dp * 16 + (lane % 8) + 8 * (lane / 16), 2 * kk + (lane / 8) % 2));
      if constexpr (kFp8) {
        mma_e4m3_16832(pv[2 * dp], p_frag[kk], vb[0], vb[1]);
        mma_e4m3_16832(pv[2 * dp + 1], p_frag[kk], vb[2], vb[3]);
      } else {
        mma_u8s8_16832(pv[2 * dp], p_frag[kk], vb[0], vb[1]);
        mma_u8s8_16832(pv[2 * dp + 1], p_frag[kk], vb[2], vb[3]);
      }
    }
  }
  fold_pv_tile<kHeadDim>(o_acc, pv, corr, carry, v_scale, lane % 4);
}

// kMode: kHalf (INT8 Q/K, BF16 V), kFull (INT8 Q/K/V), kFp8 (E4M3 Q/K/V and P).
enum Mode { kHalf = 0, kFullInt8 = 1, kFp8Mode = 2 };

// kExtras: a window or sinks are set (else a.window and a.sinks are not read).
template <int kHeadDim, int kMode, bool kExtras>
__global__ void __launch_bounds__(kThreads, 2) int8_attention_kernel(Params prm, float scale_log2) {
  constexpr bool kFull = kMode != kHalf;  // 8-bit V, transposed in shared memory
  constexpr bool kFp8 = kMode == kFp8Mode;
  const HalfInt8AttentionArgs& a = prm.a;
  using LQ = TileLayout<kHeadDim / 2>;  // an INT8 row of kHeadDim bytes: the layout of kHeadDim / 2 BF16
  constexpr int kKSteps = kHeadDim / 32;   // k32 steps of S = Q K^T
  constexpr int kDimTiles = kHeadDim / 8;  // n-tiles of O
  constexpr int kKeyTiles = kBlockKv / 8;  // n-tiles of S
  constexpr int kQkBytes = kBlockKv * kHeadDim;
  constexpr int kVBytes = kBlockKv * kHeadDim * (kFull ? 1 : 2);  // a V stage: BF16, or raw INT8
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t q_tile = smem_addr(smem);
  const auto k_tile = [&](int stage) { return q_tile + (1 + stage) * kQkBytes; };
  const auto v_tile = [&](int stage) { return q_tile + 3 * kQkBytes + stage * kVBytes; };
  const auto ks_tile = [&](int stage) { return q_tile + 3 * kQkBytes + 2 * kVBytes + stage * kBlockKv * 4; };
  const float* key_scales = reinterpret_cast<const float*>(smem + 3 * kQkBytes + 2 * kVBytes);
  // Full-INT8 only: V's scales per stage, then the transposed V tile.
  constexpr int kVsOffset = 3 * kQkBytes + 2 * kVBytes + 2 * kBlockKv * 4;
  const auto vs_tile = [&](int stage) { return q_tile + kVsOffset + stage * kHeadDim * 4; };
  const float* v_scales = reinterpret_cast<const float*>(smem + kVsOffset);
  constexpr int kVtOffset = kVsOffset + 2 * kHeadDim * 4;
  unsigned char* vt = smem + kVtOffset;

  const int m_block = gridDim.x - 1 - blockIdx.x;  // heavy (late, causal) query blocks first
  const int head = blockIdx.y;
  const int kv_head = head / static_cast<int>(a.heads / a.kv_heads);
  const int q_len = static_cast<int>(a.q_len), kv_len = static_cast<int>(a.kv_len);
  const int q0 = m_block * kBlockQ;
  if (q0 >= q_len) return;
  const int q_rows = min(kBlockQ, q_len - q0);
  const int pos0 = kv_len - q_len + q0;
  const int key_end = a.causal ? min(kv_len, pos0 + q_rows) : kv_len;
  const int n_tiles = key_end > 0 ? (key_end + kBlockKv - 1) / kBlockKv : 0;
  // Sliding window (host-clamped below kv_len, or 0): tiles tile_begin .. n_tiles - 1; tiles below
  // window_edge hold keys before some row's window (-1: none does).
  const int window = kExtras ? static_cast<int>(a.window) : 0;
  const int tile_begin = window > 0 ? max(0, pos0 - window + 1) / kBlockKv : 0;
  const int n_iters = kExtras ? max(n_tiles - tile_begin, 0) : n_tiles;
  const int window_edge = window > 0 ? pos0 + kBlockQ - window : -1;

  const int64_t q_stride = a.heads * kHeadDim, kv_stride = a.kv_heads * kHeadDim;  // elements
  // INT8 rows are moved as BF16-sized pairs: strides and bases in 2-byte units.
  const uint16_t* q_base = reinterpret_cast<const uint16_t*>(a.q + (q0 * q_stride + static_cast<int64_t>(head) * kHeadDim));
  const uint16_t* k_base = reinterpret_cast<const uint16_t*>(a.k + static_cast<int64_t>(kv_head) * kHeadDim);
  const float* k_scale = a.k_scale + static_cast<int64_t>(kv_head) * kv_len;
  const int kv_tiles = (kv_len + kBlockKv - 1) / kBlockKv;
  const auto load_kv = [&](int j, int stage) {
    load_tile_async<kHeadDim / 2>(k_tile(stage), k_base, kv_stride / 2, j * kBlockKv, key_end);
    if (kFull && prm.vt != nullptr) {
      // V^T rows (channels) of this tile's 64 keys, already in the kappa order: the stage holds the
      // transposed tile itself. Columns past kv_len are zeros in v_t.
      using LT = TileLayout<32>;
      const int64_t vt_stride = prm.vt_stride;
      const int8_t* src = prm.vt + static_cast<int64_t>(kv_head) * kHeadDim * vt_stride + j * kBlockKv;
      for (int idx = threadIdx.x; idx < kHeadDim * 4; idx += kThreads)
        cp_async_16(v_tile(stage) + LT::offset_bytes(idx / 4, idx % 4), src + (idx / 4) * vt_stride + (idx % 4) * 16, 16);
    } else if constexpr (kFull) {
      // Raw rows of kHeadDim bytes, 16 at a time; rows past key_end are zeros.
      const int8_t* v8 = prm.v8 + static_cast<int64_t>(kv_head) * kHeadDim;
      for (int idx = threadIdx.x; idx < kBlockKv * kHeadDim / 16; idx += kThreads) {
        const int row = idx / (kHeadDim / 16), piece = idx % (kHeadDim / 16);
        const bool valid = j * kBlockKv + row < key_end;
        cp_async_16(v_tile(stage) + idx * 16, v8 + (valid ? (j * kBlockKv + row) * kv_stride : 0) + piece * 16,
                    valid ? 16 : 0);
      }
    } else {
      load_tile_async<kHeadDim>(v_tile(stage), a.v + static_cast<int64_t>(kv_head) * kHeadDim, kv_stride, j * kBlockKv,
                                key_end);
    }
    if (kFull && threadIdx.x < kHeadDim)
      cp_async_4(vs_tile(stage) + threadIdx.x * 4,
                 prm.v_scale + (static_cast<int64_t>(kv_head) * kv_tiles + j) * kHeadDim + threadIdx.x, 4);
    if (threadIdx.x < kBlockKv) {
      const int key = j * kBlockKv + static_cast<int>(threadIdx.x);
      const bool valid = key < key_end;
      cp_async_4(ks_tile(stage) + threadIdx.x * 4, k_scale + (valid ? key : 0), valid ? 4 : 0);
    }
  };

  load_tile_async<kHeadDim / 2>(q_tile, q_base, q_stride / 2, 0, q_rows);
  if (n_iters > 0) load_kv(n_tiles - 1, 0);
  cp_async_commit();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int row_lo = warp * 16 + g;
  const int pos_row[2] = {pos0 + row_lo, pos0 + row_lo + 8};
  const int key_lo[2] = {window > 0 ? pos_row[0] - window + 1 : 0, window > 0 ? pos_row[1] - window + 1 : 0};
  float q_scale[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_lo + 8 * r;
    q_scale[r] = row < q_rows ? a.q_scale[static_cast<int64_t>(head) * q_len + q0 + row] : 0.f;
  }

  float o_acc[kDimTiles][4];
#pragma unroll
  for (int i = 0; i < kDimTiles; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // score units (half-INT8) or log2 units (quantize_p_tile)
  float frame[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};
  uint32_t q_frag[kKSteps][4];

  for (int it = 0; it < n_iters; ++it) {
    const int j = n_tiles - 1 - it;
    const int stage = it & 1;
    if (it + 1 < n_iters) {
      load_kv(j - 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (kFull && prm.vt == nullptr) {
      // The previous tile's readers of Vt passed the barrier that ended the last iteration.
      transpose_v_tile<kHeadDim>(smem + 3 * kQkBytes + stage * kVBytes, vt);
      __syncthreads();
    }
    if (it == 0) {
      // ldmatrix.x4 quads: rows 0-7 / 8-15 of the warp's 16, 16-byte chunk 2ks / 2ks+1 -> a0..a3
      // of m16n8k32 (a0: row g, K 4t..4t+3; a1: row g + 8; a2, a3: K 16 + 4t..).
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
        ldmatrix_x4(q_frag[ks], q_tile + LQ::offset_bytes(warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2), 2 * ks + lane / 16));
    }

    // S = Q K^T in INT32 (16 x 64 per warp), then scores acc * sq * sk.
    using SAcc = std::conditional_t<kFp8, float, int32_t>;
    SAcc sacc[kKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) sacc[n][0] = sacc[n][1] = sacc[n][2] = sacc[n][3] = SAcc(0);
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int np = 0; np < kKeyTiles / 2; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, k_tile(stage) + LQ::offset_bytes(np * 16 + (lane % 8) + 8 * (lane / 16), 2 * ks + (lane / 8) % 2));
        if constexpr (kFp8) {
          mma_e4m3_16832(sacc[2 * np], q_frag[ks], kb[0], kb[1]);
          mma_e4m3_16832(sacc[2 * np + 1], q_frag[ks], kb[2], kb[3]);
        } else {
          mma_s8_16832(sacc[2 * np], q_frag[ks], kb[0], kb[1]);
          mma_s8_16832(sacc[2 * np + 1], q_frag[ks], kb[2], kb[3]);
        }
      }
    }
    const float* sk = key_scales + stage * kBlockKv;
    float s[kKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float acc;
        if constexpr (kFp8) {
          acc = sacc[n][e];
        } else {
          acc = small_int_to_float(sacc[n][e]);  // |Q K^T| <= 128 * 127^2 < 2^22
        }
        s[n][e] = acc * (q_scale[e / 2] * sk[n * 8 + 2 * t + (e & 1)]);
      }

    const int key0 = j * kBlockKv;
    const bool needs_mask =
        key0 + kBlockKv > kv_len || (a.causal && key0 + kBlockKv - 1 > pos0) || (kExtras && key0 < window_edge);
    if (needs_mask) {
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + n * 8 + 2 * t + (e & 1);
          const int limit = a.causal ? min(kv_len, pos_row[e / 2] + 1) : kv_len;
          if (key >= limit || (kExtras && key < key_lo[e / 2])) s[n][e] = -INFINITY;
        }
    }

    if constexpr (kFull) {
      full_int8_pv_step<kHeadDim, kFp8>(s, row_max, frame, row_sum, o_acc, scale_log2,
                                        prm.vt != nullptr ? v_tile(stage) : smem_addr(vt), v_scales + stage * kHeadDim, lane);
    } else {
      softmax_pv_step<kHeadDim, true>(s, row_max, row_sum, o_acc, scale_log2, v_tile(stage), lane);
    }
    __syncthreads();
  }
  if (n_iters == 0) cp_async_wait<0>();
  uint16_t* out_row[2];
  float sink[2] = {0.f, 0.f};  // the sink's share of each row's denominator
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    out_row[r] = row_lo + 8 * r < q_rows ? a.out + (q0 + row_lo + 8 * r) * q_stride + static_cast<int64_t>(head) * kHeadDim
                                         : nullptr;
    if (kExtras && a.sinks != nullptr) {
      // Half-INT8: P against row_max (score units, times scale_log2 in softmax_pv_step), unit 1;
      // full-INT8 / FP8: against the frame (log2 units).
      const float ref = kFull ? frame[r] : row_max[r] * scale_log2;
      sink[r] = sink_share<kFull ? (kFp8 ? kSinkFp8 : kSinkInt8) : kSinkUnit>(a.sinks[head], ref);
    }
  }
  store_normalized_rows<kHeadDim, kExtras>(o_acc, row_sum, sink, out_row, t);
}

template <int kHeadDim, int kMode> constexpr int smem_bytes() {
  constexpr bool kFull = kMode != kHalf;
  const int qk = 3 * kBlockKv * kHeadDim, scales = 2 * kBlockKv * 4;
  return kFull ? qk + 2 * kBlockKv * kHeadDim + scales + 2 * kHeadDim * 4 + kHeadDim * kBlockKv
               : qk + 2 * kBlockKv * kHeadDim * 2 + scales;
}

template <int kHeadDim, int kMode>
Status launch(const Params& p, float scale_log2, cudaStream_t stream) {
  // The window already clamped (0 when it masks nothing).
  const bool extras = p.a.window > 0 || p.a.sinks != nullptr;
  const auto kernel = extras ? int8_attention_kernel<kHeadDim, kMode, true> : int8_attention_kernel<kHeadDim, kMode, false>;
  constexpr int bytes = smem_bytes<kHeadDim, kMode>();
  int device = 0;
  LLMQ_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  LLMQ_RETURN_IF_ERROR(cuda::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes, device));
  const dim3 grid(static_cast<unsigned>((p.a.q_len + kBlockQ - 1) / kBlockQ), static_cast<unsigned>(p.a.heads));
  kernel<<<grid, kThreads, bytes, stream>>>(p, scale_log2);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("int8_attention_kernel");
  return {};
}

bool aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

// Shapes and the Q/K side, common to both variants.
Status check_qk(const HalfInt8AttentionArgs& a) {
  if (a.q_len < 0 || a.kv_len < 0 || a.q_len > a.kv_len)
    return invalid_argument("q_len, kv_len: need 0 <= q_len <= kv_len, got " + std::to_string(a.q_len) + ", " +
                            std::to_string(a.kv_len));
  if (a.kv_len > (int64_t{1} << 30) || a.heads > 65535) return invalid_argument("kv_len, heads: too large for one launch");
  if (a.heads <= 0 || a.kv_heads <= 0 || a.heads % a.kv_heads != 0)
    return invalid_argument("heads, kv_heads: heads must be a positive multiple of kv_heads");
  if (a.head_dim != 64 && a.head_dim != 128)
    return unsupported("head_dim: the INT8 attention kernels take 64 or 128, got " + std::to_string(a.head_dim));
  if (a.window < 0) return invalid_argument("window: must be >= 0 (0: no sliding window), got " + std::to_string(a.window));
  if (a.window > 0 && !a.causal) return invalid_argument("window: a sliding window needs causal attention");
  if (a.q_len == 0) return {};
  if (a.q == nullptr || a.q_scale == nullptr || a.k == nullptr || a.k_scale == nullptr || a.out == nullptr)
    return invalid_argument("q, q_scale, k, k_scale, out: null device pointer");
  if (!aligned(a.q, 16) || !aligned(a.k, 16) || !aligned(a.out, 16) || !aligned(a.k_scale, 4))
    return invalid_argument("q, k, out: must be 16-byte aligned");
  return {};
}

Status run(const Params& params, int mode, CudaStream stream) {
  // Positions are below kv_len: a window of kv_len or more masks nothing (the plain path).
  Params p = params;
  if (p.a.window >= p.a.kv_len) p.a.window = 0;
  const HalfInt8AttentionArgs& a = p.a;
  const float scale = a.softmax_scale > 0.f ? a.softmax_scale : 1.f / std::sqrt(static_cast<float>(a.head_dim));
  const float scale_log2 = scale * kLog2e;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (mode == kFp8Mode) return a.head_dim == 64 ? launch<64, kFp8Mode>(p, scale_log2, s) : launch<128, kFp8Mode>(p, scale_log2, s);
  if (mode == kFullInt8) return a.head_dim == 64 ? launch<64, kFullInt8>(p, scale_log2, s) : launch<128, kFullInt8>(p, scale_log2, s);
  return a.head_dim == 64 ? launch<64, kHalf>(p, scale_log2, s) : launch<128, kHalf>(p, scale_log2, s);
}

// The V side of the full-INT8 and FP8 kernels.
Status check_v(const FullInt8AttentionArgs& f) {
  if ((f.v == nullptr && f.v_t == nullptr) || f.v_scale == nullptr)
    return invalid_argument("v (or v_t), v_scale: null device pointer");
  if ((f.v != nullptr && !aligned(f.v, 16)) || (f.v_t != nullptr && !aligned(f.v_t, 16)) || !aligned(f.v_scale, 4))
    return invalid_argument("v, v_t: must be 16-byte aligned");
  return {};
}

// Full-INT8 or FP8: the Hopper kernel where it applies, else mma.sync.
Status run_8bit_v(const FullInt8AttentionArgs& f, bool fp8, CudaStream stream) {
  LLMQ_RETURN_IF_ERROR(check_qk(f.qk));
  if (f.qk.q_len == 0) return {};
  LLMQ_RETURN_IF_ERROR(check_v(f));
  cuda::DeviceFacts dev;
  LLMQ_RETURN_IF_ERROR(cuda::current_device_facts(&dev));
  if (fp8 && dev.major * 10 + dev.minor < 89)
    return unsupported("the FP8 attention kernel needs an sm_89+ GPU (E4M3 mma), this one is sm_" +
                       std::to_string(dev.major) + std::to_string(dev.minor));
  if (f.v_block == 0 && !fp8) return invalid_argument("v_block 0 (V per channel): FP8 only; full-INT8 takes 64 or 128");
  if (f.v_block == 128 || f.v_block == 0) {
    if (!attention::sm90_attention_applies(f, dev))
      return unsupported("v_block " + std::to_string(f.v_block) +
                         ": only the Hopper kernel takes it (v_t given, head_dim 128, an sm_90 GPU, a "
                         "library built with sm_90a code); use v_block 64 (cuda_attention_v_block)");
    const float scale = f.qk.softmax_scale > 0.f ? f.qk.softmax_scale : 1.f / std::sqrt(static_cast<float>(f.qk.head_dim));
    return attention::sm90_8bit_attention(f, fp8, scale * kLog2e, dev, stream);
  }
  if (f.v_block != 64) return invalid_argument("v_block: must be 64, 128 or (FP8) 0, got " + std::to_string(f.v_block));
  return run(Params{f.qk, f.v, f.v_t, f.v_scale, attention_v_t_stride(f.qk.kv_len)}, fp8 ? kFp8Mode : kFullInt8, stream);
}

}  // namespace

Status cuda_half_int8_attention(const HalfInt8AttentionArgs& a, CudaStream stream) {
  LLMQ_RETURN_IF_ERROR(check_qk(a));
  if (a.q_len == 0) return {};
  if (a.v == nullptr || !aligned(a.v, 16)) return invalid_argument("v: null or not 16-byte aligned");
  return run(Params{a, nullptr, nullptr, nullptr, 0}, kHalf, stream);
}

Status cuda_full_int8_attention(const FullInt8AttentionArgs& f, CudaStream stream) { return run_8bit_v(f, false, stream); }

Status cuda_attention_v_block(int64_t head_dim, int64_t* v_block, bool fp8) {
  if (v_block == nullptr) return invalid_argument("v_block: null pointer");
  cuda::DeviceFacts dev;
  LLMQ_RETURN_IF_ERROR(cuda::current_device_facts(&dev));
  // FP8 with V per channel accumulates P V in the tensor core across tiles: 8-9% faster than V per
  // 128-key block on an H200 at 16k-32k keys, as accurate (docs/attention.md).
  *v_block = attention::sm90_attention_runs(head_dim, dev) ? (fp8 ? 0 : 128) : 64;
  return {};
}

Status cuda_fp8_attention(const FullInt8AttentionArgs& f, CudaStream stream) { return run_8bit_v(f, true, stream); }

}  // namespace llmq
