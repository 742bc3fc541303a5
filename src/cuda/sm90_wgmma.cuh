// Hopper warpgroup MMA (wgmma.mma_async, sm_90a only): the shared-memory matrix descriptors for
// K-major tiles in the swizzle that TMA writes, the fence / commit / wait instructions, register
// re-allocation (setmaxnreg), and every mma form llmq's kernels issue:
//   * A and B from shared memory: m64nNk32 .s32.s8.s8 (N = 64, 128, 256: the INT8 GEMM),
//     m64n128k32 .f32.e4m3.e4m3 and m64n128k16 .f32.bf16.bf16 (the MoE grouped GEMM);
//   * A from registers (RS), B from shared memory: m64n128k32 .s32.s8.s8, .s32.u8.s8 and
//     .f32.e4m3.e4m3 (the 8-bit flash attention: Q K^T and P V), m64n128k16 .f32.bf16.bf16 (the
//     BF16 flash attention).
// Internal; CUDA sources only. Every function here must be called from code compiled for sm_90a
// (LLMQ_SM90A): other passes compile the Hopper kernels' bodies away.
#pragma once

#include <cstdint>

// True in the device pass that targets sm_90a, where wgmma, setmaxnreg and TMA exist. Other passes
// (the compute_80 PTX fallback) compile the Hopper kernels to a trap (or nothing), and the host
// never launches them on a device other than sm_90.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LLMQ_SM90A 1
#else
#define LLMQ_SM90A 0
#endif

namespace llmq::sm90 {

// Shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format") for a K-major operand whose
// rows are 128 bytes (128 8-bit elements along K) in the 128-byte swizzle: 8-row atoms of 1024 bytes
// stacked along M/N. Bits 0-13: start address >> 4; 16-29: leading byte offset >> 4 (unused for
// swizzled K-major, set to 1 as the ISA says it is assumed); 32-45: stride byte offset >> 4 (1024
// bytes from one 8-row atom to the next); 49-51: base offset (0: every tile starts 1024-byte
// aligned); 62-63: swizzle mode (1 = 128B). Stepping K by 32 bytes inside the atom only moves the
// start address (+2 in the descriptor): the hardware applies the XOR swizzle to the final address
// bits, as TMA did when writing. The 64-byte swizzle (rows of 64 bytes, TMA's SWIZZLE_64B) has
// 512-byte atoms and layout type 2.
template <int kSwizzleBytes>
__device__ __forceinline__ uint64_t make_smem_desc_k(uint32_t smem_addr) {
  static_assert(kSwizzleBytes == 64 || kSwizzleBytes == 128, "64- or 128-byte swizzle");
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4);
  desc |= static_cast<uint64_t>(1) << 16;
  desc |= static_cast<uint64_t>(8 * kSwizzleBytes >> 4) << 32;
  desc |= static_cast<uint64_t>(kSwizzleBytes == 128 ? 1 : 2) << 62;
  return desc;
}
__device__ __forceinline__ uint64_t make_smem_desc_k_sw128(uint32_t smem_addr) { return make_smem_desc_k<128>(smem_addr); }

// Warp-specialised kernels: the producer warpgroup gives registers back (dec), the consumers take
// them (inc); every thread of the warpgroup executes it. kRegisters: a multiple of 8 in [24, 256].
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
#if LLMQ_SM90A
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
#endif
}
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
#if LLMQ_SM90A
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
#endif
}

// Named barrier `id` (1-15; 0 is __syncthreads') over kThreads threads: sync waits for them all,
// arrive counts this warp in and goes on. The attention kernels' two consumer warpgroups take turns
// with a pair of them (ping-pong).
template <int kThreads>
__device__ __forceinline__ void named_barrier_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}
template <int kThreads>
__device__ __forceinline__ void named_barrier_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

