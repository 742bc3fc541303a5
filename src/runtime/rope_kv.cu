// rope_kv (row_kernels.hpp): after the QKV projection, one CTA per token: the bias, Qwen3's q/k
// norm, the rotary embedding of q and k, q to q_out, k and v to the token's row of the paged KV
// cache (BF16, or E4M3 with a scale per kv head).
//
// Two kernels compute the same values. The vectorized one takes the layout every Hugging Face
// checkpoint we read has (pairs (j, j + head_dim/2), head_dim % 16 == 0, 16-byte aligned rows): a
// thread rotates 8 consecutive pairs of one head with two 16-byte loads and two 16-byte (E4M3:
// 8-byte) stores, or moves 8 elements of v. The general one (llama2.c's interleaved pairs, odd
// shapes) takes one pair per thread with 2-byte accesses and 64-bit index arithmetic; at 8192 rows
// of Llama-3-8B it ran at a quarter of the memory bandwidth (ncu, H200: 153 us a call).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "attention/attention.hpp"
#include "cuda/cuda_check.cuh"
#include "cuda/pdl.cuh"
#include "runtime/row_kernels.hpp"
#include "runtime/row_math.cuh"

namespace llmq::runtime {
namespace {

// The paged cache row (table row slot, position pos) maps to: block_size is a power of two (a shift
// and a mask, as the attention kernels split positions).
__device__ __forceinline__ int64_t cache_row_of(const RopeKvArgs& a, int64_t slot, int64_t pos) {
  const int shift = __ffs(static_cast<int>(a.pages.block_size)) - 1;
  const int64_t block = a.pages.block_table[slot * a.pages.table_stride + (pos >> shift)];
  return (block << shift) | (pos & ((int64_t{1} << shift) - 1));
}

// Qwen3's q/k norm: 1 / rms of each q head, then each k head, a warp per head (dynamic shared
// memory, n_heads + n_kv_heads floats), in the CPU rmsnorm's order: mean of squares, + eps,
// 1 / sqrt; the gain is applied by the caller as gain * (inv * x).
__device__ void head_inverse_rms(const RopeKvArgs& a, const uint16_t* row, float* head_inv) {
  const int64_t hd = a.head_dim, q_dim = a.n_heads * hd;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int heads = static_cast<int>(a.n_heads + a.n_kv_heads), warps = static_cast<int>(blockDim.x / 32);
  if (hd == 128 && a.bias == nullptr && reinterpret_cast<uintptr_t>(row) % 8 == 0) {
    // Head dim 128 (Qwen3): a lane's four consecutive dims in one 8-byte load, four heads' loads in
    // flight before any sum, where the general loop below waits on a chain of 2-byte loads a head
    // (Qwen3-30B-A3B shapes, 512 rows: rope_kv took 14 us a layer for 5 MB).
    constexpr int kInFlight = 4;
    for (int h0 = warp; h0 < heads; h0 += warps * kInFlight) {
      uint2 raw[kInFlight];
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) {
        const int h = h0 + i * warps;
        const int64_t base = h < a.n_heads ? h * hd : q_dim + (h - a.n_heads) * hd;
        if (h < heads) raw[i] = *reinterpret_cast<const uint2*>(row + base + 4 * lane);
      }
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) {
        const int h = h0 + i * warps;
        if (h >= heads) break;  // warp-uniform
        const float v[4] = {__uint_as_float(raw[i].x << 16), __uint_as_float(raw[i].x & 0xFFFF0000u),
                            __uint_as_float(raw[i].y << 16), __uint_as_float(raw[i].y & 0xFFFF0000u)};
        float ss = v[0] * v[0];
        ss += v[1] * v[1];
        ss += v[2] * v[2];
        ss += v[3] * v[3];
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
        if (lane == 0) head_inv[h] = __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(ss, static_cast<float>(hd)) + a.norm_eps));
      }
    }
    __syncthreads();
    return;
  }
  for (int64_t h = warp; h < heads; h += warps) {
    const int64_t base = h < a.n_heads ? h * hd : q_dim + (h - a.n_heads) * hd;
    float ss = 0.0f;
    for (int64_t d = lane; d < hd; d += 32) {
      const float v = a.bias != nullptr ? bf16_at(row, base + d) + a.bias[base + d] : bf16_at(row, base + d);
      ss += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
    if (lane == 0) head_inv[h] = __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(ss, static_cast<float>(hd)) + a.norm_eps));
  }
  __syncthreads();
}

