// The per-row kernels of the GPU runtime (row_kernels.hpp). One CTA per row: rows are at most a
// few tens of thousands of elements, so a row's values sit in shared memory between the reduction
// (sum of squares, absmax) and the write, and the input is read from device memory once.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "cuda/cuda_check.cuh"
#include "cuda/pdl.cuh"
#include "cuda/quantize_kernels.cuh"
#include "cuda/quantize_numerics.cuh"
#include "parallel/peer_exchange.cuh"
#include "runtime/row_kernels.hpp"
#include "runtime/row_math.cuh"
#include "core/int_math.hpp"

namespace llmq::runtime {
namespace {

using quant_kernels::ScaleParams;

constexpr int64_t kMaxRowElems = 32768;  // 128 KB of shared memory per CTA

struct RowKernelArgs {
  RowOpArgs a;
  ScaleParams scale;
};

// Eight consecutive elements per thread and step when the row allows 16-byte accesses (n % 8 == 0
// and aligned rows: every real model), else one. At batch 1 a row is one CTA's whole work, so the
// CTA is 1024 threads wide and each thread keeps its loads few and wide: the kernel is then bound by
// its barriers, not by a chain of dependent 2-byte loads (ncu, H100: a 14336-wide SiLU + quantize row
// took 56 us with 256 threads and scalar loads, 8.4 us like this).
template <int V>
struct Vec;
template <>
struct Vec<1> {
  static __device__ __forceinline__ void load_bf16(const uint16_t* p, float (&v)[1]) { v[0] = bf16_at(p, 0); }
  static __device__ __forceinline__ void load_f32(const float* p, float (&v)[1]) { v[0] = p[0]; }
  static __device__ __forceinline__ void store_f32(float* p, const float (&v)[1]) { p[0] = v[0]; }
  static __device__ __forceinline__ void store_bf16(uint16_t* p, const float (&v)[1]) { p[0] = to_bf16(v[0]); }
  static __device__ __forceinline__ void store_codes(uint8_t* p, const float (&v)[1], float inverse, bool int8) {
    p[0] = encode(__fmul_rn(v[0], inverse), int8);
  }
};
template <>
struct Vec<8> {
  static __device__ __forceinline__ void load_bf16(const uint16_t* p, float (&v)[8]) { load_bf16x8(p, v); }
  static __device__ __forceinline__ void load_f32(const float* p, float (&v)[8]) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
  static __device__ __forceinline__ void store_f32(float* p, const float (&v)[8]) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
  static __device__ __forceinline__ void store_bf16(uint16_t* p, const float (&v)[8]) { store_bf16x8(p, v); }
  static __device__ __forceinline__ void store_codes(uint8_t* p, const float (&v)[8], float inverse, bool int8) {
    store_codes8(p, v, inverse, int8);
  }
};

__host__ __device__ constexpr bool is_glu(RowFn f) { return f == RowFn::kSiluMul || f == RowFn::kClampedSwiglu; }

// The GLU of one element pair, in the CPU reference's rounding order. The clamps are written as
// std::min / std::max are (a NaN gate or up stays NaN).
template <RowFn F>
__device__ __forceinline__ float glu(float g, float u, const RowOpArgs& a) {
  if constexpr (F == RowFn::kSiluMul) {
    return g * __frcp_rn(1.0f + expf(-g)) * u;  // __frcp_rn(x) = __fdiv_rn(1, x), fewer instructions
  } else {
    const float limit = a.glu_limit;
    const float gc = limit < g ? limit : g;
    const float ul = u < -limit ? -limit : u;
    const float uc = limit < ul ? limit : ul;
    const float gated = gc * __frcp_rn(1.0f + expf(-(gc * a.glu_alpha)));
    return (uc + 1.0f) * gated;
  }
}

// Row r's gate/up biases ([gate n, up n]) or null (RowOpArgs::glu_bias).
__device__ __forceinline__ const float* glu_bias_row(const RowOpArgs& a, int64_t r) {
  if (a.glu_bias == nullptr || a.bias_group == nullptr) return a.glu_bias;
  const int64_t g = a.bias_group[r] - a.group_begin;
  return g >= 0 && g < a.groups ? a.glu_bias + g * 2 * a.n : nullptr;
}

template <int V>
__device__ __forceinline__ void add_f32(const float* p, float (&v)[V]) {
  float b[V];
  Vec<V>::load_f32(p, b);
#pragma unroll
  for (int i = 0; i < V; ++i) v[i] += b[i];
}

// The GLU of many rows keeps a whole row of FP32 in shared memory (57 KiB at 14336 wide): at most
// 3 CTAs an SM fit, and only with the largest shared-memory carveout and at most 48 registers a
// thread (49 gave 2: ncu, H100, 512 rows of 14336, 1.94 waves where 1.29 would do).
template <RowFn F>
constexpr int kRowOpMaxRegisters = is_glu(F) ? 48 : 64;

template <RowFn F, RowOut O, int V>
__global__ void __launch_bounds__(1024) __maxnreg__(kRowOpMaxRegisters<F>) row_op_kernel(RowKernelArgs args) {
  detail::pdl_wait();
  detail::pdl_launch_dependents();
  extern __shared__ float vals[];
  __shared__ float red[32];
  const RowOpArgs& a = args.a;
  const int64_t r = blockIdx.x;
  const int64_t n = a.n;
  const int64_t step = static_cast<int64_t>(blockDim.x) * V;
  const int64_t first = static_cast<int64_t>(threadIdx.x) * V;
  if constexpr (F == RowFn::kAddRmsNorm) {
    const int64_t in_row = a.row_index != nullptr ? a.row_index[r] : r;
    float* x = a.x + in_row * n;
    float ss = 0.0f;
    for (int64_t j = first; j < n; j += step) {
      float v[V];
      Vec<V>::load_f32(x + j, v);
      if (a.delta != nullptr) {
        float d[V];
        Vec<V>::load_bf16(a.delta + in_row * n + j, d);
        if (a.delta_bias != nullptr) add_f32<V>(a.delta_bias + j, d);
#pragma unroll
        for (int i = 0; i < V; ++i) v[i] += d[i];
        Vec<V>::store_f32(x + j, v);
      }
#pragma unroll
      for (int i = 0; i < V; ++i) ss += v[i] * v[i];
      Vec<V>::store_f32(vals + j, v);
    }
    // run.c's order: mean of squares, + eps, 1 / sqrt, then gain * (inv * x).
    const float total = cta_sum(ss, red);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(total, static_cast<float>(n)) + a.eps));
    for (int64_t j = first; j < n; j += step) {
      float v[V], g[V];
      Vec<V>::load_f32(vals + j, v);
      Vec<V>::load_f32(a.gain + j, g);
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = g[i] * (inv * v[i]);
      Vec<V>::store_f32(vals + j, v);
    }
  } else if constexpr (is_glu(F)) {
    const uint16_t* gu = a.src + r * 2 * n;
    const float* bias = glu_bias_row(a, r);
    for (int64_t j = first; j < n; j += step) {
      float g[V], u[V];
      Vec<V>::load_bf16(gu + j, g);
      Vec<V>::load_bf16(gu + n + j, u);
      if (bias != nullptr) {
        add_f32<V>(bias + j, g);
        add_f32<V>(bias + n + j, u);
      }
#pragma unroll
      for (int i = 0; i < V; ++i) g[i] = glu<F>(g[i], u[i], a);
      Vec<V>::store_f32(vals + j, g);
    }
  } else {
    for (int64_t j = first; j < n; j += step) {
      float v[V];
      Vec<V>::load_bf16(a.src + r * n + j, v);
      Vec<V>::store_f32(vals + j, v);
    }
  }

