// src/attention/bf16_prefill_attention.hpp: gather a lone sequence's K rows and V^T from the paged
// cache, then the Hopper BF16 wgmma attention.
//   gather_k_and_v_t_kernel: a CTA per (64-key tile, kv head). K: each 16-byte piece of the tile's
//     rows copied through the block table into [kv_len, kv_heads, 128]. V: the tile's rows staged in
//     shared memory, then written as 128 channel rows of 64 keys (128 bytes each) of V^T; keys past
//     kv_len up to the stride (a multiple of 128) write zeros, the padding the wgmma kernel reads.
//     The tile's 16-byte pieces are XOR-swizzled by the row's 8-row group (piece p of row k at p ^
//     ((k / 8) % 8)): the eight rows 8 apart that a warp reads together then sit in eight different
//     bank groups (unswizzled they met in one bank: 8-way conflicts).
#include "attention/bf16_prefill_attention.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "attention/bf16_attention_sm90.hpp"
#include "attention/kv_pages.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/device_facts.cuh"
#include "llmq/cuda_attention_int8.hpp"

namespace llmq::attention {
namespace {

constexpr int kHeadDim = 128;
constexpr int kTileKeys = 64;
constexpr int kGatherThreads = 256;
constexpr int kPitch = kHeadDim;  // shared-memory row of the V tile, in BF16 elements

__global__ void __launch_bounds__(kGatherThreads)
    gather_k_and_v_t_kernel(const uint4* k_cache, const uint16_t* v_cache, KvPages pages, int table_row, int kv_len,
                            int kv_heads, int64_t stride, uint4* k_out, uint16_t* v_t) {
  __shared__ alignas(16) uint16_t tile[kTileKeys * kPitch];
  const PagedRows rows = paged_rows(pages, table_row);
  const int key0 = blockIdx.x * kTileKeys, g = blockIdx.y;
  constexpr int kPieces = kHeadDim / 8;  // 16-byte pieces of one head's row
  for (int i = threadIdx.x; i < kTileKeys * kPieces; i += kGatherThreads) {
    const int key = key0 + i / kPieces, piece = i % kPieces;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (key < kv_len) {
      const int64_t src = (static_cast<int64_t>(rows.row(key)) * kv_heads + g) * kPieces + piece;
      k_out[(static_cast<int64_t>(key) * kv_heads + g) * kPieces + piece] = __ldg(k_cache + src);
      v = __ldg(reinterpret_cast<const uint4*>(v_cache) + src);
    }
    const int row = i / kPieces;
    *reinterpret_cast<uint4*>(tile + row * kPitch + (piece ^ ((row >> 3) & 7)) * 8) = v;
  }
  __syncthreads();
  // V^T row (g, c): keys key0 .. key0 + 63, eight a thread.
  for (int i = threadIdx.x; i < kHeadDim * (kTileKeys / 8); i += kGatherThreads) {
    const int c = i / (kTileKeys / 8), k8 = i % (kTileKeys / 8);
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // rows 8 k8 + 2j and + 1: their 8-row group is k8
      const int col = c ^ (8 * (k8 & 7));
      w[j] = static_cast<uint32_t>(tile[(8 * k8 + 2 * j) * kPitch + col]) |
             (static_cast<uint32_t>(tile[(8 * k8 + 2 * j + 1) * kPitch + col]) << 16);
    }
    *reinterpret_cast<uint4*>(v_t + (static_cast<int64_t>(g) * kHeadDim + c) * stride + key0 + 8 * k8) =
        make_uint4(w[0], w[1], w[2], w[3]);
  }
}

}  // namespace

namespace {

// The one decision of whether the path exists for these shapes on the current device (allocate and
// bytes_for both ask it, so the memory a runtime is sized for is what it takes).
Status path_runs(int64_t head_dim, int64_t max_keys, bool bf16_cache, bool* runs) {
  *runs = false;
  if (head_dim != kHeadDim || !bf16_cache || max_keys <= 0) return {};
  cuda::DeviceFacts dev;
  LLMQ_RETURN_IF_ERROR(cuda::current_device_facts(&dev));
  *runs = sm90_bf16_attention_runs(dev);
  return {};
}

}  // namespace

