// Whole-model quantization in memory and the backend that runs it through quantized_gemm.
#include "llmq/quantized_model.hpp"

#include <cmath>

#include "llmq/gemm.hpp"
#include "llmq/scale.hpp"

namespace llmq {

bool linear_is_quantized(const Linear& linear, const QuantizeModelOptions& options) {
  if (linear.id.role == LinearRole::kLmHead) return options.quantize_lm_head;
  if (linear.id.role == LinearRole::kRouter) return options.quantize_router;
  return true;
}

const QuantizedLinear* QuantizedModel::find(const std::string& module) const {
  const auto it = linears.find(module);
  return it == linears.end() ? nullptr : &it->second;
}

std::vector<LinearId> linear_ids(const ModelConfig& c) {
  std::vector<LinearId> ids;
  for (int64_t i = 0; i < c.n_layers; ++i) {
    for (LinearRole r : {LinearRole::kQ, LinearRole::kK, LinearRole::kV, LinearRole::kO}) ids.push_back({i, r, -1});
    if (c.is_moe()) {
      ids.push_back({i, LinearRole::kRouter, -1});
      for (int64_t e = 0; e < c.n_experts; ++e)
        for (LinearRole r : {LinearRole::kGate, LinearRole::kUp, LinearRole::kDown}) ids.push_back({i, r, e});
    } else {
      for (LinearRole r : {LinearRole::kGate, LinearRole::kUp, LinearRole::kDown}) ids.push_back({i, r, -1});
    }
  }
  ids.push_back({-1, LinearRole::kLmHead, -1});
  return ids;
}

Status smoothing_groups(const ModelConfig& c, const CalibrationStats& stats, float alpha,
                        const WeightColumnsFn& weight_columns, std::vector<SmoothingGroup>* out) {
  out->clear();
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    std::vector<std::string> attn, ffn;
    for (LinearRole r : {LinearRole::kQ, LinearRole::kK, LinearRole::kV}) attn.push_back(LinearId{i, r, -1}.hf_name(c));
    if (c.is_moe()) {
      ffn.push_back(LinearId{i, LinearRole::kRouter, -1}.hf_name(c));
      for (int64_t e = 0; e < c.n_experts; ++e)
        for (LinearRole r : {LinearRole::kGate, LinearRole::kUp}) ffn.push_back(LinearId{i, r, e}.hf_name(c));
    } else {
      for (LinearRole r : {LinearRole::kGate, LinearRole::kUp}) ffn.push_back(LinearId{i, r, -1}.hf_name(c));
    }
    for (auto& [norm, members] : {std::pair{prefix + "input_layernorm.weight", attn},
                                  std::pair{prefix + "post_attention_layernorm.weight", ffn}}) {
      // Every consumer sees the same input; MoE experts see only their routed tokens, so take the
      // element-wise max over every member that was observed.
      std::vector<float> act, wcols;
      for (const std::string& m : members) {
        const LinearStats* s = stats.find(m);
        if (s != nullptr && s->rows_seen > 0) {
          if (act.empty()) act.assign(s->input_channel_absmax.size(), 0.0f);
          if (act.size() != s->input_channel_absmax.size())
            return invalid_argument("--stats: " + m + " has " + std::to_string(s->input_channel_absmax.size()) +
                                    " input channels, expected " + std::to_string(act.size()));
          for (size_t k = 0; k < act.size(); ++k) act[k] = std::max(act[k], s->input_channel_absmax[k]);
        }
        std::vector<float> cols;
        LLMQ_RETURN_IF_ERROR(weight_columns(m, &cols));
        if (wcols.empty()) wcols.assign(cols.size(), 0.0f);
        for (size_t k = 0; k < std::min(cols.size(), wcols.size()); ++k) wcols[k] = std::max(wcols[k], cols[k]);
      }
      if (act.empty())
        return invalid_argument("--stats: no statistics for the inputs of " + norm +
                                " (calibrate this model first: llmq calibrate)");
      SmoothingGroup g;
      g.norm = norm;
      g.members = members;
      LLMQ_RETURN_IF_ERROR(smoothquant_factors(act, wcols, alpha, &g.factors));
      out->push_back(std::move(g));
    }
  }
  return {};
}