  if constexpr (O == RowOut::kBF16) {
    for (int64_t j = first; j < n; j += step) {
      float v[V];
      Vec<V>::load_f32(vals + j, v);
      Vec<V>::store_bf16(a.out_bf16 + r * n + j, v);
    }
  } else {
    if (a.out_bf16 != nullptr)  // the BF16 values too (an MoE router reads them)
      for (int64_t j = first; j < n; j += step) {
        float v[V];
        Vec<V>::load_f32(vals + j, v);
        Vec<V>::store_bf16(a.out_bf16 + r * n + j, v);
      }
    const bool int8 = a.spec.format == DType::kI8;
    float s;
    if constexpr (O == RowOut::kCodesPerToken) {
      float m = 0.0f;
      for (int64_t j = first; j < n; j += step) {
        float v[V];
        Vec<V>::load_f32(vals + j, v);
#pragma unroll
        for (int i = 0; i < V; ++i) m = fmaxf(m, fabsf(v[i]));  // NaN ignored
      }
      s = quant_kernels::scale_from_absmax(cta_max(m, red), args.scale);
    } else {
      s = a.static_scale;
    }
    const float inverse = __fdiv_rn(1.0f, s);
    uint8_t* codes = static_cast<uint8_t*>(a.codes) + r * n;
    for (int64_t j = first; j < n; j += step) {
      float v[V];
      Vec<V>::load_f32(vals + j, v);
      Vec<V>::store_codes(codes + j, v, inverse, int8);
    }
    if (threadIdx.x == 0) a.scales[r] = s;
  }
}

