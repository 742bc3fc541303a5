// Per-input-channel absmax of a row-major matrix, folded into a running maximum: the measurement
// behind `llmq calibrate --device cuda` (the GPU runtime's calibration observer folds every linear's
// input rows into it, and the weights' rows once). On the device (channel_absmax.cu) and, as the
// specification, on the host (channel_absmax_reference.cpp). Internal header; no CUDA headers.
//
// The definition, for x [rows, k] with row stride ld (elements) and a running max m [k] >= 0:
//   m[j] = max(m[j], max over rows r with |x[r, j]| finite of |x[r, j]|)
//   nonfinite += the number of NaN and +-Inf elements of x
// Non-finite values are counted, never folded into m: a NaN would otherwise win an integer
// compare (its bits are above +Inf's) or be dropped by a float compare, and either way the
// statistics would be silently wrong. The caller refuses the statistics when the count is not 0.
// BF16 elements are widened exactly to float first, so the device result equals the reference
// on the same values bit for bit (max involves no rounding).
#pragma once

#include <cstdint>

#include "attention/attention.hpp"
#include "llmq/cuda_stream.hpp"
#include "llmq/dtype.hpp"
#include "llmq/status.hpp"

namespace llmq::runtime {

struct ChannelAbsmaxArgs {
  const void* x = nullptr;        // [rows, ld] device memory, BF16 or F32
  DType dtype = DType::kBF16;     // kBF16 or kF32
  int64_t rows = 0;               // may be 0 (nothing is launched)
  int64_t k = 0;                  // channels (columns read), >= 1
  int64_t ld = 0;                 // row stride in elements, >= k
  float* channel_max = nullptr;   // [k] device memory, every value >= 0 (zeros to start)
  unsigned long long* nonfinite = nullptr;  // device counter, incremented
  // Optional gather through a paged KV cache (rows of a K or V cache as a step wrote them): with
  // position set, row r of the fold is the cache row of position[r] in block-table row slot[r]
  // (attention.hpp's KvPages), and ld is the cache row's width in elements.
  const int32_t* position = nullptr;  // device [rows]
  const int32_t* slot = nullptr;      // device [rows]
  attention::KvPages pages;
  // Optional gather by index (an MoE expert's routed rows): row r of the fold is x's row row_index[r].
  const int32_t* row_index = nullptr;  // device [rows]
  // Optional segments (MoE experts): row r folds into channel_max + s * k, s the segment with
  // segment_offsets[s] <= r < segment_offsets[s + 1] (device [segments + 1], non-decreasing, from
  // 0); rows at or past segment_offsets[segments] are not folded.
  const int32_t* segment_offsets = nullptr;
  int64_t segments = 0;
};

// counts[s] += offsets[s + 1] - offsets[s] for s < segments (device memory; enqueued on `stream`):
// the rows each segment of a segmented fold saw.
Status segment_rows_add(const int32_t* offsets, int64_t segments, int64_t* counts, CudaStream stream);

// Enqueues the fold on `stream`: no allocation, no host synchronisation. Refused (naming the
// field): a dtype other than BF16/F32, rows < 0, k < 1, ld < k, null pointers when rows > 0.
Status channel_absmax(const ChannelAbsmaxArgs& args, CudaStream stream);

// The host reference, on float values (BF16 inputs widened first): the definition above, with
// *nonfinite incremented by the count.
void channel_absmax_reference(const float* x, int64_t rows, int64_t k, int64_t ld, float* channel_max,
                              int64_t* nonfinite);

}  // namespace llmq::runtime
