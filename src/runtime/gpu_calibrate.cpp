// calibrate_on_gpu (gpu_runtime.hpp): calibrate() on the GPU runtime, through its public API only,
// so that it builds with or without CUDA (without, the runtime's calls say so).
#include <algorithm>

#include "llmq/calibration.hpp"
#include "llmq/gpu_runtime.hpp"

namespace llmq {

Status calibrate_on_gpu(GpuRuntime& runtime, const std::vector<int32_t>& tokens, int64_t chunk, CalibrationStats* out) {
  if (chunk <= 0 || chunk > runtime.options().max_context)
    return invalid_argument("--chunk: must be in [1, the runtime's max_context = " +
                            std::to_string(runtime.options().max_context) + "]");
  if (tokens.empty()) return invalid_argument("--data: no calibration tokens");
  LLMQ_RETURN_IF_ERROR(runtime.begin_calibration());
  Status st;
  std::vector<float> logits;
  for (size_t start = 0; start < tokens.size() && st.ok(); start += static_cast<size_t>(chunk)) {
    const size_t end = std::min(tokens.size(), start + static_cast<size_t>(chunk));
    runtime.reset();  // each window from position 0, as calibrate() resets its KV cache
    // Every position's logits: lm_head then reads every row, as the CPU's does.
    st = runtime.prefill({std::vector<int32_t>(tokens.begin() + static_cast<std::ptrdiff_t>(start),
                                               tokens.begin() + static_cast<std::ptrdiff_t>(end))},
                         true, &logits);
  }
  // Always detached; a failed pass discards what it saw.
  const Status ended = runtime.end_calibration(st.ok() ? out : nullptr);
  runtime.reset();
  LLMQ_RETURN_IF_ERROR(st);
  LLMQ_RETURN_IF_ERROR(ended);
  out->tokens += static_cast<int64_t>(tokens.size());
  return {};
}

}  // namespace llmq
