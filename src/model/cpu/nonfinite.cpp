// NaN / Inf detection and the quantizer's policy for them.
#include "llmq/nonfinite.hpp"

#include <cmath>

namespace llmq {

NonFiniteCount count_nonfinite(const float* data, int64_t n) {
  NonFiniteCount c;
  for (int64_t i = 0; i < n; ++i) {
    const float v = data[i];
    if (std::isfinite(v)) continue;
    if (std::isnan(v)) ++c.nan;
    else ++c.inf;
    if (c.first < 0) c.first = i;
  }
  return c;
}

Status apply_nonfinite_policy(const std::string& name, NonFinitePolicy policy, Tensor* t, int64_t* replaced,
                              int64_t first_row) {
  if (t->dtype() != DType::kF32) return invalid_argument(name + ": the non-finite check reads float32 tensors");
  float* p = t->data_as<float>();
  const NonFiniteCount c = count_nonfinite(p, t->numel());
  if (c.total() == 0) return {};
  if (policy == NonFinitePolicy::kZero) {
    for (int64_t i = c.first; i < t->numel(); ++i)
      if (!std::isfinite(p[i])) p[i] = 0.0f;
    if (replaced != nullptr) *replaced += c.total();
    return {};
  }
  const int64_t rows = t->shape().empty() ? 1 : t->shape()[0];
  const int64_t row_elements = rows > 0 ? t->numel() / rows : 1;
  const int64_t first = first_row * row_elements + c.first;
  std::string where = "element " + std::to_string(first);
  if (t->shape().size() == 2 && row_elements > 0)
    where += " (row " + std::to_string(first / row_elements) + ", col " + std::to_string(first % row_elements) + ")";
  return invalid_argument("tensor '" + name + "': " + std::to_string(c.nan) + " NaN and " + std::to_string(c.inf) +
                          " Inf values, the first at " + where +
                          "; llmq refuses non-finite weights (llmq quantize --nonfinite zero replaces them with 0)");
}

Status check_logits(const float* logits, int64_t n, int64_t vocab, const std::string& row_label, int64_t first_row) {
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits + i * vocab;
    const NonFiniteCount bad = count_nonfinite(row, vocab);
    const std::string where = "the model's logits at " + row_label + std::to_string(first_row + i);
    if (bad.total() > 0)
      return invalid_argument(where + " hold " + std::to_string(bad.nan) + " NaN and " + std::to_string(bad.inf) +
                              " Inf of " + std::to_string(vocab) + " (first at token " + std::to_string(bad.first) +
                              "): the weights overflow float32 or are corrupt");
    bool constant = vocab > 1;
    for (int64_t v = 1; v < vocab && constant; ++v) constant = row[v] == row[0];
    if (constant)
      return invalid_argument(where + " are all " + std::to_string(row[0]) +
                              ": the output does not depend on the input (degenerate weights, e.g. a zero lm_head or norm)");
  }
  return {};
}

}  // namespace llmq