// The decode-size form: a row is at most 2 x 8 elements per thread of one CTA, held in registers
// from the first load to the last store (no shared-memory round trips), and the norm gain, which no
// earlier kernel writes, is loaded before the programmatic-launch wait so that its latency hides
// behind the previous kernel.
template <RowFn F, RowOut O, int C, bool kPeer>
__device__ __forceinline__ void row_op_registers(const RowKernelArgs& args) {
  __shared__ float red[32];
  const RowOpArgs& a = args.a;
  const int64_t r = blockIdx.x;
  const int64_t n = a.n;
  int64_t at[C];
  bool on[C];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    at[c] = (static_cast<int64_t>(c) * blockDim.x + threadIdx.x) * 8;
    on[c] = at[c] < n;
  }
  float v[C][8];
  float g[C][8];
  if constexpr (F == RowFn::kAddRmsNorm) {
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (on[c]) Vec<8>::load_f32(a.gain + at[c], g[c]);
  }
  detail::pdl_wait();
  detail::pdl_launch_dependents();
  if constexpr (F == RowFn::kAddRmsNorm) {
    const int64_t in_row = a.row_index != nullptr ? a.row_index[r] : r;
    float* x = a.x + in_row * n;
    float ss = 0.0f;
    // Tensor parallelism: the delta is the sum over the ranks' rows (parallel/peer_exchange.cuh).
    const bool peer = kPeer && a.peer.ranks > 1;
    const uint16_t* delta_row = a.delta != nullptr ? a.delta + in_row * n : nullptr;
    const uint32_t call = peer ? parallel::peer_row_call(a.peer) : 0;
    if (peer) {
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (on[c]) parallel::peer_row_push(a.peer, call, delta_row, r, n, at[c]);
      parallel::peer_handshake(a.peer.flags, a.peer.rank, a.peer.ranks, static_cast<int>(kRowPeerMaxRows), static_cast<int>(r), call);
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
      if (!on[c]) continue;
      Vec<8>::load_f32(x + at[c], v[c]);
      if (a.delta != nullptr) {
        float d[8];
        if (peer) parallel::peer_row_delta(a.peer, call, delta_row, r, n, at[c], d);
        else Vec<8>::load_bf16(delta_row + at[c], d);
        if (a.delta_bias != nullptr) add_f32<8>(a.delta_bias + at[c], d);  // after the ranks' sum
#pragma unroll
        for (int i = 0; i < 8; ++i) v[c][i] += d[i];
        Vec<8>::store_f32(x + at[c], v[c]);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += v[c][i] * v[c][i];
    }
    const float total = cta_sum(ss, red);  // its barrier: every thread is done with the staging rows
    if (peer) parallel::peer_row_done(a.peer, call);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(total, static_cast<float>(n)) + a.eps));
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int i = 0; i < 8; ++i) v[c][i] = g[c][i] * (inv * v[c][i]);
  } else if constexpr (is_glu(F)) {
    const uint16_t* gu = a.src + r * 2 * n;
    const float* bias = glu_bias_row(a, r);
#pragma unroll
    for (int c = 0; c < C; ++c) {
      if (!on[c]) continue;
      Vec<8>::load_bf16(gu + at[c], v[c]);
      Vec<8>::load_bf16(gu + n + at[c], g[c]);
      if (bias != nullptr) {
        add_f32<8>(bias + at[c], v[c]);
        add_f32<8>(bias + n + at[c], g[c]);
      }
    }
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int i = 0; i < 8; ++i) v[c][i] = glu<F>(v[c][i], g[c][i], a);
  } else {
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (on[c]) Vec<8>::load_bf16(a.src + r * n + at[c], v[c]);
  }
  if constexpr (O == RowOut::kBF16) {
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (on[c]) Vec<8>::store_bf16(a.out_bf16 + r * n + at[c], v[c]);
  } else {
    if (a.out_bf16 != nullptr)  // the BF16 values too (an MoE router reads them)
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (on[c]) Vec<8>::store_bf16(a.out_bf16 + r * n + at[c], v[c]);
    const bool int8 = a.spec.format == DType::kI8;
    float s;
    if constexpr (O == RowOut::kCodesPerToken) {
      float m = 0.0f;
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (on[c])
#pragma unroll
          for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(v[c][i]));  // NaN ignored
      s = quant_kernels::scale_from_absmax(cta_max(m, red), args.scale);
    } else {
      s = a.static_scale;
    }
    const float inverse = __fdiv_rn(1.0f, s);
    uint8_t* codes = static_cast<uint8_t*>(a.codes) + r * n;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      if (!on[c]) continue;
      store_codes8(codes + at[c], v[c], inverse, int8);
    }
    if (threadIdx.x == 0) a.scales[r] = s;
  }
}