Status smoothing_groups(const ModelWeights& model, const CalibrationStats& stats, float alpha,
                        std::vector<SmoothingGroup>* out) {
  std::map<std::string, const Linear*> by_name;
  for (const Linear* l : model.linears()) by_name[l->id.hf_name(model.config)] = l;
  auto columns = [&by_name](const std::string& module, std::vector<float>* absmax) -> Status {
    const auto it = by_name.find(module);
    if (it == by_name.end()) return invalid_argument("model: no linear layer " + module);
    const Tensor& w = it->second->weight;
    MatrixView m{w.data(), DType::kF32, w.shape()[0], w.shape()[1], w.shape()[1], 1};
    *absmax = column_absmax(m);
    return {};
  };
  return smoothing_groups(model.config, stats, alpha, columns, out);
}

Status apply_smoothing(const std::vector<SmoothingGroup>& groups, ModelWeights* model) {
  std::map<std::string, Linear*> by_name;
  for (Linear* l : model->linears()) by_name[l->id.hf_name(model->config)] = l;
  for (const SmoothingGroup& g : groups) {
    // The norm: input_layernorm of layer i or post_attention_layernorm.
    const auto dot = g.norm.find('.', 13);  // after "model.layers."
    const int64_t layer = std::stoll(g.norm.substr(13, dot - 13));
    Tensor& gain = g.norm.find("input_layernorm") != std::string::npos
                       ? model->layers[static_cast<size_t>(layer)].attn_norm
                       : model->layers[static_cast<size_t>(layer)].ffn_norm;
    float* gv = gain.data_as<float>();
    for (size_t k = 0; k < g.factors.size(); ++k) gv[k] /= g.factors[k];
    for (const std::string& name : g.members) {
      Linear* l = by_name.at(name);
      const int64_t rows = l->weight.shape()[0], cols = l->weight.shape()[1];
      float* w = l->weight.data_as<float>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t col = 0; col < cols; ++col) w[r * cols + col] *= g.factors[static_cast<size_t>(col)];
    }
  }
  return {};
}

Status static_activation_scale(const LinearStats& stats, const std::vector<float>* smoothing,
                               const QuantSpec& spec, float* out) {
  if (spec.method == ScaleMethod::kUnit) {
    *out = 1.0f;
    return {};
  }
  float s;
  if (smoothing != nullptr) {
    s = smoothed_activation_scale(stats.input_channel_absmax, *smoothing, spec);
  } else {
    s = absmax_scale(stats.input_absmax, spec);
  }
  if (!(s > 0.0f) || std::isinf(s)) return invalid_argument("--stats: unusable activation scale " + std::to_string(s));
  *out = round_scale(s, spec);
  return {};
}

Status quantize_weight(const Tensor& weight, const Scheme& scheme, QuantizedTensor* out) {
  return quantize(weight.view(), scheme.weight, out);
}

Status quantize_linear(const Linear& linear, const ModelConfig& config, const Scheme& scheme,
                       const CalibrationStats* stats, const std::vector<float>* smoothing, QuantizedLinear* out) {
  const std::string name = linear.id.hf_name(config);
  QuantizedLinear ql;
  ql.scheme = scheme.name;
  LLMQ_RETURN_IF_ERROR(quantize_weight(linear.weight, scheme, &ql.weight));
  ql.quantize_input = scheme.quantize_activations;
  ql.input_spec = scheme.activation;
  if (ql.quantize_input && scheme.activation.source == ScaleSource::kStatic) {
    const LinearStats* s = stats != nullptr ? stats->find(name) : nullptr;
    float scale = 1.0f;
    if (scheme.activation.method != ScaleMethod::kUnit) {
      if ((s == nullptr || s->rows_seen == 0) && linear.id.expert >= 0) {
        // An MoE expert no calibration token reached: fall back to dynamic for it.
        ql.input_spec.source = ScaleSource::kDynamic;
      } else if (s == nullptr || s->rows_seen == 0) {
        return invalid_argument("--stats: no activation statistics for " + name +
                                " (were they measured on this model?)");
      } else {
        LLMQ_RETURN_IF_ERROR(static_activation_scale(*s, smoothing, scheme.activation, &scale));
      }
    }
    if (ql.input_spec.source == ScaleSource::kStatic) {
      ql.static_input_scale.scales = Tensor(DType::kF32, {1, 1});
      ql.static_input_scale.scales.data_as<float>()[0] = scale;
      ql.static_input_scale.block = {1, 1};  // resolved per call: per-tensor covers the matrix
    }
  }
  *out = std::move(ql);
  return {};
}

