// Calibration statistics (llmq-calibration-v1 JSON, as `llmq calibrate` writes it). Accepted
// statistics are what quantize trusts for static scales and SmoothQuant: channel lists of
// in_features values, every absmax finite and non-negative, counts non-negative; KV statistics
// layers x kv_heads values each.
#include <cmath>

#include "fuzz_support.hpp"
#include "llmq/calibration.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmq;
  const std::string source = "fuzz-stats.json";
  CalibrationStats stats;
  const Status st = CalibrationStats::parse(source, fuzz::as_string(data, size), &stats);
  fuzz::require_named_error(st, source);
  if (!st.ok()) return 0;
  fuzz::require(stats.tokens >= 0, "negative token count");
  auto usable = [](double v) { return std::isfinite(v) && v >= 0.0; };
  for (const auto& [name, l] : stats.linears) {
    fuzz::require(l.in_features >= 0 && l.rows_seen >= 0, "negative count", name);
    fuzz::require(static_cast<int64_t>(l.input_channel_absmax.size()) == l.in_features &&
                      static_cast<int64_t>(l.weight_channel_absmax.size()) == l.in_features,
                  "channel statistics of the wrong length", name);
    fuzz::require(usable(l.input_absmax) && usable(l.weight_absmax), "absmax not finite and non-negative", name);
    for (const auto* channels : {&l.input_channel_absmax, &l.weight_channel_absmax})
      for (float v : *channels) fuzz::require(usable(v), "channel absmax not finite and non-negative", name);
  }
  const KvCacheStats& kv = stats.kv_cache;
  if (!kv.empty()) {
    fuzz::require(kv.layers >= 1 && kv.kv_heads >= 1, "KV statistics without layers or heads");
    const size_t n = static_cast<size_t>(kv.layers * kv.kv_heads);
    fuzz::require(kv.k_absmax.size() == n && kv.v_absmax.size() == n, "KV statistics of the wrong length");
    for (const auto* values : {&kv.k_absmax, &kv.v_absmax})
      for (float v : *values) fuzz::require(usable(v), "KV absmax not finite and non-negative");
  }
  return 0;
}
