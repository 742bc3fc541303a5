// calibrate_on_gpu (gpu_runtime.hpp, tensor_parallel.hpp): calibrate() on the GPU runtime, through
// its public API only, so that it builds with or without CUDA (without, the runtime's calls say so).
#include <algorithm>

#include "llmq/calibration.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/tensor_parallel.hpp"

namespace llmq {
namespace {

// One pass for either runtime: GpuRuntime or TensorParallelRuntime (the same calls).
template <class Runtime>
Status calibrate_windows(Runtime& runtime, const GpuRuntimeOptions& options, const std::vector<std::vector<int32_t>>& sequences,
                         int64_t chunk, CalibrationStats* out, const CalibrationProgressFn& progress) {
  if (chunk <= 0 || chunk > options.max_context)
    return invalid_argument("--chunk: must be in [1, the runtime's max_context = " + std::to_string(options.max_context) + "]");
  // Every window [start, start + chunk) of every sequence, as calibrate() cuts them.
  std::vector<std::pair<size_t, size_t>> windows;  // (sequence, start)
  int64_t total = 0;
  for (size_t s = 0; s < sequences.size(); ++s) {
    for (size_t start = 0; start < sequences[s].size(); start += static_cast<size_t>(chunk)) windows.emplace_back(s, start);
    total += static_cast<int64_t>(sequences[s].size());
  }
  if (total == 0) return invalid_argument("--data: no calibration tokens");
  CalibrationStats seen;  // folded into *out only when every window went through
  LLMQ_RETURN_IF_ERROR(runtime.begin_calibration());
  Status st;
  int64_t done = 0;
  const size_t per_prefill = static_cast<size_t>(std::max<int64_t>(1, options.max_batch));
  for (size_t first = 0; first < windows.size() && st.ok(); first += per_prefill) {
    std::vector<std::vector<int32_t>> batch;
    for (size_t w = first; w < std::min(windows.size(), first + per_prefill); ++w) {
      const std::vector<int32_t>& seq = sequences[windows[w].first];
      const size_t start = windows[w].second, end = std::min(seq.size(), start + static_cast<size_t>(chunk));
      batch.emplace_back(seq.begin() + static_cast<std::ptrdiff_t>(start), seq.begin() + static_cast<std::ptrdiff_t>(end));
      done += static_cast<int64_t>(end - start);
    }
    runtime.reset();  // each window from position 0, as calibrate() resets its KV cache
    // Every position through lm_head (it reads every row, as the CPU's does); no logits back.
    st = runtime.prefill(batch, true, nullptr);
    if (st.ok() && progress) progress(done, total);
  }
  // Always detached; a failed pass discards what it saw.
  const Status ended = runtime.end_calibration(st.ok() ? &seen : nullptr);
  runtime.reset();
  LLMQ_RETURN_IF_ERROR(st);
  LLMQ_RETURN_IF_ERROR(ended);
  seen.tokens = total;
  return out->merge(seen);
}

}  // namespace

Status calibrate_on_gpu(GpuRuntime& runtime, const std::vector<std::vector<int32_t>>& sequences, int64_t chunk,
                        CalibrationStats* out, const CalibrationProgressFn& progress) {
  return calibrate_windows(runtime, runtime.options(), sequences, chunk, out, progress);
}

Status calibrate_on_gpu(TensorParallelRuntime& runtime, const std::vector<std::vector<int32_t>>& sequences, int64_t chunk,
                        CalibrationStats* out, const CalibrationProgressFn& progress) {
  if (!runtime.started()) return invalid_argument("calibration: the tensor-parallel runtime is not started");
  return calibrate_windows(runtime, runtime.runtime(0).options(), sequences, chunk, out, progress);
}

}  // namespace llmq
