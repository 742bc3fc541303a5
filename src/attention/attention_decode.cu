// Decode attention (see attention.hpp): flash-decoding over the paged KV cache, one query token per
// sequence. head_dim 128 with GQA runs on tensor cores: attention_decode_warp.cu (a warp per GQA
// group) when one chunk per sequence and the groups alone fill the GPU, else attention_decode_mma.cu
// (the same plan, ring and outputs as here); this file's CUDA-core kernel takes every other shape.
//  * Split: the keys 0..max_kv_len-1 are cut into n_chunks chunks of chunk_keys keys (both fixed on
//    the host from max_kv_len, the batch, the heads and the SM count, so a captured graph stays
//    valid while kv_len grows on the device). Grid (chunk, head group, sequence); a chunk at or
//    past kv_len[b] exits at once.
//  * CTA (128 threads): the q heads of one GQA group (up to 8; a larger group is split over CTAs),
//    so each K/V byte of the chunk is read once for all of them. Tiles of 4096 / head_dim keys
//    (8 KiB of K + 8 KiB of V) stream through a 3-stage cp.async ring (48 KiB). head_dim / 8
//    threads share a key, each holding 8 dims as one 16-byte read; the 128 / (head_dim / 8) key
//    lanes each run their own online softmax (max, sum, 8-dim accumulators per head) over every
//    key-lane-th key of the tile, so a tile needs no barrier beyond the ring's. At the end the key
//    lanes are merged through shared memory.
//  * Output: a single chunk writes BF16 directly; otherwise each CTA writes its normalised partial
//    output (FP32) and log2-sum-exp to the workspace and decode_attention_combine_kernel merges the
//    live chunks of each (sequence, head) in chunk order (deterministic).
//  * E4M3 cache: the same tiles in keys (4096 / head_dim keys, so the plan and the workspace are
//    those of BF16) hold half the bytes: 4 KiB of K + 4 KiB of V, through a 6-stage ring (still
//    48 KiB, five tiles in flight). A thread's 8 dims are one 8-byte shared read, widened exactly by
//    cvt.f16x2.e4m3x2 then to FP32. k_scale[kv head] is folded into the query's scale, v_scale[kv
//    head] multiplies the CTA's normalised output (a partial output or the final one: the combine
//    is linear in them, so it needs no scale).
//  * Sliding window W: only keys [kv_len - W, kv_len) count. The split covers min(max_kv_len, W)
//    keys (host), and every chunk's key range is offset on the device by kv_len - W, so no chunk
//    outside the window is launched and a captured graph stays valid as kv_len grows past W.
//  * Sinks: one term of the softmax denominator per q head, added once: by the single chunk when
//    there is one, else by the combine (the partials stay normalised by their own keys only).
//  * Paged cache: each key a thread copies is looked up in the sequence's block-table row (__ldg,
//    shift and mask: kv_pages.cuh). At batch 1 a CTA runs only a few tiles, so the lookup's latency
//    would sit in front of every tile's copies; instead the lookups run one tile ahead of the
//    copies (a thread's <= 4 rows per tile in registers): the prologue looks up the first kStages
//    tiles at once (one table latency, before any K/V byte moves) and each iteration looks up the
//    tile after the one it starts copying, so the latency passes under a tile of math. A
//    chunk-wide table copy in shared memory was not taken: a chunk may span more entries than
//    shared memory holds (one chunk of 2^30 keys at block size 1), and the ring already takes 48 KiB.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/cuda_check.cuh"
#include "cuda/device_facts.cuh"
#include "cuda/pdl.cuh"
#include "attention/attention.hpp"
#include "attention/attention_validate.hpp"
#include "attention/decode_merge.cuh"
#include "attention/decode_plan.hpp"
#include "attention/kv_pages.cuh"
#include "core/int_math.hpp"

