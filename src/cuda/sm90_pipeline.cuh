// The TMA stage ring of llmq's Hopper GEMMs (INT8 GEMM, MoE grouped GEMM; the 8-bit attention
// runs the same protocol on barriers inside its own SharedStorage): a producer fills kStages shared-memory stages in turn, consumers read them in the same order, and
// each stage s is guarded by two mbarriers:
//   full[s]  completes when the producer's arrivals are in and the TMA bytes it announced with
//            expect_tx have landed: the stage may be read;
//   empty[s] completes when every consumer arrival is in: the stage may be overwritten.
// Each side keeps its position in the ring, a stage index and the parity of the pass it is on, in
// two scalars of its own, stepped in place after each stage:
//     if (++stage == kStages) { stage = 0; phase ^= 1u; }
// and waits on that parity: consumers on full[s], the producer on empty[s] one pass behind. A fresh
// barrier is in phase 0, so waiting on parity 1 returns at once: that is how the producer's first
// pass finds every stage free. (The step is not a helper here: each form of one tried, a function
// on references, a cursor struct, straight-line selects, changed the order in which NVVM numbers
// and schedules the two updates and with it ptxas's output for some of the kernels.)
// Internal; CUDA sources only; sm_90.
#pragma once

#include <cstdint>

#include "cuda/sm90_tma.cuh"

namespace llmq::sm90 {

// The ring's 2 x kStages mbarriers, 8 bytes each from the shared address `bars` (8-byte aligned):
// full[0 .. kStages) then empty[0 .. kStages).
template <int kStages>
struct StageRing {
  static constexpr uint32_t kBarrierBytes = 16u * kStages;

  uint32_t bars;

  __device__ __forceinline__ uint32_t full(int s) const { return bars + 8u * static_cast<uint32_t>(s); }
  __device__ __forceinline__ uint32_t empty(int s) const { return bars + 8u * static_cast<uint32_t>(kStages + s); }

  // One thread, followed by a block-wide barrier before any other use. full[s] completes after
  // `producer_arrivals` arrivals (plus the announced bytes), empty[s] after `consumer_arrivals`.
  __device__ __forceinline__ void init(uint32_t producer_arrivals, uint32_t consumer_arrivals) const {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full(s), producer_arrivals);
      mbarrier_init(empty(s), consumer_arrivals);
    }
    fence_barrier_init();
  }

  // Producer: wait until the consumers have released stage s (in the pass before `phase`).
  __device__ __forceinline__ void wait_empty(int s, uint32_t phase) const { mbarrier_wait(empty(s), phase ^ 1u); }
  // Producer: arrive on the stage's full barrier announcing the bytes its TMA copies will deliver
  // (the copies complete on full(stage)), or arrive without any.
  __device__ __forceinline__ void arrive_full_expect_tx(int s, uint32_t bytes) const {
    mbarrier_arrive_expect_tx(full(s), bytes);
  }
  __device__ __forceinline__ void arrive_full(int s) const { mbarrier_arrive(full(s)); }

  // Consumer: wait until the stage's data has landed; then, once done reading it, release it.
  __device__ __forceinline__ void wait_full(int s, uint32_t phase) const { mbarrier_wait(full(s), phase); }
  __device__ __forceinline__ void release(int s) const { mbarrier_arrive(empty(s)); }
};

}  // namespace llmq::sm90
