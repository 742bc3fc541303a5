// The pieces of llmq's mma.sync flash attention shared by its kernels (attention/attention_prefill.cu,
// the BF16 / E4M3-cache prefill; attention/half_int8_attention.cu): tile constants, cp.async /
// ldmatrix / mma.sync wrappers, FP8 conversions, the XOR-swizzled shared-memory tile layout and
// the online-softmax + P V step of one key tile.
// Internal; CUDA sources only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace llmq::attention::mma {

constexpr int kBlockQ = 64;     // queries per CTA (16 per warp)
constexpr int kBlockKv = 64;    // keys per shared-memory tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;

// ---------------------------------------------------------------------------------------------
// PTX wrappers

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, bypassing L1; src_bytes = 0 writes zeros (rows past the sequence).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// c (16x8, FP32) += a (16x16 BF16, row) * b (16x8 BF16, col)
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// 2^x by the SFU (2 ulp; -inf -> +0), the same instruction exp2f lowers to under fast math.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float bf16_to_float(uint16_t bits) { return __uint_as_float(uint32_t(bits) << 16); }
// Two E4M3 codes (the low byte first) to FP32, exactly: every E4M3 value is an FP16 value, so
// cvt.f16x2.e4m3x2 (sm_89+; cuda_fp8.h has a software path for older targets) then FP16 -> FP32.
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t two_codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes & 0xffffu), __NV_E4M3);
  return __half22float2(__half2(h));
}
// Two E4M3 codes to a BF16 pair (exact: E4M3 has 3 mantissa bits and exponents within BF16's).
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t two_codes) {
  const float2 f = e4m3x2_to_float2(two_codes);
  return pack_bf16x2(f.x, f.y);
}

// Shared-memory tile of `rows` x kHeadDim BF16: row r, 16-byte chunk c lives at chunk
// r * kChunks + (c ^ (r & kSwizzle)): the 8 rows one ldmatrix phase reads fall in 8 different
// bank groups (4 for head_dim 32, a 2-way conflict there).
template <int kHeadDim> struct TileLayout {
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kSwizzle = (kChunks < 8 ? kChunks : 8) - 1;
  static __device__ __forceinline__ int offset_bytes(int row, int chunk) {
    return (row * kChunks + (chunk ^ (row & kSwizzle))) * 16;
  }
};

// Copies rows [row0, row0 + 64) of a row-major [*, row_stride] BF16 matrix into a swizzled tile;
// rows at or beyond row_end are zero-filled (and their address clamped to a valid row).
template <int kHeadDim>
__device__ __forceinline__ void load_tile_async(uint32_t tile, const uint16_t* base, int64_t row_stride,
                                                int row0, int row_end) {
  using L = TileLayout<kHeadDim>;
  constexpr int kPerThread = kBlockKv * L::kChunks / kThreads;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int row = idx / L::kChunks, chunk = idx % L::kChunks;
    const bool valid = row0 + row < row_end;
    const int src_row = valid ? row0 + row : 0;
    cp_async_16(tile + L::offset_bytes(row, chunk), base + src_row * row_stride + chunk * 8, valid ? 16 : 0);
  }
}

// One key tile of the online softmax for a warp's 16 query rows (this thread: rows g and g + 8,
// e = 0, 1 and 2, 3 of each S fragment), then O += P V. s holds raw scores (masked ones -inf);
// scores scale to log2 units by scale_log2 inside the exp2. A row with no key yet keeps max -inf
// and subtracts 0, so exp2 gives 0, not NaN. kRoundP: P is rounded to BF16 before the row sum (the
// sum then matches the P that P V uses, as the 8-bit specification has it). P's fragments are the
// S accumulators of key tiles 2kk, 2kk + 1: the m16n8 C layout is the m16n8k16 A layout.
template <int kHeadDim, bool kRoundP>
__device__ __forceinline__ void softmax_pv_step(float (&s)[kBlockKv / 8][4], float (&row_max)[2], float (&row_sum)[2],
                                                float (&o_acc)[kHeadDim / 8][4], float scale_log2, uint32_t v_tile,
                                                int lane) {
  constexpr int kKeyTiles = kBlockKv / 8, kDimTiles = kHeadDim / 8;
  using L = TileLayout<kHeadDim>;
  float corr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float m = row_max[r];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) m = fmaxf(m, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    const float m_scaled = m == -INFINITY ? 0.f : m * scale_log2;
    corr[r] = fast_exp2(__fmaf_rn(row_max[r], scale_log2, -m_scaled));
    row_max[r] = m;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
      s[n][2 * r] = fast_exp2(__fmaf_rn(s[n][2 * r], scale_log2, -m_scaled));
      s[n][2 * r + 1] = fast_exp2(__fmaf_rn(s[n][2 * r + 1], scale_log2, -m_scaled));
      if constexpr (kRoundP) {
        s[n][2 * r] = __bfloat162float(__float2bfloat16_rn(s[n][2 * r]));
        s[n][2 * r + 1] = __bfloat162float(__float2bfloat16_rn(s[n][2 * r + 1]));
      }
      sum += s[n][2 * r] + s[n][2 * r + 1];
    }
    row_sum[r] = __fmaf_rn(row_sum[r], corr[r], sum);
  }
#pragma unroll
  for (int d = 0; d < kDimTiles; ++d) {
    o_acc[d][0] *= corr[0]; o_acc[d][1] *= corr[0];
    o_acc[d][2] *= corr[1]; o_acc[d][3] *= corr[1];
  }
#pragma unroll
  for (int kk = 0; kk < kBlockKv / 16; ++kk) {
    const uint32_t p_frag[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]), pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                                pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < kDimTiles / 2; ++dp) {
      // Transposed matrices: keys kk*16 + 0-7 / 8-15 ((lane / 8) % 2) x dims chunk 2dp / 2dp+1
      // (lane / 16): b0, b1 of dim tile 2dp, then of dim tile 2dp + 1.
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, v_tile + L::offset_bytes(kk * 16 + (lane % 8) + 8 * ((lane / 8) % 2), 2 * dp + lane / 16));
      mma_bf16_16816(o_acc[2 * dp], p_frag, vb[0], vb[1]);
      mma_bf16_16816(o_acc[2 * dp + 1], p_frag, vb[2], vb[3]);
    }
  }
}

}  // namespace llmq::attention::mma
