// The runtime's RoPE table (row_kernels.hpp rope_cos_sin): host code, so that it is the CPU
// reference's arithmetic by construction (the same rope_inv_freq, the same float cos / sin).
#include <cmath>

#include "llmq/transformer.hpp"
#include "runtime/row_kernels.hpp"

namespace llmq::runtime {

std::vector<float> rope_cos_sin(const ModelConfig& c, int64_t positions) {
  const std::vector<float> inv = rope_inv_freq(c);
  // YaRN scales cos and sin by its attention factor; with none (1) they stay bit-identical.
  const float factor = rope_attention_factor(c);
  const int64_t half = c.head_dim / 2;
  std::vector<float> cs(static_cast<size_t>(positions * half * 2));
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t j = 0; j < half; ++j) {
      const float val = static_cast<float>(p) * inv[static_cast<size_t>(j)];
      cs[static_cast<size_t>((p * half + j) * 2)] = factor == 1.0f ? std::cos(val) : std::cos(val) * factor;
      cs[static_cast<size_t>((p * half + j) * 2 + 1)] = factor == 1.0f ? std::sin(val) : std::sin(val) * factor;
    }
  return cs;
}

}  // namespace llmq::runtime
