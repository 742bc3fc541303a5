// Shared pieces of the quantize kernels: input element types and 16-element "packs" (the unit
// every vectorised kernel moves: 16-byte loads of the input, one 16-byte store of codes), block
// and team reductions, division by run-time invariants, and the kernels' argument structs.
// Internal header; CUDA sources only (the host half of FastDivmod is also used by tests).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/quantize_numerics.cuh"

namespace llmq::quant_kernels {

enum class InType : int { kF32, kBF16, kF16 };

// Elements per pack: 16 codes = one 16-byte store. A pack of BF16/F16 is two 16-byte loads, of
// F32 four. kWords is the pack's size in 32-bit registers.
inline constexpr int kPackElems = 16;

template <InType T>
struct InTraits {
  static constexpr int kBytes = T == InType::kF32 ? 4 : 2;
  static constexpr int kWords = kPackElems * kBytes / 4;  // 16 (F32) or 8 (BF16, F16)
  // Packs a thread keeps in flight: 32 registers' worth, i.e. 128 bytes of loads per thread.
  static constexpr int kSlots = 32 / kWords;  // 2 (F32) or 4 (BF16, F16)
};

// Packs per thread in flight for an input type and encoder: the stochastic encoders are bound by
// Philox arithmetic, not memory, and need the registers for it, so they keep half as many.
__host__ __device__ constexpr int slots_for(InType t, Encoder e) {
  const int full = t == InType::kF32 ? InTraits<InType::kF32>::kSlots : InTraits<InType::kBF16>::kSlots;
  return is_stochastic(e) ? (full > 1 ? full / 2 : 1) : full;
}

// ---- Loads.

template <InType T>
__device__ __forceinline__ float load_scalar(const void* base, int64_t i) {
  if constexpr (T == InType::kF32) {
    return __ldg(static_cast<const float*>(base) + i);
  } else {
    const unsigned short h = __ldg(static_cast<const unsigned short*>(base) + i);
    if constexpr (T == InType::kBF16) return __uint_as_float(static_cast<uint32_t>(h) << 16);
    else return __half2float(__ushort_as_half(h));  // exact, subnormals included
  }
}

// The pack at element offset `i` (16-byte aligned) as raw words, loaded 16 bytes at a time.
template <InType T>
__device__ __forceinline__ void load_pack(const void* base, int64_t i, uint32_t (&w)[InTraits<T>::kWords]) {
  const uint4* p = reinterpret_cast<const uint4*>(static_cast<const char*>(base) + i * InTraits<T>::kBytes);
#pragma unroll
  for (int k = 0; k < InTraits<T>::kWords / 4; ++k) {
    const uint4 u = __ldg(p + k);
    w[4 * k] = u.x;
    w[4 * k + 1] = u.y;
    w[4 * k + 2] = u.z;
    w[4 * k + 3] = u.w;
  }
}

// Raw words -> 16 floats (every conversion here is exact).
template <InType T>
__device__ __forceinline__ void unpack(const uint32_t (&w)[InTraits<T>::kWords], float (&v)[16]) {
#pragma unroll
  for (int k = 0; k < InTraits<T>::kWords; ++k) {
    if constexpr (T == InType::kF32) {
      v[k] = __uint_as_float(w[k]);
    } else if constexpr (T == InType::kBF16) {
      v[2 * k] = __uint_as_float(w[k] << 16);
      v[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
    } else {
      v[2 * k] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[k] & 0xFFFFu)));
      v[2 * k + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[k] >> 16)));
    }
  }
}

// SmoothQuant: x / d[c] as IEEE division, as the CPU reference divides (not x * (1 / d)).
__device__ __forceinline__ void smooth_pack(const float* divisor, int64_t c, float (&v)[16]) {
  const float4* d4 = reinterpret_cast<const float4*>(divisor + c);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float4 d = __ldg(d4 + k);
    v[4 * k] = __fdiv_rn(v[4 * k], d.x);
    v[4 * k + 1] = __fdiv_rn(v[4 * k + 1], d.y);
    v[4 * k + 2] = __fdiv_rn(v[4 * k + 2], d.z);
    v[4 * k + 3] = __fdiv_rn(v[4 * k + 3], d.w);
  }
}

__device__ __forceinline__ float pack_absmax(const float (&v)[16], float m) {
#pragma unroll
  for (int j = 0; j < 16; ++j) m = fmaxf(m, fabsf(v[j]));  // fmaxf ignores NaN; Inf wins
  return m;
}

