// The recipe file: {"groups": [{"name", "scheme", "targets"}], "ignore", "smooth_alpha",
// "backoff"}. Every field is checked here, so a hand-written file gets an error naming the field
// (groups[1].targets[0]) rather than a nlohmann type error, and a key written twice anywhere is
// refused (nlohmann would keep the last one silently).
#include <cmath>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmq/quant_recipe.hpp"
#include "model/checkpoint/input_file.hpp"
#include "model/quant/quant_recipe_targets.hpp"

namespace llmq {
namespace {

using json = nlohmann::json;

// A recipe names a few groups and a few hundred modules at most; 1 MiB is far above that.
constexpr int64_t kMaxRecipeBytes = int64_t{1} << 20;

Status bad_field(const std::string& source, const std::string& where, const std::string& what) {
  return invalid_argument("--recipe: " + source + ": " + where + ": " + what);
}

// The first key written twice in any one object, "" when none (`text` is known to parse, within
// the depth bound).
std::string duplicate_key(const std::string& text) {
  std::vector<std::set<std::string>> open;  // keys of each object being read, innermost last
  std::string duplicate;
  const json::parser_callback_t note = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) open.emplace_back();
    if (event == json::parse_event_t::object_end && !open.empty()) open.pop_back();
    if (event == json::parse_event_t::key && !open.empty() && !open.back().insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return false;  // nothing is kept: only the keys are wanted
  };
  try {
    const json nothing_kept = json::parse(text, note);
    (void)nothing_kept;
  } catch (const std::exception&) {
  }
  return duplicate;
}

Status check_keys(const std::string& source, const json& obj, const std::string& where,
                  const std::set<std::string>& allowed) {
  for (const auto& [key, value] : obj.items())
    if (allowed.count(key) == 0) {
      std::string known;
      for (const std::string& k : allowed) known += (known.empty() ? "" : ", ") + k;
      return bad_field(source, where + key, "unknown key (known: " + known + ")");
    }
  return {};
}

// Each target is compiled to check it here, naming its field; `budget` bounds the compiling of
// the whole file (a megabyte of large patterns would otherwise take minutes).
Status read_targets(const std::string& source, const json& v, const std::string& where, bool allow_empty,
                    RecipeTargetBudget* budget, std::vector<std::string>* out) {
  if (!v.is_array()) return bad_field(source, where, "expected an array of module names, got " + v.dump());
  if (v.empty() && !allow_empty) return bad_field(source, where, "empty (a group targets at least one module)");
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!v[i].is_string()) return bad_field(source, at, "expected a string, got " + v[i].dump());
    RecipeTarget t;
    if (Status st = compile_recipe_target(at, v[i].get<std::string>(), TargetAnchor::kWholeName, budget, &t); !st.ok())
      return invalid_argument("--recipe: " + source + ": " + st.message());
    out->push_back(v[i].get<std::string>());
  }
  return {};
}

Status read_fraction(const std::string& source, const json& obj, const char* key, bool zero_allowed, float* out) {
  const auto it = obj.find(key);
  if (it == obj.end()) return {};
  const bool ok = it->is_number() && std::isfinite(it->get<double>()) &&
                  (zero_allowed ? it->get<double>() >= 0.0 : it->get<double>() > 0.0) && it->get<double>() <= 1.0;
  if (!ok) return bad_field(source, key, std::string("expected a number in ") + (zero_allowed ? "[0, 1]" : "(0, 1]") +
                                             ", got " + it->dump());
  *out = it->get<float>();
  return {};
}

}  // namespace

Status parse_recipe_json(const std::string& text, const std::string& source, QuantRecipe* out) {
  if (static_cast<int64_t>(text.size()) > kMaxRecipeBytes)
    return invalid_argument("--recipe: " + source + ": " + std::to_string(text.size()) + " bytes; a recipe is at most " +
                            std::to_string(kMaxRecipeBytes));
  json j;
  LLMQ_RETURN_IF_ERROR(parse_json_text("--recipe: " + source, text, &j));
  if (const std::string dup = duplicate_key(text); !dup.empty())
    return bad_field(source, dup, "the key is written twice in one object");
  if (!j.is_object()) return invalid_argument("--recipe: " + source + ": expected a JSON object");
  LLMQ_RETURN_IF_ERROR(check_keys(source, j, "", {"groups", "ignore", "smooth_alpha", "backoff"}));
  QuantRecipe r;
  const auto groups = j.find("groups");
  if (groups == j.end()) return bad_field(source, "groups", "missing");
  if (!groups->is_array() || groups->empty())
    return bad_field(source, "groups", "expected a non-empty array of groups, got " + groups->dump());
  std::set<std::string> names;
  RecipeTargetBudget budget;
  for (size_t i = 0; i < groups->size(); ++i) {
    const json& g = (*groups)[i];
    const std::string where = "groups[" + std::to_string(i) + "].";
    if (!g.is_object()) return bad_field(source, where.substr(0, where.size() - 1), "expected an object");
    LLMQ_RETURN_IF_ERROR(check_keys(source, g, where, {"name", "scheme", "targets"}));
    RecipeGroup group;
    group.name = "group_" + std::to_string(i);
    if (const auto n = g.find("name"); n != g.end()) {
      if (!n->is_string() || n->get<std::string>().empty())
        return bad_field(source, where + "name", "expected a non-empty string, got " + n->dump());
      group.name = n->get<std::string>();
    }
    if (!names.insert(group.name).second)
      return bad_field(source, where + "name", "'" + group.name + "' names two groups");
    const auto s = g.find("scheme");
    if (s == g.end()) return bad_field(source, where + "scheme", "missing");
    if (!s->is_string()) return bad_field(source, where + "scheme", "expected a scheme name, got " + s->dump());
    Scheme known;
    if (Status st = find_scheme(s->get<std::string>(), &known); !st.ok())
      return bad_field(source, where + "scheme", st.message().substr(st.message().find("unknown")));
    group.scheme = s->get<std::string>();
    const auto t = g.find("targets");
    if (t == g.end()) return bad_field(source, where + "targets", "missing");
    LLMQ_RETURN_IF_ERROR(read_targets(source, *t, where + "targets", false, &budget, &group.targets));
    r.groups.push_back(std::move(group));
  }
  if (const auto ig = j.find("ignore"); ig != j.end())
    LLMQ_RETURN_IF_ERROR(read_targets(source, *ig, "ignore", true, &budget, &r.ignore));
  LLMQ_RETURN_IF_ERROR(read_fraction(source, j, "smooth_alpha", true, &r.smooth_alpha));
  LLMQ_RETURN_IF_ERROR(read_fraction(source, j, "backoff", false, &r.backoff));
  *out = std::move(r);
  return {};
}

Status load_recipe_file(const std::string& path, QuantRecipe* out) {
  std::string text;
  LLMQ_RETURN_IF_ERROR(read_input_file("--recipe", path, kMaxRecipeBytes, &text));
  return parse_recipe_json(text, path, out);
}

std::string recipe_to_json(const QuantRecipe& recipe) {
  nlohmann::ordered_json j;
  j["groups"] = nlohmann::ordered_json::array();
  for (const RecipeGroup& g : recipe.groups)
    j["groups"].push_back({{"name", g.name}, {"scheme", g.scheme}, {"targets", g.targets}});
  j["ignore"] = recipe.ignore;
  if (recipe.smooth_alpha >= 0.0f) j["smooth_alpha"] = recipe.smooth_alpha;
  if (recipe.backoff >= 0.0f) j["backoff"] = recipe.backoff;
  return j.dump(2) + "\n";
}

}  // namespace llmq
