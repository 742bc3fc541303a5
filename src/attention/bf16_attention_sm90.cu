// The Hopper BF16 flash attention (sm_90a, head_dim 128): FlashAttention-3's schedule on wgmma fed
// by TMA, the BF16 sibling of the 8-bit kernel's V-per-channel form (int8_attention_sm90.cu).
//   CTA: 2 consumer warpgroups of 64 query rows (128 rows of one head; 240 registers a thread) and a
//   producer warpgroup (24), of which one warp works.
//   Producer: per 128-key tile, TMA copies of the K tile [128 keys x 128 dims] and the V^T tile [128
//     channels x 128 keys], each as two 128-byte-swizzled boxes of 64 BF16 columns, into a 3-stage
//     ring guarded by full / empty mbarriers.
//   Consumers: Q's A fragments stay in registers (read once from global); S = Q K^T and O += P V are
//     wgmma m64n128k16 with A from registers (P packed to BF16 from the score accumulators: their
//     layout is the A fragment's). Per tile j: O takes P_j's correction, S_{j+1} and P_j V_j are
//     issued together, S_{j+1}'s exponentials run while P_j V_j does, and P_{j+1} is packed once
//     P_j V_j is done (one set of P registers). The two warpgroups take turns to issue (named-barrier
//     ping-pong). O accumulates in the tensor core in FP32 across tiles.
// Only code compiled for sm_90a has a body (LLMQ_SM90A); the host launches it only on compute
// capability 9.0 when that code is present.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "attention/attention_mma.cuh"
#include "attention/bf16_attention_sm90.hpp"
#include "attention/int8_softmax.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/sm90_tma.cuh"
#include "cuda/sm90_wgmma.cuh"
#include "llmq/cuda_attention_int8.hpp"

