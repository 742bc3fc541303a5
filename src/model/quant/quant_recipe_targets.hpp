// A recipe target compiled once: an exact module name, or "re:" + a regular expression. Bounded,
// because a recipe (or a checkpoint's config.json) is user input: at most kMaxRecipeTargetChars
// characters, counted repetitions ({n,m}) of at most kMaxRecipeRepeat, an estimated automaton of at
// most kMaxRecipeStates states, matched by libstdc++'s polynomial (breadth-first) executor without
// submatches, so no pattern backtracks exponentially on a module name. One RecipeTargetBudget
// bounds all the targets of one recipe or one quantization_config together: their compilation
// (kMaxRecipeTotalStates) and their matching against every module (kMaxRecipeMatchWork), since a
// few hundred targets that are each within bounds still multiply into hours over a large MoE.
//
// The patterns are written for Python's re (compressed-tensors reads the same strings) and run as
// ECMAScript here, so only the syntax both read alike is accepted: escapes \d \D \w \W \s \S \b
// \B and escaped punctuation (Python's \Z or \A would be the letters Z and A in ECMAScript),
// balanced parentheses, and no ']' first in a class (a literal in Python, an empty class here).
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
// All regular expressions of one recipe or quantization_config: about half a second of compiling
// at most (a 65536-state pattern compiles in about 0.1 s; a class costs like kClassStates states).
inline constexpr int64_t kMaxRecipeTotalStates = int64_t{1} << 18;
// Estimated states times name characters over every match of one recipe or checkpoint: about eight
// seconds at the worst rate measured (60 ns per state and character, a pattern of 250 groups
// repeated 64 times), and room for a few ordinary patterns (about 20 states each) over a
// DeepSeek-sized model (47,000 linears of about 60 characters).
inline constexpr int64_t kMaxRecipeMatchWork = int64_t{1} << 27;

// How a regular expression must match: the whole name (llmq recipes), or from its start only
// (Python's re.match, as compressed-tensors and vLLM read a checkpoint's targets).
enum class TargetAnchor { kWholeName, kPrefix };

struct RecipeTarget {
  std::string text;  // as written
  bool is_regex = false;
  int64_t states = 0;  // the estimated automaton size (0 for an exact name)
  std::shared_ptr<const std::regex> regex;  // when is_regex
};

// What one recipe's (or checkpoint's) targets have spent so far.
struct RecipeTargetBudget {
  int64_t states = 0;  // compiled, at most kMaxRecipeTotalStates
  int64_t work = 0;    // matched: states x (name length + 1), at most kMaxRecipeMatchWork
};

// `where` names the list in errors ("recipe group 'attn'", "recipe ignore"). The states of a
// regular expression are charged to `budget` before it is compiled.
Status compile_recipe_target(const std::string& where, const std::string& text, TargetAnchor anchor,
                             RecipeTargetBudget* budget, RecipeTarget* out);
// One target alone, matching the whole name (a budget of its own).
Status compile_recipe_target(const std::string& where, const std::string& text, RecipeTarget* out);
// The work of one match is charged to `budget` first (nullptr: not counted); over the budget is an
// error that says why.
Status recipe_target_matches(const RecipeTarget& target, const std::string& module, RecipeTargetBudget* budget,
                             bool* matched);
Status recipe_target_matches(const RecipeTarget& target, const std::string& module, bool* matched);

// The matching work of `states` regular-expression states over names of `name_chars` characters in
// all (each counted with one more), refused when past kMaxRecipeMatchWork: `what` names the targets.
Status check_match_work(const std::string& what, int64_t states, int64_t name_chars);

}  // namespace llmq
