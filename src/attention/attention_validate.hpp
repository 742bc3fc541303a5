// Argument checks that prefill_attention and decode_attention share: the KV cache in its format
// (BF16 pointers, or E4M3 codes with their per-head scales), the 16-byte alignment of the rows
// the kernels move, and the sliding window. Internal host header (no CUDA headers).
#pragma once

#include <cstdint>
#include <string>

#include "llmq/status.hpp"
#include "attention/attention.hpp"

namespace llmq::attention {

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// `f` prefixes every message ("decode_attention: "). Args: PrefillAttentionArgs or DecodeAttentionArgs.
template <typename Args>
Status validate_kv_cache_and_alignment(const Args& a, const std::string& f) {
  if (a.kv_dtype == KvCacheDType::kBF16) {
    if (a.k_cache == nullptr) return invalid_argument(f + "k_cache is null");
    if (a.v_cache == nullptr) return invalid_argument(f + "v_cache is null");
    if (!aligned16(a.q) || !aligned16(a.k_cache) || !aligned16(a.v_cache) || !aligned16(a.out))
      return invalid_argument(f + "q, k_cache, v_cache and out must be 16-byte aligned");
    return {};
  }
  if (a.kv_dtype != KvCacheDType::kE4M3)
    return invalid_argument(f + "kv_dtype " + std::to_string(static_cast<int>(a.kv_dtype)) + " is neither bf16 nor e4m3");
  if (a.k_cache8 == nullptr) return invalid_argument(f + "k_cache8 is null (kv_dtype e4m3)");
  if (a.v_cache8 == nullptr) return invalid_argument(f + "v_cache8 is null (kv_dtype e4m3)");
  if (a.k_scale == nullptr) return invalid_argument(f + "k_scale is null (kv_dtype e4m3)");
  if (a.v_scale == nullptr) return invalid_argument(f + "v_scale is null (kv_dtype e4m3)");
  if (!aligned16(a.q) || !aligned16(a.k_cache8) || !aligned16(a.v_cache8) || !aligned16(a.out))
    return invalid_argument(f + "q, k_cache8, v_cache8 and out must be 16-byte aligned");
  return {};
}

// window: >= 0, and a sliding window only with the causal mask (it is defined against it).
inline Status validate_window(int64_t window, bool causal, const std::string& f) {
  if (window < 0) return invalid_argument(f + "window " + std::to_string(window) + " is negative (0: no sliding window)");
  if (window > 0 && !causal) return invalid_argument(f + "window " + std::to_string(window) + " needs causal attention");
  return {};
}

}  // namespace llmq::attention