namespace llmq::attention {
namespace {

using attention::mma::fast_exp2;
using attention::mma::pack_bf16x2;
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
using sm90::wgmma_m64n128k16_bf16_rs;
using sm90::wgmma_wait_group;

constexpr int kHeadDim = 128;
constexpr int kBlockN = 128;                      // keys per tile
constexpr int kConsumers = 2;                     // warpgroups of 64 query rows
constexpr int kBlockM = 64 * kConsumers;
constexpr int kStages = 3;
constexpr int kThreads = (kConsumers + 1) * 128;
constexpr int kBoxBytes = 128 * 128;              // 128 rows of 64 BF16 (128 bytes)
constexpr int kTileBytes = 2 * kBoxBytes;         // a K or V^T tile: two boxes (columns 0-63, 64-127)
constexpr int kSteps = kHeadDim / 16;             // k16 steps over head_dim (S) or a tile's keys (P V)

struct SharedStorage {
  alignas(1024) unsigned char k[kStages][kTileBytes];
  alignas(1024) unsigned char vt[kStages][kTileBytes];
  uint64_t full[kStages], empty[kStages];
};
constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;

// The launch's sequences (Bf16AttentionBatch) and, per sequence, the first of its 128-row blocks in
// the grid's order of items.
struct Params {
  const uint16_t* q;
  uint16_t* out;
  const float* k_scale;
  const float* v_scale;
  int heads, group, count;
  float scale_log2;
  bool causal;
  int q_begin[kBf16AttentionMaxSeqs], q_len[kBf16AttentionMaxSeqs], kv_len[kBf16AttentionMaxSeqs],
      kv_begin[kBf16AttentionMaxSeqs], block_begin[kBf16AttentionMaxSeqs];
};


// Descriptor of k16 step `step` of a two-box tile: box step / 4, 32 bytes per step inside it.
__device__ __forceinline__ uint64_t step_desc(uint32_t tile, int step) {
  return make_smem_desc_k_sw128(tile + (step / 4) * kBoxBytes + (step % 4) * 32);
}

// acc (+)= A B over the kSteps k16 steps, one commit group; the first step overwrites acc unless kAccumulate.
template <bool kAccumulate>
__device__ __forceinline__ void product(float (&acc)[64], const uint32_t (&a)[kSteps][4], uint32_t tile) {
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < kSteps; ++k) {
    if (k == 0 && !kAccumulate) wgmma_m64n128k16_bf16_rs<false>(acc, a[k], step_desc(tile, k));
    else wgmma_m64n128k16_bf16_rs<true>(acc, a[k], step_desc(tile, k));
  }
  wgmma_commit_group();
}

__global__ void __launch_bounds__(kThreads, 1)
    bf16_attention_sm90_kernel(const __grid_constant__ CUtensorMap tmap_k, const __grid_constant__ CUtensorMap tmap_v,
                               const Params p) {
#if LLMQ_SM90A
  extern __shared__ unsigned char smem_raw[];
  SharedStorage& sh = *reinterpret_cast<SharedStorage*>(smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u));
  // The items in reverse: within a sequence its late (causal: heavy) row blocks first.
  const int item = gridDim.x - 1 - blockIdx.x;
  int seq = 0;
  while (seq + 1 < p.count && p.block_begin[seq + 1] <= item) ++seq;
  const int m_block = item - p.block_begin[seq];
  const int q_len = p.q_len[seq], kv_len = p.kv_len[seq], kv_begin = p.kv_begin[seq];
  const int head = blockIdx.y, kv_head = head / p.group;
  const int q0 = m_block * kBlockM;
  const int q_rows = min(kBlockM, q_len - q0);
  const int pos0 = kv_len - q_len + q0;
  const int key_end = p.causal ? min(kv_len, pos0 + q_rows) : kv_len;
  const uint16_t* q_seq = p.q + static_cast<int64_t>(p.q_begin[seq]) * p.heads * kHeadDim;
  uint16_t* out_seq = p.out + static_cast<int64_t>(p.q_begin[seq]) * p.heads * kHeadDim;
  const int n_tiles = (key_end + kBlockN - 1) / kBlockN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(smem_u32(&sh.full[s]), 1);
      mbarrier_init(smem_u32(&sh.empty[s]), kConsumers * 128);
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (warp >= kConsumers * 4) {
    sm90::setmaxnreg_dec<24>();
    if (warp != kConsumers * 4 || lane != 0) return;
    for (int it = 0; it < n_tiles; ++it) {
      const int s = it % kStages;
      const int key0 = kv_begin + it * kBlockN;  // the sequence's rows of K, columns of V^T
      mbarrier_wait(smem_u32(&sh.empty[s]), ((it / kStages) & 1) ^ 1);
      const uint32_t full = smem_u32(&sh.full[s]);
      mbarrier_arrive_expect_tx(full, 2 * kTileBytes);
      // K: bytes kv_head * 256 + {0, 128} of rows key0..; V^T: rows kv_head * 128.., bytes 2 key0 + {0, 128}.
      for (int b = 0; b < 2; ++b) {
        tma_load_2d(smem_u32(sh.k[s]) + b * kBoxBytes, &tmap_k, full, kv_head * 256 + 128 * b, key0);
        tma_load_2d(smem_u32(sh.vt[s]) + b * kBoxBytes, &tmap_v, full, 2 * key0 + 128 * b, kv_head * kHeadDim);
      }
    }
    return;
  }