template <RowFn F, RowOut O, int C, bool kPeer>
__global__ void __launch_bounds__(1024) row_op_registers_kernel(RowKernelArgs args) {
  row_op_registers<F, O, C, kPeer>(args);
}

// Add + RMSNorm of one chunk without the tensor-parallel exchange, held to 40 registers so that
// three 512-thread CTAs share an SM (ncu, H200, 512 rows of 4096 to E4M3: 10.16 -> 8.92 us; one
// row 3.98 -> 3.73). Its own kernel: __maxnreg__ on the shared one changed the other functions'
// code too (the copy's took 36 registers where it had taken 30, and ran slower).
template <RowOut O>
__global__ void __maxnreg__(40) row_op_norm_registers_kernel(RowKernelArgs args) {
  row_op_registers<RowFn::kAddRmsNorm, O, 1, false>(args);
}

// The GLU of many rows (prefill, and decode steps of more than 64 rows), held in registers: C
// chunks of 8 (gate, up) pairs a thread, every chunk's two 16-byte loads issued before the first
// is used so that a thread keeps 2C loads in flight, and CTAs of at most 448 threads light enough
// (72 registers: 512 threads and 64 spilled at C = 4) for two an SM, one's reduction and stores
// overlapping the other's loads. Rows up to 448 x 8 x 4 = 14336 wide (Llama-3-8B's, 70B's at TP=2);
// wider ones keep the shared-memory form, which holds one chunk's loads in flight. ncu, H200, 2048
// rows of 14336 to E4M3: 70.4 us in the shared-memory form, 58.8 here, 51.4 with store_codes8 (the
// bytes floor is ~31 us; the kernel is bound by instruction issue: expf, the exact 1 / x).
constexpr int kGluRowsThreads = 448;
constexpr int kGluRowsMaxChunks = 4;