// Orders this warpgroup's earlier register writes before the next wgmma reads its accumulators.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
// Closes the group of wgmma instructions issued since the last commit.
__device__ __forceinline__ void wgmma_commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most `kPending` committed groups of this thread are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Tells the compiler that the registers may have been written behind its back (by an async wgmma),
// so it neither reads them early nor reorders their uses across a wait.
template <int kCount>
__device__ __forceinline__ void fence_registers(int32_t (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
template <int kCount>
__device__ __forceinline__ void fence_registers(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The same for register A fragments ([k steps][4] 32-bit words): computed before this point and
// kept unchanged up to it (else ptxas may move their writes next to each product).
template <int kSteps>
__device__ __forceinline__ void fence_registers(uint32_t (&a)[kSteps][4]) {
#pragma unroll
  for (int k = 0; k < kSteps; ++k)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[k][i])::"memory");
}

// ---------------------------------------------------------------------------------------------
// The mma forms. One instruction each, D of 32, 64, 96 or 128 registers a thread, laid out as the PTX
// ISA's wgmma D fragment: d[4j + 0, 1] row r, columns 8j + 2t, +1; d[4j + 2, 3] row r + 8
// (r = 16 warp + lane / 4, t = lane % 4). The operand lists are spelled by the macros below.
// scale-d is the predicate p: false makes D = A * B (no accumulate).

// "%0, ..., %(n-1)": the accumulator operands of an instruction with n of them.
#define LLMQ_WGMMA_REGS32                                                            \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"             \
  " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define LLMQ_WGMMA_REGS64                                                            \
  LLMQ_WGMMA_REGS32 ","                                                              \
  " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"  \
  " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define LLMQ_WGMMA_REGS128                                                                          \
  LLMQ_WGMMA_REGS64 ","                                                                             \
  " %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"                 \
  " %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"                 \
  " %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"     \
  " %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define LLMQ_WGMMA_REGS96                                                                           \
  LLMQ_WGMMA_REGS64 ","                                                                             \
  " %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"                 \
  " %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
// C(d[i]), ..., C(d[i + n - 1]) with C a constraint string: "+r" / "+f" (accumulate into d) or
// "=r" / "=f" (d is written only, so the compiler may let the old values die before the product).
#define LLMQ_WGMMA_D8(C, i)                                                                          \
  C(d[(i) + 0]), C(d[(i) + 1]), C(d[(i) + 2]), C(d[(i) + 3]), C(d[(i) + 4]), C(d[(i) + 5]),            \
      C(d[(i) + 6]), C(d[(i) + 7])
#define LLMQ_WGMMA_D32(C, i) LLMQ_WGMMA_D8(C, i), LLMQ_WGMMA_D8(C, (i) + 8), LLMQ_WGMMA_D8(C, (i) + 16), LLMQ_WGMMA_D8(C, (i) + 24)
#define LLMQ_WGMMA_D64(C, i) LLMQ_WGMMA_D32(C, i), LLMQ_WGMMA_D32(C, (i) + 32)
#define LLMQ_WGMMA_D128(C) LLMQ_WGMMA_D64(C, 0), LLMQ_WGMMA_D64(C, 64)
#define LLMQ_WGMMA_D96(C) LLMQ_WGMMA_D64(C, 0), LLMQ_WGMMA_D32(C, 64)

// A and B from shared memory (descriptors desc_a, desc_b; operands %A, %B), the accumulate flag
// (register operand %S) as scale-d; TAIL: the immediates some types take after it.
#define LLMQ_WGMMA_SS(SHAPE_TYPES, REGS, D, A, B, S, TAIL)                                          \
  asm volatile(                                                                                     \
      "{\n"                                                                                         \
      ".reg .pred p;\n"                                                                             \
      "setp.ne.b32 p, %" #S ", 0;\n"                                                                \
      "wgmma.mma_async.sync.aligned." SHAPE_TYPES " {" REGS "}, %" #A ", %" #B ", p" TAIL ";\n"      \
      "}\n"                                                                                         \
      : D                                                                                           \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

// A from registers (a[0..3], the A fragment of m16n8k32 for the warp's 16 rows: a0 row g, k 4t..;
// a1 row g + 8; a2, a3 k 16 + 4t..), B from shared memory (desc_b); 64 accumulators; ACC the
// scale-d immediate (1 with "+" constraints, 0 with "=").
#define LLMQ_WGMMA_RS64(SHAPE_TYPES, C, ACC, TAIL)                                                   \
  asm volatile(                                                                                     \
      "{\n"                                                                                         \
      ".reg .pred p;\n"                                                                             \
      "setp.ne.b32 p, %69, 0;\n"                                                                    \
      "wgmma.mma_async.sync.aligned." SHAPE_TYPES " {" LLMQ_WGMMA_REGS64 "},"                        \
      " {%64, %65, %66, %67}, %68, p" TAIL ";\n"                                                    \
      "}\n"                                                                                         \
      : LLMQ_WGMMA_D64(C, 0)                                                                        \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(ACC))

// D[64 x N] (+)= A[64 x 32] * B[N x 32]^T, INT8 x INT8 -> INT32, both from shared memory (K-major).
// `d` holds N / 2 accumulators per thread; accumulate == 0 overwrites D (first k step).
__device__ __forceinline__ void wgmma_m64n64k32_s8(int32_t (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                   int accumulate) {
  LLMQ_WGMMA_SS("m64n64k32.s32.s8.s8", LLMQ_WGMMA_REGS32, LLMQ_WGMMA_D32("+r", 0), 32, 33, 34, "");
}
__device__ __forceinline__ void wgmma_m64n128k32_s8(int32_t (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                    int accumulate) {
  LLMQ_WGMMA_SS("m64n128k32.s32.s8.s8", LLMQ_WGMMA_REGS64, LLMQ_WGMMA_D64("+r", 0), 64, 65, 66, "");
}
__device__ __forceinline__ void wgmma_m64n256k32_s8(int32_t (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                    int accumulate) {
  LLMQ_WGMMA_SS("m64n256k32.s32.s8.s8", LLMQ_WGMMA_REGS128, LLMQ_WGMMA_D128("+r"), 128, 129, 130, "");
}
// Dispatch by the compile-time tile width.
template <int kN>
__device__ __forceinline__ void wgmma_s8(int32_t (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b,
                                         int accumulate) {
  static_assert(kN == 64 || kN == 128 || kN == 256, "wgmma_s8: N must be 64, 128 or 256");
  if constexpr (kN == 64) wgmma_m64n64k32_s8(d, desc_a, desc_b, accumulate);
  if constexpr (kN == 128) wgmma_m64n128k32_s8(d, desc_a, desc_b, accumulate);
  if constexpr (kN == 256) wgmma_m64n256k32_s8(d, desc_a, desc_b, accumulate);
}

// D[64 x 128] (+)= A[64 x 32] * B[128 x 32]^T in FP32, both E4M3 from shared memory (K-major).
// The trailing immediates are FP8 wgmma's scale-a / scale-b (1: no negation).
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                      int accumulate) {
  LLMQ_WGMMA_SS("m64n128k32.f32.e4m3.e4m3", LLMQ_WGMMA_REGS64, LLMQ_WGMMA_D64("+f", 0), 64, 65, 66, ", 1, 1");
}

// D[64 x 192] (+)= A[64 x 32] * B[192 x 32]^T in FP32, E4M3 (the 192-column form).
__device__ __forceinline__ void wgmma_m64n192k32_e4m3(float (&d)[96], uint64_t desc_a, uint64_t desc_b,
                                                      int accumulate) {
  LLMQ_WGMMA_SS("m64n192k32.f32.e4m3.e4m3", LLMQ_WGMMA_REGS96, LLMQ_WGMMA_D96("+f"), 96, 97, 98, ", 1, 1");
}

// D[64 x 64] (+)= A[64 x 32] * B[64 x 32]^T in FP32, E4M3 (the 64-column form of the above).
__device__ __forceinline__ void wgmma_m64n64k32_e4m3(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  LLMQ_WGMMA_SS("m64n64k32.f32.e4m3.e4m3", LLMQ_WGMMA_REGS32, LLMQ_WGMMA_D32("+f", 0), 32, 33, 34, ", 1, 1");
}

// D[64 x 128] (+)= A[64 x 16] * B[128 x 16]^T in FP32, both BF16 from shared memory (K-major: the
// same 128-byte swizzled rows, now 64 BF16 each, so a 16-element K step is again 32 bytes). The
// trailing immediates: scale-a, scale-b (1) and transpose-a, transpose-b (0: K-major).
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                      int accumulate) {
  LLMQ_WGMMA_SS("m64n128k16.f32.bf16.bf16", LLMQ_WGMMA_REGS64, LLMQ_WGMMA_D64("+f", 0), 64, 65, 66,
                ", 1, 1, 0, 0");
}
// D[64 x 64] (+)= A[64 x 16] * B[64 x 16]^T in FP32, BF16 (the 64-column form of the above).
__device__ __forceinline__ void wgmma_m64n64k16_bf16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  LLMQ_WGMMA_SS("m64n64k16.f32.bf16.bf16", LLMQ_WGMMA_REGS32, LLMQ_WGMMA_D32("+f", 0), 32, 33, 34, ", 1, 1, 0, 0");
}
// Dispatch by the compile-time tile width, as wgmma_s8 does: 32 bytes of K of E4M3 or BF16.
template <int kN>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  static_assert(kN == 64 || kN == 128 || kN == 192, "wgmma_e4m3: N must be 64, 128 or 192");
  if constexpr (kN == 64) wgmma_m64n64k32_e4m3(d, desc_a, desc_b, accumulate);
  if constexpr (kN == 128) wgmma_m64n128k32_e4m3(d, desc_a, desc_b, accumulate);
  if constexpr (kN == 192) wgmma_m64n192k32_e4m3(d, desc_a, desc_b, accumulate);
}
template <int kN>
__device__ __forceinline__ void wgmma_bf16(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  static_assert(kN == 64 || kN == 128, "wgmma_bf16: N must be 64 or 128");
  if constexpr (kN == 64) wgmma_m64n64k16_bf16(d, desc_a, desc_b, accumulate);
  if constexpr (kN == 128) wgmma_m64n128k16_bf16(d, desc_a, desc_b, accumulate);
}

// The register-A forms flash attention needs: Q's fragments stay in registers for every key tile,
// and P goes from the score accumulators to the P V product without a trip through shared memory.
// kAccumulate = false: D = A B, and D is an output only ("=r"), so the compiler lets the old
// accumulators die instead of keeping them live into the instruction (that alone spilled the
// attention kernel).

// S[64 x 128] (+)= Q[64 x 32] K[128 x 32]^T: INT8 x INT8 -> INT32.
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n128k32_s8_rs(int32_t (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (kAccumulate) {
    LLMQ_WGMMA_RS64("m64n128k32.s32.s8.s8", "+r", 1, "");
  } else {
    LLMQ_WGMMA_RS64("m64n128k32.s32.s8.s8", "=r", 0, "");
  }
}
// O[64 x 128] (+)= P[64 x 32] Vt[128 x 32]^T: unsigned 8-bit P x INT8 V -> INT32.
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n128k32_u8s8_rs(int32_t (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (kAccumulate) {
    LLMQ_WGMMA_RS64("m64n128k32.s32.u8.s8", "+r", 1, "");
  } else {
    LLMQ_WGMMA_RS64("m64n128k32.s32.u8.s8", "=r", 0, "");
  }
}
// O[64 x 128] (+)= P[64 x 32] Vt[128 x 32]^T: E4M3 x E4M3 -> FP32 (scale-a, scale-b immediates 1).
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n128k32_e4m3_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (kAccumulate) {
    LLMQ_WGMMA_RS64("m64n128k32.f32.e4m3.e4m3", "+f", 1, ", 1, 1");
  } else {
    LLMQ_WGMMA_RS64("m64n128k32.f32.e4m3.e4m3", "=f", 0, ", 1, 1");
  }
}

// O[64 x 128] (+)= P[64 x 16] Vt[128 x 16]^T (or S = Q K^T): BF16 x BF16 -> FP32, B K-major (not
// transposed), scale-a / scale-b 1.
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n128k16_bf16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (kAccumulate) {
    LLMQ_WGMMA_RS64("m64n128k16.f32.bf16.bf16", "+f", 1, ", 1, 1, 0");
  } else {
    LLMQ_WGMMA_RS64("m64n128k16.f32.bf16.bf16", "=f", 0, ", 1, 1, 0");
  }
}

#undef LLMQ_WGMMA_RS64
#undef LLMQ_WGMMA_SS
#undef LLMQ_WGMMA_D128
#undef LLMQ_WGMMA_D64
#undef LLMQ_WGMMA_D32
#undef LLMQ_WGMMA_D8
#undef LLMQ_WGMMA_REGS128
#undef LLMQ_WGMMA_REGS64
#undef LLMQ_WGMMA_REGS32

}  // namespace llmq::sm90