  sm90::setmaxnreg_inc<240>();
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);
  const int g = lane / 4, t = lane % 4;
  const int row_lo = wg * 64 + (warp % 4) * 16 + g;  // block-local rows row_lo and row_lo + 8
  uint32_t q_frag[kSteps][4];
  int pos_row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_lo + 8 * r;
    const bool valid = row < q_rows;
    pos_row[r] = pos0 + row;
    const uint16_t* src = q_seq + (static_cast<int64_t>(q0 + row) * p.heads + head) * kHeadDim;
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {  // A fragment: a0 / a1 rows g / g + 8 at dims 16ks + 2t, a2 / a3 at + 8
      q_frag[ks][r] = valid ? *reinterpret_cast<const uint32_t*>(src + 16 * ks + 2 * t) : 0u;
      q_frag[ks][2 + r] = valid ? *reinterpret_cast<const uint32_t*>(src + 16 * ks + 8 + 2 * t) : 0u;
    }
  }
  const auto active_tiles = [&](int w) {
    const int last_row = min(w * 64 + 63, q_rows - 1);
    const int end = w * 64 >= q_rows ? 0 : (p.causal ? min(kv_len, pos0 + last_row + 1) : kv_len);
    return (end + kBlockN - 1) / kBlockN;
  };
  const int n_active = active_tiles(wg);
  const int n_turns = min(n_active, active_tiles(1 - wg));
  if (wg == 1 && n_turns > 0) named_barrier_arrive<kConsumers * 128>(1);

  float o[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.f;
  float sacc[kBlockN / 2];
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f}, corr[2] = {1.f, 1.f};
  // E4M3 cache: scores of the dequantized keys, q . (code k_scale).
  const float scale_log2 = p.k_scale != nullptr ? p.scale_log2 * p.k_scale[kv_head] : p.scale_log2;
  uint32_t p_frag[kSteps][4];

  const auto issue_scores = [&](int tile) {
    const int stage = tile % kStages;
    mbarrier_wait(smem_u32(&sh.full[stage]), (tile / kStages) & 1);
    product<false>(sacc, q_frag, smem_u32(sh.k[stage]));
  };
  const auto release = [&](int stage) { mbarrier_arrive(smem_u32(&sh.empty[stage])); };
  // Tile `tile`'s scores (complete in sacc) to unnormalized probabilities in place, the row maxima,
  // sums and O's correction. sacc[4n + e]: row g + 8 (e / 2), key 8n + 2t + e % 2 of the tile.
  const auto softmax = [&](int tile) {
    const int key0 = tile * kBlockN;
    if (key0 + kBlockN > kv_len || (p.causal && key0 + kBlockN - 1 > pos0 + wg * 64)) {
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) {
        const int key = key0 + (i / 4) * 8 + 2 * t + (i & 1);
        const int limit = p.causal ? min(kv_len, pos_row[(i / 2) % 2] + 1) : kv_len;
        if (key >= limit) sacc[i] = -INFINITY;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mt = -INFINITY;
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n) mt = fmaxf(mt, fmaxf(sacc[4 * n + 2 * r], sacc[4 * n + 2 * r + 1]));
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
      const float m = fmaxf(row_max[r], mt * scale_log2);
      corr[r] = m == row_max[r] ? 1.f : fast_exp2(row_max[r] - m);
      row_max[r] = m;
      const float shift = m == -INFINITY ? 0.f : m;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          sacc[4 * n + e] = fast_exp2(__fmaf_rn(sacc[4 * n + e], scale_log2, -shift));
          sum += sacc[4 * n + e];
        }
      row_sum[r] = __fmaf_rn(row_sum[r], corr[r], sum);
    }
  };
  // P as BF16 A fragments of k16 steps: step kk takes n-tiles 2kk (a0 / a1) and 2kk + 1 (a2 / a3).
  const auto pack_p = [&]() {
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = 2 * kk + h;
        p_frag[kk][2 * h] = pack_bf16x2(sacc[4 * n], sacc[4 * n + 1]);
        p_frag[kk][2 * h + 1] = pack_bf16x2(sacc[4 * n + 2], sacc[4 * n + 3]);
      }
  };

  if (n_active > 0) {
    issue_scores(0);
    wgmma_wait_group<0>();
    fence_registers(sacc);
    softmax(0);
    pack_p();
    // One tile; kNext: whether S_{tile+1} is issued and turned into P under P_tile V_tile. Two
    // instances, not a runtime branch: ptxas serialized every wgmma when the issue and the wait of
    // S_{tile+1} sat under two separate conditions.
    const auto step = [&](int tile, auto next) {
      constexpr bool kNext = decltype(next)::value;
      if (!__all_sync(0xffffffffu, corr[0] == 1.f && corr[1] == 1.f)) {
#pragma unroll
        for (int i = 0; i < kHeadDim / 2; ++i) o[i] *= corr[(i / 2) % 2];
      }
      fence_registers(p_frag);
      if (tile < n_turns) named_barrier_sync<kConsumers * 128>(1 + wg);
      if constexpr (kNext) issue_scores(tile + 1);
      product<true>(o, p_frag, smem_u32(sh.vt[tile % kStages]));
      if (tile < n_turns && !(wg == 1 && tile == n_turns - 1)) named_barrier_arrive<kConsumers * 128>(2 - wg);
      if constexpr (kNext) {
        wgmma_wait_group<1>();  // S_{tile+1}
        fence_registers(sacc);
        softmax(tile + 1);
      }
      wgmma_wait_group<0>();  // P_tile V_tile
      fence_registers(o);
      fence_registers(p_frag);
      release(tile % kStages);
      if constexpr (kNext) pack_p();
    };
    for (int tile = 0; tile + 1 < n_active; ++tile) step(tile, std::true_type{});
    step(n_active - 1, std::false_type{});
  }
  // Tiles past the warpgroup's last key (causal): passed on, not computed.
  for (int it = n_active; it < n_tiles; ++it) {
    mbarrier_wait(smem_u32(&sh.full[it % kStages]), (it / kStages) & 1);
    release(it % kStages);
  }

  uint16_t* out_row[2];  // O / l as BF16, straight from registers (int8_softmax.cuh's epilogue, no sink)
