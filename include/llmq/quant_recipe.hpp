// Mixed quantization: a recipe assigns a scheme to each linear layer of a model (by module name or
// regular expression, like compressed-tensors' config_groups) and names the layers kept in high
// precision (its `ignore`). `llmq quantize --recipe`, `llmq eval --recipe` and `llmq recipe` (which
// searches for one under an accuracy budget) all go through resolve_recipe, the one place that
// decides which scheme a module gets.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "llmq/calibration.hpp"
#include "llmq/model.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/scheme.hpp"
#include "llmq/status.hpp"

namespace llmq {

struct RecipeGroup {
  std::string name;                  // "group_0", or a name the recipe file gives
  std::string scheme;                // a name of all_schemes() ("fp8-dynamic", "int8-w8a8", ...)
  // Exact module names ("model.layers.0.mlp.down_proj") or "re:" + an ECMAScript regular
  // expression that must match the whole module name ("re:model\\.layers\\.[0-9]+\\.mlp\\..*").
  std::vector<std::string> targets;
};

struct QuantRecipe {
  std::vector<RecipeGroup> groups;
  // Modules kept in the checkpoint's high-precision dtype; the same target syntax. lm_head and MoE
  // routers are kept unless a group names them explicitly (by exact name: a regular expression
  // never quantizes them, so "re:.*" means what --scheme means). Modules no group matches are
  // kept too. ignore wins over a group's regular expression ("re:.*" with one layer ignored is
  // the usual way to keep a few layers, as in compressed-tensors); a module a group names exactly
  // and ignore also matches is a contradiction and refused.
  std::vector<std::string> ignore;
  // Overrides for every group's scheme when set (>= 0): SmoothQuant's alpha for schemes that
  // smooth (refused when no quantized module's scheme smooths), and the scale backoff beta (0, 1]
  // of the weights and of static activation scales. Dynamic activation scales keep theirs: the
  // engine computes them per batch and no checkpoint format can ask it for a backoff.
  float smooth_alpha = -1.0f;
  float backoff = -1.0f;
};

// One recipe resolved against a model: every quantized linear's scheme; the others are kept.
struct ResolvedRecipe {
  std::map<std::string, Scheme> scheme_of;  // module name -> scheme (after the overrides)
  std::vector<std::string> kept;            // module names kept, in forward order
  std::map<std::string, std::string> group_of;  // module name -> RecipeGroup::name
  // The distinct scheme names in use, sorted (one: a uniform model with some modules kept).
  std::vector<std::string> scheme_names() const;
  // Whether more than one scheme is in use (exports and the runtime treat such a model apart).
  bool mixed() const { return scheme_names().size() > 1; }
};

// Resolve `recipe` against `config`'s linear layers (linear_ids). Refused, naming the module and
// the targets: a module matched by two groups, or named exactly by a group and matched by ignore;
// a target that matches no module (a typo would otherwise quantize nothing); q/k/v (and gate/up)
// of one layer under different schemes or partly kept (engines fuse them into one GEMM and refuse
// that); the experts of one MoE layer under more than one scheme (vLLM's FusedMoE and llmq's GPU
// runtime run one scheme per layer's experts); an unknown scheme; a SmoothQuant scheme on only
// part of the quantized consumers of one RMSNorm; a tied lm_head named by a group (it has no
// weight of its own); an empty group, a duplicate group name, a target over 4096 characters or a
// regular expression that does not compile or that Python's re would read differently (see
// quant_recipe_targets.hpp); regular expressions too large or too many to match against this
// model's module names in bounded time; overrides out of range (smooth_alpha [0, 1], backoff
// (0, 1]) or smooth_alpha when no quantized module's scheme smooths.
Status resolve_recipe(const QuantRecipe& recipe, const ModelConfig& config, ResolvedRecipe* out);

// What a model or checkpoint quantized under more than one scheme calls its scheme (QuantizedModel::
// scheme.name, the checkpoint's llmq_scheme).
inline constexpr char kMixedSchemeName[] = "mixed";

// The model quantized in memory under the recipe: each linear under its own group's scheme, kept
// modules left float (absent from QuantizedModel::linears). SmoothQuant is applied per RMSNorm
// whose quantized consumers take a smoothing scheme (resolve_recipe made them agree), with the
// factors the uniform scheme would use. The recipe decides what is quantized: options asking for
// lm_head or routers are refused (name them in a group). A recipe with one scheme over the
// modules --scheme quantizes gives the uniform model exactly.
Status quantize_model(const ModelWeights& model, const QuantRecipe& recipe, const CalibrationStats* stats,
                      const QuantizeModelOptions& options, QuantizedModel* out);

// `scheme` under the overrides a recipe carries (smooth_alpha, backoff; negative: unset), as every
// group's scheme gets them: --smooth-alpha and --backoff with --scheme. Out of range is refused
// naming the field; smooth_alpha set for a scheme that does not smooth is refused too (it would
// change nothing).
Status apply_overrides(const Scheme& scheme, float smooth_alpha, float backoff, Scheme* out);

// A uniform recipe: every linear but lm_head and routers under `scheme` (what --scheme means).
QuantRecipe uniform_recipe(const std::string& scheme);

// The recipe file (JSON): {"groups": [{"name", "scheme", "targets": [...]}], "ignore": [...],
// "smooth_alpha": a, "backoff": b}. Unknown keys, wrong types and duplicates are refused naming
// the field; the file is bounded in size and depth.
Status parse_recipe_json(const std::string& text, const std::string& source_name, QuantRecipe* out);
std::string recipe_to_json(const QuantRecipe& recipe);
// The file at `path` through the bounded input reader (regular files only, at most 1 MiB): the
// CLI's --recipe and the recipe search read recipe files this one way.
Status load_recipe_file(const std::string& path, QuantRecipe* out);

}  // namespace llmq
