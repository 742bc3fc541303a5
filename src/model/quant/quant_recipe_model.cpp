// quantize_model under a QuantRecipe: the uniform quantizer's per-linear step (quantize_linear)
// with each linear's own scheme, and SmoothQuant only on the norms whose consumers smooth.
#include <set>

#include "llmq/quant_recipe.hpp"

namespace llmq {
namespace {

// The Scheme a QuantizedModel reports: the one scheme in use, or a summary named kMixedSchemeName.
Scheme model_scheme(const ResolvedRecipe& r) {
  const std::vector<std::string> names = r.scheme_names();
  if (names.size() == 1) return r.scheme_of.begin()->second;
  Scheme mixed;
  mixed.name = kMixedSchemeName;
  mixed.quantize_activations = false;
  std::map<std::string, int64_t> count;
  bool first = true;
  for (const auto& [module, s] : r.scheme_of) {
    ++count[s.name];
    if (first || s.weight.granularity == Granularity::kPerBlock) {
      // The summary specs: blocks win (tensor parallelism must know that a linear has them).
      mixed.weight = s.weight;
      mixed.activation = s.activation;
      first = false;
    }
    mixed.quantize_activations = mixed.quantize_activations || s.quantize_activations;
  }
  for (const auto& [name, n] : count)
    mixed.description += (mixed.description.empty() ? "" : ", ") + name + " x" + std::to_string(n);
  mixed.description += ", kept x" + std::to_string(r.kept.size());
  mixed.export_format = ExportFormat::kCompressedTensors;
  return mixed;
}

}  // namespace

Status quantize_model(const ModelWeights& model, const QuantRecipe& recipe, const CalibrationStats* stats,
                      const QuantizeModelOptions& options, QuantizedModel* out) {
  if (options.quantize_lm_head || options.quantize_router)
    return invalid_argument("recipe: lm_head and routers are quantized by naming them in a group, not by options");
  ResolvedRecipe r;
  LLMQ_RETURN_IF_ERROR(resolve_recipe(recipe, model.config, &r));
  if (r.scheme_of.empty()) return invalid_argument("recipe: quantizes no linear layer of this model (every one is kept)");
  std::set<float> alphas;
  for (const auto& [module, s] : r.scheme_of) {
    if (s.needs_statistics() && stats == nullptr)
      return invalid_argument("--stats: scheme " + s.name + " (" + module +
                              ") needs calibration statistics (static activation scales or SmoothQuant); run llmq calibrate");
    if (s.quantize_activations && s.activation.source == ScaleSource::kStatic &&
        s.activation.granularity != Granularity::kPerTensor)
      return unsupported("recipe: scheme " + s.name + ": static activation scales are per-tensor only");
    if (s.smooth_alpha >= 0.0f) alphas.insert(s.smooth_alpha);
  }
  if (stats != nullptr) LLMQ_RETURN_IF_ERROR(stats->check_matches(model.config));
  QuantizedModel qm;
  qm.scheme = model_scheme(r);
  qm.options = options;
  qm.weights = model;
  // Per alpha, the groups of the norms whose quantized consumers smooth with that alpha; a norm's
  // kept consumers (a router) take the factors in float, as in the uniform model.
  std::vector<SmoothingGroup> applied;
  for (float alpha : alphas) {
    std::vector<SmoothingGroup> groups;
    LLMQ_RETURN_IF_ERROR(smoothing_groups(model, *stats, alpha, &groups));
    for (SmoothingGroup& g : groups) {
      bool smoothed = false;
      for (const std::string& m : g.members) {
        const auto it = r.scheme_of.find(m);
        smoothed = smoothed || (it != r.scheme_of.end() && it->second.smooth_alpha == alpha);
      }
      if (smoothed) applied.push_back(std::move(g));
    }
  }
  LLMQ_RETURN_IF_ERROR(apply_smoothing(applied, &qm.weights));
  std::map<std::string, const std::vector<float>*> smoothing_of;
  for (const SmoothingGroup& g : applied)
    for (const std::string& m : g.members) smoothing_of[m] = &g.factors;
  for (const Linear* l : qm.weights.linears()) {
    const std::string name = l->id.hf_name(model.config);
    const auto s = r.scheme_of.find(name);
    if (s == r.scheme_of.end()) continue;  // kept in float
    const auto sm = smoothing_of.find(name);
    QuantizedLinear ql;
    LLMQ_RETURN_IF_ERROR(
        quantize_linear(*l, model.config, s->second, stats, sm == smoothing_of.end() ? nullptr : sm->second, &ql));
    qm.linears[name] = std::move(ql);
  }
  *out = std::move(qm);
  return {};
}

}  // namespace llmq
