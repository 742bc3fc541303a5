// resolve_recipe: which scheme each linear layer of a model gets under a recipe, and every reason a
// recipe is refused. The target matching (exact names, "re:" + a regular expression over the whole
// name) is the one quant_recipe_targets.cpp defines; the file format is quant_recipe_json.cpp's.
#include <algorithm>
#include <cmath>
#include <set>

#include "llmq/quant_recipe.hpp"
#include "llmq/quantized_model.hpp"
#include "model/quant/quant_recipe_targets.hpp"

namespace llmq {
namespace {

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// One group's or ignore's targets, compiled, each remembering whether it matched anything.
struct CompiledList {
  std::string where;  // "group 'attn'" or "ignore"
  std::vector<RecipeTarget> targets;
  std::vector<bool> used;
};

Status compile_list(const std::string& where, const std::vector<std::string>& targets, RecipeTargetBudget* budget,
                    CompiledList* out) {
  out->where = where;
  for (const std::string& t : targets) {
    RecipeTarget c;
    LLMQ_RETURN_IF_ERROR(compile_recipe_target(where, t, TargetAnchor::kWholeName, budget, &c));
    out->targets.push_back(std::move(c));
  }
  out->used.assign(out->targets.size(), false);
  return {};
}

// Every target of `list` that matches `module`, in order, each marked used (a redundant target
// that also matches is used, not "matching nothing"); with exact_only, regular expressions are
// skipped (lm_head and routers are quantized only when named).
Status match(CompiledList* list, const std::string& module, bool exact_only, std::vector<int>* found) {
  found->clear();
  for (size_t i = 0; i < list->targets.size(); ++i) {
    const RecipeTarget& t = list->targets[i];
    if (exact_only && t.is_regex) continue;
    bool matched = false;
    LLMQ_RETURN_IF_ERROR(recipe_target_matches(t, module, &matched));
    if (!matched) continue;
    found->push_back(static_cast<int>(i));
    list->used[i] = true;
  }
  return {};
}

// The first exact name among `found` (-1: only regular expressions matched).
int exact_target(const CompiledList& list, const std::vector<int>& found) {
  for (const int t : found)
    if (!list.targets[static_cast<size_t>(t)].is_regex) return t;
  return -1;
}

// Modules an engine runs as one GEMM (q/k/v; gate/up of a dense layer or of one expert), which
// must therefore share a scheme, or all be kept.
std::vector<std::vector<LinearId>> fused_sets(const ModelConfig& c) {
  std::vector<std::vector<LinearId>> sets;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    sets.push_back({{l, LinearRole::kQ, -1}, {l, LinearRole::kK, -1}, {l, LinearRole::kV, -1}});
    if (c.is_moe()) {
      // One FusedMoE per layer: every expert projection shares one scheme.
      std::vector<LinearId> experts;
      for (int64_t e = 0; e < c.n_experts; ++e)
        for (LinearRole r : {LinearRole::kGate, LinearRole::kUp, LinearRole::kDown}) experts.push_back({l, r, e});
      sets.push_back(std::move(experts));
    } else {
      sets.push_back({{l, LinearRole::kGate, -1}, {l, LinearRole::kUp, -1}});
    }
  }
  return sets;
}

// The consumers of each RMSNorm output (SmoothQuant folds one vector into the norm for all).
std::vector<std::vector<LinearId>> norm_consumers(const ModelConfig& c) {
  std::vector<std::vector<LinearId>> sets;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    sets.push_back({{l, LinearRole::kQ, -1}, {l, LinearRole::kK, -1}, {l, LinearRole::kV, -1}});
    std::vector<LinearId> ffn;
    if (c.is_moe()) {
      ffn.push_back({l, LinearRole::kRouter, -1});
      for (int64_t e = 0; e < c.n_experts; ++e)
        for (LinearRole r : {LinearRole::kGate, LinearRole::kUp}) ffn.push_back({l, r, e});
    } else {
      ffn = {{l, LinearRole::kGate, -1}, {l, LinearRole::kUp, -1}};
    }
    sets.push_back(std::move(ffn));
  }
  return sets;
}

std::string scheme_or_kept(const ResolvedRecipe& r, const std::string& module) {
  const auto it = r.scheme_of.find(module);
  return it == r.scheme_of.end() ? std::string("kept") : it->second.name;
}