namespace llmq::attention {
namespace {

constexpr int kThreads = kDecodeThreads;
constexpr int kTileBytes = kDecodeTileBytes;          // K (or V) bytes of one BF16 tile
constexpr int kSmemBytes = kDecodeSmemBytes;          // 48 KiB for either cache type: no opt-in needed
constexpr int kMaxHeadsPerCta = kDecodeMaxHeadsPerCta;
constexpr int kMinChunkKeys = 64;    // shorter chunks cost more in combine than they win in parallelism (H100: 256 -> 64 took batch-1 decode over 1k keys from 16.3 to 12.9 us)
constexpr int64_t kMaxPlanSms = 256; // the plan assumes at most this many SMs (workspace bound)
constexpr int kCtasPerSmTarget = 2;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// 8 bytes (an E4M3 row of head_dim 8); .cg takes only 16, so through L1.
__device__ __forceinline__ void cp_async_8(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// 8 BF16 (one 16-byte word) to FP32: the low half of each 32-bit word is the lower dim.
__device__ __forceinline__ void unpack8(const uint4& raw, float (&x)[8]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = __uint_as_float(w[i] << 16);
    x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
// 8 E4M3 codes (one 8-byte word, the lowest byte the lowest dim) to FP32, exactly: every E4M3 value
// is an FP16 value, so cvt.f16x2.e4m3x2 (sm_89+; cuda_fp8.h's software path on older targets) then
// FP16 -> FP32. Codes are never NaN here: positions past kv_len were zero-filled.
__device__ __forceinline__ void unpack8(const uint2& raw, float (&x)[8]) {
  const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w[i] >> (16 * p)), __NV_E4M3);
      const float2 f = __half22float2(__half2(hr));
      x[4 * i + 2 * p] = f.x;
      x[4 * i + 2 * p + 1] = f.y;
    }
  }
}
__device__ __forceinline__ uint16_t to_bf16_bits(float x) {
  const __nv_bfloat16 v = __float2bfloat16_rn(x);
  return *reinterpret_cast<const uint16_t*>(&v);
}

// The first key the query (position kv_len - 1) sees: kv_len - window, or 0 (window 0: none).
__device__ __forceinline__ int window_begin(int kv_len, int64_t window) {
  return window > 0 ? max(0, kv_len - static_cast<int>(window)) : 0;
}

using Workspace = DecodeWorkspace;

