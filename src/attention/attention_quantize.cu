// cuda_quantize_attention_inputs (include/llmq/cuda_attention_int8.hpp): BF16 Q, K, V -> the 8-bit
// attention kernels' inputs, bit for bit as the CPU specification quantizes them
// (src/ref/quant_attention.cpp; the tests' host copy is tests/attention_quant_support.hpp). The op
// is memory bound: every input byte is read once (K twice with smooth_k) and every code written once.
//   Q and K (qk_rows_kernel, one launch for both): a team of d / 8 lanes (rounded up to a power of
//     two) per (token, head) row, one 16-byte load of 8 BF16 per lane, the row's absmax by shuffles
//     within the team, 8 codes per lane in one 8-byte store. A CTA takes consecutive tokens of one
//     head, so its head-major scales are one contiguous run.
//   V (v_blocks_kernel): a CTA per (v_block-key block, kv head), v_block 64 or 128. Thread (kappa
//     quad, channel octet) loads the four keys of its kappa quad (rows base, base+1, base+8, base+9:
//     attention_v_t_column) for 8 channels, so after the per-channel absmax (shared memory across
//     the block's quads) each of its 8 channels' 4 codes are one word of the transposed row already
//     in kappa order; the words meet in shared memory and leave as coalesced 16-byte stores of
//     v_block-byte row pieces of v_t. Keys past kv_len load as 0 and encode to 0, which is the zero
//     padding of v_t.
//   V per channel (v_block 0, E4M3): v_channel_absmax_kernel takes each channel's absmax over all
//     keys into v_scale (zeroed first), v_blocks_kernel quantizes 128-key blocks with the scales
//     that gives, and v_channel_scale_kernel turns the absmax into the scale once they all read it.
//   smooth_k (k_mean_partial_kernel, k_mean_finalize_kernel): per-channel sums of K over chunks of
//     128 tokens in double, then the mean, as the specification computes it (double sum, float
//     cast); the K rows then subtract it in float before the absmax.
// Numerics (quantize_numerics.cuh, the library's device ports of its encoders): scale = absmax / 127
// (or / 448) and inv = 1 / scale in correctly rounded float division, x * inv correctly rounded,
// INT8 RNE saturating to [-128, 127] (int8_rne_bits), E4M3 RNE satfinite (the hardware cvt on
// sm_89+, the integer encoder in the compute_80 PTX). An all-zero row or block gets scale 1.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/cuda_check.cuh"
#include "cuda/quantize_kernels.cuh"
#include "cuda/quantize_numerics.cuh"
#include "llmq/cuda_attention_int8.hpp"
#include "llmq/quant_spec.hpp"