Status check_overrides(const QuantRecipe& recipe) {
  // Unset is any negative value; NaN is neither set nor unset and is refused.
  if (std::isnan(recipe.smooth_alpha) || (recipe.smooth_alpha >= 0.0f && recipe.smooth_alpha > 1.0f))
    return invalid_argument("recipe smooth_alpha (--smooth-alpha) must be in [0, 1], got " + std::to_string(recipe.smooth_alpha));
  if (std::isnan(recipe.backoff) || (recipe.backoff >= 0.0f && !(recipe.backoff > 0.0f && recipe.backoff <= 1.0f)))
    return invalid_argument("recipe backoff (--backoff) must be in (0, 1], got " + std::to_string(recipe.backoff));
  return {};
}

// The scheme after the recipe's overrides. The name stays (it says which method); the
// description says what was changed.
Scheme with_overrides(Scheme s, const QuantRecipe& recipe) {
  if (recipe.smooth_alpha >= 0.0f && s.smooth_alpha >= 0.0f && s.smooth_alpha != recipe.smooth_alpha) {
    s.smooth_alpha = recipe.smooth_alpha;
    s.description += " (alpha " + std::to_string(recipe.smooth_alpha) + ")";
  }
  if (recipe.backoff > 0.0f && recipe.backoff != 1.0f) {
    s.weight.backoff = recipe.backoff;
    // A dynamic activation scale is computed by the engine per batch, and no checkpoint format
    // can ask it for a backoff: evaluating one would measure a model `quantize` cannot write.
    if (s.activation.source == ScaleSource::kStatic) s.activation.backoff = recipe.backoff;
    s.description += " (backoff " + std::to_string(recipe.backoff) + ")";
  }
  return s;
}

}  // namespace

std::vector<std::string> ResolvedRecipe::scheme_names() const {
  std::set<std::string> names;
  for (const auto& [module, s] : scheme_of) names.insert(s.name);
  return {names.begin(), names.end()};
}

Status apply_overrides(const Scheme& scheme, float smooth_alpha, float backoff, Scheme* out) {
  QuantRecipe overrides;
  overrides.smooth_alpha = smooth_alpha;
  overrides.backoff = backoff;
  LLMQ_RETURN_IF_ERROR(check_overrides(overrides));
  if (smooth_alpha >= 0.0f && scheme.smooth_alpha < 0.0f)
    return invalid_argument("--smooth-alpha: scheme " + scheme.name + " does not smooth (SmoothQuant schemes: "
                            "fp8-smoothquant, int8-smoothquant)");
  *out = with_overrides(scheme, overrides);
  return {};
}

QuantRecipe uniform_recipe(const std::string& scheme) {
  QuantRecipe r;
  r.groups.push_back({"group_0", scheme, {"re:.*"}});
  return r;
}