// kFp8: the cache holds E4M3 codes (k_cache8 / v_cache8) with per-kv-head scales.
template <int kHeadDim, int kHeads, bool kFp8>
__global__ void __launch_bounds__(kThreads)
    decode_attention_chunk_kernel(DecodeAttentionArgs a, DecodePlan plan, Workspace ws, float scale_log2) {
  using Raw = std::conditional_t<kFp8, uint2, uint4>;     // a thread's 8 dims of one key
  constexpr int kElemBytes = kFp8 ? 1 : 2;
  constexpr int kLanesPerKey = kHeadDim / 8;              // threads sharing one key, 8 dims each
  constexpr int kKeyLanes = kThreads / kLanesPerKey;      // keys in flight across the CTA
  constexpr int kTileKeys = kTileBytes / (2 * kHeadDim);  // keys per tile (both cache types)
  constexpr int kKeysPerLane = kTileKeys / kKeyLanes;     // = 4 for every head_dim
  constexpr int kTileBytesHere = kTileKeys * kHeadDim * kElemBytes;  // K (or V) bytes of a tile
  constexpr int kStages = kSmemBytes / (2 * kTileBytesHere);         // 3 (BF16) or 6 (E4M3)
  constexpr int kRowBytes = kHeadDim * kElemBytes;
  constexpr int kCopyBytes = kRowBytes < 16 ? kRowBytes : 16;        // 8 only for E4M3 head_dim 8
  constexpr int kCopiesPerKey = kRowBytes / kCopyBytes;
  constexpr int kCopiesPerTile = kTileBytesHere / kCopyBytes;
  constexpr int kRowsPerThread = kCopiesPerTile / kThreads;  // keys a thread copies per tile: 2 or 4
  static_assert(kKeysPerLane * kKeyLanes == kTileKeys, "tile shape");
  static_assert(kThreads % kCopiesPerKey == 0, "a thread's copies of a tile are whole keys apart, one piece of each");
  static_assert(kCopiesPerTile % kThreads == 0 && kStages >= 3, "ring shape");
  extern __shared__ __align__(16) unsigned char smem[];

  llmq::detail::pdl_wait();  // q, the cache and kv_len come from the kernels before this one
  llmq::detail::pdl_launch_dependents();
  const DecodeCta cta = decode_cta(a, plan);
  if (decode_cta_has_no_keys<kHeadDim>(a, plan, cta)) return;
  const int chunk = cta.chunk, b = cta.b, head0 = cta.head0, kv_head = cta.kv_head;
  const int key_begin = cta.key_begin, key_end = cta.key_end;
  const int n_heads_here = plan.heads_per_cta;  // <= kHeads

  const PagedRows rows = paged_rows(a.pages, a.slot[b]);
  const DecodeKvBases kv = decode_kv_bases<kFp8>(a, kv_head, kRowBytes);
  const unsigned char* k_base = kv.k;
  const unsigned char* v_base = kv.v;
  const int64_t kv_stride_bytes = kv.stride_bytes;
  scale_log2 *= kv.k_scale;
  const float v_scale = kv.v_scale;
  const int n_tiles = (key_end - key_begin + kTileKeys - 1) / kTileKeys;
  const uint32_t ring = smem_addr(smem);

  // Copy i of a tile by this thread: key (threadIdx.x / kCopiesPerKey) + i * (kThreads /
  // kCopiesPerKey) of the tile, piece threadIdx.x % kCopiesPerKey of its row.
  // tile_rows: the cache rows of this thread's keys of `tile`; -1 past key_end (no lookup: the
  // table past the sequence may hold anything).
  const auto tile_rows = [&](int tile, int (&r)[kRowsPerThread]) {
    const int key0 = key_begin + tile * kTileKeys + static_cast<int>(threadIdx.x) / kCopiesPerKey;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int key = key0 + i * (kThreads / kCopiesPerKey);
      r[i] = key < key_end ? rows.row(key) : -1;
    }
  };
  // Stage s: K tile at ring + 2s * kTileBytesHere, V tile right after it (rows of kRowBytes,
  // unpadded). Keys past key_end are zero-filled (code 0 is +0 in E4M3 too) so that whatever the
  // cache holds there never meets the arithmetic; their address is cache row 0.
  const auto load_tile = [&](const int (&r)[kRowsPerThread], int stage) {
    const uint32_t k_dst = ring + 2 * stage * kTileBytesHere, v_dst = k_dst + kTileBytesHere;
    const int piece = static_cast<int>(threadIdx.x) % kCopiesPerKey;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      const bool valid = r[i] >= 0;
      const int64_t off = static_cast<int64_t>(valid ? r[i] : 0) * kv_stride_bytes + piece * kCopyBytes;
      if constexpr (kCopyBytes == 16) {
        cp_async_16(k_dst + idx * 16, k_base + off, valid ? 16 : 0);
        cp_async_16(v_dst + idx * 16, v_base + off, valid ? 16 : 0);
      } else {
        cp_async_8(k_dst + idx * 8, k_base + off, valid ? 8 : 0);
        cp_async_8(v_dst + idx * 8, v_base + off, valid ? 8 : 0);
      }
    }
  };
  // The rows of the first kStages tiles, looked up together; next_rows: those of the next tile
  // the loop copies (tile kStages - 1 first).
  int next_rows[kRowsPerThread];
  {
    int first_rows[kStages][kRowsPerThread];
#pragma unroll
    for (int s = 0; s < kStages; ++s) tile_rows(s, first_rows[s]);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < n_tiles) load_tile(first_rows[s], s);
      cp_async_commit();  // empty groups keep the wait counts uniform
    }
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) next_rows[i] = first_rows[kStages - 1][i];
  }

  const int key_lane = threadIdx.x / kLanesPerKey, dim_lane = threadIdx.x % kLanesPerKey;
  // This thread's 8 dims of each head's query, scaled so that scores come out in log2 units.
  float q[kHeads][8];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    if (h < n_heads_here) {
      const uint4 raw = *reinterpret_cast<const uint4*>(a.q + (static_cast<int64_t>(b) * a.n_heads + head0 + h) * kHeadDim + dim_lane * 8);
      unpack8(raw, q[h]);
#pragma unroll
      for (int i = 0; i < 8; ++i) q[h][i] *= scale_log2;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) q[h][i] = 0.f;
    }
  }
  float acc[kHeads][8], m[kHeads], l[kHeads];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[h][i] = 0.f;
  }

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int stage = tile % kStages;
    if (tile + kStages - 1 < n_tiles) load_tile(next_rows, (tile + kStages - 1) % kStages);
    cp_async_commit();
    tile_rows(tile + kStages, next_rows);  // used next iteration: the lookup's latency hides under this tile
    cp_async_wait<kStages - 1>();
    __syncthreads();
    const Raw* k_tile = reinterpret_cast<const Raw*>(smem + 2 * stage * kTileBytesHere);
    const Raw* v_tile = k_tile + kTileBytesHere / sizeof(Raw);
    const int key0 = key_begin + tile * kTileKeys;

    float s[kKeysPerLane][kHeads];
