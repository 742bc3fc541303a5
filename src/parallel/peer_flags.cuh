// Flags between GPUs of one host for the one-shot all-reduce (p2p_all_reduce.cu) and its form
// folded into the norm (runtime/row_kernels.cu): a release store into a peer's memory after this
// CTA's writes, and an acquire spin on this rank's own flag. System scope, because the flags and
// the data they guard cross GPUs. Internal header; CUDA sources only.
#pragma once

#include <cstdint>

namespace llmq::parallel {

// flag = call, ordered after every write this CTA made before its last barrier.
__device__ __forceinline__ void peer_signal(uint32_t* flag, uint32_t call) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(flag), "r"(call) : "memory");
}

// Spins until *flag has reached `call` (counters wrap: compared as a signed difference). After 20 s
// it traps: a rank that never comes fails the kernel instead of hanging the GPU.
__device__ __forceinline__ void peer_wait(const uint32_t* flag, uint32_t call) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    if (static_cast<int32_t>(v - call) >= 0) return;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > 20000000000ull) __trap();
  }
}

}  // namespace llmq::parallel