Status resolve_recipe(const QuantRecipe& recipe, const ModelConfig& config, ResolvedRecipe* out) {
  LLMQ_RETURN_IF_ERROR(check_overrides(recipe));
  if (recipe.groups.empty()) return invalid_argument("recipe: no groups (a recipe quantizes at least one group)");
  std::vector<CompiledList> groups(recipe.groups.size());
  std::vector<Scheme> schemes(recipe.groups.size());
  RecipeTargetBudget budget;  // every regular expression of the recipe together
  std::set<std::string> names;
  for (size_t g = 0; g < recipe.groups.size(); ++g) {
    const RecipeGroup& group = recipe.groups[g];
    const std::string where = "recipe group " + quoted(group.name);
    if (group.name.empty()) return invalid_argument("recipe: group " + std::to_string(g) + " has no name");
    if (!names.insert(group.name).second) return invalid_argument(where + ": the name is used twice");
    if (group.targets.empty()) return invalid_argument(where + ": no targets");
    if (Status st = find_scheme(group.scheme, &schemes[g]); !st.ok())
      return invalid_argument(where + ": unknown scheme " + quoted(group.scheme));
    schemes[g] = with_overrides(schemes[g], recipe);
    LLMQ_RETURN_IF_ERROR(compile_list(where, group.targets, &budget, &groups[g]));
  }
  CompiledList ignore;
  LLMQ_RETURN_IF_ERROR(compile_list("recipe ignore", recipe.ignore, &budget, &ignore));
  // Every regular expression runs against every module name: bounded before any is run.
  const std::vector<LinearId> ids = linear_ids(config);
  int64_t name_chars = 0;
  for (const LinearId& id : ids) name_chars += static_cast<int64_t>(id.hf_name(config).size()) + 1;
  LLMQ_RETURN_IF_ERROR(check_match_work("recipe", budget.states, name_chars));

  ResolvedRecipe r;
  for (const LinearId& id : ids) {
    const std::string module = id.hf_name(config);
    // lm_head and routers: quantized only when a group names them exactly.
    const bool named_only = id.role == LinearRole::kLmHead || id.role == LinearRole::kRouter;
    int owner = -1;
    std::vector<int> owner_targets, found;
    for (size_t g = 0; g < groups.size(); ++g) {
      LLMQ_RETURN_IF_ERROR(match(&groups[g], module, named_only, &found));
      if (found.empty()) continue;
      if (owner >= 0)
        return invalid_argument("recipe: module " + module + " is matched by " + groups[owner].where + " (target " +
                                quoted(groups[owner].targets[owner_targets[0]].text) + ") and by " + groups[g].where +
                                " (target " + quoted(groups[g].targets[found[0]].text) + "); each module belongs to one group");
      owner = static_cast<int>(g);
      owner_targets = found;
    }
    std::vector<int> ignored_by;
    LLMQ_RETURN_IF_ERROR(match(&ignore, module, false, &ignored_by));
    const bool ignored = !ignored_by.empty();
    // Named exactly by its group (whichever of the group's targets comes first) and ignored too.
    const int exact = owner >= 0 ? exact_target(groups[owner], owner_targets) : -1;
    if (exact >= 0 && ignored)
      return invalid_argument("recipe: module " + module + " is named by " + groups[owner].where + " (target " +
                              quoted(groups[owner].targets[exact].text) + ") and matched by ignore (target " +
                              quoted(ignore.targets[ignored_by[0]].text) + "); keep it or quantize it, not both");
    if (owner >= 0 && id.role == LinearRole::kLmHead && config.tie_embeddings)
      return invalid_argument("recipe: " + groups[owner].where + " names lm_head, which is tied to the embeddings "
                              "(tie_word_embeddings): it has no weight of its own to quantize");
    if (owner < 0 || ignored) {
      r.kept.push_back(module);
      continue;
    }
    r.scheme_of[module] = schemes[static_cast<size_t>(owner)];
    r.group_of[module] = recipe.groups[static_cast<size_t>(owner)].name;
  }
  std::vector<const CompiledList*> lists{&ignore};
  for (const CompiledList& g : groups) lists.push_back(&g);
  for (const CompiledList* list : lists)
    for (size_t t = 0; t < list->targets.size(); ++t)
      if (!list->used[t])
        return invalid_argument(list->where + ": target " + quoted(list->targets[t].text) +
                                " matches no linear layer of this model (lm_head and routers are matched only by "
                                "their exact names" +
                                (list->targets[t].is_regex ? std::string(")")
                                                           : "; a target without 're:' is an exact module name, not a "
                                                             "class name such as Linear: 're:.*' takes every linear)"));
  // An override that changes nothing is refused, as --smooth-alpha with --scheme is: the user
  // would believe the model was smoothed with it.
  if (recipe.smooth_alpha >= 0.0f &&
      std::none_of(r.scheme_of.begin(), r.scheme_of.end(), [](const auto& m) { return m.second.smooth_alpha >= 0.0f; }))
    return invalid_argument("recipe smooth_alpha (--smooth-alpha) is set, but no quantized module's scheme smooths "
                            "(SmoothQuant schemes: fp8-smoothquant, int8-smoothquant); it would change nothing");

  for (const auto& set : fused_sets(config)) {
    const std::string first = set[0].hf_name(config), want = scheme_or_kept(r, first);
    for (const LinearId& id : set) {
      const std::string module = id.hf_name(config), got = scheme_or_kept(r, module);
      if (got != want)
        return invalid_argument("recipe: " + first + " is " + want + " but " + module + " is " + got +
                                "; engines run these as one GEMM (q/k/v, gate/up, a layer's experts), so they share one "
                                "scheme or are all kept");
    }
  }
  for (const auto& set : norm_consumers(config)) {
    std::string smoothing;  // the smoothing scheme of this norm's quantized consumers, if any
    for (const LinearId& id : set) {
      const auto it = r.scheme_of.find(id.hf_name(config));
      if (it != r.scheme_of.end() && it->second.smooth_alpha >= 0.0f) smoothing = it->second.name;
    }
    if (smoothing.empty()) continue;
    for (const LinearId& id : set) {
      const std::string module = id.hf_name(config);
      const auto it = r.scheme_of.find(module);
      if (it != r.scheme_of.end() && it->second.name != smoothing)
        return invalid_argument("recipe: " + module + " is " + it->second.name + " while another input of the same "
                                "RMSNorm is " + smoothing + "; SmoothQuant folds one vector into the norm, so every "
                                "quantized consumer of it takes the same smoothing scheme");
    }
  }
  if (out != nullptr) *out = std::move(r);
  return {};
}

}  // namespace llmq
