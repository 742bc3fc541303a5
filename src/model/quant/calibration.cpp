// Calibration observers (the statistics file is read and written in calibration_stats.cpp).
#include "llmq/calibration.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <limits>

#include "llmq/quantized_model.hpp"

namespace llmq {

// Statistics against a model (kept out of calibration_stats.cpp, which the fuzz targets link
// without the model code).
Status CalibrationStats::check_matches(const ModelConfig& config) const {
  std::map<std::string, int64_t> in_features;  // module -> input width
  for (const LinearId& id : linear_ids(config)) in_features[id.hf_name(config)] = linear_shape(config, id)[1];
  for (const auto& [name, l] : linears) {
    const auto it = in_features.find(name);
    if (it == in_features.end())
      return invalid_argument("--stats: '" + name + "' is not a linear layer of this model (" +
                              std::to_string(config.n_layers) + " layers, " + config.model_type +
                              (config.is_moe() ? ", " + std::to_string(config.n_experts) + " experts" : "") +
                              "); were the statistics measured on another model?");
    if (l.in_features != it->second)
      return invalid_argument("--stats: '" + name + "' has " + std::to_string(l.in_features) +
                              " input channels; this model's has " + std::to_string(it->second) +
                              "; were the statistics measured on another model?");
    const bool bad_scalar = !std::isfinite(l.input_absmax) || l.input_absmax < 0 || !std::isfinite(l.weight_absmax) ||
                            l.weight_absmax < 0 || l.rows_seen < 0;
    auto bad = [](float v) { return !std::isfinite(v) || v < 0; };
    if (bad_scalar || std::any_of(l.input_channel_absmax.begin(), l.input_channel_absmax.end(), bad) ||
        std::any_of(l.weight_channel_absmax.begin(), l.weight_channel_absmax.end(), bad))
      return invalid_argument("--stats: '" + name + "' holds a negative, infinite or NaN absmax or row count");
  }
  if (!kv_cache.empty()) {
    const KvCacheStats& kv = kv_cache;
    if (kv.layers != config.n_layers || kv.kv_heads != config.n_kv_heads)
      return invalid_argument("--stats: the KV cache statistics are for " + std::to_string(kv.layers) + " layers of " +
                              std::to_string(kv.kv_heads) + " KV heads; this model has " + std::to_string(config.n_layers) +
                              " of " + std::to_string(config.n_kv_heads) + "; were the statistics measured on another model?");
    const size_t n = static_cast<size_t>(kv.layers * kv.kv_heads);
    auto bad = [](float v) { return !std::isfinite(v) || v < 0; };
    if (kv.k_absmax.size() != n || kv.v_absmax.size() != n || std::any_of(kv.k_absmax.begin(), kv.k_absmax.end(), bad) ||
        std::any_of(kv.v_absmax.begin(), kv.v_absmax.end(), bad))
      return invalid_argument("--stats: the KV cache statistics are not " + std::to_string(n) +
                              " finite non-negative values each for keys and values");
  }
  return {};
}

Status KvCacheStats::static_e4m3_scales(std::vector<float>* k, std::vector<float>* v) const {
  if (empty()) return invalid_argument("KV cache statistics: none measured (run llmq calibrate)");
  k->clear();
  v->clear();
  for (int64_t l = 0; l < layers; ++l)
    for (const auto& [what, from, to] : {std::tuple<const char*, const std::vector<float>*, std::vector<float>*>{"key", &k_absmax, k},
                                         {"value", &v_absmax, v}}) {
      float absmax = 0.0f;
      for (int64_t h = 0; h < kv_heads; ++h) absmax = std::max(absmax, (*from)[static_cast<size_t>(l * kv_heads + h)]);
      const float scale = absmax / 448.0f;
      if (!(scale >= std::numeric_limits<float>::min()) || !std::isfinite(scale))  // 0, subnormal or Inf: no usable scale
        return invalid_argument("KV cache statistics: the " + std::string(what) + " absmax of layer " + std::to_string(l) +
                                " is " + std::to_string(absmax) + " (the calibration never wrote that cache?)");
      to->insert(to->end(), static_cast<size_t>(kv_heads), scale);
    }
  return {};
}

Status KvCacheStats::merge(const std::vector<float>& k, const std::vector<float>& v, int64_t n_layers, int64_t n_kv_heads) {
  const size_t n = static_cast<size_t>(n_layers * n_kv_heads);
  if (n_layers <= 0 || n_kv_heads <= 0 || k.size() != n || v.size() != n ||
      (!empty() && (k_absmax.size() != n || v_absmax.size() != n)))
    return invalid_argument("KV cache statistics: " + std::to_string(k.size()) + " and " + std::to_string(v.size()) +
                            " values for " + std::to_string(n_layers) + " layers of " + std::to_string(n_kv_heads) + " KV heads");
  if (empty()) {
    layers = n_layers;
    kv_heads = n_kv_heads;
    k_absmax = k;
    v_absmax = v;
    return {};
  }
  if (layers != n_layers || kv_heads != n_kv_heads)
    return invalid_argument("KV cache statistics: " + std::to_string(n_layers) + " layers of " + std::to_string(n_kv_heads) +
                            " KV heads do not fold into " + std::to_string(layers) + " of " + std::to_string(kv_heads));
  for (size_t i = 0; i < n; ++i) {
    k_absmax[i] = std::max(k_absmax[i], k[i]);
    v_absmax[i] = std::max(v_absmax[i], v[i]);
  }
  return {};
}

Status CalibrationStats::merge(const CalibrationStats& other) {
  // Every entry either side would touch holds in_features maxima of each kind, checked first.
  auto sized = [](const std::string& name, const LinearStats& l) -> Status {
    const size_t k = static_cast<size_t>(std::max<int64_t>(l.in_features, 0));
    if (l.input_channel_absmax.size() != k || l.weight_channel_absmax.size() != k)
      return invalid_argument("calibration statistics: '" + name + "' has " + std::to_string(l.input_channel_absmax.size()) +
                              " input and " + std::to_string(l.weight_channel_absmax.size()) + " weight channel maxima for " +
                              std::to_string(l.in_features) + " input channels");
    return {};
  };
  for (const auto& [name, l] : other.linears) {
    const auto it = linears.find(name);
    if (it != linears.end() && it->second.in_features != l.in_features)
      return invalid_argument("calibration statistics: '" + name + "' has " + std::to_string(it->second.in_features) +
                              " input channels here and " + std::to_string(l.in_features) + " in the measurement folded in");
    LLMQ_RETURN_IF_ERROR(sized(name, l));
    if (it != linears.end()) LLMQ_RETURN_IF_ERROR(sized(name, it->second));
  }
  if (!other.kv_cache.empty() && !kv_cache.empty() &&
      (other.kv_cache.layers != kv_cache.layers || other.kv_cache.kv_heads != kv_cache.kv_heads))
    return invalid_argument("calibration statistics: a KV cache of " + std::to_string(other.kv_cache.layers) + " layers of " +
                            std::to_string(other.kv_cache.kv_heads) + " KV heads does not fold into " +
                            std::to_string(kv_cache.layers) + " of " + std::to_string(kv_cache.kv_heads));
  if (!other.kv_cache.empty())
    LLMQ_RETURN_IF_ERROR(kv_cache.merge(other.kv_cache.k_absmax, other.kv_cache.v_absmax, other.kv_cache.layers,
                                        other.kv_cache.kv_heads));  // its sizes are checked before anything changes
  for (const auto& [name, l] : other.linears) {
    auto [it, added] = linears.emplace(name, l);
    if (added) continue;
    LinearStats& mine = it->second;
    for (size_t j = 0; j < mine.input_channel_absmax.size(); ++j)
      mine.input_channel_absmax[j] = std::max(mine.input_channel_absmax[j], l.input_channel_absmax[j]);
    mine.input_absmax = std::max(mine.input_absmax, l.input_absmax);
    mine.rows_seen += l.rows_seen;
  }
  tokens += other.tokens;
  return {};
}

CalibrationBackend::CalibrationBackend(const ModelConfig& config, CalibrationStats* stats)
    : config_(config), stats_(stats) {}

Status CalibrationBackend::forward(const Linear& linear, const float* x, int64_t rows, float* y) {
  const int64_t in = linear.weight.shape()[1];
  LinearStats& s = stats_->linears[linear.id.hf_name(config_)];
  if (s.in_features == 0) {
    // First sighting: the weight statistics (eq. 10a, 10c), measured once.
    s.in_features = in;
    s.input_channel_absmax.assign(static_cast<size_t>(in), 0.0f);
    s.weight_channel_absmax.assign(static_cast<size_t>(in), 0.0f);
    const float* w = linear.weight.data_as<float>();
    const int64_t out = linear.weight.shape()[0];
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < in; ++k) {
        const float a = std::fabs(w[o * in + k]);
        float& m = s.weight_channel_absmax[static_cast<size_t>(k)];
        if (a > m) m = a;
      }
    for (float m : s.weight_channel_absmax) s.weight_absmax = std::max(s.weight_absmax, static_cast<double>(m));
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < in; ++k) {
      const float a = std::fabs(x[r * in + k]);
      float& m = s.input_channel_absmax[static_cast<size_t>(k)];
      if (a > m) m = a;  // NaN never wins
    }
  for (float m : s.input_channel_absmax) s.input_absmax = std::max(s.input_absmax, static_cast<double>(m));
  s.rows_seen += rows;
  return float_.forward(linear, x, rows, y);
}

