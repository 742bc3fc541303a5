// PTX wrappers of the 8-bit attention kernels (src/attention/): a 4-byte cp.async and the
// mma.sync m16n8k32 INT8 products (s8 x s8 for Q K^T, u8 x s8 for P V with unsigned P).
// Internal; CUDA sources only.
#pragma once

#include <cstdint>

namespace llmq::attention {

// 4 bytes global -> shared (via L1); src_bytes = 0 writes zeros.
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

// c (16x8, INT32) += a (16x32 UINT8, row) * b (32x8 INT8, col)
__device__ __forceinline__ void mma_u8s8_16832(int32_t (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace llmq::attention