__device__ __forceinline__ void scale_pack(float (&v)[16], float inverse) {
#pragma unroll
  for (int j = 0; j < 16; ++j) v[j] = __fmul_rn(v[j], inverse);  // never fused
}

// ---- Reductions.

__device__ __forceinline__ float warp_max(float m) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  return m;
}

// Max over the whole CTA, returned to every thread. `slots` is 32 floats of shared memory that
// no thread may still be reading from a previous call: callers alternate two buffers, and the
// barrier inside each call keeps a fast warp from reusing a buffer a slow one still reads.
__device__ __forceinline__ float cta_max(float m, float* slots) {
  m = warp_max(m);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) slots[warp] = m;
  __syncthreads();
  m = lane < static_cast<int>(blockDim.x >> 5) ? slots[lane] : 0.0f;
  return warp_max(m);
}

// Adds each warp's clip count to *counter with one atomic (all 32 lanes must call this).
__device__ __forceinline__ void flush_clips(uint32_t clips, unsigned long long* counter) {
  if (counter == nullptr) return;
  unsigned long long total = clips;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xFFFFFFFFu, total, o);
  if ((threadIdx.x & 31) == 0 && total != 0) atomicAdd(counter, total);
}

// ---- n / d for a run-time invariant 32-bit d: one multiply-high, an add and a shift
// ---- (Granlund & Montgomery 1994, the round-up multiplier with a 33-bit sum).
struct FastDivmod {
  uint32_t d = 1, multiplier = 0, shift = 0;
  FastDivmod() = default;
  __host__ explicit FastDivmod(uint32_t divisor) : d(divisor) {
    while ((uint64_t{1} << shift) < divisor) ++shift;  // ceil(log2 d)
    // m = floor(2^32 (2^l - d) / d) + 1 < 2^32; 0 for d == 1 (then n / 1 = (0 + n) >> 0).
    multiplier = divisor == 1 ? 0u
                              : static_cast<uint32_t>((((uint64_t{1} << shift) - divisor) << 32) / divisor + 1);
  }
  __host__ __device__ __forceinline__ uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, multiplier);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * multiplier) >> 32);
#endif
    return static_cast<uint32_t>((static_cast<uint64_t>(hi) + n) >> shift);
  }
};

// ---- Kernel arguments (passed by value; a few hundred bytes).

struct CommonArgs {
  const void* x = nullptr;  // [rows, cols], row stride x_stride elements, column stride 1
  int64_t rows = 0, cols = 0, x_stride = 0;
  uint8_t* q = nullptr;     // [rows, cols] contiguous codes
  float* scales = nullptr;  // [scale_rows, scale_cols]
  int64_t scale_rows = 1, scale_cols = 1;
  int64_t block_rows = 1, block_cols = 1;
  const float* smooth = nullptr;          // [cols] or null
  unsigned long long* clip_count = nullptr;
  EncodeParams enc;
  ScaleParams scale;
};

// Dynamic scales, one team of threads per scale block, the block held in registers (x read once).
struct TileArgs {
  CommonArgs c;
  uint32_t num_tiles = 0;   // scale_rows * scale_cols
  int team_lanes = 32;      // sub-warp teams: lanes per team (power of two <= 32)
  int slots = 1;            // packs per thread per tile (<= InTraits::kSlots)
  FastDivmod scale_cols_div;
};

// Where the elementwise kernel's scales come from.
enum class ScaleSource : int {
  kTensor,    // scales[0] (static per-tensor)
  kBlocks,    // scales[(r / block_rows) * scale_cols + c / block_cols] (static)
  kUnit,      // 1, written to every scale (dynamic ScaleMethod::kUnit)
  kPartials,  // max over the partial absmax values of the reduction pass (dynamic per-tensor)
};

struct ElementwiseArgs {
  CommonArgs c;
  ScaleSource source = ScaleSource::kTensor;
  const float* partials = nullptr;
  int num_partials = 0;
  // Pack path: packs are numbered row-major over the matrix; (r, c) is needed only when x has
  // padded rows, a smooth divisor or block scales. Divisors are 32-bit (checked on the host).
  uint32_t total_packs = 0;
  bool need_row_col = false;
  FastDivmod packs_per_row, block_rows_div, block_cols_div;
};

struct ReduceArgs {
  CommonArgs c;
  float* partials = nullptr;  // one per CTA
  uint32_t total_packs = 0;
  bool need_row_col = false;
  FastDivmod packs_per_row;
};

}  // namespace llmq::quant_kernels
