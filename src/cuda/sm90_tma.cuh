// Hopper bulk tensor copies (TMA) and the shared-memory mbarriers they complete on: device-side
// PTX wrappers (llmq::sm90; the stage ring built on them is cuda/sm90_pipeline.cuh), plus the
// host-side tensor-map encoder reached through the runtime's driver entry point (so llmq needs no
// -lcuda; llmq::int8_gemm, defined in sm90_tma.cu). Internal; CUDA sources only. The device
// functions need sm_90.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only; no driver symbols are linked)
#include <cuda_runtime.h>

#include <cstdint>

#include "llmq/status.hpp"

// ---------------------------------------------------------------------------------------------
// Device side (call only from code compiled for sm_90 or later)

namespace llmq::sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One thread initialises a barrier that completes a phase after `count` arrivals (plus, for the
// full barriers, the transaction bytes announced by expect_tx).
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Makes the initialised barriers visible to the async proxy (the TMA unit) before first use.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Arrive once and announce `bytes` that the TMA copies of this phase will deliver.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Spin until the phase with parity `parity` has completed. A fresh barrier is in phase 0, so
// waiting on parity 1 returns at once: that is how the producer's first pass finds every slot free.
// The loop lives inside the asm: a C++ loop around try_wait is a divergent path to ptxas, and
// crossing one with a wgmma in flight (a consumer waiting for the next tile while its last P V
// runs) makes it serialize every wgmma of the kernel.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "LLMQ_MBAR_WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra LLMQ_MBAR_WAIT_%=;\n"
      "}\n"
      :
      : "r"(bar), "r"(parity)
      : "memory");
}

// Pulls the tensor map into the constant cache ahead of the first copy.
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// 2-D tile copy global -> shared; `x` is the inner (contiguous) coordinate, `y` the row. Elements
// outside the tensor are written as zeros and still count towards the barrier's transaction bytes.
__device__ __forceinline__ void tma_load_2d(uint32_t smem_dst, const CUtensorMap* map, uint32_t bar,
                                            int32_t x, int32_t y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(smem_dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(x), "r"(y)
      : "memory");
}

}  // namespace llmq::sm90

// ---------------------------------------------------------------------------------------------
// Host side

namespace llmq::int8_gemm {

// Tensor map of a row-major int8 matrix [rows, cols] read in boxes of [box_rows, box_cols] with
// the 128-byte swizzle (box_cols must be 128 bytes = one swizzle row). cols * 1 byte must be a
// multiple of 16 and `data` 16-byte aligned (TMA's rules); the caller checks both.
Status encode_int8_tensor_map(CUtensorMap* map, const void* data, int64_t rows, int64_t cols,
                              uint32_t box_rows, uint32_t box_cols);
// The general form: rows `row_stride` bytes apart (a multiple of 16, >= cols; columns past `cols`
// read as zeros), box_cols = swizzle_bytes (64 or 128) bytes wide in that swizzle.
Status encode_u8_tensor_map(CUtensorMap* map, const void* data, int64_t rows, int64_t cols, int64_t row_stride,
                            uint32_t box_rows, uint32_t box_cols, int swizzle_bytes);

}  // namespace llmq::int8_gemm
