// A recipe target compiled once: an exact module name, or "re:" + an ECMAScript regular expression
// that must match the whole name. Bounded, because a recipe is user input: at most
// kMaxRecipeTargetChars characters, counted repetitions ({n,m}) of at most kMaxRecipeRepeat, an
// estimated automaton of at most kMaxRecipeStates states, matched by libstdc++'s polynomial
// (breadth-first) executor, so no pattern backtracks exponentially on a module name.
#pragma once

#include <cstdint>
#include <memory>
#include <regex>
#include <string>

#include "llmq/status.hpp"

namespace llmq {

inline constexpr int64_t kMaxRecipeTargetChars = 4096;
inline constexpr int64_t kMaxRecipeRepeat = 64;
inline constexpr int64_t kMaxRecipeStates = int64_t{1} << 16;
inline constexpr int64_t kMaxRecipeNesting = 32;  // parentheses and brackets: the compiler recurses

struct RecipeTarget {
  std::string text;  // as written
  bool is_regex = false;
  std::shared_ptr<const std::regex> regex;  // when is_regex
};

// `where` names the list in errors ("recipe group 'attn'", "recipe ignore").
Status compile_recipe_target(const std::string& where, const std::string& text, RecipeTarget* out);
Status recipe_target_matches(const RecipeTarget& target, const std::string& module, bool* matched);

}  // namespace llmq