#pragma unroll
    for (int j = 0; j < kKeysPerLane; ++j) {
      const int key = key_lane + j * kKeyLanes;
      float k[8];
      unpack8(k_tile[key * kLanesPerKey + dim_lane], k);
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) dot = __fmaf_rn(q[h][i], k[i], dot);
#pragma unroll
        for (int o = kLanesPerKey / 2; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        s[j][h] = key0 + key < key_end ? dot : -INFINITY;
      }
    }
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      float m_new = m[h];
#pragma unroll
      for (int j = 0; j < kKeysPerLane; ++j) m_new = fmaxf(m_new, s[j][h]);
      // A key lane whose keys are all past key_end keeps max -inf: subtract 0, exp2 gives 0.
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float corr = fast_exp2(m[h] - m_use);
      m[h] = m_new;
      l[h] *= corr;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[h][i] *= corr;
#pragma unroll
      for (int j = 0; j < kKeysPerLane; ++j) s[j][h] = fast_exp2(s[j][h] - m_use);
    }
#pragma unroll
    for (int j = 0; j < kKeysPerLane; ++j) {
      float v[8];
      unpack8(v_tile[(key_lane + j * kKeyLanes) * kLanesPerKey + dim_lane], v);
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        l[h] += s[j][h];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[h][i] = __fmaf_rn(s[j][h], v[i], acc[h][i]);
      }
    }
    __syncthreads();  // the next iteration's load overwrites the stage read here
  }
  cp_async_wait<0>();
  __syncthreads();

  // Merge the key lanes: shared [kKeyLanes][kHeads][kHeadDim] accumulators (32 KiB), then
  // [kKeyLanes][kHeads] maxima and sums (8 KiB at most), reusing the ring.
  float* red_acc = reinterpret_cast<float*>(smem);
  float* red_m = red_acc + kKeyLanes * kHeads * kHeadDim;
  float* red_l = red_m + kKeyLanes * kHeads;
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
#pragma unroll
    for (int i = 0; i < 8; ++i) red_acc[(key_lane * kHeads + h) * kHeadDim + dim_lane * 8 + i] = acc[h][i];
    if (dim_lane == 0) {
      red_m[key_lane * kHeads + h] = m[h];
      red_l[key_lane * kHeads + h] = l[h];
    }
  }
  __syncthreads();
  decode_merge_and_store<kHeadDim, kKeyLanes, kHeads, kFp8>(a, plan, ws, red_acc, red_m, red_l, b, head0, chunk, v_scale);
}

