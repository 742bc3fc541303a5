// QuantizationTargets (quantization_targets.hpp): a checkpoint's config-group targets and ignore
// list, compiled once and matched under one work bound.
#include "model/checkpoint/quantization_targets.hpp"

namespace llmq {
namespace {

using json = nlohmann::json;

// An array of strings at q[key] (absent or null: none), each compiled as a Python re.match target.
Status compile_list(const json& q, const std::string& where, RecipeTargetBudget* budget, std::vector<RecipeTarget>* out) {
  if (q.is_null()) return {};
  if (!q.is_array()) return invalid_argument("quantization_config." + where + ": expected an array of strings");
  for (size_t i = 0; i < q.size(); ++i) {
    const std::string at = "quantization_config." + where + "[" + std::to_string(i) + "]";
    if (!q[i].is_string()) return invalid_argument(at + ": expected a string, got " + q[i].dump());
    RecipeTarget t;
    LLMQ_RETURN_IF_ERROR(compile_recipe_target(at, q[i].get<std::string>(), TargetAnchor::kPrefix, budget, &t));
    out->push_back(std::move(t));
  }
  return {};
}

}  // namespace

Status QuantizationTargets::parse(const json& q, const std::function<bool(const std::string&)>& is_module,
                                  QuantizationTargets* out) {
  QuantizationTargets t;
  const auto method = q.find("quant_method");
  t.compressed_tensors_ = method != q.end() && method->is_string() && method->get<std::string>() == "compressed-tensors";
  if (!t.compressed_tensors_) {
    // vLLM's fp8 reads ignored_layers, transformers modules_to_not_convert: exact names here.
    for (const char* key : {"ignored_layers", "modules_to_not_convert"})
      if (const auto it = q.find(key); it != q.end())
        for (const json& name : it->is_array() ? *it : json::array())
          if (name.is_string()) {
            RecipeTarget exact;
            exact.text = name.get<std::string>();
            t.ignore_.push_back(std::move(exact));
          }
    *out = std::move(t);
    return {};
  }
  const auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->empty())
    return invalid_argument("quantization_config.config_groups: expected an object of config groups");
  for (const auto& [key, g] : groups->items()) {
    Group group;
    group.name = key;
    group.config = &g;
    const std::string where = "config_groups." + key + ".targets";
    const auto targets = g.is_object() ? g.find("targets") : g.end();
    if (!g.is_object() || targets == g.end() || !targets->is_array())
      return invalid_argument("quantization_config." + where + ": expected an array");
    json rest = json::array();
    for (const json& target : *targets) {
      if (target.is_string() && target.get<std::string>() == "Linear") {
        group.all_linear = true;
      } else if (target.is_string() && target.get<std::string>().rfind("re:", 0) != 0 && !is_module(target.get<std::string>())) {
        return unsupported("quantization_config." + where + ": '" + target.get<std::string>() +
                           "' is neither a linear of this checkpoint nor \"Linear\" nor a \"re:\" pattern; vLLM "
                           "would read it as a class name (by substring), which llmq does not guess at");
      } else {
        rest.push_back(target);
      }
    }
    LLMQ_RETURN_IF_ERROR(compile_list(rest, where, &t.budget_, &group.targets));
    t.groups_.push_back(std::move(group));
  }
  if (const auto ignore = q.find("ignore"); ignore != q.end())
    LLMQ_RETURN_IF_ERROR(compile_list(*ignore, "ignore", &t.budget_, &t.ignore_));
  *out = std::move(t);
  return {};
}

Status QuantizationTargets::group_of(const std::string& module, std::string* name, const json** group) {
  *group = nullptr;
  name->clear();
  for (const RecipeTarget& t : ignore_) {
    bool kept = false;
    LLMQ_RETURN_IF_ERROR(recipe_target_matches(t, module, &budget_, &kept));
    if (kept)
      return invalid_argument("quantization_config: " + module + " is stored 8-bit but the ignore list keeps it "
                              "(target '" + t.text + "'): a loader would read its codes as high-precision weights");
  }
  if (!compressed_tensors_) return {};
  for (const Group& g : groups_) {
    bool takes = g.all_linear;
    for (size_t i = 0; i < g.targets.size() && !takes; ++i)
      LLMQ_RETURN_IF_ERROR(recipe_target_matches(g.targets[i], module, &budget_, &takes));
    if (!takes) continue;
    if (*group != nullptr)
      return invalid_argument("quantization_config: " + module + " is a target of config groups " + *name + " and " +
                              g.name + "; loaders would disagree on its quantization");
    *name = g.name;
    *group = g.config;
  }
  if (*group == nullptr)
    return invalid_argument("quantization_config: " + module + " is stored 8-bit but no config group targets it");
  return {};
}

}  // namespace llmq
