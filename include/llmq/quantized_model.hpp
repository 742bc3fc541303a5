// A model quantized in memory under a Scheme, and the LinearBackend that runs it through llmq's
// reference quantized GEMM: every linear layer's weight quantized once, activations quantized at
// run time (dynamic) or with calibrated scales (static), SmoothQuant folded into the RMSNorm gains
// and weight columns. This is what `eval --scheme` measures and what `quantize` writes.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "llmq/calibration.hpp"
#include "llmq/model.hpp"
#include "llmq/quantize_tensor.hpp"
#include "llmq/scheme.hpp"
#include "llmq/transformer.hpp"

namespace llmq {

struct QuantizeModelOptions {
  bool quantize_lm_head = false;  // the paper (3.3, step 5) keeps lm_head in high precision
  bool quantize_router = false;   // MoE routers are tiny and decide the routing: kept
};

// Is this linear quantized under the options? (Attention and MLP projections always are.)
bool linear_is_quantized(const Linear& linear, const QuantizeModelOptions& options);

struct QuantizedLinear {
  // The llmq scheme it was quantized under ("fp8-dynamic"; a checkpoint's scheme when read from
  // one, "checkpoint" when the checkpoint does not say): in a mixed model each linear has its own.
  std::string scheme;
  QuantizedTensor weight;
  bool quantize_input = false;
  QuantSpec input_spec;
  ScaleSet static_input_scale;  // when input_spec.source == kStatic
};

struct QuantizedModel {
  // The scheme of every quantized linear; for a mixed model (quant_recipe.hpp) its name is
  // kMixedSchemeName and its specs only summarise (weight: blocks when any linear has blocks), each
  // linear's own being in QuantizedLinear::scheme and its specs.
  Scheme scheme;
  QuantizeModelOptions options;
  ModelWeights weights;  // float weights after smoothing (norm gains / s, weight columns * s)
  std::map<std::string, QuantizedLinear> linears;  // by Hugging Face module name
  const QuantizedLinear* find(const std::string& module) const;
};

// SmoothQuant: the consumers of each RMSNorm output share one smoothing vector s (eq. 26), from
// the calibrated input absmax (shared by the consumers) and the max over their weights' per-input-
// channel absmax. The norm gain is divided by s and each consumer's columns multiplied by s, which
// leaves the float model's function unchanged. o_proj and down_proj inputs are not smoothed.
struct SmoothingGroup {
  std::string norm;                  // "model.layers.3.input_layernorm.weight"
  std::vector<std::string> members;  // module names of the consumers
  std::vector<float> factors;        // s_c [dim]
};
// `weight_columns(module, &absmax)` gives a consumer's per-input-channel weight absmax: from memory
// here, from a memory-mapped checkpoint when exporting.
using WeightColumnsFn = std::function<Status(const std::string& module, std::vector<float>* absmax)>;
Status smoothing_groups(const ModelConfig& config, const CalibrationStats& stats, float alpha,
                        const WeightColumnsFn& weight_columns, std::vector<SmoothingGroup>* out);
Status smoothing_groups(const ModelWeights& model, const CalibrationStats& stats, float alpha,
                        std::vector<SmoothingGroup>* out);
// Module names of the linear layers of a config, in forward order, with their ids.
std::vector<LinearId> linear_ids(const ModelConfig& config);
// Apply the groups to a float model in place.
Status apply_smoothing(const std::vector<SmoothingGroup>& groups, ModelWeights* model);

// The static activation scale of one linear under a spec (eq. 15a; eq. 27 after smoothing, the
// statistics having been divided by the smoothing factors).
Status static_activation_scale(const LinearStats& stats, const std::vector<float>* smoothing,
                               const QuantSpec& spec, float* out);

// Quantize one weight [out, in] under the scheme (the spec's method, block shape, rounding).
Status quantize_weight(const Tensor& weight, const Scheme& scheme, QuantizedTensor* out);

// One linear under `scheme`: its weight quantized, its input quantization (a static scale from
// `stats`, after `smoothing` when the linear's input is smoothed; null otherwise). An MoE expert
// no calibration token reached falls back to dynamic activations.
Status quantize_linear(const Linear& linear, const ModelConfig& config, const Scheme& scheme,
                       const CalibrationStats* stats, const std::vector<float>* smoothing, QuantizedLinear* out);

Status quantize_model(const ModelWeights& model, const Scheme& scheme, const CalibrationStats* stats,
                      const QuantizeModelOptions& options, QuantizedModel* out);

// How far the quantized weights are from the float weights they stand for (QuantizedModel::weights,
// after any smoothing): relative L2 error ||W_q - W|| / ||W|| over every quantized linear, over the
// MoE experts alone, and the share of elements reproduced exactly. For a model read from MXFP4
// (gpt-oss), the float weights are the exact MXFP4 values: this is the conversion's error.
struct WeightError {
  double rel_l2 = 0.0;
  double expert_rel_l2 = 0.0;  // 0 for dense models
  double exact_fraction = 0.0;
  int64_t elements = 0;
};
Status weight_error(const QuantizedModel& model, WeightError* out);

class QuantizedLinearBackend : public LinearBackend {
 public:
  explicit QuantizedLinearBackend(const QuantizedModel& model) : model_(model) {}
  Status forward(const Linear& linear, const float* x, int64_t rows, float* y) override;

 private:
  const QuantizedModel& model_;
  FloatLinearBackend float_;
};

}  // namespace llmq
