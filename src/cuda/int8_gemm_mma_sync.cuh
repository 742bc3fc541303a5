// The portable INT8 GEMM kernel (sm_80+): mma.sync m16n8k32 s8 x s8 -> s32 from cp.async
// double-buffered shared-memory tiles. It is the fallback on GPUs without wgmma (the compute_80
// PTX that the driver compiles for them) and an independent second implementation that the tests
// compare the Hopper kernel with. Internal; included by int8_gemm_sm90.cu only.
#pragma once

#include <cstdint>

#include "cuda/int8_gemm_epilogue.cuh"

namespace llmq::int8_gemm {

// CTA tile 128 x 128 x 64, 8 warps as 2 (M) x 4 (N), each warp 64 x 32 = 4 x 4 mma tiles.
constexpr int kMmaBlockM = 128;
constexpr int kMmaBlockN = 128;
constexpr int kMmaBlockK = 64;
constexpr int kMmaThreads = 256;
// Rows padded from 64 to 80 bytes: the 8 rows x 4 words that one fragment load touches then
// fall in 32 distinct banks (row * 20 + t words), so shared loads are conflict free.
constexpr int kMmaSmemRow = kMmaBlockK + 16;

// 16-byte async copy global -> shared; src_bytes = 0 writes zeros (rows past M / N, K past the end).
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// c += a (16 x 32, row) * b (32 x 8, col): a[0..3] rows g / g+8, k 4t.. and 16+4t..; b[0..1]
// k 4t.. and 16+4t.. of column g; c rows g / g+8, columns 2t, 2t+1 (g = lane / 4, t = lane % 4).
__device__ __forceinline__ void mma_m16n8k32_s8(int32_t (&c)[4], const uint32_t (&a)[4],
                                                const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One 128 x 64 int8 tile (rows `row0`.. of a [rows, k] matrix, columns k0..) into shared memory:
// 512 chunks of 16 bytes, two per thread. K is a multiple of 16, so a chunk is wholly in or out.
__device__ __forceinline__ void load_tile_async(int8_t (*smem)[kMmaSmemRow], const int8_t* g,
                                                int64_t rows, int64_t k, int64_t row0, int64_t k0) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int chunk = static_cast<int>(threadIdx.x) + i * kMmaThreads;
    const int r = chunk / (kMmaBlockK / 16);
    const int c = (chunk % (kMmaBlockK / 16)) * 16;
    const int64_t gr = row0 + r;
    const int64_t gc = k0 + c;
    const bool valid = gr < rows && gc < k;
    cp_async_16(&smem[r][c], valid ? g + gr * k + gc : g, valid ? 16 : 0);
  }
}

template <OutputKind kOut>
__global__ void __launch_bounds__(kMmaThreads, 1)
    int8_gemm_mma_sync_kernel(const int8_t* __restrict__ a, const int8_t* __restrict__ b,
                              EpilogueParams p, int64_t k) {
  __shared__ __align__(16) int8_t smem_a[2][kMmaBlockM][kMmaSmemRow];
  __shared__ __align__(16) int8_t smem_b[2][kMmaBlockN][kMmaSmemRow];

  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kMmaBlockM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kMmaBlockN;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp_m = warp / 4;  // 64-row half
  const int warp_n = warp % 4;  // 32-column quarter
  const int g = lane / 4;
  const int t = lane % 4;

  int32_t acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0;

  const int64_t k_blocks = (k + kMmaBlockK - 1) / kMmaBlockK;
  load_tile_async(smem_a[0], a, p.m, k, m0, 0);
  load_tile_async(smem_b[0], b, p.n, k, n0, 0);
  cp_async_commit();

  for (int64_t kb = 0; kb < k_blocks; ++kb) {
    const int cur = static_cast<int>(kb & 1);
    if (kb + 1 < k_blocks) {
      // The other buffer was released by the __syncthreads() that ended the previous step.
      load_tile_async(smem_a[cur ^ 1], a, p.m, k, m0, (kb + 1) * kMmaBlockK);
      load_tile_async(smem_b[cur ^ 1], b, p.n, k, n0, (kb + 1) * kMmaBlockK);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

#pragma unroll
    for (int kk = 0; kk < kMmaBlockK; kk += 32) {
      uint32_t fa[4][4];
      uint32_t fb[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = warp_m * 64 + i * 16 + g;
        fa[i][0] = *reinterpret_cast<const uint32_t*>(&smem_a[cur][r][kk + 4 * t]);
        fa[i][1] = *reinterpret_cast<const uint32_t*>(&smem_a[cur][r + 8][kk + 4 * t]);
        fa[i][2] = *reinterpret_cast<const uint32_t*>(&smem_a[cur][r][kk + 16 + 4 * t]);
        fa[i][3] = *reinterpret_cast<const uint32_t*>(&smem_a[cur][r + 8][kk + 16 + 4 * t]);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = warp_n * 32 + j * 8 + g;
        fb[j][0] = *reinterpret_cast<const uint32_t*>(&smem_b[cur][c][kk + 4 * t]);
        fb[j][1] = *reinterpret_cast<const uint32_t*>(&smem_b[cur][c][kk + 16 + 4 * t]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_m16n8k32_s8(acc[i][j], fa[i], fb[j]);
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row0 = m0 + warp_m * 64 + i * 16 + g;
    const float sa0 = load_row_scale<kOut>(p, row0);
    const float sa1 = load_row_scale<kOut>(p, row0 + 8);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t col = n0 + warp_n * 32 + j * 8 + 2 * t;
      store_acc_pairs<kOut>(p, row0, col, acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3],
                            sa0, sa1);
    }
  }
}

}  // namespace llmq::int8_gemm
