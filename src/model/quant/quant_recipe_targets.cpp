// Recipe targets (quant_recipe_targets.hpp): exact names and bounded regular expressions.
#include "model/quant/quant_recipe_targets.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace llmq {
namespace {

constexpr char kRegexPrefix[] = "re:";
// A character class (or \d \w \s) compiles to a 256-entry lookup table: about as slow to build as
// this many plain states (1300 \w took 0.08 s to compile, as long as 40,000 plain characters).
constexpr int64_t kClassStates = 32;

// Python's re and ECMAScript read these escapes alike; any other letter or digit escape differs
// (\Z \A \z: anchors in Python, letters in ECMAScript; \1: a backreference; \x41 \n: spelled
// differently) and is refused rather than read one way here and another way by an engine.
bool portable_escape(char e) {
  return std::strchr("dDwWsSbB", e) != nullptr || (e > ' ' && e < 0x7f && std::ispunct(static_cast<unsigned char>(e)));
}

Status refuse(const std::string& where, const std::string& text, const std::string& why) {
  return invalid_argument(where + ": target '" + text + "' " + why);
}

// Check a pattern's syntax for what Python and ECMAScript read alike, and estimate its automaton
// before std::regex sees it: the length, plus kClassStates per class, times every counted
// repetition's bound. Also refuses what would make the compiler recurse deeply.
Status check_pattern(const std::string& where, const std::string& text, const std::string& pattern, int64_t* states_out) {
  int64_t states = std::max<int64_t>(1, static_cast<int64_t>(pattern.size()));
  int64_t depth = 0, deepest = 0;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\') {
      if (i + 1 == pattern.size()) return refuse(where, text, "is not a usable regular expression: it ends in a lone backslash");
      const char e = pattern[++i];
      if (!portable_escape(e))
        return refuse(where, text, std::string("uses the escape \\") + e + ", which Python's re (compressed-tensors) and "
                      "ECMAScript (llmq) read differently or not at all; allowed: \\d \\D \\w \\W \\s \\S \\b \\B and "
                      "escaped punctuation such as \\.");
      if (!in_class && std::strchr("dDwWsS", e) != nullptr) states += kClassStates;
      continue;
    }
    if (in_class) {
      in_class = c != ']';
      continue;  // ( ) { and | are literals in a class
    }
    if (c == '[') {
      in_class = true;
      states += kClassStates;
      deepest = std::max(deepest, depth + 1);
      size_t j = i + 1;
      if (j < pattern.size() && pattern[j] == '^') ++j;
      if (j < pattern.size() && pattern[j] == ']')
        return refuse(where, text, "opens a class with ']' (a literal ] in Python, an empty class in ECMAScript); "
                      "write \\]");
      i = j - 1;
      continue;
    }
    if (c == '(') deepest = std::max(deepest, ++depth);
    if (c == ')' && depth-- == 0)
      return refuse(where, text, "is not a usable regular expression: a ')' closes no '(' (unbalanced parentheses; Python refuses "
                                   "it)");
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
      return refuse(where, text, "repeats more than " + std::to_string(kMaxRecipeRepeat) +
                                     " times ({n,m}); module names need no more");
    states *= std::max<int64_t>(1, bound);
    if (states > kMaxRecipeStates)
      return refuse(where, text, "is too large a regular expression (its counted repetitions multiply past " +
                                     std::to_string(kMaxRecipeStates) + " states)");
    i = j;
  }
  if (in_class) return refuse(where, text, "is not a usable regular expression: a '[' is never closed");
  if (depth > 0) return refuse(where, text, "is not a usable regular expression: a '(' is never closed (unbalanced "
                                   "parentheses)");
  if (deepest > kMaxRecipeNesting)
    return refuse(where, text, "nests groups " + std::to_string(deepest) + " deep; at most " +
                                   std::to_string(kMaxRecipeNesting));
  if (states > kMaxRecipeStates)
    return refuse(where, text, "is too large a regular expression (about " + std::to_string(states) +
                                   " states; at most " + std::to_string(kMaxRecipeStates) + ")");
  *states_out = states;
  return {};
}

}  // namespace

Status compile_recipe_target(const std::string& where, const std::string& text, TargetAnchor anchor,
                             RecipeTargetBudget* budget, RecipeTarget* out) {
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
  std::string pattern = text.substr(sizeof(kRegexPrefix) - 1);
  if (pattern.empty()) return refuse(where, text, "has an empty regular expression");
  LLMQ_RETURN_IF_ERROR(check_pattern(where, text, pattern, &t.states));
  // The parentheses are balanced (checked above), so the pattern cannot close this group early.
  if (anchor == TargetAnchor::kPrefix) pattern = "(?:" + pattern + ")[\\s\\S]*";
  if (budget->states + t.states > kMaxRecipeTotalStates)
    return refuse(where, text, "takes the regular expressions of this list past " +
                                   std::to_string(kMaxRecipeTotalStates) + " estimated states in all (" +
                                   std::to_string(budget->states + t.states) + "); use fewer or smaller patterns");
  budget->states += t.states;
  t.is_regex = true;
  try {
    // __polynomial: libstdc++'s breadth-first executor (no backreferences), linear in the name.
    // nosubs: that executor copies every capture group per state per character otherwise (a
    // pattern of 250 groups repeated 64 times took 2.8 s and 199 MB per match; 0.1 s without).
    t.regex = std::make_shared<const std::regex>(
        pattern, std::regex::ECMAScript | std::regex::nosubs | std::regex_constants::__polynomial);
  } catch (const std::regex_error& e) {
    return refuse(where, text, std::string("is not a usable regular expression: ") + e.what());
  }
  *out = std::move(t);
  return {};
}

Status compile_recipe_target(const std::string& where, const std::string& text, RecipeTarget* out) {
  RecipeTargetBudget own;
  return compile_recipe_target(where, text, TargetAnchor::kWholeName, &own, out);
}

Status check_match_work(const std::string& what, int64_t states, int64_t name_chars) {
  // Both factors are bounded (states by kMaxRecipeTotalStates), so the product cannot overflow
  // for any name list that fits in memory; compared by division all the same.
  if (states > 0 && name_chars > kMaxRecipeMatchWork / states)
    return invalid_argument(what + ": matching regular expressions of about " + std::to_string(states) +
                            " states against " + std::to_string(name_chars) + " characters of module names is too "
                            "much work (more than " + std::to_string(kMaxRecipeMatchWork) +
                            " state-characters); use fewer or smaller patterns, or exact names");
  return {};
}

Status recipe_target_matches(const RecipeTarget& target, const std::string& module, RecipeTargetBudget* budget,
                             bool* matched) {
  if (!target.is_regex) {
    *matched = target.text == module;
    return {};
  }
  if (budget != nullptr) {
    const int64_t chars = static_cast<int64_t>(module.size()) + 1;
    if (budget->work + target.states * chars > kMaxRecipeMatchWork)
      return invalid_argument("target '" + target.text + "': the regular expressions of this list, matched against "
                              "one module name after another, passed " + std::to_string(kMaxRecipeMatchWork) +
                              " estimated state-characters of work at " + module +
                              "; use fewer or smaller patterns, or exact names");
    budget->work += target.states * chars;
  }
  try {
    *matched = std::regex_match(module, *target.regex);
  } catch (const std::regex_error& e) {
    return invalid_argument("recipe target '" + target.text + "' could not be matched against " + module + ": " + e.what());
  }
  return {};
}

Status recipe_target_matches(const RecipeTarget& target, const std::string& module, bool* matched) {
  return recipe_target_matches(target, module, nullptr, matched);
}

}  // namespace llmq