int64_t Bf16PrefillAttention::bytes_for(int64_t kv_heads, int64_t head_dim, int64_t max_keys, bool bf16_cache) {
  bool runs = false;
  if (!path_runs(head_dim, max_keys, bf16_cache, &runs).ok() || !runs) return 0;
  const int64_t keys = std::min(max_keys, kMaxKeys);
  return keys * kv_heads * kHeadDim * 2 + kv_heads * kHeadDim * attention_v_t_stride(keys) * 2;
}

Status Bf16PrefillAttention::allocate(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t max_keys, bool bf16_cache) {
  active_ = false;
  bool runs = false;
  LLMQ_RETURN_IF_ERROR(path_runs(head_dim, max_keys, bf16_cache, &runs));
  if (!runs) return {};
  heads_ = heads, kv_heads_ = kv_heads, max_keys_ = std::min(max_keys, kMaxKeys);
  LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(max_keys_ * kv_heads * kHeadDim * 2, "BF16 attention K rows", &k_rows_));
  LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(kv_heads * kHeadDim * attention_v_t_stride(max_keys_) * 2,
                                                        "BF16 attention V^T", &v_t_));
  active_ = true;
  return {};
}

bool Bf16PrefillAttention::applies(const std::vector<PrefillSequence>& seqs, int64_t window, const float* sinks) const {
  return active_ && seqs.size() == 1 && window == 0 && sinks == nullptr && seqs[0].q_len >= kMinQueries &&
         seqs[0].kv_len <= max_keys_;
}

Status Bf16PrefillAttention::run(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache, const KvPages& pages,
                                 const std::vector<PrefillSequence>& seqs, uint16_t* out, float softmax_scale,
                                 CudaStream stream) const {
  if (!active_) return invalid_argument("BF16 prefill attention: not allocated");
  LLMQ_RETURN_IF_ERROR(validate_kv_pages(pages, "BF16 prefill attention: "));
  if (k_cache == nullptr || v_cache == nullptr) return invalid_argument("BF16 prefill attention: k_cache or v_cache is null");
  if (reinterpret_cast<uintptr_t>(k_cache) % 16 != 0 || reinterpret_cast<uintptr_t>(v_cache) % 16 != 0)
    return invalid_argument("BF16 prefill attention: k_cache and v_cache must be 16-byte aligned (rows move 16 bytes at a time)");
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  for (const PrefillSequence& seq : seqs) {
    if (seq.q_len <= 0) continue;
    LLMQ_RETURN_IF_ERROR(check_prefill_sequence(seq, max_keys_, max_keys_, pages, "BF16 prefill attention"));
    const int64_t stride = attention_v_t_stride(seq.kv_len);
    const dim3 grid(static_cast<unsigned>(stride / kTileKeys), static_cast<unsigned>(kv_heads_));
    gather_k_and_v_t_kernel<<<grid, kGatherThreads, 0, s>>>(
        reinterpret_cast<const uint4*>(k_cache), v_cache, pages, static_cast<int>(seq.slot), static_cast<int>(seq.kv_len),
        static_cast<int>(kv_heads_), stride, k_rows_.as<uint4>(), v_t_.as<uint16_t>());
    LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("gather_k_and_v_t_kernel");
    Bf16AttentionArgs a;
    a.q_len = seq.q_len;
    a.kv_len = seq.kv_len;
    a.heads = heads_;
    a.kv_heads = kv_heads_;
    a.causal = true;
    a.softmax_scale = softmax_scale;
    a.q = q + seq.q_begin * heads_ * kHeadDim;
    a.k = k_rows_.as<uint16_t>();
    a.v_t = v_t_.as<uint16_t>();
    a.out = out + seq.q_begin * heads_ * kHeadDim;
    LLMQ_RETURN_IF_ERROR(sm90_bf16_attention(a, stream));
  }
  return {};
}

}  // namespace llmq::attention
