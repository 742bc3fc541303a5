// Bf16PrefillAttention (bf16_prefill_attention.hpp): gather a prefill step's sequences' K rows and
// V^T from the paged cache into packed buffers, then the Hopper BF16 wgmma attention over them all.
//   gather_k_and_v_t_kernel: a CTA per (64-key tile of a sequence, kv head). K: each 8-element piece
//     of the tile's rows copied through the block table into the sequence's rows of [keys, kv_heads,
//     128] (E4M3 codes widened to BF16, exactly). V: the tile's rows staged in shared memory, then
//     written as 128 channel rows of 64 keys (128 bytes each) of V^T; keys past kv_len up to the
//     sequence's next multiple of 128 write zeros, the padding the wgmma kernel reads.
//     The tile's 16-byte pieces are XOR-swizzled by the row's 8-row group (piece p of row k at p ^
//     ((k / 8) % 8)): the eight rows 8 apart that a warp reads together then sit in eight different
//     bank groups (unswizzled they met in one bank: 8-way conflicts).
#include "attention/bf16_prefill_attention.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "attention/attention_mma.cuh"
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
constexpr int kMaxSeqs = kBf16AttentionMaxSeqs;

// The launch's sequences: block-table row, keys, first packed row (a multiple of 128) and first
// 64-key tile in the grid.
struct GatherSeqs {
  int count;
  int slot[kMaxSeqs], kv_len[kMaxSeqs], kv_begin[kMaxSeqs], tile_begin[kMaxSeqs];
};

// Eight elements of K (or V) row `row` of kv head g at piece `piece`, as 8 BF16: the cache's own
// BF16, or its E4M3 codes widened exactly.
template <bool kFp8>
__device__ __forceinline__ uint4 cache_piece(const void* cache, int64_t row, int g, int kv_heads, int piece) {
  const int64_t at = (row * kv_heads + g) * (kHeadDim / 8) + piece;
  if constexpr (kFp8) {
    const uint2 c = __ldg(static_cast<const uint2*>(cache) + at);
    return make_uint4(mma::e4m3x2_to_bf16x2(c.x), mma::e4m3x2_to_bf16x2(c.x >> 16), mma::e4m3x2_to_bf16x2(c.y),
                      mma::e4m3x2_to_bf16x2(c.y >> 16));
  } else {
    return __ldg(static_cast<const uint4*>(cache) + at);
  }
}

template <bool kFp8>
__global__ void __launch_bounds__(kGatherThreads)
    gather_k_and_v_t_kernel(const void* k_cache, const void* v_cache, KvPages pages, const GatherSeqs seqs, int kv_heads,
                            int64_t stride, uint4* k_out, uint16_t* v_t) {
  __shared__ alignas(16) uint16_t tile[kTileKeys * kPitch];
  int s = 0;
  while (s + 1 < seqs.count && seqs.tile_begin[s + 1] <= static_cast<int>(blockIdx.x)) ++s;
  const PagedRows rows = paged_rows(pages, seqs.slot[s]);
  const int kv_len = seqs.kv_len[s], key0 = (static_cast<int>(blockIdx.x) - seqs.tile_begin[s]) * kTileKeys;
  const int64_t out0 = seqs.kv_begin[s] + key0;  // packed row of the tile's first key
  const int g = blockIdx.y;
  constexpr int kPieces = kHeadDim / 8;  // 8-element pieces of one head's row
  for (int i = threadIdx.x; i < kTileKeys * kPieces; i += kGatherThreads) {
    const int key = key0 + i / kPieces, piece = i % kPieces;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (key < kv_len) {
      const int64_t row = rows.row(key);
      k_out[((out0 + i / kPieces) * kv_heads + g) * kPieces + piece] = cache_piece<kFp8>(k_cache, row, g, kv_heads, piece);
      v = cache_piece<kFp8>(v_cache, row, g, kv_heads, piece);
    }
    const int r = i / kPieces;
    *reinterpret_cast<uint4*>(tile + r * kPitch + (piece ^ ((r >> 3) & 7)) * 8) = v;
  }
  __syncthreads();
  // V^T row (g, c): the tile's 64 keys, eight a thread.
  for (int i = threadIdx.x; i < kHeadDim * (kTileKeys / 8); i += kGatherThreads) {
    const int c = i / (kTileKeys / 8), k8 = i % (kTileKeys / 8);
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // rows 8 k8 + 2j and + 1: their 8-row group is k8
      const int col = c ^ (8 * (k8 & 7));
      w[j] = static_cast<uint32_t>(tile[(8 * k8 + 2 * j) * kPitch + col]) |
             (static_cast<uint32_t>(tile[(8 * k8 + 2 * j + 1) * kPitch + col]) << 16);
    }
    *reinterpret_cast<uint4*>(v_t + (static_cast<int64_t>(g) * kHeadDim + c) * stride + out0 + 8 * k8) =
        make_uint4(w[0], w[1], w[2], w[3]);
  }
}

}  // namespace