// One CTA per (head, sequence), head_dim threads: merges the live chunks in chunk order.
__global__ void decode_attention_combine_kernel(DecodeAttentionArgs a, DecodePlan plan, Workspace ws) {
  llmq::detail::pdl_wait();  // the partials of the chunk kernel
  llmq::detail::pdl_launch_dependents();
  const int head = blockIdx.x, b = blockIdx.y, d = threadIdx.x;
  const int64_t bh = static_cast<int64_t>(b) * a.n_heads + head;
  const int kv_len = min(max(a.kv_len[b], 0), min(pages_capacity(a.pages), static_cast<int>(a.max_kv_len)));
  const int keys = kv_len - window_begin(kv_len, a.window);
  const int live = min(plan.n_chunks, (keys + plan.chunk_keys - 1) / plan.chunk_keys);
  if (live == 0) {
    a.out[bh * a.head_dim + d] = 0;
    return;
  }
  const float* lse = ws.partial_lse + bh * plan.n_chunks;
  float lse_max = -INFINITY;
  for (int c = 0; c < live; ++c) lse_max = fmaxf(lse_max, lse[c]);
  float sum = 0.f, o = 0.f;
  for (int c = 0; c < live; ++c) {
    const float w = fast_exp2(lse[c] - lse_max);
    sum += w;
    o = __fmaf_rn(w, ws.partial_out[(bh * plan.n_chunks + c) * a.head_dim + d], o);
  }
  if (a.sinks != nullptr) sum += fast_exp2(__fmaf_rn(a.sinks[head], kLog2e, -lse_max));  // the sink, once
  a.out[bh * a.head_dim + d] = to_bf16_bits(o / sum);
}

// ---------------------------------------------------------------------------------------------
// Host side

int64_t tile_keys(int64_t head_dim) { return kTileBytes / (2 * head_dim); }

// Chunks: enough CTAs for kCtasPerSmTarget per SM, none shorter than kMinChunkKeys (nor than a
// tile). The count never exceeds max_chunks_bound (what the workspace was sized for).
int64_t max_chunks_bound(int64_t batch, int64_t max_kv_len) {
  return std::max<int64_t>(1, std::min(ceil_div(max_kv_len, kMinChunkKeys), ceil_div(kCtasPerSmTarget * kMaxPlanSms, batch)));
}

// a.window: already clamped (0, or below min(pages.capacity(), max_kv_len)); the split covers the keys
// one query can see.
DecodePlan make_plan(const DecodeAttentionArgs& a, int64_t sms) {
  DecodePlan p;
  const int64_t keys_seen = a.window > 0 ? std::min(a.max_kv_len, a.window) : a.max_kv_len;
  const int64_t group = a.n_heads / a.n_kv_heads;
  int64_t hpc = std::min<int64_t>(group, kMaxHeadsPerCta);
  while (group % hpc != 0) --hpc;
  p.heads_per_cta = static_cast<int>(hpc);
  const int64_t ctas_per_chunk = a.batch * (a.n_heads / hpc);
  const int64_t want = ceil_div(kCtasPerSmTarget * std::min(sms, kMaxPlanSms), ctas_per_chunk);
  // max_chunks_bound grows with the key count: the workspace sized for max_kv_len holds these.
  const int64_t chunks = std::min(want, max_chunks_bound(a.batch, keys_seen));
  const int64_t tile = tile_keys(a.head_dim);
  const int64_t keys = ceil_div(ceil_div(keys_seen, chunks), tile) * tile;
  p.chunk_keys = static_cast<int>(keys);
  p.n_chunks = static_cast<int>(ceil_div(keys_seen, keys));
  return p;
}

Status query_sm_count(int64_t* sms) {
  cuda::DeviceFacts dev;  // cached per device
  LLMQ_RETURN_IF_ERROR(cuda::current_device_facts(&dev));
  *sms = dev.sms;
  return {};
}