namespace llmq {
namespace {

namespace qk = quant_kernels;

constexpr int kThreads = 256;         // Q/K and mean kernels
constexpr int kRowsPerTeam = 4;       // rows a team loads before it reduces: 64 bytes in flight per lane
constexpr int kMeanChunk = 128;       // tokens per CTA of the smooth_k partial sums (enough CTAs to fill the GPU)
constexpr int kMaxHeadDim = 256;
static_assert(kMeanChunk >= 16, "the partial sums (8 bytes per channel per chunk) must fit in k8");

// ---- Shared pieces.

// 8 BF16 (one 16-byte load) -> 8 floats (exact): a BF16 is the top half of the float with the
// same bits, so the low element of each word shifts up and the high one is masked. (Measured on an
// H100: the uint4 reinterpreted as __nv_bfloat162 for __bfloat1622float2 made the Q/K pass 15% slower.)
__device__ __forceinline__ void bf16x8_to_float(const uint4& u, float (&v)[8]) {
  v[0] = __uint_as_float(u.x << 16);
  v[1] = __uint_as_float(u.x & 0xFFFF0000u);
  v[2] = __uint_as_float(u.y << 16);
  v[3] = __uint_as_float(u.y & 0xFFFF0000u);
  v[4] = __uint_as_float(u.z << 16);
  v[5] = __uint_as_float(u.z & 0xFFFF0000u);
  v[6] = __uint_as_float(u.w << 16);
  v[7] = __uint_as_float(u.w & 0xFFFF0000u);
}

// Four scaled values -> four code bytes (value j in byte j), INT8 or E4M3.
template <bool kFp8>
__device__ __forceinline__ uint32_t encode4(float a, float b, float c, float d, const qk::EncodeParams& enc) {
  if constexpr (kFp8) {
    return qk::encode_fp8x2_hw<qk::Encoder::kE4M3Hw>(a, b, enc) | (qk::encode_fp8x2_hw<qk::Encoder::kE4M3Hw>(c, d, enc) << 16);
  } else {
    return qk::pack_low_bytes(qk::int8_rne_bits(a), qk::int8_rne_bits(b), qk::int8_rne_bits(c), qk::int8_rne_bits(d));
  }
}

// The specification's scale of a row or block with absmax m: m / max_code, 1 when all zero.
template <bool kFp8>
__device__ __forceinline__ float scale_of(float m) {
  return m > 0.f ? qk::div_rn(m, kFp8 ? 448.f : 127.f) : 1.f;
}

// ---- Q and K: one row (token, head) of d channels per team.

struct RowsPart {
  const uint16_t* x = nullptr;  // BF16, token t of head h at x + t * row_stride + h * d
  int64_t row_stride = 0;
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t chunks = 0;           // CTAs per head
  int8_t* codes = nullptr;      // [tokens, heads, d]
  float* scales = nullptr;      // [heads, tokens]
  const float* mean = nullptr;  // smooth_k: [heads, d] subtracted before the absmax, else null
};

struct RowsParams {
  RowsPart q, k;
  int64_t q_ctas = 0;  // CTAs [0, q_ctas) take Q, the rest K
  int d = 0;
  qk::EncodeParams enc;  // E4M3 facts for the integer encoder of the compute_80 PTX
};

template <int kTeam, bool kFp8>
__global__ void __launch_bounds__(kThreads) qk_rows_kernel(const RowsParams p) {
  constexpr int kTeams = kThreads / kTeam;
  const bool is_k = blockIdx.x >= p.q_ctas;
  const RowsPart part = is_k ? p.k : p.q;
  const int64_t b = static_cast<int64_t>(blockIdx.x) - (is_k ? p.q_ctas : 0);
  const int64_t head = b / part.chunks, t0 = (b % part.chunks) * (kTeams * kRowsPerTeam);
  const int team = threadIdx.x / kTeam, lane = threadIdx.x % kTeam;
  const int c0 = lane * 8;
  const bool has_channels = c0 < p.d;  // d / 8 need not be a power of two: the team's spare lanes idle

  float mean[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (part.mean != nullptr && has_channels) {
#pragma unroll
    for (int i = 0; i < 8; ++i) mean[i] = __ldg(part.mean + head * p.d + c0 + i);
  }
  // All loads first (64 bytes in flight per lane), then the reductions. Rows u of a team are
  // kTeams tokens apart so that each u's scale stores from the CTA are contiguous.
  uint4 raw[kRowsPerTeam];
#pragma unroll
  for (int u = 0; u < kRowsPerTeam; ++u) {
    const int64_t t = t0 + u * kTeams + team;
    raw[u] = make_uint4(0, 0, 0, 0);
    if (t < part.tokens && has_channels)
      raw[u] = __ldg(reinterpret_cast<const uint4*>(part.x + t * part.row_stride + head * p.d + c0));
  }
#pragma unroll
  for (int u = 0; u < kRowsPerTeam; ++u) {
    const int64_t t = t0 + u * kTeams + team;
    float v[8];
    bf16x8_to_float(raw[u], v);
    if (part.mean != nullptr) {  // uniform per CTA
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = qk::add_rn(v[i], -mean[i]);  // the specification's float subtraction
    }
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(v[i]));
    if (!has_channels) m = 0.f;  // spare lanes hold -mean
    // Every lane reaches the shuffles, rows past the end too (they hold zeros and store nothing).
#pragma unroll
    for (int off = kTeam / 2; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
    const float s = scale_of<kFp8>(m), inv = qk::div_rn(1.f, s);
    if (t >= part.tokens) continue;
    if (has_channels) {
      uint2 w;
      w.x = encode4<kFp8>(qk::mul_rn(v[0], inv), qk::mul_rn(v[1], inv), qk::mul_rn(v[2], inv), qk::mul_rn(v[3], inv), p.enc);
      w.y = encode4<kFp8>(qk::mul_rn(v[4], inv), qk::mul_rn(v[5], inv), qk::mul_rn(v[6], inv), qk::mul_rn(v[7], inv), p.enc);
      *reinterpret_cast<uint2*>(part.codes + (t * part.heads + head) * p.d + c0) = w;
    }
    if (lane == 0) part.scales[head * part.tokens + t] = s;
  }
}

// ---- V: one (kBlock-key block, kv head) per CTA of kBlock / 4 * d / 8 threads.

struct VParams {
  const uint16_t* v = nullptr;
  int64_t row_stride = 0, kv_len = 0, kv_heads = 0, tiles = 0, v_t_stride = 0;
  int d = 0;
  int8_t* v_t = nullptr;      // [kv_heads, d, v_t_stride]
  float* v_scale = nullptr;   // [kv_heads, tiles, d]; per channel: [kv_heads, d], the absmax until v_channel_scale_kernel
  bool per_channel = false;   // v_block 0: every block takes its channels' absmax over all keys from v_scale
  qk::EncodeParams enc;
};

// Byte offset of kappa quad q (kappa 4q .. 4q + 3) of channel c in the CTA's transposed block
// (d rows of kBlock bytes). The 16-byte chunk is XOR-swizzled by the channel octet so that the 16
// octets of a warp's word stores spread over 4 banks' groups instead of one; the 16-byte reads of
// the store-out pass stay whole chunks.
template <int kBlock>
__device__ __forceinline__ int vt_smem_offset(int c, int q) {
  return c * kBlock + (((q / 4) ^ ((c / 8) & 3)) * 16) + (q % 4) * 4;
}

template <bool kFp8, int kBlock>
__global__ void v_blocks_kernel(const VParams p) {
  constexpr int kVQuads = kBlock / 4;
  extern __shared__ float smem[];
  float* red = smem;                    // [kVQuads][d] per-quad channel absmax
  float* inv_s = red + kVQuads * p.d;   // [d]
  unsigned char* vt = reinterpret_cast<unsigned char*>(inv_s + p.d);  // [d][kBlock] codes, kappa order
  const int octets = p.d / 8;
  const int o = threadIdx.x % octets, q = threadIdx.x / octets, c0 = 8 * o;
  const int64_t g = blockIdx.y, j = blockIdx.x;
  // Kappa quad q holds keys base, base + 1, base + 8, base + 9 of the block (attention_v_t_column).
  const int base = 32 * (q / 8) + 16 * ((q % 8) / 4) + 2 * (q % 4);
  const int rows[4] = {base, base + 1, base + 8, base + 9};
  float v[4][8];
  {
    uint4 raw[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t key = j * kBlock + rows[r];
      raw[r] = make_uint4(0, 0, 0, 0);  // keys past kv_len: code 0, v_t's padding
      if (key < p.kv_len) raw[r] = __ldg(reinterpret_cast<const uint4*>(p.v + key * p.row_stride + g * p.d + c0));
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) bf16x8_to_float(raw[r], v[r]);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float m = 0.f;
#pragma unroll
    for (int r = 0; r < 4; ++r) m = fmaxf(m, fabsf(v[r][i]));
    red[q * p.d + c0 + i] = m;
  }
  __syncthreads();
  for (int c = threadIdx.x; c < p.d; c += blockDim.x) {
    float m = 0.f;
    if (p.per_channel) {
      m = p.v_scale[g * p.d + c];  // written by v_channel_absmax_kernel
    } else {
      for (int k = 0; k < kVQuads; ++k) m = fmaxf(m, red[k * p.d + c]);
    }
    const float s = scale_of<kFp8>(m);
    inv_s[c] = qk::div_rn(1.f, s);
    if (!p.per_channel && j < p.tiles) p.v_scale[(g * p.tiles + j) * p.d + c] = s;  // past them: a block of padding
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float inv = inv_s[c0 + i];
    *reinterpret_cast<uint32_t*>(vt + vt_smem_offset<kBlock>(c0 + i, q)) =
        encode4<kFp8>(qk::mul_rn(v[0][i], inv), qk::mul_rn(v[1][i], inv), qk::mul_rn(v[2][i], inv),
                      qk::mul_rn(v[3][i], inv), p.enc);
  }
  __syncthreads();
  // d rows x kBlock / 16 chunks of 16 bytes: consecutive threads write one row's kBlock bytes, then
  // the next row's.
  constexpr int kChunks = kBlock / 16;
  int8_t* out = p.v_t + g * p.d * p.v_t_stride + j * kBlock;
  for (int idx = threadIdx.x; idx < kChunks * p.d; idx += blockDim.x) {
    const int c = idx / kChunks, k = idx % kChunks;
    *reinterpret_cast<uint4*>(out + c * p.v_t_stride + 16 * k) =
        *reinterpret_cast<const uint4*>(vt + vt_smem_offset<kBlock>(c, 4 * k));
  }
}

// ---- V per channel (v_block 0): the channels' absmax over all keys first, then the blocks.

constexpr int kChannelChunk = 512;  // keys per CTA of the absmax

// Grid (chunks, kv heads), kThreads threads: thread (row r, octet o) takes 8 channels of keys r,
// r + rows, .. of its chunk; the CTA's maxima go to v_scale (zeroed before) by an integer atomicMax,
// which orders non-negative floats as their bits do.
__global__ void __launch_bounds__(kThreads) v_channel_absmax_kernel(const VParams p) {
  __shared__ float red[kThreads * 8];  // [rows][d], rows * d <= 8 kThreads
  const int octets = p.d / 8, rows = kThreads / octets;
  const int o = threadIdx.x % octets, r = threadIdx.x / octets;
  const int64_t g = blockIdx.y, t0 = static_cast<int64_t>(blockIdx.x) * kChannelChunk;
  const int64_t t1 = t0 + kChannelChunk < p.kv_len ? t0 + kChannelChunk : p.kv_len;
  if (r < rows) {
    float m[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int64_t t = t0 + r; t < t1; t += rows) {
      float x[8];
      bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(p.v + t * p.row_stride + g * p.d + 8 * o)), x);
#pragma unroll
      for (int i = 0; i < 8; ++i) m[i] = fmaxf(m[i], fabsf(x[i]));
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) red[r * p.d + 8 * o + i] = m[i];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < p.d; c += blockDim.x) {
    float m = 0.f;
    for (int k = 0; k < rows; ++k) m = fmaxf(m, red[k * p.d + c]);
    atomicMax(reinterpret_cast<int*>(p.v_scale + g * p.d + c), __float_as_int(m));
  }
}

// The absmax in v_scale turned into the scale, in place, once every block has read it.
template <bool kFp8>
__global__ void v_channel_scale_kernel(float* v_scale, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) v_scale[i] = scale_of<kFp8>(v_scale[i]);
}