Status calibrate(const ModelWeights& model, const std::vector<int32_t>& tokens, int64_t chunk,
                 CalibrationStats* out) {
  if (chunk <= 0 || chunk > model.config.max_seq_len)
    return invalid_argument("--chunk: must be in [1, max_seq_len = " + std::to_string(model.config.max_seq_len) + "]");
  if (tokens.empty()) return invalid_argument("--data: no calibration tokens");
  CalibrationBackend backend(model.config, out);
  Transformer transformer(model, &backend);
  std::vector<float> logits;
  for (size_t start = 0; start < tokens.size(); start += static_cast<size_t>(chunk)) {
    const int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(tokens.size() - start));
    logits.resize(static_cast<size_t>(n * model.config.vocab_size));
    transformer.reset();
    LLMQ_RETURN_IF_ERROR(transformer.forward(tokens.data() + start, n, 0, logits.data()));
    std::vector<float> k, v;  // this window's cache: every position it wrote
    transformer.kv_absmax(&k, &v);
    for (const std::vector<float>* values : {&k, &v})
      for (float x : *values)
        if (!std::isfinite(x))  // the file could not hold it (JSON has no Inf), nor a scale come of it
          return invalid_argument("calibrate: the KV cache held NaN/Inf over the calibration data (the model overflows?)");
    LLMQ_RETURN_IF_ERROR(out->kv_cache.merge(k, v, model.config.n_layers, model.config.n_kv_heads));
  }
  out->tokens += static_cast<int64_t>(tokens.size());
  return {};
}

}  // namespace llmq
