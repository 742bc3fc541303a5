// NaN and Inf in weights. No trained model has them where they matter, so they mean a corrupt or
// broken checkpoint: loaders and the quantizer refuse them by default, naming the tensor, the
// counts and the first position. llmq quantize --nonfinite zero replaces them with 0 instead (and
// counts what it replaced), for a model whose owner knows which entries are dead.
#pragma once

#include <cstdint>
#include <string>

#include "llmq/status.hpp"
#include "llmq/tensor.hpp"

namespace llmq {

enum class NonFinitePolicy { kError, kZero };

struct NonFiniteCount {
  int64_t nan = 0;
  int64_t inf = 0;
  int64_t first = -1;  // flat index of the first one, -1 when none
  int64_t total() const { return nan + inf; }
};

NonFiniteCount count_nonfinite(const float* data, int64_t n);

// Apply the policy to a float32 tensor called `name`. kError: an error naming the tensor, the
// counts and the first element (as row, col for a matrix). kZero: replace them with 0 and add the
// count to *replaced (when not null). first_row: where t starts in the whole tensor (t a block of
// its rows), so the error gives the position in the whole tensor.
Status apply_nonfinite_policy(const std::string& name, NonFinitePolicy policy, Tensor* t, int64_t* replaced = nullptr,
                              int64_t first_row = 0);

// Logits of n rows of `vocab` are a model's answer only when finite and not all equal: NaN/Inf
// (weights that overflow float32, a broken scale) or a constant row (an output that no longer
// depends on the input: zeroed or degenerate weights) are an error, never output. The message
// names the row as `row_label` + (first_row + i), e.g. "position 17".
Status check_logits(const float* logits, int64_t n, int64_t vocab, const std::string& row_label, int64_t first_row);

}  // namespace llmq