__global__ void rope_kv_kernel(RopeKvArgs a) {
  detail::pdl_wait();
  detail::pdl_launch_dependents();
  const int64_t r = blockIdx.x;
  const int64_t hd = a.head_dim, half = hd / 2;
  const int64_t q_dim = a.n_heads * hd, kv_dim = a.n_kv_heads * hd;
  const int64_t width = q_dim + 2 * kv_dim;
  const uint16_t* row = a.qkv + r * width;
  const int64_t pos = a.position[r];
  const float* cs = a.cos_sin + pos * hd;  // (half, 2)
  const int64_t cache_row = cache_row_of(a, a.slot[r], pos) * kv_dim;
  // The bias only where there is one: + 0.0f would turn a -0 input into +0 (the CPU reference and
  // the vectorized kernel keep it).
  auto value = [&](int64_t c) { return a.bias != nullptr ? bf16_at(row, c) + a.bias[c] : bf16_at(row, c); };
  extern __shared__ float head_inv[];
  if (a.q_norm != nullptr) head_inverse_rms(a, row, head_inv);
  // Rotated pairs of q (n_heads * half) and k (n_kv_heads * half).
  const int64_t pairs = (a.n_heads + a.n_kv_heads) * half;
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int64_t head = p / half, j = p % half;
    const int64_t i0 = a.interleaved ? 2 * j : j;
    const int64_t i1 = a.interleaved ? 2 * j + 1 : j + half;
    const bool is_q = head < a.n_heads;
    const int64_t base = is_q ? head * hd : q_dim + (head - a.n_heads) * hd;
    float v0 = value(base + i0), v1 = value(base + i1);
    if (a.q_norm != nullptr) {
      const float* gain = is_q ? a.q_norm : a.k_norm;
      const float inv = head_inv[head];
      v0 = gain[i0] * (inv * v0);
      v1 = gain[i1] * (inv * v1);
    }
    const float fcr = cs[2 * j], fci = cs[2 * j + 1];
    const float o0 = v0 * fcr - v1 * fci;
    const float o1 = v0 * fci + v1 * fcr;
    if (is_q) {
      a.q_out[r * q_dim + head * hd + i0] = to_bf16(o0);
      a.q_out[r * q_dim + head * hd + i1] = to_bf16(o1);
    } else if (a.k_cache8 != nullptr) {
      const int64_t kh = head - a.n_heads;
      const float inv = __fdiv_rn(1.0f, a.k_scale[kh]);
      a.k_cache8[cache_row + kh * hd + i0] = encode(__fmul_rn(o0, inv), false);
      a.k_cache8[cache_row + kh * hd + i1] = encode(__fmul_rn(o1, inv), false);
    } else {
      const int64_t kh = head - a.n_heads;
      a.k_cache[cache_row + kh * hd + i0] = to_bf16(o0);
      a.k_cache[cache_row + kh * hd + i1] = to_bf16(o1);
    }
  }
  for (int64_t c = threadIdx.x; c < kv_dim; c += blockDim.x) {
    const float v = value(q_dim + kv_dim + c);
    if (a.v_cache8 != nullptr) a.v_cache8[cache_row + c] = encode(__fmul_rn(v, __fdiv_rn(1.0f, a.v_scale[c / hd])), false);
    else a.v_cache[cache_row + c] = to_bf16(v);
  }
}

__device__ __forceinline__ void add_bias8(const float* bias, float (&v)[8]) {
  if (bias == nullptr) return;
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] += bias[i];
}