namespace {

// The one decision of whether the path exists for these shapes on the current device (allocate and
// bytes_for both ask it, so the memory a runtime is sized for is what it takes).
Status path_runs(int64_t head_dim, int64_t max_keys, bool enabled, bool* runs) {
  *runs = false;
  if (head_dim != kHeadDim || !enabled || max_keys <= 0) return {};
  cuda::DeviceFacts dev;
  LLMQ_RETURN_IF_ERROR(cuda::current_device_facts(&dev));
  *runs = sm90_bf16_attention_runs(dev);
  return {};
}

int64_t packed_keys(int64_t max_keys) { return attention_v_t_stride(std::min(max_keys, Bf16PrefillAttention::kMaxKeys)); }

}  // namespace

int64_t Bf16PrefillAttention::bytes_for(int64_t kv_heads, int64_t head_dim, int64_t max_keys, bool enabled) {
  bool runs = false;
  if (!path_runs(head_dim, max_keys, enabled, &runs).ok() || !runs) return 0;
  return 2 * packed_keys(max_keys) * kv_heads * kHeadDim * 2;
}

Status Bf16PrefillAttention::allocate(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t max_keys, bool enabled) {
  active_ = false;
  bool runs = false;
  LLMQ_RETURN_IF_ERROR(path_runs(head_dim, max_keys, enabled, &runs));
  if (!runs) return {};
  heads_ = heads, kv_heads_ = kv_heads, keys_ = packed_keys(max_keys);
  LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(keys_ * kv_heads * kHeadDim * 2, "BF16 attention K rows", &k_rows_));
  LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(kv_heads * kHeadDim * keys_ * 2, "BF16 attention V^T", &v_t_));
  active_ = true;
  return {};
}

bool Bf16PrefillAttention::applies(const std::vector<PrefillSequence>& seqs, int64_t window, const float* sinks) const {
  if (!active_ || window != 0 || sinks != nullptr || seqs.empty()) return false;
  double work = 0.0, keys = 0.0;  // sum of q_len x kv_len, of kv_len
  for (const PrefillSequence& s : seqs) {
    if (s.q_len <= 0) continue;  // run skips it
    if (s.kv_len > keys_) return false;
    work += static_cast<double>(s.q_len) * static_cast<double>(s.kv_len);
    keys += static_cast<double>(s.kv_len);
  }
  return work >= static_cast<double>(kMinQueries) * keys && keys > 0.0;
}

