// cuda_half_int8_attention (include/llmq/cuda_attention_int8.hpp). The runtime's mma.sync flash
// attention (runtime/attention_prefill.cu) with S = Q K^T in INT8: a CTA of 4 warps takes 64 queries
// of one head, each warp 16 rows whose INT8 Q fragments stay in registers; 64-key tiles of INT8 K,
// their scales and BF16 V stream through shared memory with cp.async, double buffered. S is
// mma.sync m16n8k32 s8 -> s32 (exact), turned into scores by acc * sq[row] * sk[key]; the online
// softmax, P (BF16, and the row sum taken from the BF16 P, as the specification does) and P V
// (m16n8k16 BF16, FP32 accumulators) are the BF16 kernel's. The S accumulators' layout is the
// same for k32 INT8 and k16 BF16 products, so P goes to P V from registers unchanged.
// Shared memory: Q + 2 K (INT8, 64 x d each) + 2 V (BF16) + 2 x 64 key scales: 48 KB at d = 128.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "cuda/cuda_check.cuh"
#include "llmq/cuda_attention_int8.hpp"
#include "runtime/attention_mma.cuh"

namespace llmq {
namespace {

using namespace runtime::attn;

__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// c (16x8, INT32) += a (16x32 INT8, row) * b (32x8 INT8, col)
__device__ __forceinline__ void mma_s8_16832(int32_t (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int kHeadDim>
__global__ void __launch_bounds__(kThreads, 2) half_int8_attention_kernel(HalfInt8AttentionArgs a, float scale_log2) {
  using LQ = TileLayout<kHeadDim / 2>;  // an INT8 row of kHeadDim bytes: the layout of kHeadDim / 2 BF16
  constexpr int kKSteps = kHeadDim / 32;   // k32 steps of S = Q K^T
  constexpr int kDimTiles = kHeadDim / 8;  // n-tiles of O
  constexpr int kKeyTiles = kBlockKv / 8;  // n-tiles of S
  constexpr int kQkBytes = kBlockKv * kHeadDim;
  constexpr int kVBytes = kBlockKv * kHeadDim * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t q_tile = smem_addr(smem);
  const auto k_tile = [&](int stage) { return q_tile + (1 + stage) * kQkBytes; };
  const auto v_tile = [&](int stage) { return q_tile + 3 * kQkBytes + stage * kVBytes; };
  const auto ks_tile = [&](int stage) { return q_tile + 3 * kQkBytes + 2 * kVBytes + stage * kBlockKv * 4; };
  const float* key_scales = reinterpret_cast<const float*>(smem + 3 * kQkBytes + 2 * kVBytes);

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

  const int64_t q_stride = a.heads * kHeadDim, kv_stride = a.kv_heads * kHeadDim;  // elements
  // INT8 rows are moved as BF16-sized pairs: strides and bases in 2-byte units.
  const uint16_t* q_base = reinterpret_cast<const uint16_t*>(a.q + (q0 * q_stride + static_cast<int64_t>(head) * kHeadDim));
  const uint16_t* k_base = reinterpret_cast<const uint16_t*>(a.k + static_cast<int64_t>(kv_head) * kHeadDim);
  const uint16_t* v_base = a.v + static_cast<int64_t>(kv_head) * kHeadDim;
  const float* k_scale = a.k_scale + static_cast<int64_t>(kv_head) * kv_len;
  const auto load_kv = [&](int j, int stage) {
    load_tile_async<kHeadDim / 2>(k_tile(stage), k_base, kv_stride / 2, j * kBlockKv, key_end);
    load_tile_async<kHeadDim>(v_tile(stage), v_base, kv_stride, j * kBlockKv, key_end);
    if (threadIdx.x < kBlockKv) {
      const int key = j * kBlockKv + static_cast<int>(threadIdx.x);
      const bool valid = key < key_end;
      cp_async_4(ks_tile(stage) + threadIdx.x * 4, k_scale + (valid ? key : 0), valid ? 4 : 0);
    }
  };

  load_tile_async<kHeadDim / 2>(q_tile, q_base, q_stride / 2, 0, q_rows);
  if (n_tiles > 0) load_kv(n_tiles - 1, 0);
  cp_async_commit();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int row_lo = warp * 16 + g;
  const int pos_row[2] = {pos0 + row_lo, pos0 + row_lo + 8};
  float q_scale[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_lo + 8 * r;
    q_scale[r] = row < q_rows ? a.q_scale[static_cast<int64_t>(head) * q_len + q0 + row] : 0.f;
  }

  float o_acc[kDimTiles][4];
#pragma unroll
  for (int i = 0; i < kDimTiles; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};
  uint32_t q_frag[kKSteps][4];

  for (int it = 0; it < n_tiles; ++it) {
    const int j = n_tiles - 1 - it;
    const int stage = it & 1;
    if (it + 1 < n_tiles) {
      load_kv(j - 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (it == 0) {
      // ldmatrix.x4 quads: rows 0-7 / 8-15 of the warp's 16, 16-byte chunk 2ks / 2ks+1 -> a0..a3
      // of m16n8k32 (a0: row g, K 4t..4t+3; a1: row g + 8; a2, a3: K 16 + 4t..).
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
        ldmatrix_x4(q_frag[ks], q_tile + LQ::offset_bytes(warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2), 2 * ks + lane / 16));
    }

    // S = Q K^T in INT32 (16 x 64 per warp), then scores acc * sq * sk.
    int32_t sacc[kKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) sacc[n][0] = sacc[n][1] = sacc[n][2] = sacc[n][3] = 0;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int np = 0; np < kKeyTiles / 2; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, k_tile(stage) + LQ::offset_bytes(np * 16 + (lane % 8) + 8 * (lane / 16), 2 * ks + (lane / 8) % 2));
        mma_s8_16832(sacc[2 * np], q_frag[ks], kb[0], kb[1]);
        mma_s8_16832(sacc[2 * np + 1], q_frag[ks], kb[2], kb[3]);
      }
    }
    const float* sk = key_scales + stage * kBlockKv;
    float s[kKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = static_cast<float>(sacc[n][e]) * (q_scale[e / 2] * sk[n * 8 + 2 * t + (e & 1)]);

    const int key0 = j * kBlockKv;
    const bool needs_mask = key0 + kBlockKv > kv_len || (a.causal && key0 + kBlockKv - 1 > pos0);
    if (needs_mask) {
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + n * 8 + 2 * t + (e & 1);
          const int limit = a.causal ? min(kv_len, pos_row[e / 2] + 1) : kv_len;
          if (key >= limit) s[n][e] = -INFINITY;
        }
    }

    softmax_pv_step<kHeadDim, true>(s, row_max, row_sum, o_acc, scale_log2, v_tile(stage), lane);
    __syncthreads();
  }
  if (n_tiles == 0) cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    const int row = row_lo + 8 * r;
    if (row < q_rows) {
      uint16_t* out_row = a.out + (q0 + row) * q_stride + static_cast<int64_t>(head) * kHeadDim;
#pragma unroll
      for (int d = 0; d < kDimTiles; ++d)
        *reinterpret_cast<uint32_t*>(out_row + d * 8 + 2 * t) = pack_bf16x2(o_acc[d][2 * r] * inv, o_acc[d][2 * r + 1] * inv);
    }
  }
}

template <int kHeadDim> constexpr int smem_bytes() { return 3 * kBlockKv * kHeadDim + 2 * kBlockKv * kHeadDim * 2 + 2 * kBlockKv * 4; }

template <int kHeadDim>
Status launch(const HalfInt8AttentionArgs& a, float scale_log2, cudaStream_t stream) {
  const auto kernel = half_int8_attention_kernel<kHeadDim>;
  constexpr int bytes = smem_bytes<kHeadDim>();
  LLMQ_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  const dim3 grid(static_cast<unsigned>((a.q_len + kBlockQ - 1) / kBlockQ), static_cast<unsigned>(a.heads));
  kernel<<<grid, kThreads, bytes, stream>>>(a, scale_log2);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("half_int8_attention_kernel");
  return {};
}

bool aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

}  // namespace