__global__ void rope_kv_vec_kernel(RopeKvArgs a) {
  detail::pdl_wait();
  detail::pdl_launch_dependents();
  const int64_t r = blockIdx.x;
  const int hd = static_cast<int>(a.head_dim), half = hd / 2, groups = half / 8;  // 8-pair groups per head
  const int n_heads = static_cast<int>(a.n_heads), n_kv = static_cast<int>(a.n_kv_heads);
  const int q_dim = n_heads * hd, kv_dim = n_kv * hd;
  const uint16_t* row = a.qkv + r * (q_dim + 2 * kv_dim);
  const int64_t pos = a.position[r];
  const float* cs = a.cos_sin + pos * hd;  // (half, 2)
  const int64_t cache_row = cache_row_of(a, a.slot[r], pos) * kv_dim;
  extern __shared__ float head_inv[];
  if (a.q_norm != nullptr) head_inverse_rms(a, row, head_inv);
  const int qk_units = (n_heads + n_kv) * groups, units = qk_units + kv_dim / 8;
  for (int u = threadIdx.x; u < units; u += blockDim.x) {
    if (u < qk_units) {
      const int head = u / groups, j0 = (u - head * groups) * 8;
      const bool is_q = head < n_heads;
      const int base = is_q ? head * hd : q_dim + (head - n_heads) * hd;
      float v0[8], v1[8];
      load_bf16x8(row + base + j0, v0);
      load_bf16x8(row + base + half + j0, v1);
      if (a.bias != nullptr) {
        add_bias8(a.bias + base + j0, v0);
        add_bias8(a.bias + base + half + j0, v1);
      }
      if (a.q_norm != nullptr) {
        const float* gain = is_q ? a.q_norm : a.k_norm;
        const float inv = head_inv[head];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          v0[i] = gain[j0 + i] * (inv * v0[i]);
          v1[i] = gain[half + j0 + i] * (inv * v1[i]);
        }
      }
      float o0[8], o1[8];
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        const float4 c = *reinterpret_cast<const float4*>(cs + 2 * (j0 + i));  // (cos, sin) of pairs j0+i, j0+i+1
        const float fcr[2] = {c.x, c.z}, fci[2] = {c.y, c.w};
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          o0[i + t] = v0[i + t] * fcr[t] - v1[i + t] * fci[t];
          o1[i + t] = v0[i + t] * fci[t] + v1[i + t] * fcr[t];
        }
      }
      if (is_q) {
        uint16_t* q = a.q_out + r * q_dim + head * hd;
        store_bf16x8(q + j0, o0);
        store_bf16x8(q + half + j0, o1);
      } else {
        const int kh = head - n_heads;
        if (a.k_cache8 != nullptr) {
          const float inv = __frcp_rn(a.k_scale[kh]);  // = __fdiv_rn(1, scale): both round 1/x once
          uint8_t* k = a.k_cache8 + cache_row + kh * hd;
          store_codes8(k + j0, o0, inv, false);
          store_codes8(k + half + j0, o1, inv, false);
        } else {
          uint16_t* k = a.k_cache + cache_row + kh * hd;
          store_bf16x8(k + j0, o0);
          store_bf16x8(k + half + j0, o1);
        }
      }
    } else {
      const int c = (u - qk_units) * 8;
      float v[8];
      load_bf16x8(row + q_dim + kv_dim + c, v);
      if (a.bias != nullptr) add_bias8(a.bias + q_dim + kv_dim + c, v);
      if (a.v_cache8 != nullptr) store_codes8(a.v_cache8 + cache_row + c, v, __frcp_rn(a.v_scale[c / hd]), false);
      else store_bf16x8(a.v_cache + cache_row + c, v);
    }
  }
}

bool aligned(const void* p, uintptr_t bytes) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

Status rope_kv(const RopeKvArgs& a, CudaStream stream) {
  if (a.rows == 0) return {};
  if (a.head_dim % 2 != 0) return invalid_argument("rope_kv: odd head_dim " + std::to_string(a.head_dim));
  if ((a.q_norm == nullptr) != (a.k_norm == nullptr)) return invalid_argument("rope_kv: q_norm and k_norm go together");
  LLMQ_RETURN_IF_ERROR(attention::validate_kv_pages(a.pages, "rope_kv: "));
  const size_t smem = a.q_norm != nullptr ? static_cast<size_t>(a.n_heads + a.n_kv_heads) * sizeof(float) : 0;
  if (smem > 48 * 1024) return invalid_argument("rope_kv: " + std::to_string(a.n_heads + a.n_kv_heads) + " heads");
  // Every 8-element group starts 16 bytes into a 16-byte aligned row (8 for E4M3 cache rows) when
  // head_dim % 16 == 0; the widths fit int for every model (checked, with the vector count).
  const int64_t units = (a.n_heads + a.n_kv_heads) * (a.head_dim / 16) + a.n_kv_heads * a.head_dim / 8;
  const bool vec = units > 0 && !a.interleaved && a.head_dim % 16 == 0 && (a.n_heads + 2 * a.n_kv_heads) * a.head_dim < (int64_t{1} << 30) &&
                   aligned(a.qkv, 16) && aligned(a.q_out, 16) && aligned(a.k_cache, 16) && aligned(a.v_cache, 16) &&
                   aligned(a.k_cache8, 8) && aligned(a.v_cache8, 8) && aligned(a.cos_sin, 16);
  if (vec) {
    // One unit per thread at decode sizes (the row is one latency); at prefill sizes narrower CTAs,
    // more of them resident per SM.
    const int64_t cap = a.rows <= 64 ? 1024 : 128;
    const unsigned threads = static_cast<unsigned>(std::min<int64_t>(cap, (units + 31) / 32 * 32));
    LLMQ_CUDA_RETURN_IF_ERROR(detail::launch_pdl(rope_kv_vec_kernel, dim3(static_cast<unsigned>(a.rows)), dim3(threads), smem, stream, a));
    LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("rope_kv_vec_kernel");
    return {};
  }
  // A decode step has one row per sequence: a wide CTA keeps the row from being a chain of loads.
  LLMQ_CUDA_RETURN_IF_ERROR(detail::launch_pdl(rope_kv_kernel, dim3(static_cast<unsigned>(a.rows)), dim3(a.rows <= 64 ? 1024 : 256),
                                                smem, stream, a));
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("rope_kv_kernel");
  return {};
}

}  // namespace llmq::runtime
