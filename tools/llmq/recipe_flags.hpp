// The flags `quantize` and `eval` share for mixed quantization (quant_recipe.hpp): --recipe FILE and
// the overrides --smooth-alpha and --backoff, declared once so both commands read them alike.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
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
  // CLI::Range lets NaN through (every comparison with it is false): refused here, at parsing.
  const CLI::Validator finite(
      [](std::string& text) {
        try {
          return std::isfinite(std::stof(text)) ? std::string() : "not a finite number: " + text;
        } catch (const std::exception&) {
          return "not a number: " + text;
        }
      },
      "FINITE");
  cmd->add_option("--smooth-alpha", f->smooth_alpha, "SmoothQuant alpha in [0, 1] of the schemes that smooth (default 0.5)")
      ->check(finite)
      ->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--backoff", f->backoff,
                  "scale backoff beta in (0, 1] of the weights and of static activation scales (default 1); dynamic\n"
                  "activation scales keep none: engines compute them per batch and no checkpoint can ask for one")
      ->check(finite)
      ->check(CLI::Range(0.0f, 1.0f));
}

// The recipe file of --recipe with the overrides given on the command line.
inline Status load_recipe_flags(const RecipeFlags& f, QuantRecipe* out) {
  // Unset is negative; NaN is neither and would pass `>= 0` as unset: refused by name.
  if (std::isnan(f.smooth_alpha) || std::isinf(f.smooth_alpha))
    return invalid_argument("--smooth-alpha: expected a number in [0, 1], got " + std::to_string(f.smooth_alpha));
  if (std::isnan(f.backoff) || std::isinf(f.backoff))
    return invalid_argument("--backoff: expected a number in (0, 1], got " + std::to_string(f.backoff));
  LLMQ_RETURN_IF_ERROR(load_recipe_file(f.recipe, out));
  if (f.smooth_alpha >= 0.0f) out->smooth_alpha = f.smooth_alpha;
  if (f.backoff >= 0.0f) out->backoff = f.backoff;
  return {};
}

}  // namespace llmq::cli