template <RowFn F, RowOut O, int C>
__global__ void __launch_bounds__(kGluRowsThreads, 2) row_op_glu_kernel(RowKernelArgs args) {
  __shared__ float red[32];
  detail::pdl_wait();
  detail::pdl_launch_dependents();
  const RowOpArgs& a = args.a;
  const int64_t r = blockIdx.x;
  const int64_t n = a.n;
  const uint16_t* gu = a.src + r * 2 * n;
  // Column offsets in 32 bits (n <= kMaxRowElems): 64-bit ones spilled at C = 4.
  const int step = static_cast<int>(blockDim.x) * 8;
  const int first = static_cast<int>(threadIdx.x) * 8;
  const int width = static_cast<int>(n);
  uint4 raw_g[C], raw_u[C];
#pragma unroll
  for (int c = 0; c < C; ++c)
    if (first + c * step < width) {
      raw_g[c] = *reinterpret_cast<const uint4*>(gu + first + c * step);
      raw_u[c] = *reinterpret_cast<const uint4*>(gu + width + first + c * step);
    }
  const float* bias = glu_bias_row(a, r);
  float v[C][8];
  float m = 0.0f;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    if (first + c * step >= width) continue;
    float g[8], u[8];
    unpack_bf16x8(raw_g[c], g);
    unpack_bf16x8(raw_u[c], u);
    if (bias != nullptr) {
      add_f32<8>(bias + first + c * step, g);
      add_f32<8>(bias + n + first + c * step, u);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v[c][i] = glu<F>(g[i], u[i], a);
      m = fmaxf(m, fabsf(v[c][i]));  // NaN ignored
    }
  }
  if constexpr (O == RowOut::kBF16) {
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (first + c * step < width) Vec<8>::store_bf16(a.out_bf16 + r * n + first + c * step, v[c]);
  } else {
    if (a.out_bf16 != nullptr)
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (first + c * step < width) Vec<8>::store_bf16(a.out_bf16 + r * n + first + c * step, v[c]);
    const bool int8 = a.spec.format == DType::kI8;
    float s;
    if constexpr (O == RowOut::kCodesPerToken) s = quant_kernels::scale_from_absmax(cta_max(m, red), args.scale);
    else s = a.static_scale;
    const float inverse = __fdiv_rn(1.0f, s);
    uint8_t* codes = static_cast<uint8_t*>(a.codes) + r * n;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      if (first + c * step >= width) continue;
      store_codes8(codes + first + c * step, v[c], inverse, int8);
    }
    if (threadIdx.x == 0) a.scales[r] = s;
  }
}

template <RowFn F, RowOut O, int V>
Status launch_row_op_v(const RowKernelArgs& args, int threads, CudaStream stream) {
  const size_t smem = static_cast<size_t>(args.a.n) * sizeof(float);
  if (smem > 48 * 1024) {
    LLMQ_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(row_op_kernel<F, O, V>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(kMaxRowElems * sizeof(float))));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(row_op_kernel<F, O, V>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                   static_cast<int>(cudaSharedmemCarveoutMaxShared)));
  }
  LLMQ_CUDA_RETURN_IF_ERROR(detail::launch_pdl(row_op_kernel<F, O, V>, dim3(static_cast<unsigned>(args.a.rows)),
                                                dim3(static_cast<unsigned>(threads)), smem, stream, args));
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("row_op_kernel");
  return {};
}


bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <RowFn F, RowOut O>
Status launch_row_op(const RowKernelArgs& args, CudaStream stream) {
  const RowOpArgs& a = args.a;
  // Few rows (decode): one wide CTA per row; many rows (prefill): narrower CTAs, more per SM.
  const int64_t per_thread = a.rows <= 64 ? 8 : 32;
  int threads = static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(32, (a.n / per_thread + 31) / 32 * 32)));
  const bool vec = a.n % 8 == 0 && aligned16(a.x) && aligned16(a.delta) && aligned16(a.gain) && aligned16(a.src) &&
                   aligned16(a.out_bf16) && aligned16(a.codes) && aligned16(a.delta_bias) && aligned16(a.glu_bias);
  // The GLU of more than 64 rows: row_op_glu_kernel (C chunks a thread, 448-thread CTAs, two an
  // SM) up to 14336 wide. The register kernel below, one chunk a thread in CTAs up to 1024 wide,
  // fit one such CTA an SM for it (896 threads at 14336: each row's load, reduction and store ran
  // one after another, 337 us at 8192 rows on an H100).
  if constexpr (is_glu(F)) {
    const int64_t vecs = a.n / 8;
    const int64_t chunks = ceil_div(vecs, int64_t{kGluRowsThreads});
    if (vec && a.rows > 64 && chunks <= kGluRowsMaxChunks) {
      const unsigned t = static_cast<unsigned>((ceil_div(vecs, chunks) + 31) / 32 * 32);
      auto kernel = chunks == 1   ? row_op_glu_kernel<F, O, 1>
                    : chunks == 2 ? row_op_glu_kernel<F, O, 2>
                    : chunks == 3 ? row_op_glu_kernel<F, O, 3>
                                  : row_op_glu_kernel<F, O, 4>;
      LLMQ_CUDA_RETURN_IF_ERROR(detail::launch_pdl(kernel, dim3(static_cast<unsigned>(a.rows)), dim3(t), 0, stream, args));
      LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("row_op_glu_kernel");
      return {};
    }
  }
  // Registers: 8 elements per thread, once (n <= 8192) or twice (n <= 16384): every decode step, and
  // the norms and copies of prefill steps too (ncu, H100, 8192 rows of add + RMSNorm + quantize, 4096
  // wide: 129 us, 85% of the memory bandwidth).
  if (vec && (a.rows <= 64 || !is_glu(F))) {
    const int64_t vecs = a.n / 8;
    const int chunks = vecs <= 1024 ? 1 : (vecs <= 2048 ? 2 : 0);
    if (chunks > 0) {
      const unsigned t = static_cast<unsigned>((ceil_div(vecs, chunks) + 31) / 32 * 32);
      // The tensor-parallel exchange is its own instance: its code held the plain norm at 64
      // registers (row_op_norm_registers_kernel).
      constexpr bool kNorm = F == RowFn::kAddRmsNorm;
      const bool peer = kNorm && a.peer.ranks > 1;
      void (*kernel)(RowKernelArgs) = nullptr;
      if constexpr (kNorm)
        kernel = chunks == 1 ? (peer ? row_op_registers_kernel<F, O, 1, true> : row_op_norm_registers_kernel<O>)
                             : (peer ? row_op_registers_kernel<F, O, 2, true> : row_op_registers_kernel<F, O, 2, false>);
      else
        kernel = chunks == 1 ? row_op_registers_kernel<F, O, 1, false> : row_op_registers_kernel<F, O, 2, false>;
      LLMQ_CUDA_RETURN_IF_ERROR(detail::launch_pdl(kernel, dim3(static_cast<unsigned>(a.rows)), dim3(t), 0, stream, args));
      return {};
    }
  }
  if (vec) return launch_row_op_v<F, O, 8>(args, threads, stream);
  return launch_row_op_v<F, O, 1>(args, threads, stream);
}

template <RowFn F>
Status dispatch_out(const RowKernelArgs& args, CudaStream stream) {
  switch (args.a.out) {
    case RowOut::kBF16: return launch_row_op<F, RowOut::kBF16>(args, stream);
    case RowOut::kCodesPerToken: return launch_row_op<F, RowOut::kCodesPerToken>(args, stream);
    case RowOut::kCodesStatic: return launch_row_op<F, RowOut::kCodesStatic>(args, stream);
  }
  return invalid_argument("row_op: unknown output kind");
}

