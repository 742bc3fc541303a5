// Recipe targets (src/model/quant/quant_recipe_targets.hpp) under hostile input and under the two
// regular-expression dialects: a pattern libstdc++ matches slowly, and many of them, are refused
// before any is matched (the test would otherwise run for hours); escapes and parentheses that
// Python's re (how compressed-tensors reads the same strings) and ECMAScript read differently are
// refused naming the target; a prefix target matches as re.match does.
#include "model/quant/quant_recipe_targets.hpp"

#include "llmq/quant_recipe.hpp"
#include "model_quantize_support.hpp"

namespace llmq {
namespace {

// 250 capture groups repeated 64 times: within every per-pattern bound, yet libstdc++'s
// breadth-first executor took 2.8 s and 199 MB per module name with submatches, 0.1 s without.
std::string hostile_pattern() {
  std::string p = "re:(?:";
  for (int i = 0; i < 250; ++i) p += "(.?)";
  return p + "){64}";
}

// A Mixtral-sized MoE config (32 layers of 8 experts: about 930 linears), names only.
ModelConfig large_moe_config() {
  ModelConfig c = small_model(4).model.config;
  c.n_layers = 32;
  c.n_experts = 8;
  return c;
}

void expect_refused(const Status& st, const std::vector<std::string>& words, const std::string& what) {
  ASSERT_FALSE(st.ok()) << what << " was accepted";
  for (const std::string& w : words) EXPECT_TRUE(contains(st.message(), w)) << what << ": '" << w << "' not in: " << st.message();
}

TEST(RecipeTargets, HostilePatternsAreRefusedBeforeTheyAreMatched) {
  RecipeTarget one;
  ASSERT_TRUE(compile_recipe_target("g", hostile_pattern(), &one).ok()) << "within the per-pattern bounds";

  // One such pattern against every module of a large MoE: too much matching work, refused before
  // the first match.
  QuantRecipe single = uniform_recipe("fp8-dynamic");
  single.groups[0].targets = {hostile_pattern()};
  expect_refused(resolve_recipe(single, large_moe_config(), nullptr), {"too much work", "exact names"},
                 "a slow pattern over 930 modules");

  // 780 of them (a 1 MiB recipe): refused by their total size, before most are compiled.
  QuantRecipe many = uniform_recipe("fp8-dynamic");
  many.groups[0].targets.clear();
  for (int i = 0; i < 780; ++i) many.groups[0].targets.push_back(hostile_pattern() + std::string(1, static_cast<char>('a' + i % 26)));
  expect_refused(resolve_recipe(many, small_model(0).model.config, nullptr), {"estimated states in all"},
                 "780 slow patterns");

  // The recipe file: the same, naming the field.
  nlohmann::json file = {{"groups", {{{"scheme", "fp8-dynamic"}, {"targets", many.groups[0].targets}}}}};
  QuantRecipe parsed;
  expect_refused(parse_recipe_json(file.dump(), "hostile.json", &parsed), {"hostile.json", "groups[0].targets[", "states"},
                 "a recipe file of 780 slow patterns");

  // The match budget counts every match against it.
  RecipeTargetBudget budget;
  budget.work = kMaxRecipeMatchWork - 10;
  bool matched = false;
  expect_refused(recipe_target_matches(one, "model.layers.0.mlp.up_proj", &budget, &matched), {"state-characters"},
                 "a match past the budget");
}

TEST(RecipeTargets, EscapesPythonReadsDifferentlyAreRefused) {
  // \Z is Python's end anchor but the letter Z in ECMAScript: q/k/v would silently match nothing.
  for (const std::string bad : {"re:.*self_attn\\.[qkv]_proj\\Z", "re:\\A.*q_proj", "re:(a)\\1", "re:\\x41",
                                "re:a\\nb", "re:.*\\z", "re:.*proj\\"}) {
    RecipeTarget t;
    expect_refused(compile_recipe_target("recipe group 'g'", bad, &t), {"'g'", bad}, bad);
  }
  for (const std::string good : {"re:model\\.layers\\.\\d+\\.mlp\\..*", "re:\\w+\\.\\S*", "re:.*[\\]\\-](x|y)",
                                 "re:.*\\bq_proj", "re:a\\/b\\\\c"}) {
    RecipeTarget t;
    const Status st = compile_recipe_target("g", good, &t);
    EXPECT_TRUE(st.ok()) << good << ": " << st.to_string();
  }
  RecipeTarget t;
  ASSERT_TRUE(compile_recipe_target("g", "re:model\\.layers\\.\\d+\\.self_attn\\.[qkv]_proj", &t).ok());
  bool matched = false;
  ASSERT_TRUE(recipe_target_matches(t, "model.layers.12.self_attn.k_proj", &matched).ok());
  EXPECT_TRUE(matched);
}

TEST(RecipeTargets, UnbalancedParenthesesAndAmbiguousClassesAreRefused) {
  // Wrapped as "(?:" + p + ")" for re.match, "a)|(?:b" would compile and match "b..." anywhere;
  // Python refuses it.
  for (const std::string bad : {"re:a)|(?:b", "re:(a", "re:a)", "re:[]a]", "re:[^]a]", "re:[abc"}) {
    for (TargetAnchor anchor : {TargetAnchor::kWholeName, TargetAnchor::kPrefix}) {
      RecipeTarget t;
      RecipeTargetBudget budget;
      expect_refused(compile_recipe_target("quantization_config.ignore[0]", bad, anchor, &budget, &t),
                     {"ignore[0]", bad}, bad);
    }
  }
  // Parentheses inside a class are characters, not groups.
  RecipeTarget t;
  RecipeTargetBudget budget;
  ASSERT_TRUE(compile_recipe_target("g", "re:.*[()](x)", TargetAnchor::kWholeName, &budget, &t).ok());
  bool matched = false;
  ASSERT_TRUE(recipe_target_matches(t, "a(x", &matched).ok());
  EXPECT_TRUE(matched);
}

TEST(RecipeTargets, PrefixTargetsMatchAsPythonReMatchDoes) {
  RecipeTargetBudget budget;
  RecipeTarget prefix, whole;
  ASSERT_TRUE(compile_recipe_target("g", "re:.*self_attn", TargetAnchor::kPrefix, &budget, &prefix).ok());
  ASSERT_TRUE(compile_recipe_target("g", "re:.*self_attn", TargetAnchor::kWholeName, &budget, &whole).ok());
  bool p = false, w = true;
  ASSERT_TRUE(recipe_target_matches(prefix, "model.layers.0.self_attn.q_proj", &budget, &p).ok());
  ASSERT_TRUE(recipe_target_matches(whole, "model.layers.0.self_attn.q_proj", &budget, &w).ok());
  EXPECT_TRUE(p) << "re.match anchors at the start only";
  EXPECT_FALSE(w) << "a recipe's pattern matches the whole name";
  EXPECT_GT(budget.work, 0);
  EXPECT_GT(budget.states, 0);
}

}  // namespace
}  // namespace llmq
