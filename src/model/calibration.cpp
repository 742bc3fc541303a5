// Calibration observers (the statistics file is read and written in calibration_stats.cpp).
#include "llmq/calibration.hpp"

#include <algorithm>
#include <cmath>

namespace llmq {

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
  }
  out->tokens += static_cast<int64_t>(tokens.size());
  return {};
}

}  // namespace llmq