__global__ void embedding_kernel(const int32_t* tokens, const void* table, bool table_f32, int64_t dim, float* x) {
  detail::pdl_wait();
  detail::pdl_launch_dependents();
  const int64_t r = blockIdx.x;
  const int64_t t = tokens[r];
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
    x[r * dim + j] = table_f32 ? static_cast<const float*>(table)[t * dim + j]
                               : bf16_at(static_cast<const uint16_t*>(table), t * dim + j);
}

__global__ void broadcast_scale_kernel(float* scales, int64_t rows) {
  detail::pdl_wait();
  detail::pdl_launch_dependents();
  const float s = scales[0];
  for (int64_t i = 1 + blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += gridDim.x * blockDim.x) scales[i] = s;
}

}  // namespace

Status embedding(const int32_t* tokens, int64_t rows, const void* table, bool table_f32, int64_t dim, float* x,
                 CudaStream stream) {
  if (rows == 0) return {};
  LLMQ_CUDA_RETURN_IF_ERROR(detail::launch_pdl(embedding_kernel, dim3(static_cast<unsigned>(rows)), dim3(rows <= 64 ? 1024 : 256), 0,
                                                stream, tokens, table, table_f32, dim, x));
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("embedding_kernel");
  return {};
}

bool row_op_fuses_peer_sum(int64_t rows, int64_t n, int ranks, int64_t slot_elements) {
  return rows >= 1 && rows <= kRowPeerMaxRows && n % 8 == 0 && n / 8 <= 2048 && ranks >= 2 &&
         rows * n * (ranks - 1) <= slot_elements;
}

Status row_op(const RowOpArgs& a, CudaStream stream) {
  if (a.rows == 0) return {};
  if (a.peer.ranks > 1 && (a.fn != RowFn::kAddRmsNorm || a.delta == nullptr ||
                           !row_op_fuses_peer_sum(a.rows, a.n, a.peer.ranks, a.peer.slot_elements) ||
                           !aligned16(a.x) || !aligned16(a.delta) || !aligned16(a.gain) || !aligned16(a.out_bf16) ||
                           !aligned16(a.codes) || !aligned16(a.delta_bias) || a.peer.ranks > kRowPeerMaxRanks))
    return invalid_argument("row_op: the peer sum runs in the decode norm kernel only (" + std::to_string(a.rows) + " rows of " +
                            std::to_string(a.n) + ")");
  if (a.n <= 0 || a.n > kMaxRowElems)
    return invalid_argument("row_op: row width " + std::to_string(a.n) + " outside [1, " + std::to_string(kMaxRowElems) + "]");
  if (a.out != RowOut::kBF16 && a.spec.format != DType::kE4M3 && a.spec.format != DType::kI8)
    return unsupported(std::string("row_op: fused quantize writes e4m3 or int8, not ") + dtype_name(a.spec.format));
  RowKernelArgs args{a, {}};
  if (a.out == RowOut::kCodesPerToken) args.scale = quant_kernels::scale_params(a.spec);
  switch (a.fn) {
    case RowFn::kAddRmsNorm: return dispatch_out<RowFn::kAddRmsNorm>(args, stream);
    case RowFn::kSiluMul: return dispatch_out<RowFn::kSiluMul>(args, stream);
    case RowFn::kClampedSwiglu: return dispatch_out<RowFn::kClampedSwiglu>(args, stream);
    case RowFn::kCopy: return dispatch_out<RowFn::kCopy>(args, stream);
  }
  return invalid_argument("row_op: unknown function");
}

Status broadcast_scale(float* scales, int64_t rows, CudaStream stream) {
  if (rows <= 1) return {};
  LLMQ_CUDA_RETURN_IF_ERROR(detail::launch_pdl(broadcast_scale_kernel, dim3(grid_for(rows)), dim3(256), 0, stream, scales, rows));
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("broadcast_scale_kernel");
  return {};
}

}  // namespace llmq::runtime
