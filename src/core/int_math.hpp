// Integer helpers for sizes and grids, shared by every layer (host code; sizes are int64_t).
#pragma once

#include <cstdint>

namespace llmq {

// ceil(a / b) for a >= 0, b > 0, without the overflow of (a + b - 1) / b near INT64_MAX.
constexpr int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// The smallest multiple of b that is >= a.
constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

}  // namespace llmq
