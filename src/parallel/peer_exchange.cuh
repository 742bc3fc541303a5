// The device side of the one-shot all-reduce (p2p_all_reduce.hpp), shared by its own kernel
// (p2p_all_reduce.cu, a message cut into per-CTA chunks) and by the add + RMSNorm that folds it in
// (runtime/row_kernels.cu, one row per CTA, RowPeerSum). Each rank's staging buffer is
// [2 (call parity)][ranks (source)][slot_elements]; each rank's flags are [ranks (source)][slots].
// A CTA pushes its part of the message into its slot of every peer's staging, raises its flag in
// every peer (release, after the barrier that follows its stores), waits for the peers' flags
// (acquire), and adds the parts, now in its own memory, in rank order. System scope, because the
// flags and the data they guard cross GPUs. Internal header; CUDA sources only.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "parallel/peer_sum.hpp"

namespace llmq::parallel {

constexpr int kPeerMaxRanks = kRowPeerMaxRanks;

// Offset of (call parity, source rank) in a staging buffer.
__device__ __forceinline__ int64_t peer_slot(uint32_t call, int source, int ranks, int64_t slot_elements) {
  return (static_cast<int64_t>(call & 1) * ranks + source) * slot_elements;
}

// v (8 BF16) into element `at` of this rank's slot in every peer's staging for `call`.
__device__ __forceinline__ void peer_push(const uint4& v, uint16_t* const* staging, int rank, int ranks,
                                          int64_t slot_elements, uint32_t call, int64_t at) {
  for (int q = 0; q < ranks; ++q)
    if (q != rank) *reinterpret_cast<uint4*>(staging[q] + peer_slot(call, rank, ranks, slot_elements) + at) = v;
}

// After the CTA's pushes: flag `slot` of every peer := call, then wait for every peer's flag `slot`
// here to reach `call` (counters wrap: a signed difference). Barriers before and after. After 20 s
// it traps: a rank that never comes fails the kernel instead of hanging the GPU.
__device__ __forceinline__ void peer_handshake(uint32_t* const* flags, int rank, int ranks, int slots, int slot, uint32_t call) {
  __syncthreads();
  const int q = static_cast<int>(threadIdx.x);
  if (q < ranks && q != rank) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(flags[q] + rank * slots + slot), "r"(call) : "memory");
    const uint32_t* mine = flags[rank] + q * slots + slot;
    uint64_t start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    for (;;) {
      uint32_t v;
      asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(mine) : "memory");
      if (static_cast<int32_t>(v - call) >= 0) break;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
      if (now - start > 20000000000ull) __trap();
    }
  }
  __syncthreads();
}

// acc = the 8 values at `at` summed over the ranks in rank order: this rank's own `mine`, the
// others' from this rank's staging (loads first, so they are in flight together).
__device__ __forceinline__ void peer_sum8(const uint4& mine, const uint16_t* own_staging, int rank, int ranks,
                                          int64_t slot_elements, uint32_t call, int64_t at, float (&acc)[8]) {
  uint4 v[kPeerMaxRanks];
#pragma unroll
  for (int r = 0; r < kPeerMaxRanks; ++r)
    if (r < ranks)
      v[r] = r == rank ? mine : __ldcg(reinterpret_cast<const uint4*>(own_staging + peer_slot(call, r, ranks, slot_elements) + at));
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
#pragma unroll
  for (int r = 0; r < kPeerMaxRanks; ++r) {
    if (r >= ranks) break;
    const uint32_t w[4] = {v[r].x, v[r].y, v[r].z, v[r].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc[2 * i] += __uint_as_float(w[i] << 16);
      acc[2 * i + 1] += __uint_as_float(w[i] & 0xFFFF0000u);
    }
  }
}

// ---- The form folded into the norm (RowPeerSum): CTA r exchanges row r of `delta`.

// The call number, read by every CTA at its start (peer_row_done moves it on).
__device__ __forceinline__ uint32_t peer_row_call(const RowPeerSum& p) {
  __shared__ uint32_t call;
  if (threadIdx.x == 0) call = p.counter[0] + 1;
  __syncthreads();
  return call;
}

// Push the 8 values of row r at column `at` (a CTA calls it for each of its vectors, then
// peer_handshake with slot r).
__device__ __forceinline__ void peer_row_push(const RowPeerSum& p, uint32_t call, const uint16_t* delta_row,
                                              int64_t r, int64_t n, int64_t at) {
  peer_push(*reinterpret_cast<const uint4*>(delta_row + at), p.staging, p.rank, p.ranks, p.slot_elements, call, r * n + at);
}

// The delta of row r at columns at .. at + 7: the ranks' rows added in rank order, rounded to BF16
// once (as the all-reduce kernel rounds its output).
__device__ __forceinline__ void peer_row_delta(const RowPeerSum& p, uint32_t call, const uint16_t* delta_row,
                                               int64_t r, int64_t n, int64_t at, float (&d)[8]) {
  peer_sum8(*reinterpret_cast<const uint4*>(delta_row + at), p.staging[p.rank], p.rank, p.ranks, p.slot_elements, call,
            r * n + at, d);
#pragma unroll
  for (int i = 0; i < 8; ++i) d[i] = __bfloat162float(__float2bfloat16_rn(d[i]));
}

// The last CTA of a call to finish moves the call counter on (every CTA has read it by then). Call
// after a barrier that follows the CTA's last staging read.
__device__ __forceinline__ void peer_row_done(const RowPeerSum& p, uint32_t call) {
  if (threadIdx.x != 0) return;
  __threadfence();
  if (atomicAdd(p.counter + 1, 1u) == gridDim.x - 1) {
    p.counter[1] = 0;
    p.counter[0] = call;
  }
}

}  // namespace llmq::parallel