Status quantize_model(const ModelWeights& model, const Scheme& scheme, const CalibrationStats* stats,
                      const QuantizeModelOptions& options, QuantizedModel* out) {
  if (scheme.needs_statistics() && stats == nullptr)
    return invalid_argument("--stats: scheme " + scheme.name +
                            " needs calibration statistics (static activation scales or SmoothQuant); run llmq calibrate");
  if (stats != nullptr) LLMQ_RETURN_IF_ERROR(stats->check_matches(model.config));
  if (scheme.quantize_activations && scheme.activation.source == ScaleSource::kStatic &&
      scheme.activation.granularity != Granularity::kPerTensor)
    return unsupported("--scheme " + scheme.name + ": static activation scales are per-tensor only");
  QuantizedModel qm;
  qm.scheme = scheme;
  qm.options = options;
  qm.weights = model;
  std::map<std::string, const std::vector<float>*> smoothing_of;
  std::vector<SmoothingGroup> groups;
  if (scheme.smooth_alpha >= 0.0f) {
    LLMQ_RETURN_IF_ERROR(smoothing_groups(model, *stats, scheme.smooth_alpha, &groups));
    LLMQ_RETURN_IF_ERROR(apply_smoothing(groups, &qm.weights));
    for (const SmoothingGroup& g : groups)
      for (const std::string& m : g.members) smoothing_of[m] = &g.factors;
  }
  for (const Linear* l : qm.weights.linears()) {
    if (!linear_is_quantized(*l, options)) continue;
    const std::string name = l->id.hf_name(model.config);
    const auto sm = smoothing_of.find(name);
    QuantizedLinear ql;
    LLMQ_RETURN_IF_ERROR(quantize_linear(*l, model.config, scheme, stats, sm == smoothing_of.end() ? nullptr : sm->second, &ql));
    qm.linears[name] = std::move(ql);
  }
  *out = std::move(qm);
  return {};
}

Status QuantizedLinearBackend::forward(const Linear& linear, const float* x, int64_t rows, float* y) {
  const QuantizedLinear* ql = model_.find(linear.id.hf_name(model_.weights.config));
  if (ql == nullptr) return float_.forward(linear, x, rows, y);
  const int64_t in = linear.weight.shape()[1], out = linear.weight.shape()[0];
  const TensorView xv = matrix_view(x, rows, in);
  QuantizedTensor qx;
  GemmOperand a = GemmOperand::of(xv);
  if (ql->quantize_input) {
    if (ql->input_spec.source == ScaleSource::kStatic) {
      ScaleSet s = ql->static_input_scale;
      s.block = {std::max<int64_t>(rows, 1), std::max<int64_t>(in, 1)};  // per-tensor: one block
      LLMQ_RETURN_IF_ERROR(quantize(xv, ql->input_spec, &qx, &s));
    } else {
      LLMQ_RETURN_IF_ERROR(quantize(xv, ql->input_spec, &qx));
    }
    a = GemmOperand::of(qx);
  }
  GemmOptions options;
  if (linear.bias.numel() > 0) options.bias = linear.bias.data_as<float>();
  return quantized_gemm(a, GemmOperand::of(ql->weight), matrix_view(y, rows, out), options);
}

Status weight_error(const QuantizedModel& model, WeightError* out) {
  // Sums of squares in double: a 70B model has 10^10 elements.
  double err = 0, norm = 0, expert_err = 0, expert_norm = 0;
  int64_t exact = 0, elements = 0;
  for (const Linear* l : model.weights.linears()) {
    const QuantizedLinear* q = model.find(l->id.hf_name(model.weights.config));
    if (q == nullptr) continue;  // kept in high precision
    Tensor deq(DType::kF32, l->weight.shape());
    LLMQ_RETURN_IF_ERROR(dequantize(q->weight, deq.view()));
    const float* w = l->weight.data_as<float>();
    const float* d = deq.data_as<float>();
    const bool expert = l->id.expert >= 0;
    for (int64_t i = 0; i < deq.numel(); ++i) {
      const double diff = static_cast<double>(d[i]) - w[i], ref = w[i];
      err += diff * diff;
      norm += ref * ref;
      if (expert) expert_err += diff * diff, expert_norm += ref * ref;
      exact += d[i] == w[i];
    }
    elements += deq.numel();
  }
  WeightError r;
  r.rel_l2 = norm > 0 ? std::sqrt(err / norm) : 0.0;
  r.expert_rel_l2 = expert_norm > 0 ? std::sqrt(expert_err / expert_norm) : 0.0;
  r.exact_fraction = elements > 0 ? static_cast<double>(exact) / static_cast<double>(elements) : 0.0;
  r.elements = elements;
  *out = r;
  return {};
}

}  // namespace llmq
