// Recipe targets (quant_recipe_targets.hpp): exact names and bounded regular expressions.
#include "model/quant/quant_recipe_targets.hpp"

#include <algorithm>

namespace llmq {
namespace {

constexpr char kRegexPrefix[] = "re:";

// Refuse patterns whose automaton could be large or whose compilation recurses deeply, before
// std::regex sees them: the estimate is the length times every counted repetition's bound.
Status check_pattern_size(const std::string& where, const std::string& text, const std::string& pattern) {
  int64_t states = std::max<int64_t>(1, static_cast<int64_t>(pattern.size()));
  int64_t depth = 0, deepest = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\') {
      ++i;  // an escaped character is a literal
      continue;
    }
    if (c == '(' || c == '[') deepest = std::max(deepest, ++depth);
    if ((c == ')' || c == ']') && depth > 0) --depth;
    if (c != '{') continue;
    int64_t bound = 0, number = 0;
    size_t j = i + 1;
    for (; j < pattern.size() && pattern[j] != '}'; ++j) {
      const char d = pattern[j];
      if (d >= '0' && d <= '9') {
        number = std::min<int64_t>(number * 10 + (d - '0'), kMaxRecipeRepeat + 1);
        bound = std::max(bound, number);
      } else {
        number = 0;
      }
    }
    if (bound > kMaxRecipeRepeat)
      return invalid_argument(where + ": target '" + text + "' repeats more than " + std::to_string(kMaxRecipeRepeat) +
                              " times ({n,m}); module names need no more");
    states *= std::max<int64_t>(1, bound);
    if (states > kMaxRecipeStates)
      return invalid_argument(where + ": target '" + text + "' is too large a regular expression (its counted "
                              "repetitions multiply past " + std::to_string(kMaxRecipeStates) + " states)");
    i = j;
  }
  if (deepest > kMaxRecipeNesting)
    return invalid_argument(where + ": target '" + text + "' nests groups " + std::to_string(deepest) +
                            " deep; at most " + std::to_string(kMaxRecipeNesting));
  return {};
}

}  // namespace

Status compile_recipe_target(const std::string& where, const std::string& text, RecipeTarget* out) {
  if (text.empty()) return invalid_argument(where + ": an empty target");
  if (static_cast<int64_t>(text.size()) > kMaxRecipeTargetChars)
    return invalid_argument(where + ": a target of " + std::to_string(text.size()) + " characters (at most " +
                            std::to_string(kMaxRecipeTargetChars) + ")");
  RecipeTarget t;
  t.text = text;
  if (text.rfind(kRegexPrefix, 0) != 0) {
    *out = std::move(t);
    return {};
  }
  const std::string pattern = text.substr(sizeof(kRegexPrefix) - 1);
  if (pattern.empty()) return invalid_argument(where + ": target '" + text + "' has an empty regular expression");
  LLMQ_RETURN_IF_ERROR(check_pattern_size(where, text, pattern));
  t.is_regex = true;
  try {
    // __polynomial: libstdc++'s breadth-first executor (no backreferences), linear in the name.
    t.regex = std::make_shared<const std::regex>(pattern, std::regex::ECMAScript | std::regex_constants::__polynomial);
  } catch (const std::regex_error& e) {
    return invalid_argument(where + ": target '" + text + "' is not a usable regular expression: " + e.what());
  }
  *out = std::move(t);
  return {};
}

Status recipe_target_matches(const RecipeTarget& target, const std::string& module, bool* matched) {
  if (!target.is_regex) {
    *matched = target.text == module;
    return {};
  }
  try {
    *matched = std::regex_match(module, *target.regex);
  } catch (const std::regex_error& e) {
    return invalid_argument("recipe target '" + target.text + "' could not be matched against " + module + ": " + e.what());
  }
  return {};
}

}  // namespace llmq