Status validate(const DecodeAttentionArgs& a) {
  const std::string f = "decode_attention: ";
  if (a.q == nullptr) return invalid_argument(f + "q is null");
  if (a.out == nullptr) return invalid_argument(f + "out is null");
  if (a.kv_len == nullptr) return invalid_argument(f + "kv_len is null");
  if (a.slot == nullptr) return invalid_argument(f + "slot is null");
  LLMQ_RETURN_IF_ERROR(validate_kv_cache_and_alignment(a, f));
  if (a.batch < 0 || a.batch > 65535) return invalid_argument(f + "batch " + std::to_string(a.batch) + " not in [0, 65535]");
  if (a.n_heads <= 0 || a.n_heads > 65535) return invalid_argument(f + "n_heads " + std::to_string(a.n_heads) + " not in [1, 65535]");
  if (a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0)
    return invalid_argument(f + "n_heads " + std::to_string(a.n_heads) + " is not a multiple of n_kv_heads " +
                            std::to_string(a.n_kv_heads));
  const int64_t d = a.head_dim;
  if (d != 8 && d != 16 && d != 32 && d != 64 && d != 128 && d != 256)
    return invalid_argument(f + "head_dim " + std::to_string(d) + " not one of 8, 16, 32, 64, 128, 256");
  LLMQ_RETURN_IF_ERROR(validate_kv_pages(a.pages, f.c_str()));
  if (a.max_kv_len <= 0 || a.max_kv_len > (int64_t{1} << 30))
    return invalid_argument(f + "max_kv_len " + std::to_string(a.max_kv_len) + " not in [1, 2^30]");
  if (!(a.softmax_scale > 0.f) || !(a.softmax_scale < INFINITY))
    return invalid_argument(f + "softmax_scale " + std::to_string(a.softmax_scale) + " is not a positive finite number");
  const int64_t need = decode_attention_workspace_bytes(a.batch, a.n_heads, a.head_dim, a.max_kv_len);
  if (need > 0 && a.workspace == nullptr) return invalid_argument(f + "workspace is null (" + std::to_string(need) + " bytes needed)");
  if (a.workspace_bytes < need)
    return invalid_argument(f + "workspace_bytes " + std::to_string(a.workspace_bytes) + " < " + std::to_string(need) +
                            " (decode_attention_workspace_bytes)");
  if (need > 0 && !aligned16(a.workspace)) return invalid_argument(f + "workspace must be 16-byte aligned");
  LLMQ_RETURN_IF_ERROR(validate_window(a.window, /*causal=*/true, f));  // decode is causal by nature
  return {};
}

template <int kHeadDim, int kHeads>
Status launch_chunks(const DecodeAttentionArgs& a, const DecodePlan& plan, Workspace ws, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(plan.n_chunks), static_cast<unsigned>(a.n_heads / plan.heads_per_cta),
                  static_cast<unsigned>(a.batch));
  const auto kernel = a.kv_dtype == KvCacheDType::kE4M3 ? decode_attention_chunk_kernel<kHeadDim, kHeads, true>
                                                        : decode_attention_chunk_kernel<kHeadDim, kHeads, false>;
  LLMQ_CUDA_RETURN_IF_ERROR(
      llmq::detail::launch_pdl(kernel, grid, dim3(kThreads), kSmemBytes, stream, a, plan, ws, a.softmax_scale * kLog2e));
  return {};
}

DecodeKernel choose_kernel(const DecodeAttentionArgs& a, const DecodePlan& plan, int64_t sms) {
  if (decode_warp_applies(a, plan, sms)) return DecodeKernel::kWarpMma;
  if (decode_mma_applies(a, plan)) return DecodeKernel::kCtaMma;
  return DecodeKernel::kCudaCore;
}

// a.window as decode_attention leaves it: a window at least min(capacity, max_kv_len) masks nothing,
// and runs the plain path (the kernels' window arithmetic then stays in int).
DecodeAttentionArgs with_window_clamped(const DecodeAttentionArgs& args) {
  DecodeAttentionArgs a = args;
  if (a.window >= std::min(a.pages.capacity(), a.max_kv_len)) a.window = 0;
  return a;
}