#pragma unroll
  for (int r = 0; r < 2; ++r)
    out_row[r] = row_lo + 8 * r < q_rows ? out_seq + (static_cast<int64_t>(q0 + row_lo + 8 * r) * p.heads + head) * kHeadDim
                                         : nullptr;
  const float no_sink[2] = {0.f, 0.f};
  // E4M3 cache: O of the dequantized values is (P codes) v_scale, v_scale / l taken once as the
  // mma.sync kernel takes it.
  const float out_scale = p.v_scale != nullptr ? p.v_scale[kv_head] : 1.f;
  store_normalized_rows<kHeadDim, false>(*reinterpret_cast<const float(*)[kHeadDim / 8][4]>(&o), row_sum, no_sink, out_row, t,
                                         out_scale);
#endif
}

bool code_present() {
  static const bool present = [] {
    cudaFuncAttributes attr{};
    return cudaFuncGetAttributes(&attr, bf16_attention_sm90_kernel) == cudaSuccess && attr.binaryVersion == 90;
  }();
  return present;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool sm90_bf16_attention_runs(const cuda::DeviceFacts& dev) {
  return cuda::has_sm90a(dev) && dev.smem_optin >= kSmemBytes && code_present();
}

Status sm90_bf16_attention(const Bf16AttentionArgs& a, CudaStream stream) {
  if (a.q_len < 0 || a.kv_len < 0 || a.q_len > a.kv_len)
    return invalid_argument("bf16 attention: q_len " + std::to_string(a.q_len) + ", kv_len " + std::to_string(a.kv_len) +
                            ": need 0 <= q_len <= kv_len");
  if (a.kv_len > (int64_t{1} << 30)) return invalid_argument("bf16 attention: kv_len too large for one launch");
  Bf16AttentionBatchArgs b;
  b.seqs.count = 1;
  b.seqs.q_len[0] = static_cast<int>(a.q_len);
  b.seqs.kv_len[0] = static_cast<int>(a.kv_len);
  b.keys = a.kv_len;
  b.heads = a.heads;
  b.kv_heads = a.kv_heads;
  b.causal = a.causal;
  b.softmax_scale = a.softmax_scale;
  b.q = a.q;
  b.k = a.k;
  b.v_t = a.v_t;
  b.out = a.out;
  return sm90_bf16_attention_batch(b, stream);
}

Status sm90_bf16_attention_batch(const Bf16AttentionBatchArgs& a, CudaStream stream) {
  const Bf16AttentionBatch& seqs = a.seqs;
  if (seqs.count < 0 || seqs.count > kBf16AttentionMaxSeqs)
    return invalid_argument("bf16 attention: " + std::to_string(seqs.count) + " sequences (at most " +
                            std::to_string(kBf16AttentionMaxSeqs) + " a launch)");
  if (a.heads <= 0 || a.kv_heads <= 0 || a.heads % a.kv_heads != 0)
    return invalid_argument("bf16 attention: heads must be a positive multiple of kv_heads");
  if (a.keys < 0 || a.keys > (int64_t{1} << 30) || a.heads > 65535)
    return invalid_argument("bf16 attention: keys or heads too large for one launch");
  Params p{};
  int64_t blocks = 0;
  for (int s = 0; s < seqs.count; ++s) {
    const std::string which = "bf16 attention: sequence " + std::to_string(s) + ": ";
    if (seqs.q_len[s] < 0 || seqs.kv_len[s] < 0 || seqs.q_len[s] > seqs.kv_len[s])
      return invalid_argument(which + "q_len " + std::to_string(seqs.q_len[s]) + ", kv_len " + std::to_string(seqs.kv_len[s]) +
                              ": need 0 <= q_len <= kv_len");
    if (seqs.q_begin[s] < 0 || seqs.kv_begin[s] < 0 || seqs.kv_begin[s] % kBlockN != 0 ||
        static_cast<int64_t>(seqs.kv_begin[s]) + seqs.kv_len[s] > a.keys)
      return invalid_argument(which + "keys at row " + std::to_string(seqs.kv_begin[s]) + " (a multiple of 128) + " +
                              std::to_string(seqs.kv_len[s]) + " must lie in the " + std::to_string(a.keys) + " rows of k");
    p.q_begin[s] = seqs.q_begin[s];
    p.q_len[s] = seqs.q_len[s];
    p.kv_len[s] = seqs.kv_len[s];
    p.kv_begin[s] = seqs.kv_begin[s];
    p.block_begin[s] = static_cast<int>(blocks);
    blocks += (seqs.q_len[s] + kBlockM - 1) / kBlockM;
  }
  if (blocks == 0) return {};
  if (a.q == nullptr || a.k == nullptr || a.v_t == nullptr || a.out == nullptr)
    return invalid_argument("bf16 attention: q, k, v_t, out: null device pointer");
  if (!aligned16(a.q) || !aligned16(a.k) || !aligned16(a.v_t) || !aligned16(a.out))
    return invalid_argument("bf16 attention: q, k, v_t, out must be 16-byte aligned");
  if ((a.k_scale == nullptr) != (a.v_scale == nullptr))
    return invalid_argument("bf16 attention: k_scale and v_scale come together (an E4M3 cache) or not at all");
  cuda::DeviceFacts dev;
  LLMQ_RETURN_IF_ERROR(cuda::current_device_facts(&dev));
  if (!sm90_bf16_attention_runs(dev))
    return unsupported("bf16 attention: the Hopper kernel needs an sm_90 GPU and a library built with sm_90a code");
  CUtensorMap tmap_k, tmap_v;
  // As byte matrices: K [keys, kv_heads * 256 bytes], a box 128 keys x 128 bytes (64 dims);
  // V^T [kv_heads * 128, 2 * stride bytes], a box 128 channels x 128 bytes (64 keys).
  const int64_t stride = attention_v_t_stride(a.keys);
  LLMQ_RETURN_IF_ERROR(int8_gemm::encode_u8_tensor_map(&tmap_k, a.k, a.keys, a.kv_heads * 256, a.kv_heads * 256,
                                                       kBlockN, 128, 128));
  LLMQ_RETURN_IF_ERROR(int8_gemm::encode_u8_tensor_map(&tmap_v, a.v_t, a.kv_heads * kHeadDim, 2 * stride, 2 * stride,
                                                       kHeadDim, 128, 128));
  p.q = a.q;
  p.out = a.out;
  p.k_scale = a.k_scale;
  p.v_scale = a.v_scale;
  p.count = seqs.count;
  p.heads = static_cast<int>(a.heads);
  p.group = static_cast<int>(a.heads / a.kv_heads);
  const float scale = a.softmax_scale > 0.f ? a.softmax_scale : 1.f / std::sqrt(static_cast<float>(kHeadDim));
  p.scale_log2 = scale * mma::kLog2e;
  p.causal = a.causal;
  LLMQ_RETURN_IF_ERROR(cuda::allow_dynamic_smem(reinterpret_cast<const void*>(bf16_attention_sm90_kernel), kSmemBytes, dev.ordinal));
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(a.heads));
  bf16_attention_sm90_kernel<<<grid, kThreads, kSmemBytes, static_cast<cudaStream_t>(stream)>>>(tmap_k, tmap_v, p);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("bf16_attention_sm90_kernel");
  return {};
}

}  // namespace llmq::attention
