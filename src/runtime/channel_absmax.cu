// Per-input-channel absmax on the device (channel_absmax.hpp holds the definition).
//
// One thread per column over a chunk of kRowsPerBlock rows: consecutive threads read consecutive
// columns of a row, so every warp's loads are coalesced for a row-major matrix, and each thread
// keeps its maximum in a register; one atomicMax per thread and chunk folds it into the running
// maximum. atomicMax on the int bit pattern is the float maximum because both operands are
// non-negative finite floats (IEEE-754 orders those like their bits); non-finite values are
// counted instead, so a NaN's bits (above +Inf's) never reach the compare. Row chunks beyond the
// grid's height are walked by a grid stride, so any row count runs in one launch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <string>

#include "attention/kv_pages.cuh"
#include "cuda/cuda_check.cuh"
#include "runtime/channel_absmax.hpp"

namespace llmq::runtime {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kRowsPerBlock = 64;
constexpr int64_t kMaxGridY = 4096;  // row chunks launched at once (the rest by the grid stride)

// Where row r of the fold is: r itself, the cache row of position[r] in slot[r]'s pages (kPaged),
// or row_index[r] (kIndex); and which running maximum it folds into (segments: channel_max + s * k).
enum class RowMode { kDirect, kPaged, kIndex };
struct RowSource {
  RowMode mode;
  const int32_t* position;
  const int32_t* slot;
  attention::KvPages pages;
  const int32_t* row_index;
  const int32_t* segment_offsets;  // null: one segment
  int segments;
};

// The segment of row r: the last s with offsets[s] <= r (offsets non-decreasing from 0), or
// `segments` past the end.
__device__ __forceinline__ int segment_of(const int32_t* offsets, int segments, int64_t r) {
  if (r >= offsets[segments]) return segments;
  int lo = 0, hi = segments - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= r) lo = mid; else hi = mid - 1;
  }
  return lo;
}

template <bool kF32>
__global__ void channel_absmax_kernel(const void* __restrict__ x, int64_t rows, int64_t k, int64_t ld,
                                      float* __restrict__ channel_max, unsigned long long* __restrict__ nonfinite,
                                      RowSource src) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (col >= k) return;
  float m = 0.0f;
  unsigned long long bad = 0;
  int seg = 0;  // the segment m belongs to (segmented folds flush m when it changes)
  auto flush = [&] {
    if (m > 0.0f) atomicMax(reinterpret_cast<int*>(channel_max + static_cast<int64_t>(seg) * k + col), __float_as_int(m));
    m = 0.0f;
  };
  bool past_segments = false;  // rows rise across this thread's chunks: once past the last segment, done
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowsPerBlock; r0 < rows && !past_segments;
       r0 += static_cast<int64_t>(gridDim.y) * kRowsPerBlock) {
    const int64_t r1 = r0 + kRowsPerBlock < rows ? r0 + kRowsPerBlock : rows;
    for (int64_t r = r0; r < r1; ++r) {
      if (src.segment_offsets != nullptr) {
        const int s = segment_of(src.segment_offsets, src.segments, r);
        if (s == src.segments) {
          past_segments = true;
          break;
        }
        if (s != seg) {
          flush();
          seg = s;
        }
      }
      const int64_t row = src.mode == RowMode::kPaged   ? attention::paged_rows(src.pages, src.slot[r]).row(src.position[r])
                          : src.mode == RowMode::kIndex ? src.row_index[r]
                                                        : r;
      const int64_t at = row * ld + col;
      const float v = kF32 ? static_cast<const float*>(x)[at]
                           : __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(x)[at]) << 16);
      const float a = fabsf(v);
      if (a <= FLT_MAX) {
        m = fmaxf(m, a);
      } else {
        ++bad;  // NaN (every compare false) or +-Inf
      }
    }
  }
  flush();
  if (bad != 0) atomicAdd(nonfinite, bad);
}

__global__ void segment_rows_add_kernel(const int32_t* offsets, int64_t segments, int64_t* counts) {
  for (int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; s < segments;
       s += static_cast<int64_t>(gridDim.x) * blockDim.x)
    counts[s] += offsets[s + 1] - offsets[s];
}

}  // namespace

Status channel_absmax(const ChannelAbsmaxArgs& a, CudaStream stream) {
  if (a.dtype != DType::kBF16 && a.dtype != DType::kF32)
    return invalid_argument(std::string("channel_absmax: dtype must be bf16 or f32, got ") + dtype_name(a.dtype));
  if (a.rows < 0) return invalid_argument("channel_absmax: rows = " + std::to_string(a.rows));
  if (a.k < 1) return invalid_argument("channel_absmax: k = " + std::to_string(a.k));
  if (a.ld < a.k)
    return invalid_argument("channel_absmax: ld = " + std::to_string(a.ld) + " < k = " + std::to_string(a.k));
  if (a.rows == 0) return {};
  if (a.x == nullptr || a.channel_max == nullptr || a.nonfinite == nullptr)
    return invalid_argument("channel_absmax: null x, channel_max or nonfinite");
  RowSource src{RowMode::kDirect, a.position, a.slot, a.pages, a.row_index, a.segment_offsets, 0};
  if (a.position != nullptr) {
    if (a.slot == nullptr) return invalid_argument("channel_absmax: position without slot");
    if (a.row_index != nullptr) return invalid_argument("channel_absmax: position and row_index both set");
    LLMQ_RETURN_IF_ERROR(attention::validate_kv_pages(a.pages, "channel_absmax: "));
    src.mode = RowMode::kPaged;
  } else if (a.row_index != nullptr) {
    src.mode = RowMode::kIndex;
  }
  if (a.segment_offsets != nullptr) {
    if (a.segments < 1 || a.segments > INT_MAX - 1)
      return invalid_argument("channel_absmax: segments = " + std::to_string(a.segments));
    src.segments = static_cast<int>(a.segments);
  }
  const int64_t grid_x = (a.k + kThreads - 1) / kThreads;
  if (grid_x > INT_MAX) return invalid_argument("channel_absmax: k = " + std::to_string(a.k) + " is too wide");
  const int64_t chunks = (a.rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(std::min(chunks, kMaxGridY)));
  auto kernel = a.dtype == DType::kF32 ? channel_absmax_kernel<true> : channel_absmax_kernel<false>;
  kernel<<<grid, kThreads, 0, stream>>>(a.x, a.rows, a.k, a.ld, a.channel_max, a.nonfinite, src);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("channel_absmax_kernel");
  return {};
}

Status segment_rows_add(const int32_t* offsets, int64_t segments, int64_t* counts, CudaStream stream) {
  if (segments < 1 || offsets == nullptr || counts == nullptr)
    return invalid_argument("segment_rows_add: " + std::to_string(segments) + " segments, or null offsets or counts");
  segment_rows_add_kernel<<<static_cast<unsigned>(std::min<int64_t>((segments + 255) / 256, 1024)), 256, 0, stream>>>(
      offsets, segments, counts);
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("segment_rows_add_kernel");
  return {};
}

}  // namespace llmq::runtime
