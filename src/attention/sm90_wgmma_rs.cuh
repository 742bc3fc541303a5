// Hopper warpgroup MMA with the A operand in registers (wgmma.mma_async ... {a0..a3}, b-desc), the
// form flash attention needs: Q's fragments stay in registers for every key tile, and P goes from
// the score accumulators to the P V product without a trip through shared memory. 8-bit types
// only (k32): the A fragment of a warp is m16n8k32's (a0: row g, k 4t..4t+3; a1: row g + 8; a2, a3:
// k 16 + 4t..), warp w of the warpgroup holding rows 16w..16w+15; D is laid out like the
// shared-memory forms' (cuda/sm90_wgmma_s8.cuh). B comes from shared memory, K-major.
// kAccumulate = false: D = A B, and D is an output only ("=r"), so the compiler lets the old
// accumulators die instead of keeping them live into the instruction (that alone spilled the
// attention kernel). Wrappers generated; call only from code compiled for sm_90a. Internal; CUDA
// sources only.
#pragma once

#include <cstdint>

namespace llmq::attention {

// D[64 x 128] (+)= A[64 x 32] B[128 x 32]^T, 8-bit integers -> INT32: TYPES ".s8.s8" (S = Q K^T
// over a 128-key tile) or ".u8.s8" (P V: unsigned P x INT8 V); C makes D's operand constraint:
// LLMQ_ACC_RW, "+r" (accumulate), or LLMQ_ACC_W, "=r" (D = A B; see the top).
#define LLMQ_WGMMA_M64N128K32_S32_RS(TYPES, C, ACC)                                                  \
  asm volatile(                                                                                     \
      "{\n"                                                                                         \
      ".reg .pred p;\n"                                                                             \
      "setp.ne.b32 p, %69, 0;\n"                                                                    \
      "wgmma.mma_async.sync.aligned.m64n128k32.s32" TYPES " "                                       \
      "{"                                                                                           \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                        \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"              \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"              \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"               \
      "},"                                                                                          \
      " {%64, %65, %66, %67}, %68, p;\n"                                                            \
      "}\n"                                                                                         \
      : \
        C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), \
        C(d[8]), C(d[9]), C(d[10]), C(d[11]), C(d[12]), C(d[13]), C(d[14]), C(d[15]), \
        C(d[16]), C(d[17]), C(d[18]), C(d[19]), C(d[20]), C(d[21]), C(d[22]), C(d[23]), \
        C(d[24]), C(d[25]), C(d[26]), C(d[27]), C(d[28]), C(d[29]), C(d[30]), C(d[31]), \
        C(d[32]), C(d[33]), C(d[34]), C(d[35]), C(d[36]), C(d[37]), C(d[38]), C(d[39]), \
        C(d[40]), C(d[41]), C(d[42]), C(d[43]), C(d[44]), C(d[45]), C(d[46]), C(d[47]), \
        C(d[48]), C(d[49]), C(d[50]), C(d[51]), C(d[52]), C(d[53]), C(d[54]), C(d[55]), \
        C(d[56]), C(d[57]), C(d[58]), C(d[59]), C(d[60]), C(d[61]), C(d[62]), C(d[63]) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(ACC))

template <bool kSignedA, bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n128k32_int_rs(int32_t (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
#define LLMQ_ACC_RW(x) "+r"(x)
#define LLMQ_ACC_W(x) "=r"(x)
  if constexpr (kSignedA && kAccumulate) {
    LLMQ_WGMMA_M64N128K32_S32_RS(".s8.s8", LLMQ_ACC_RW, 1);
  } else if constexpr (kSignedA) {
    LLMQ_WGMMA_M64N128K32_S32_RS(".s8.s8", LLMQ_ACC_W, 0);
  } else if constexpr (kAccumulate) {
    LLMQ_WGMMA_M64N128K32_S32_RS(".u8.s8", LLMQ_ACC_RW, 1);
  } else {
    LLMQ_WGMMA_M64N128K32_S32_RS(".u8.s8", LLMQ_ACC_W, 0);
  }
#undef LLMQ_ACC_RW
#undef LLMQ_ACC_W
}
#undef LLMQ_WGMMA_M64N128K32_S32_RS

// O[64 x 128] (+)= P[64 x 32] Vt[128 x 32]^T: unsigned 8-bit P x INT8 V -> INT32.
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n128k32_u8s8_rs(int32_t (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  wgmma_m64n128k32_int_rs<false, kAccumulate>(d, a, desc_b);
}
// S[64 x 128] (+)= Q[64 x 32] K[128 x 32]^T: INT8 x INT8 -> INT32.
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n128k32_s8_rs(int32_t (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  wgmma_m64n128k32_int_rs<true, kAccumulate>(d, a, desc_b);
}

// O[64 x 128] (+)= P[64 x 32] Vt[128 x 32]^T: E4M3 x E4M3 -> FP32.
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n128k32_e4m3_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (kAccumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "},"
      " {%64, %65, %66, %67}, %68, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(kAccumulate ? 1 : 0));
  } else {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "},"
      " {%64, %65, %66, %67}, %68, p, 1, 1;\n"
      "}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]),
        "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]),
        "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]),
        "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]),
        "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]),
        "=f"(d[40]), "=f"(d[41]), "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]),
        "=f"(d[48]), "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]),
        "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]), "=f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(kAccumulate ? 1 : 0));
  }
}

}  // namespace llmq::attention
