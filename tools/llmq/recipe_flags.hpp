// The flags `quantize` and `eval` share for mixed quantization (quant_recipe.hpp): --recipe FILE and
// the overrides --smooth-alpha and --backoff, declared once so both commands read them alike.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "llmq/quant_recipe.hpp"

namespace llmq::cli {

struct RecipeFlags {
  std::string recipe;          // a recipe file: a scheme per module group
  float smooth_alpha = -1.0f;  // overrides (negative: each scheme's own)
  float backoff = -1.0f;
};

// `instead` says what --recipe replaces in this command ("instead of --scheme").
inline void add_recipe_flags(CLI::App* cmd, RecipeFlags* f, const std::string& instead) {
  cmd->add_option("--recipe", f->recipe,
                  "a recipe file (JSON): a scheme per module group, modules kept in high precision\n"
                  "(docs/quantization.md); " + instead);
  cmd->add_option("--smooth-alpha", f->smooth_alpha, "SmoothQuant alpha in [0, 1] of the schemes that smooth (default 0.5)")
      ->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--backoff", f->backoff, "scale backoff beta in (0, 1] of weights and activations (default 1)")
      ->check(CLI::Range(0.0f, 1.0f));
}

// The recipe file of --recipe with the overrides given on the command line.
inline Status load_recipe_flags(const RecipeFlags& f, QuantRecipe* out) {
  LLMQ_RETURN_IF_ERROR(load_recipe_file(f.recipe, out));
  if (f.smooth_alpha >= 0.0f) out->smooth_alpha = f.smooth_alpha;
  if (f.backoff >= 0.0f) out->backoff = f.backoff;
  return {};
}

}  // namespace llmq::cli