// ---- smooth_k: K's per-channel mean over the kv_len tokens, per kv head.

struct MeanParams {
  const uint16_t* k = nullptr;
  int64_t row_stride = 0, kv_len = 0, chunks = 0;
  int d = 0;
  double* partial = nullptr;  // [kv_heads, chunks, d] when chunks > 1 (scratch in k8)
  float* mean = nullptr;      // [kv_heads, d]
};

// The specification sums in double (exact here in all but contrived inputs: the terms are BF16)
// and casts sum / kv_len to float; the sums of a chunk are added in a fixed order, so the result is
// the same on every run.
__device__ __forceinline__ float mean_of(double sum, int64_t n) {
  return qk::double_to_float_rn(qk::ddiv_rn(sum, static_cast<double>(n)));
}

// Grid (chunks, kv heads). Thread (row r, octet o) adds 8 channels of tokens r, r + rows, ...
__global__ void __launch_bounds__(kThreads) k_mean_partial_kernel(const MeanParams p) {
  __shared__ double red[kThreads * 8];  // [rows][d], rows * d <= 8 kThreads
  const int octets = p.d / 8, rows = kThreads / octets;
  const int o = threadIdx.x % octets, r = threadIdx.x / octets;
  const int64_t g = blockIdx.y, chunk = blockIdx.x;
  const int64_t t1 = chunk * kMeanChunk + kMeanChunk < p.kv_len ? chunk * kMeanChunk + kMeanChunk : p.kv_len;
  if (r < rows) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    // Four rows' loads in flight before their adds (the sums stay in token order per thread).
    for (int64_t t = chunk * kMeanChunk + r; t < t1; t += 4 * rows) {
      uint4 raw[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t tu = t + u * rows;
        raw[u] = tu < t1 ? __ldg(reinterpret_cast<const uint4*>(p.k + tu * p.row_stride + g * p.d + 8 * o))
                         : make_uint4(0, 0, 0, 0);  // adds +0: the sum is unchanged
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        float v[8];
        bf16x8_to_float(raw[u], v);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += static_cast<double>(v[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) red[r * p.d + 8 * o + i] = acc[i];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < p.d; c += blockDim.x) {
    double sum = 0;
    for (int k = 0; k < rows; ++k) sum += red[k * p.d + c];
    if (p.chunks == 1) p.mean[g * p.d + c] = mean_of(sum, p.kv_len);
    else p.partial[(g * p.chunks + chunk) * p.d + c] = sum;
  }
}

// Grid (kv heads), d threads: the chunks' sums in chunk order, loaded 8 at a time so that the
// few threads of this kernel wait for one load latency per 8 chunks, not per chunk.
__global__ void k_mean_finalize_kernel(const MeanParams p) {
  const int64_t g = blockIdx.x;
  const int c = threadIdx.x;
  const double* partial = p.partial + g * p.chunks * p.d + c;
  double sum = 0;
  int64_t k = 0;
  for (; k + 8 <= p.chunks; k += 8) {
    double part[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) part[i] = partial[(k + i) * p.d];
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += part[i];
  }
  for (; k < p.chunks; ++k) sum += partial[k * p.d];
  p.mean[g * p.d + c] = mean_of(sum, p.kv_len);
}

// ---- Host side.

bool aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }
std::string str(int64_t v) { return std::to_string(v); }

// One BF16 input and its outputs: pointers, alignment (16-byte loads; 8-byte code stores) and the
// row stride (at least a token's heads * d, a multiple of 8 elements so every row is 16-byte aligned).
Status check_part(const char* x_name, const uint16_t* x, const char* stride_name, int64_t stride, int64_t heads,
                  int64_t d) {
  if (x == nullptr) return invalid_argument(std::string(x_name) + ": null device pointer");
  if (!aligned(x, 16)) return invalid_argument(std::string(x_name) + ": must be 16-byte aligned (16-byte loads)");
  if (stride < heads * d)
    return invalid_argument(std::string(stride_name) + ": must be at least heads * head_dim = " + str(heads * d) +
                            " elements, got " + str(stride));
  if (stride % 8 != 0)
    return invalid_argument(std::string(stride_name) + ": must be a multiple of 8 elements (16-byte loads), got " +
                            str(stride));
  return {};
}

Status check_out(const char* name, const void* p, uintptr_t alignment) {
  if (p == nullptr) return invalid_argument(std::string(name) + ": null device pointer");
  if (!aligned(p, alignment)) return invalid_argument(std::string(name) + ": must be " + str(alignment) + "-byte aligned");
  return {};
}

Status check_args(const AttentionQuantizeArgs& a) {
  if (a.q_len < 0) return invalid_argument("q_len: must be >= 0, got " + str(a.q_len));
  if (a.kv_len < 0) return invalid_argument("kv_len: must be >= 0, got " + str(a.kv_len));
  if (a.heads <= 0 || a.kv_heads <= 0 || a.heads % a.kv_heads != 0)
    return invalid_argument("heads, kv_heads: heads must be a positive multiple of kv_heads, got " + str(a.heads) + ", " +
                            str(a.kv_heads));
  if (a.head_dim <= 0) return invalid_argument("head_dim: must be positive, got " + str(a.head_dim));
  if (a.head_dim % 8 != 0 || a.head_dim > kMaxHeadDim)
    return unsupported("head_dim: the quantize kernel takes multiples of 8 up to 256, got " + str(a.head_dim));
  // One launch: CTA counts fit a 32-bit grid dimension, kv heads the grid's y (at most 65535).
  if (a.q_len > (int64_t{1} << 31) - 1 || a.kv_len > (int64_t{1} << 31) - 1 || a.heads > 65535)
    return invalid_argument("q_len, kv_len, heads: too large for one launch");
  if (a.q_len > 0) {
    LLMQ_RETURN_IF_ERROR(check_part("q", a.q, "q_row_stride", a.q_row_stride, a.heads, a.head_dim));
    LLMQ_RETURN_IF_ERROR(check_out("q8", a.q8, 8));
    LLMQ_RETURN_IF_ERROR(check_out("q_scale", a.q_scale, 4));
  }
  if (a.kv_len > 0) {
    LLMQ_RETURN_IF_ERROR(check_part("k", a.k, "k_row_stride", a.k_row_stride, a.kv_heads, a.head_dim));
    LLMQ_RETURN_IF_ERROR(check_out("k8", a.k8, 8));  // 8: also the smooth_k partial sums (double) live there
    LLMQ_RETURN_IF_ERROR(check_out("k_scale", a.k_scale, 4));
    if (a.smooth_k) LLMQ_RETURN_IF_ERROR(check_out("k_mean", a.k_mean, 4));
    if (a.quantize_v) {
      if (a.v_block != 64 && !((a.v_block == 128 || (a.v_block == 0 && a.fp8)) && a.head_dim <= 128))
        return invalid_argument("v_block: must be 64, or 128 with head_dim <= 128, or (E4M3, per channel) 0 with "
                                "head_dim <= 128, got " + str(a.v_block) + (a.fp8 ? "" : " (INT8)"));
      LLMQ_RETURN_IF_ERROR(check_part("v", a.v, "v_row_stride", a.v_row_stride, a.kv_heads, a.head_dim));
      LLMQ_RETURN_IF_ERROR(check_out("v_t", a.v_t, 16));
      LLMQ_RETURN_IF_ERROR(check_out("v_scale", a.v_scale, 4));
    }
  }
  return {};
}

// Team size: d / 8 lanes rounded up to a power of two (the shuffle reduction's width).
int team_for(int64_t d) {
  int team = 1;
  while (team * 8 < d) team *= 2;
  return team;
}

template <int kTeam>
Status launch_rows_team(const RowsParams& p, bool fp8, unsigned ctas, cudaStream_t stream) {
  if (fp8) qk_rows_kernel<kTeam, true><<<ctas, kThreads, 0, stream>>>(p);
  else qk_rows_kernel<kTeam, false><<<ctas, kThreads, 0, stream>>>(p);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("qk_rows_kernel");
  return {};
}

Status launch_rows(const RowsParams& p, bool fp8, int team, unsigned ctas, cudaStream_t stream) {
  switch (team) {
    case 1: return launch_rows_team<1>(p, fp8, ctas, stream);
    case 2: return launch_rows_team<2>(p, fp8, ctas, stream);
    case 4: return launch_rows_team<4>(p, fp8, ctas, stream);
    case 8: return launch_rows_team<8>(p, fp8, ctas, stream);
    case 16: return launch_rows_team<16>(p, fp8, ctas, stream);
    case 32: return launch_rows_team<32>(p, fp8, ctas, stream);
    default: return {StatusCode::kInternal, "qk_rows_kernel: no instance for a team of " + str(team) + " lanes"};
  }
}

// E4M3's encoder facts from the reference encoder itself (the integer path needs them), once.
const qk::EncodeParams& e4m3_params() {
  static const qk::EncodeParams params = [] {
    QuantSpec spec;
    spec.format = DType::kE4M3;
    return qk::encode_params(spec);
  }();
  return params;
}

}  // namespace

