// The host reference of the per-channel absmax fold (channel_absmax.hpp holds the definition).
// Scalar and obvious: it is the specification the device kernel is tested against. Built with or
// without CUDA.
#include <cmath>

#include "runtime/channel_absmax.hpp"

namespace llmq::runtime {

void channel_absmax_reference(const float* x, int64_t rows, int64_t k, int64_t ld, float* channel_max,
                              int64_t* nonfinite) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j) {
      const float v = x[r * ld + j];
      if (!std::isfinite(v)) {
        ++*nonfinite;  // counted, never folded (see the header)
        continue;
      }
      const float a = std::fabs(v);
      if (a > channel_max[j]) channel_max[j] = a;
    }
}

}  // namespace llmq::runtime