Status cuda_half_int8_attention(const HalfInt8AttentionArgs& a, CudaStream stream) {
  if (a.q_len < 0 || a.kv_len < 0 || a.q_len > a.kv_len)
    return invalid_argument("q_len, kv_len: need 0 <= q_len <= kv_len, got " + std::to_string(a.q_len) + ", " +
                            std::to_string(a.kv_len));
  if (a.kv_len > (int64_t{1} << 30) || a.heads > 65535) return invalid_argument("kv_len, heads: too large for one launch");
  if (a.heads <= 0 || a.kv_heads <= 0 || a.heads % a.kv_heads != 0)
    return invalid_argument("heads, kv_heads: heads must be a positive multiple of kv_heads");
  if (a.head_dim != 64 && a.head_dim != 128)
    return unsupported("head_dim: the half-INT8 kernel takes 64 or 128, got " + std::to_string(a.head_dim));
  if (a.q_len == 0) return {};
  if (a.q == nullptr || a.q_scale == nullptr || a.k == nullptr || a.k_scale == nullptr || a.v == nullptr || a.out == nullptr)
    return invalid_argument("q, q_scale, k, k_scale, v, out: null device pointer");
  if (!aligned(a.q, 16) || !aligned(a.k, 16) || !aligned(a.v, 16) || !aligned(a.out, 16) || !aligned(a.k_scale, 4))
    return invalid_argument("q, k, v, out: must be 16-byte aligned");
  const float scale = a.softmax_scale > 0.f ? a.softmax_scale : 1.f / std::sqrt(static_cast<float>(a.head_dim));
  const float scale_log2 = scale * kLog2e;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return a.head_dim == 64 ? launch<64>(a, scale_log2, s) : launch<128>(a, scale_log2, s);
}

}  // namespace llmq