// kv_len == 0 or q_len == 0 is a valid empty part: nothing of it is read or written and its
// pointers are not looked at (a decode step may quantize Q alone, a cache append K and V alone).
// With smooth_k the mean's partial sums use k8 as scratch before the K codes overwrite it (the
// workspace the API gives is only [kv_heads, d]); every kernel runs in order on `stream`.
Status cuda_quantize_attention_inputs(const AttentionQuantizeArgs& a, CudaStream stream) {
  LLMQ_RETURN_IF_ERROR(check_args(a));
  if (a.q_len == 0 && a.kv_len == 0) return {};
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int d = static_cast<int>(a.head_dim);
  const qk::EncodeParams enc = a.fp8 ? e4m3_params() : qk::EncodeParams{};

  if (a.kv_len > 0 && a.smooth_k) {
    MeanParams m;
    m.k = a.k;
    m.row_stride = a.k_row_stride;
    m.kv_len = a.kv_len;
    m.chunks = (a.kv_len + kMeanChunk - 1) / kMeanChunk;
    m.d = d;
    m.partial = reinterpret_cast<double*>(a.k8);  // kv_heads * chunks * d doubles <= kv_len * kv_heads * d bytes
    m.mean = a.k_mean;
    k_mean_partial_kernel<<<dim3(static_cast<unsigned>(m.chunks), static_cast<unsigned>(a.kv_heads)), kThreads, 0, s>>>(m);
    LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("k_mean_partial_kernel");
    if (m.chunks > 1) {
      k_mean_finalize_kernel<<<static_cast<unsigned>(a.kv_heads), d, 0, s>>>(m);
      LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("k_mean_finalize_kernel");
    }
  }

  const int team = team_for(a.head_dim);
  const int64_t tokens_per_cta = static_cast<int64_t>(kThreads / team) * kRowsPerTeam;
  RowsParams r;
  r.d = d;
  r.enc = enc;
  if (a.q_len > 0) r.q = {a.q, a.q_row_stride, a.q_len, a.heads, (a.q_len + tokens_per_cta - 1) / tokens_per_cta,
                          a.q8, a.q_scale, nullptr};
  if (a.kv_len > 0) r.k = {a.k, a.k_row_stride, a.kv_len, a.kv_heads, (a.kv_len + tokens_per_cta - 1) / tokens_per_cta,
                           a.k8, a.k_scale, a.smooth_k ? a.k_mean : nullptr};
  r.q_ctas = r.q.heads * r.q.chunks;
  const int64_t ctas = r.q_ctas + r.k.heads * r.k.chunks;
  if (ctas > (int64_t{1} << 31) - 1) return invalid_argument("q_len, kv_len: too many rows for one launch");
  LLMQ_RETURN_IF_ERROR(launch_rows(r, a.fp8, team, static_cast<unsigned>(ctas), s));

  if (a.kv_len > 0 && a.quantize_v) {
    VParams v;
    v.v = a.v;
    v.row_stride = a.v_row_stride;
    v.kv_len = a.kv_len;
    v.kv_heads = a.kv_heads;
    v.per_channel = a.v_block == 0;
    const int block = v.per_channel ? 128 : static_cast<int>(a.v_block), quads = block / 4;
    v.tiles = (a.kv_len + block - 1) / block;
    v.v_t_stride = attention_v_t_stride(a.kv_len);
    v.d = d;
    v.v_t = a.v_t;
    v.v_scale = a.v_scale;
    v.enc = enc;
    if (v.per_channel) {
      LLMQ_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a.v_scale, 0, static_cast<size_t>(a.kv_heads * d) * sizeof(float), s));
      const unsigned chunks = static_cast<unsigned>((a.kv_len + kChannelChunk - 1) / kChannelChunk);
      v_channel_absmax_kernel<<<dim3(chunks, static_cast<unsigned>(a.kv_heads)), kThreads, 0, s>>>(v);
      LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("v_channel_absmax_kernel");
    }
    const size_t smem = static_cast<size_t>(quads * d + d) * sizeof(float) + static_cast<size_t>(d) * block;
    // Every block of v_t's columns, those past the keys too: they are written as zeros.
    const dim3 grid(static_cast<unsigned>(v.v_t_stride / block), static_cast<unsigned>(a.kv_heads));
    const unsigned threads = static_cast<unsigned>(quads * d / 8);
    if (block == 128) {
      if (a.fp8) v_blocks_kernel<true, 128><<<grid, threads, smem, s>>>(v);
      else v_blocks_kernel<false, 128><<<grid, threads, smem, s>>>(v);
    } else {
      if (a.fp8) v_blocks_kernel<true, 64><<<grid, threads, smem, s>>>(v);
      else v_blocks_kernel<false, 64><<<grid, threads, smem, s>>>(v);
    }
    LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("v_blocks_kernel");
    if (v.per_channel) {
      const int64_t n = a.kv_heads * d;
      v_channel_scale_kernel<true><<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(a.v_scale, n);
      LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("v_channel_scale_kernel");
    }
  }
  return {};
}

}  // namespace llmq