Status Bf16PrefillAttention::run(const PrefillAttentionArgs& a, const std::vector<PrefillSequence>& seqs, CudaStream stream) const {
  if (!active_) return invalid_argument("BF16 prefill attention: not allocated");
  LLMQ_RETURN_IF_ERROR(validate_kv_pages(a.pages, "BF16 prefill attention: "));
  const bool fp8 = a.kv_dtype == KvCacheDType::kE4M3;
  const void* k_cache = fp8 ? static_cast<const void*>(a.k_cache8) : a.k_cache;
  const void* v_cache = fp8 ? static_cast<const void*>(a.v_cache8) : a.v_cache;
  if (k_cache == nullptr || v_cache == nullptr) return invalid_argument("BF16 prefill attention: the K or V cache is null");
  if (fp8 && (a.k_scale == nullptr || a.v_scale == nullptr))
    return invalid_argument("BF16 prefill attention: an E4M3 cache needs k_scale and v_scale");
  if (reinterpret_cast<uintptr_t>(k_cache) % 16 != 0 || reinterpret_cast<uintptr_t>(v_cache) % 16 != 0)
    return invalid_argument("BF16 prefill attention: the K and V caches must be 16-byte aligned (rows move 8 elements at a time)");
  if (a.n_heads != heads_ || a.n_kv_heads != kv_heads_ || a.head_dim != kHeadDim)
    return invalid_argument("BF16 prefill attention: heads, kv heads or head_dim differ from the allocation");
  // Sequences in order, as many a launch as the packed buffers and the launch's table take.
  std::vector<PrefillSequence> batch;
  int64_t packed = 0;
  for (const PrefillSequence& seq : seqs) {
    if (seq.q_len <= 0) continue;
    LLMQ_RETURN_IF_ERROR(check_prefill_sequence(seq, keys_, keys_, a.pages, "BF16 prefill attention"));
    const int64_t rows = attention_v_t_stride(seq.kv_len);
    if (!batch.empty() && (packed + rows > keys_ || static_cast<int>(batch.size()) == kMaxSeqs)) {
      LLMQ_RETURN_IF_ERROR(launch(a, batch.data(), static_cast<int>(batch.size()), stream));
      batch.clear();
      packed = 0;
    }
    batch.push_back(seq);
    packed += rows;
  }
  if (!batch.empty()) LLMQ_RETURN_IF_ERROR(launch(a, batch.data(), static_cast<int>(batch.size()), stream));
  return {};
}

Status Bf16PrefillAttention::launch(const PrefillAttentionArgs& a, const PrefillSequence* seqs, int count, CudaStream stream) const {
  const bool fp8 = a.kv_dtype == KvCacheDType::kE4M3;
  GatherSeqs g{};
  Bf16AttentionBatchArgs b;
  int64_t packed = 0, tiles = 0;
  for (int i = 0; i < count; ++i) {
    const PrefillSequence& s = seqs[i];
    if (s.q_begin < 0 || s.q_begin > INT32_MAX)
      return invalid_argument("BF16 prefill attention: query row " + std::to_string(s.q_begin) + " not in [0, 2^31)");
    g.slot[i] = static_cast<int>(s.slot);
    g.kv_len[i] = b.seqs.kv_len[i] = static_cast<int>(s.kv_len);
    g.kv_begin[i] = b.seqs.kv_begin[i] = static_cast<int>(packed);
    g.tile_begin[i] = static_cast<int>(tiles);
    b.seqs.q_begin[i] = static_cast<int>(s.q_begin);
    b.seqs.q_len[i] = static_cast<int>(s.q_len);
    const int64_t rows = attention_v_t_stride(s.kv_len);
    packed += rows;
    tiles += rows / kTileKeys;
  }
  g.count = b.seqs.count = count;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(kv_heads_));
  const void* k_cache = fp8 ? static_cast<const void*>(a.k_cache8) : a.k_cache;
  const void* v_cache = fp8 ? static_cast<const void*>(a.v_cache8) : a.v_cache;
  if (fp8)
    gather_k_and_v_t_kernel<true><<<grid, kGatherThreads, 0, st>>>(k_cache, v_cache, a.pages, g, static_cast<int>(kv_heads_),
                                                                    keys_, k_rows_.as<uint4>(), v_t_.as<uint16_t>());
  else
    gather_k_and_v_t_kernel<false><<<grid, kGatherThreads, 0, st>>>(k_cache, v_cache, a.pages, g, static_cast<int>(kv_heads_),
                                                                     keys_, k_rows_.as<uint4>(), v_t_.as<uint16_t>());
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("gather_k_and_v_t_kernel");
  b.keys = keys_;
  b.heads = heads_;
  b.kv_heads = kv_heads_;
  b.causal = true;
  b.softmax_scale = a.softmax_scale;
  b.q = a.q;
  b.k = k_rows_.as<uint16_t>();
  b.v_t = v_t_.as<uint16_t>();
  b.out = a.out;
  b.k_scale = fp8 ? a.k_scale : nullptr;
  b.v_scale = fp8 ? a.v_scale : nullptr;
  return sm90_bf16_attention_batch(b, stream);
}

}  // namespace llmq::attention
