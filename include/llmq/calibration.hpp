// Calibration (the MEASURE phase of the FP8 paper, section 3.1): run calibration tokens through
// the model and record, for the input of every linear layer, the per-tensor absmax r_x (eq. 8a) and
// the per-input-channel absmax r_x| (eq. 8b), plus the weights' per-tensor and per-input-channel
// absmax (eq. 10a, 10c); and the KV cache's absmax per layer and KV head (what a static FP8
// KV-cache scale is made from). Saved as JSON; `quantize` reads it for static scales and SmoothQuant.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "llmq/model.hpp"
#include "llmq/status.hpp"
#include "llmq/transformer.hpp"

namespace llmq {

struct LinearStats {
  int64_t in_features = 0;
  int64_t rows_seen = 0;                // tokens (rows) that went through this linear
  double input_absmax = 0;              // r_x
  std::vector<float> input_channel_absmax;   // r_x| [in]
  double weight_absmax = 0;             // r_w
  std::vector<float> weight_channel_absmax;  // r_w| [in] (per input channel)
};

// The KV cache's absmax over every position calibration wrote, per layer and KV head, layer-major:
// keys after RoPE (and the q/k norm where the family has one), as the cache holds them, and values.
// Empty (layers 0) when not measured: files from before it, or a run that did not measure it.
struct KvCacheStats {
  int64_t layers = 0;
  int64_t kv_heads = 0;
  std::vector<float> k_absmax;  // [layers * kv_heads]
  std::vector<float> v_absmax;  // [layers * kv_heads]
  bool empty() const { return layers == 0; }
  // Folds another measurement of the same shape in (elementwise max); an empty one takes it whole.
  Status merge(const std::vector<float>& k, const std::vector<float>& v, int64_t layers, int64_t kv_heads);
  // Static E4M3 scales, one per layer for keys and one for values (compressed-tensors' "tensor"
  // strategy, what `llmq quantize --kv-cache-scales` writes and vLLM reads): the layer's absmax over
  // its KV heads / 448, repeated for each head ([layers * kv_heads] each, layer-major, as
  // GpuRuntime::set_kv_scales and Transformer::set_kv_cache_e4m3 take them). Refused, naming the
  // layer: empty statistics, a layer whose scale would be 0, subnormal or not finite.
  Status static_e4m3_scales(std::vector<float>* k, std::vector<float>* v) const;
};

struct CalibrationStats {
  std::string model;       // what was calibrated (path or "default")
  std::string data;        // the calibration data
  int64_t tokens = 0;
  std::map<std::string, LinearStats> linears;  // by Hugging Face module name
  KvCacheStats kv_cache;

  Status save(const std::string& path) const;  // JSON, written to a temp file and renamed
  static Status load(const std::string& path, CalibrationStats* out);
  // The file's JSON text; `source` names it in errors. Every number is checked: counts are
  // non-negative integers, absmax values finite and non-negative, channel lists in_features long.
  static Status parse(const std::string& source, const std::string& json_text, CalibrationStats* out);
  const LinearStats* find(const std::string& module) const;
  // Folds another measurement of the same model in, as one run over both data sets would have
  // measured: input channel maxima maxed, rows and tokens added, a module's weight statistics taken
  // when it is new here (else kept: the same weights), the KV cache's maxima maxed. Refused, leaving
  // *this as it was: a module with another input width, a KV cache of another shape.
  Status merge(const CalibrationStats& other);
  // Were these statistics measured on a model of this shape? Every entry must name a linear layer
  // the model has, with its input width, and hold finite, non-negative absmax values; the error
  // names the entry and says what the model has instead; KV statistics must have its layers and KV
  // heads. (Missing entries are reported where a scheme needs them.)
  Status check_matches(const ModelConfig& config) const;
};

// A LinearBackend that observes inputs (and weights, once) and then runs the float matmul.
class CalibrationBackend : public LinearBackend {
 public:
  explicit CalibrationBackend(const ModelConfig& config, CalibrationStats* stats);
  Status forward(const Linear& linear, const float* x, int64_t rows, float* y) override;

 private:
  const ModelConfig& config_;
  CalibrationStats* stats_;
  FloatLinearBackend float_;
};

// Run `tokens` through the model in chunks of `chunk` positions (the KV cache is reset between
// chunks) with observers on every linear layer.
Status calibrate(const ModelWeights& model, const std::vector<int32_t>& tokens, int64_t chunk,
                 CalibrationStats* out);

}  // namespace llmq