template <int kHeadDim>
Status launch_for_dim(const DecodeAttentionArgs& a, const DecodePlan& plan, int64_t sms, Workspace ws, cudaStream_t stream) {
  switch (choose_kernel(a, plan, sms)) {
    case DecodeKernel::kWarpMma: return launch_decode_warp(a, plan, a.softmax_scale * kLog2e, stream);
    case DecodeKernel::kCtaMma: return launch_decode_mma(a, plan, ws, a.softmax_scale * kLog2e, stream);
    case DecodeKernel::kCudaCore: break;
  }
  // Register arrays are sized by kHeads: the smallest power of two that holds the CTA's heads.
  if (plan.heads_per_cta == 1) return launch_chunks<kHeadDim, 1>(a, plan, ws, stream);
  if (plan.heads_per_cta == 2) return launch_chunks<kHeadDim, 2>(a, plan, ws, stream);
  if (plan.heads_per_cta <= 4) return launch_chunks<kHeadDim, 4>(a, plan, ws, stream);
  return launch_chunks<kHeadDim, 8>(a, plan, ws, stream);
}

}  // namespace

int64_t decode_attention_workspace_bytes(int64_t batch, int64_t n_heads, int64_t head_dim, int64_t max_kv_len) {
  if (batch <= 0 || n_heads <= 0 || head_dim <= 0 || max_kv_len <= 0) return 0;
  const int64_t chunks = max_chunks_bound(batch, max_kv_len);
  if (chunks <= 1) return 0;  // one chunk writes the output directly
  return batch * n_heads * chunks * (head_dim + 1) * static_cast<int64_t>(sizeof(float));
}

Status decode_kernel_choice(const DecodeAttentionArgs& args, DecodeKernel* out) {
  LLMQ_RETURN_IF_ERROR(validate(args));
  if (args.batch == 0) return invalid_argument("decode_kernel_choice: batch 0 launches no kernel");
  const DecodeAttentionArgs a = with_window_clamped(args);
  int64_t sms = 0;
  LLMQ_RETURN_IF_ERROR(query_sm_count(&sms));
  *out = choose_kernel(a, make_plan(a, sms), sms);
  return {};
}

Status decode_attention(const DecodeAttentionArgs& args, CudaStream stream) {
  LLMQ_RETURN_IF_ERROR(validate(args));
  if (args.batch == 0) return {};
  // kv_len is clamped to min(capacity, max_kv_len) on the device.
  const DecodeAttentionArgs a = with_window_clamped(args);
  int64_t sms = 0;
  LLMQ_RETURN_IF_ERROR(query_sm_count(&sms));
  const DecodePlan plan = make_plan(a, sms);
  Workspace ws{static_cast<float*>(a.workspace), nullptr};
  if (plan.n_chunks > 1)
    ws.partial_lse = ws.partial_out + a.batch * a.n_heads * static_cast<int64_t>(plan.n_chunks) * a.head_dim;
  switch (a.head_dim) {
    case 8: LLMQ_RETURN_IF_ERROR(launch_for_dim<8>(a, plan, sms, ws, stream)); break;
    case 16: LLMQ_RETURN_IF_ERROR(launch_for_dim<16>(a, plan, sms, ws, stream)); break;
    case 32: LLMQ_RETURN_IF_ERROR(launch_for_dim<32>(a, plan, sms, ws, stream)); break;
    case 64: LLMQ_RETURN_IF_ERROR(launch_for_dim<64>(a, plan, sms, ws, stream)); break;
    case 128: LLMQ_RETURN_IF_ERROR(launch_for_dim<128>(a, plan, sms, ws, stream)); break;
    default: LLMQ_RETURN_IF_ERROR(launch_for_dim<256>(a, plan, sms, ws, stream)); break;
  }
  if (plan.n_chunks > 1) {
    LLMQ_CUDA_RETURN_IF_ERROR(llmq::detail::launch_pdl(decode_attention_combine_kernel,
                                                       dim3(static_cast<unsigned>(a.n_heads), static_cast<unsigned>(a.batch)),
                                                       dim3(static_cast<unsigned>(a.head_dim)), 0, stream, a, plan, ws));
  }
  return {};
}

}  // namespace llmq::attention
