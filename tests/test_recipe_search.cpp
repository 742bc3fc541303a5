// The search of `llmq recipe` (llmq/recipe_search.hpp) against a fake evaluator: a deterministic
// function of the assignment whose KL is the sum of per-unit errors times an interaction factor
// that makes it non-additive and not monotone along the chain. Properties over random problems:
// the choice meets its budget when evaluated afresh, every point before it in the walked sequence
// fails the budget, a tighter budget chooses a point of the same sequence no earlier, no cheaper
// and (when another) measured strictly better on the bound, all-kept is chosen when nothing else
// meets the budget and an error when even that misses it; the chain's own invariants; the sequence
// holds the chain and each valid uniform point once, by cost; a uniform point that measures better
// than the chain's first point at the same cost is chosen; batch size changes nothing.
// Also: the budget parser and its refusals, the units of a model and the cost model's bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "llmq/recipe_search.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using Summary = EvalAccumulator::Summary;

// Random problems: units x candidate schemes, the unit's true error under each scheme, and costs.
struct FakeModel {
  RecipeSearchProblem problem;
  std::vector<std::vector<double>> error;  // [unit][scheme]
  uint64_t seed = 0;
  int64_t calls = 0;
  int64_t assignments = 0;

  // Deterministic in the assignment: an FNV hash of it draws the interaction in [0.7, 1.3].
  Summary evaluate(const RecipeAssignment& a) const {
    uint64_t h = 1469598103934665603ull ^ seed;
    double kl = 0.0;
    for (size_t u = 0; u < a.size(); ++u) {
      h = (h ^ static_cast<uint64_t>(a[u] + 7)) * 1099511628211ull;
      if (a[u] != kKeptOption) kl += error[u][static_cast<size_t>(a[u])];
    }
    const double interaction = 0.7 + 0.6 * static_cast<double>(h % 1000003) / 1000003.0;
    Summary s;
    s.tokens = 100;
    s.kl.mean = kl * interaction;
    s.top1_agreement.mean = std::exp(-3.0 * s.kl.mean);
    s.ppl_ratio = std::exp(0.8 * s.kl.mean * (2.0 - interaction));
    return s;
  }
  EvaluateAssignmentsFn evaluator() {
    return [this](const std::vector<RecipeAssignment>& batch, std::vector<Summary>* out) -> Status {
      ++calls;
      assignments += static_cast<int64_t>(batch.size());
      for (const RecipeAssignment& a : batch) out->push_back(evaluate(a));
      return {};
    };
  }
};

FakeModel random_model(uint64_t seed, size_t units, size_t schemes) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  FakeModel m;
  m.seed = seed;
  for (size_t s = 0; s < schemes; ++s) m.problem.scheme_names.push_back("scheme" + std::to_string(s));
  std::vector<double> bytes_per_element;
  for (size_t s = 0; s < schemes; ++s) bytes_per_element.push_back(1.0 + 0.9 * unit(rng));
  for (size_t u = 0; u < units; ++u) {
    m.problem.unit_names.push_back("unit" + std::to_string(u));
    const double elements = 1000.0 * (1.0 + 9.0 * unit(rng));
    const double fragility = std::pow(10.0, -3.0 + 2.0 * unit(rng));
    std::vector<double> cost, error;
    for (size_t s = 0; s < schemes; ++s) {
      cost.push_back(elements * bytes_per_element[s]);
      error.push_back(fragility * (0.2 + unit(rng)) * (2.0 - bytes_per_element[s]));
    }
    m.problem.cost.push_back(cost);
    m.problem.kept_cost.push_back(elements * 2.0);
    m.error.push_back(error);
  }
  return m;
}

AccuracyBudget budget_of(const std::string& text) {
  AccuracyBudget b;
  Status s = parse_accuracy_budget(text, &b);
  EXPECT_TRUE(s.ok()) << text << ": " << s.to_string();
  return b;
}

TEST(RecipeSearch, ChoiceMeetsBudgetAndEveryEarlierPointFails) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    FakeModel m = random_model(seed, 2 + seed % 9, 1 + seed % 4);
    for (const char* text : {"kl<=0.002", "kl<=0.0005", "top1>=0.995", "ppl<=1.001x", "kl<=0.003,top1>=0.996"}) {
      const std::string what = llmq::testing::repro(seed, 0, 0, text);
      RecipeSearchOptions options;
      options.budget = budget_of(text);
      RecipeSearchResult r;
      ASSERT_TRUE(search_recipe(m.problem, m.evaluator(), options, &r).ok()) << what;
      ASSERT_GE(r.chosen, 0) << what;
      const ChainPoint& chosen = r.points[static_cast<size_t>(r.chosen)];
      EXPECT_TRUE(budget_met(options.budget, m.evaluate(chosen.assignment))) << what;  // afresh
      EXPECT_TRUE(chosen.meets_budget) << what;
      for (int64_t i = 0; i < r.chosen; ++i) {
        EXPECT_TRUE(r.points[static_cast<size_t>(i)].evaluated) << what << " point " << i;
        EXPECT_FALSE(budget_met(options.budget, m.evaluate(r.points[static_cast<size_t>(i)].assignment)))
            << what << " point " << i;
      }
      for (size_t i = static_cast<size_t>(r.chosen) + 1; i < r.points.size(); ++i)
        EXPECT_FALSE(r.points[i].evaluated) << what << ": the walk went past the choice";
    }
  }
}

TEST(RecipeSearch, TighterBudgetNeverChoosesLessAccurateAndLooserNeverCostsMore) {
  for (uint64_t seed = 100; seed < 130; ++seed) {
    FakeModel m = random_model(seed, 3 + seed % 8, 2 + seed % 3);
    // Limits from loose (the cheapest point meets it) to tight (below any quantized unit's KL).
    std::vector<RecipeSearchResult> results;
    std::vector<double> limits;
    for (int k = 0; k <= 60; ++k) limits.push_back(100.0 * std::pow(0.7, k));
    for (double limit : limits) {
      RecipeSearchOptions options;
      options.budget.bounds = {{BudgetMetric::kKlMean, limit, "kl"}};
      options.budget.text = "kl<=" + std::to_string(limit);
      RecipeSearchResult r;
      ASSERT_TRUE(search_recipe(m.problem, m.evaluator(), options, &r).ok()) << seed;
      results.push_back(std::move(r));
    }
    for (size_t a = 0; a + 1 < results.size(); ++a) {
      const RecipeSearchResult &loose = results[a], &tight = results[a + 1];
      const std::string what = llmq::testing::repro(seed, 0, 0, "limits " + std::to_string(limits[a]) + " -> " +
                                                                    std::to_string(limits[a + 1]));
      ASSERT_EQ(tight.points.size(), loose.points.size()) << what;
      for (size_t i = 0; i < tight.points.size(); ++i)
        ASSERT_EQ(tight.points[i].assignment, loose.points[i].assignment) << what << ": the sequence moved at " << i;
      const ChainPoint& pl = loose.points[static_cast<size_t>(loose.chosen)];
      const ChainPoint& pt = tight.points[static_cast<size_t>(tight.chosen)];
      EXPECT_GE(tight.chosen, loose.chosen) << what;
      EXPECT_GE(pt.cost, pl.cost) << what;
      if (tight.chosen == loose.chosen) {
        EXPECT_EQ(pt.summary.kl.mean, pl.summary.kl.mean) << what;
      } else {
        EXPECT_LT(pt.summary.kl.mean, pl.summary.kl.mean) << what;  // the one bound, strictly better
        EXPECT_GT(pl.summary.kl.mean, limits[a + 1]) << what;       // the loose choice missed it
      }
    }
    EXPECT_EQ(results.front().chosen, 0) << seed;
    EXPECT_EQ(results.back().chosen, static_cast<int64_t>(results.back().points.size()) - 1) << seed;
  }
}

TEST(RecipeSearch, AllKeptChosenWhenNothingElseMeetsAndAnErrorWhenEvenItMisses) {
  FakeModel m = random_model(7, 5, 3);
  RecipeSearchOptions options;
  options.budget = budget_of("kl<=0");
  RecipeSearchResult r;
  ASSERT_TRUE(search_recipe(m.problem, m.evaluator(), options, &r).ok());
  EXPECT_EQ(r.chosen, static_cast<int64_t>(r.points.size()) - 1);
  for (int a : r.points.back().assignment) EXPECT_EQ(a, kKeptOption);

  options.budget = budget_of("ppl<=0.999x");  // the base model's ratio to itself is 1
  Status s = search_recipe(m.problem, m.evaluator(), options, &r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("ppl<=0.999x"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("not even every unit kept"), std::string::npos) << s.message();
}

TEST(RecipeSearch, ChainRunsFromCheapestToAllKeptOneUnitMoreAccurateAtATime) {
  for (uint64_t seed = 200; seed < 230; ++seed) {
    FakeModel m = random_model(seed, 1 + seed % 7, 1 + seed % 5);
    std::vector<std::vector<double>> sens = m.error;
    std::vector<ChainPoint> chain;
    ASSERT_TRUE(build_recipe_chain(m.problem, sens, &chain).ok());
    const std::string what = llmq::testing::repro(seed, 0, 0, "chain");
    for (size_t u = 0; u < sens.size(); ++u) {
      // The first point has each unit at its cheapest candidate; the last has it kept.
      size_t cheapest = 0;
      for (size_t s = 1; s < sens[u].size(); ++s)
        if (m.problem.cost[u][s] < m.problem.cost[u][cheapest]) cheapest = s;
      EXPECT_EQ(chain.front().assignment[u], static_cast<int>(cheapest)) << what << " unit " << u;
      EXPECT_EQ(chain.back().assignment[u], kKeptOption) << what;
    }
    auto sens_of = [&](size_t u, int o) { return o == kKeptOption ? 0.0 : sens[u][static_cast<size_t>(o)]; };
    auto cost_of = [&](size_t u, int o) {
      return o == kKeptOption ? m.problem.kept_cost[u] : m.problem.cost[u][static_cast<size_t>(o)];
    };
    for (size_t i = 1; i < chain.size(); ++i) {
      EXPECT_GT(chain[i].cost, chain[i - 1].cost) << what << " point " << i;
      int moved = 0;
      for (size_t u = 0; u < sens.size(); ++u) {
        const int from = chain[i - 1].assignment[u], to = chain[i].assignment[u];
        if (from == to) continue;
        ++moved;
        EXPECT_GT(cost_of(u, to), cost_of(u, from)) << what;
        EXPECT_TRUE(sens_of(u, to) < sens_of(u, from) || to == kKeptOption) << what;
      }
      EXPECT_EQ(moved, 1) << what << " point " << i;
    }
  }
}

TEST(RecipeSearch, DominatedSchemeNeverAppearsAndBrokenSensitivityIsSkipped) {
  RecipeSearchProblem p;
  p.unit_names = {"a", "b"};
  p.scheme_names = {"cheap", "dominated", "good", "broken"};
  // "dominated" costs more than "cheap" and is less accurate; "broken" measured NaN.
  p.cost = {{10, 12, 14, 11}, {10, 12, 14, 11}};
  p.kept_cost = {20, 20};
  std::vector<std::vector<double>> sens = {{0.5, 0.6, 0.1, std::nan("")}, {0.4, 0.9, 0.2, std::nan("")}};
  std::vector<ChainPoint> chain;
  ASSERT_TRUE(build_recipe_chain(p, sens, &chain).ok());
  for (const ChainPoint& c : chain)
    for (int a : c.assignment) {
      EXPECT_NE(a, 1);
      EXPECT_NE(a, 3);
    }
  // cheap -> good -> kept for both units: 1 + 2 + 2 points.
  EXPECT_EQ(chain.size(), 5u);
  // Unit a gains 0.4 / 4 per cost moving to "good", unit b 0.2 / 4: a moves first.
  EXPECT_EQ(chain[1].assignment, (RecipeAssignment{2, 0}));
}

// Per-unit costs (a scheme may cost more than keeping some unit) and broken sensitivities, so that
// some schemes have no uniform point and others one beside the chain.
TEST(RecipeSearch, SequenceHoldsTheChainAndEachValidUniformPointOnceByCost) {
  int64_t beside_chain = 0, missing = 0;
  for (uint64_t seed = 300; seed < 340; ++seed) {
    FakeModel m = random_model(seed, 1 + seed % 6, 1 + seed % 4);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    std::vector<std::vector<double>> sens = m.error;
    for (size_t u = 0; u < sens.size(); ++u)
      for (size_t s = 0; s < sens[u].size(); ++s) {
        m.problem.cost[u][s] *= 0.8 + 0.45 * unit(rng);
        if (unit(rng) < 0.05) sens[u][s] = std::nan("");
      }
    const std::string what = llmq::testing::repro(seed, 0, 0, "sequence");
    std::vector<ChainPoint> chain, points;
    ASSERT_TRUE(build_recipe_chain(m.problem, sens, &chain).ok()) << what;
    ASSERT_TRUE(build_recipe_sequence(m.problem, sens, &points).ok()) << what;
    auto count = [&](const RecipeAssignment& a) {
      return std::count_if(points.begin(), points.end(), [&](const ChainPoint& p) { return p.assignment == a; });
    };
    for (const ChainPoint& c : chain) EXPECT_EQ(count(c.assignment), 1) << what;
    size_t uniform_points = 0;
    for (size_t s = 0; s < m.problem.scheme_names.size(); ++s) {
      bool valid = true;
      for (size_t u = 0; u < sens.size(); ++u)
        valid = valid && std::isfinite(sens[u][s]) && m.problem.cost[u][s] < m.problem.kept_cost[u];
      const RecipeAssignment uniform(sens.size(), static_cast<int>(s));
      const bool in_chain = std::any_of(chain.begin(), chain.end(), [&](const ChainPoint& c) { return c.assignment == uniform; });
      EXPECT_EQ(count(uniform), valid ? 1 : 0) << what << " scheme " << s;
      uniform_points += valid ? 1 : 0;
      beside_chain += valid && !in_chain ? 1 : 0;
      missing += valid ? 0 : 1;
    }
    // Nothing else: the chain's points (distinct) and the uniform ones not already in it.
    size_t chain_uniform = 0;
    for (const ChainPoint& c : chain)
      chain_uniform += std::all_of(c.assignment.begin(), c.assignment.end(), [&](int o) { return o >= 0 && o == c.assignment[0]; });
    EXPECT_EQ(points.size(), chain.size() + uniform_points - chain_uniform) << what;
    for (size_t i = 0; i < points.size(); ++i) {
      const ChainPoint& p = points[i];
      double cost = 0.0, predicted = 0.0;
      bool all_one = true;
      for (size_t u = 0; u < p.assignment.size(); ++u) {
        const int o = p.assignment[u];
        cost += o == kKeptOption ? m.problem.kept_cost[u] : m.problem.cost[u][static_cast<size_t>(o)];
        predicted += o == kKeptOption ? 0.0 : sens[u][static_cast<size_t>(o)];
        all_one = all_one && o != kKeptOption && o == p.assignment[0];
      }
      EXPECT_DOUBLE_EQ(p.cost, cost) << what << " point " << i;
      EXPECT_DOUBLE_EQ(p.predicted_kl, predicted) << what << " point " << i;
      EXPECT_EQ(p.uniform_scheme, all_one ? p.assignment[0] : -1) << what << " point " << i;
      if (i == 0) continue;
      const ChainPoint& q = points[i - 1];
      EXPECT_TRUE(q.cost < p.cost || (q.cost == p.cost && q.predicted_kl <= p.predicted_kl)) << what << " point " << i;
    }
    for (int o : points.back().assignment) EXPECT_EQ(o, kKeptOption) << what;
  }
  EXPECT_GT(beside_chain, 0);  // the cases this test is for did occur
  EXPECT_GT(missing, 0);
}

// Two units, two schemes of equal cost. Alone, unit 0 prefers "a" and unit 1 "b", so the chain
// starts at the mix {a, b}; measured whole, the mix is worse than uniform "a" (the errors interact),
// which costs the same. The walk evaluates the mix, then uniform "a", and chooses it.
TEST(RecipeSearch, UniformPointBeatingTheChainsFirstPointAtEqualCostIsChosen) {
  RecipeSearchProblem p;
  p.unit_names = {"u0", "u1"};
  p.scheme_names = {"a", "b"};
  p.cost = {{10, 10}, {10, 10}};
  p.kept_cost = {20, 20};
  auto kl_of = [](const RecipeAssignment& a) {
    const std::vector<std::pair<RecipeAssignment, double>> table = {
        {{0, -1}, 0.010}, {{1, -1}, 0.020}, {{-1, 0}, 0.020}, {{-1, 1}, 0.010},  // alone
        {{0, 1}, 0.050},  {{0, 0}, 0.025},  {{1, 1}, 0.040},  {{1, 0}, 0.060},   // whole
        {{-1, -1}, 0.0}};
    for (const auto& [assignment, kl] : table)
      if (assignment == a) return kl;
    return 0.03;  // one unit kept and the other moved: any value above the budget below
  };
  std::vector<RecipeAssignment> evaluated;
  EvaluateAssignmentsFn evaluate = [&](const std::vector<RecipeAssignment>& batch, std::vector<Summary>* out) -> Status {
    for (const RecipeAssignment& a : batch) {
      evaluated.push_back(a);
      Summary s;
      s.kl.mean = kl_of(a);
      out->push_back(s);
    }
    return {};
  };
  RecipeSearchOptions options;
  options.budget = budget_of("kl<=0.03");
  RecipeSearchResult r;
  ASSERT_TRUE(search_recipe(p, evaluate, options, &r).ok());
  ASSERT_GE(r.chosen, 1);
  EXPECT_EQ(r.points[0].assignment, (RecipeAssignment{0, 1}));  // the chain's first point
  EXPECT_EQ(r.points[0].uniform_scheme, -1);
  EXPECT_FALSE(r.points[0].meets_budget);
  const ChainPoint& chosen = r.points[static_cast<size_t>(r.chosen)];
  EXPECT_EQ(r.chosen, 1);
  EXPECT_EQ(chosen.assignment, (RecipeAssignment{0, 0}));
  EXPECT_EQ(chosen.uniform_scheme, 0);
  EXPECT_EQ(chosen.cost, r.points[0].cost);
  EXPECT_EQ(chosen.summary.kl.mean, 0.025);
  // After the four sensitivities, exactly the mix and then uniform "a" were evaluated.
  ASSERT_EQ(evaluated.size(), 6u);
  EXPECT_EQ(evaluated[4], (RecipeAssignment{0, 1}));
  EXPECT_EQ(evaluated[5], (RecipeAssignment{0, 0}));
  // Uniform "b" (predicted 0.03, the same as uniform "a") comes after "a" in scheme order.
  EXPECT_EQ(r.points[2].assignment, (RecipeAssignment{1, 1}));
  EXPECT_EQ(r.points[2].uniform_scheme, 1);
  EXPECT_FALSE(r.points[2].evaluated);
}

TEST(RecipeSearch, BatchSizeChangesNothing) {
  FakeModel m = random_model(77, 6, 3);
  RecipeSearchOptions options;
  options.budget = budget_of("kl<=0.001");
  RecipeSearchResult one, many;
  ASSERT_TRUE(search_recipe(m.problem, m.evaluator(), options, &one).ok());
  const int64_t single_calls = m.calls;
  options.batch = 5;
  m.calls = 0;
  ASSERT_TRUE(search_recipe(m.problem, m.evaluator(), options, &many).ok());
  EXPECT_EQ(one.chosen, many.chosen);
  EXPECT_EQ(one.sensitivity, many.sensitivity);
  EXPECT_LT(m.calls, single_calls);
  // Sensitivity is the KL of the model with one unit quantized and every other kept.
  for (size_t u = 0; u < m.error.size(); ++u)
    for (size_t s = 0; s < m.error[u].size(); ++s) {
      RecipeAssignment a(m.error.size(), kKeptOption);
      a[u] = static_cast<int>(s);
      EXPECT_EQ(one.sensitivity[u][s], m.evaluate(a).kl.mean);
    }
}

TEST(RecipeSearch, EvaluatorErrorsAndBadProblemsAreReported) {
  FakeModel m = random_model(3, 3, 2);
  RecipeSearchOptions options;
  options.budget = budget_of("kl<=0.01");
  RecipeSearchResult r;
  auto failing = [](const std::vector<RecipeAssignment>&, std::vector<Summary>*) -> Status {
    return invalid_argument("evaluation broke");
  };
  EXPECT_EQ(search_recipe(m.problem, failing, options, &r).message(), "evaluation broke");
  auto short_count = [](const std::vector<RecipeAssignment>&, std::vector<Summary>*) -> Status { return {}; };
  EXPECT_EQ(search_recipe(m.problem, short_count, options, &r).code(), StatusCode::kInternal);
  RecipeSearchProblem bad = m.problem;
  bad.cost[1][0] = -1;
  Status s = search_recipe(bad, m.evaluator(), options, &r);
  EXPECT_NE(s.message().find("unit1"), std::string::npos) << s.message();
  bad = m.problem;
  bad.kept_cost.pop_back();
  EXPECT_FALSE(search_recipe(bad, m.evaluator(), options, &r).ok());
  options.batch = 0;
  EXPECT_FALSE(search_recipe(m.problem, m.evaluator(), options, &r).ok());
}

TEST(AccuracyBudget, ParsesEachMetricAndSeveral) {
  AccuracyBudget b = budget_of(" kl<=0.01 , top1 >= 0.99,ppl<=1.01x");
  ASSERT_EQ(b.bounds.size(), 3u);
  EXPECT_EQ(b.bounds[0].metric, BudgetMetric::kKlMean);
  EXPECT_EQ(b.bounds[0].limit, 0.01);
  EXPECT_EQ(b.bounds[1].metric, BudgetMetric::kTop1);
  EXPECT_EQ(b.bounds[1].limit, 0.99);
  EXPECT_EQ(b.bounds[2].metric, BudgetMetric::kPplRatio);
  EXPECT_EQ(b.bounds[2].limit, 1.01);
  Summary s;
  s.kl.mean = 0.01;
  s.top1_agreement.mean = 0.99;
  s.ppl_ratio = 1.01;
  EXPECT_TRUE(budget_met(b, s));  // limits are inclusive
  s.top1_agreement.mean = 0.98;
  EXPECT_FALSE(budget_met(b, s));
  s.top1_agreement.mean = 1.0;
  s.kl.mean = std::nan("");
  EXPECT_FALSE(budget_met(b, s));
  s.kl.mean = 0.0;
  s.ppl_ratio = 1.02;
  EXPECT_FALSE(budget_met(b, s));
}

TEST(AccuracyBudget, RefusalsNameTheText) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "empty bound"},
      {"kl<=0.01,", "empty bound"},
      {"kl>=0.01", "bounded from above"},
      {"top1<=0.9", "bounded from below"},
      {"ppl<=1.01", "written with an x"},
      {"ppl>=1.01x", "bounded from above"},
      {"kl<0.01", "<= or >="},
      {"kl=0.01", "<= or >="},
      {"kl 0.01", "no comparison"},
      {"loss<=0.1", "unknown metric 'loss'"},
      {"kl<=abc", "'abc' is not a finite number"},
      {"kl<=0.01x", "is not a finite number"},
      {"kl<=inf", "is not a finite number"},
      {"kl<=nan", "is not a finite number"},
      {"kl<=-0.1", "never negative"},
      {"top1>=1.5", "(0, 1]"},
      {"top1>=0", "(0, 1]"},
      {"ppl<=0x", "positive"},
      {"kl<=0.1,kl<=0.2", "bounded twice"},
  };
  for (const auto& [text, why] : cases) {
    AccuracyBudget b;
    Status s = parse_accuracy_budget(text, &b);
    ASSERT_FALSE(s.ok()) << "'" << text << "' accepted";
    EXPECT_NE(s.message().find("--budget"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(std::string("'") + text + "'"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(why), std::string::npos) << s.message();
  }
  AccuracyBudget b;
  EXPECT_FALSE(parse_accuracy_budget(std::string(10000, 'k'), &b).ok());
}

ModelConfig small_config(int64_t layers, int64_t experts) {
  DefaultModelOptions o;
  o.dim = 64;
  o.hidden_dim = 128;
  o.n_layers = layers;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.vocab_size = 64;
  o.n_experts = experts;
  return make_default_model(o).config;
}

TEST(RecipeUnits, AttentionAndMlpPerLayerRouterKeptLmHeadOnRequest) {
  ModelConfig c = small_config(3, 0);
  std::vector<RecipeUnit> units;
  ASSERT_TRUE(recipe_units(c, false, &units).ok());
  ASSERT_EQ(units.size(), 6u);
  EXPECT_EQ(units[2].name, "layers.1.attention");
  EXPECT_EQ(units[2].modules, (std::vector<std::string>{"model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj",
                                                        "model.layers.1.self_attn.v_proj", "model.layers.1.self_attn.o_proj"}));
  EXPECT_EQ(units[5].modules, (std::vector<std::string>{"model.layers.2.mlp.gate_proj", "model.layers.2.mlp.up_proj",
                                                        "model.layers.2.mlp.down_proj"}));
  ASSERT_TRUE(recipe_units(c, true, &units).ok());
  EXPECT_EQ(units.back().modules, std::vector<std::string>{"lm_head"});
  c.tie_embeddings = true;
  EXPECT_FALSE(recipe_units(c, true, &units).ok());

  ModelConfig moe = c;
  moe.tie_embeddings = false;
  moe.model_type = "mixtral";
  moe.n_experts = 4;
  moe.n_experts_per_token = 2;
  ASSERT_TRUE(recipe_units(moe, false, &units).ok());
  EXPECT_EQ(units[1].modules.size(), 12u);  // 4 experts x (w1, w3, w2), no router
  for (const RecipeUnit& u : units)
    for (const std::string& name : u.modules) EXPECT_EQ(name.find(".gate"), std::string::npos) << name;
}

TEST(RecipeCost, BytesAreElementsPlusScalesAndDecodeReadsOnlyRoutedExperts) {
  Scheme s;
  int64_t bytes = 0;
  ASSERT_TRUE(find_scheme("fp8-dynamic", &s).ok());
  ASSERT_TRUE(scheme_weight_bytes(s, 300, 200, &bytes).ok());
  EXPECT_EQ(bytes, 300 * 200 + 300 * 4);  // per-channel: one float32 scale per output row
  ASSERT_TRUE(find_scheme("fp8-block", &s).ok());
  ASSERT_TRUE(scheme_weight_bytes(s, 300, 200, &bytes).ok());
  EXPECT_EQ(bytes, 300 * 200 + 3 * 2 * 4);  // 128x128 blocks, partial at the edges
  ASSERT_TRUE(find_scheme("fp8-tensor-static", &s).ok());
  ASSERT_TRUE(scheme_weight_bytes(s, 300, 200, &bytes).ok());
  EXPECT_EQ(bytes, 300 * 200 + 4 + 4);  // one weight scale and the static input scale
  EXPECT_FALSE(scheme_weight_bytes(s, 0, 200, &bytes).ok());

  ModelConfig c = small_config(1, 4);
  c.n_experts_per_token = 1;
  std::vector<RecipeUnit> units;
  ASSERT_TRUE(recipe_units(c, false, &units).ok());
  UnitCost kept, quant;
  ASSERT_TRUE(unit_cost(c, units[1], nullptr, &kept).ok());
  EXPECT_EQ(kept.bytes, 4 * 3 * 64 * 128 * 2);
  // One of four experts per token: a quarter of the bytes are read per decode step.
  EXPECT_DOUBLE_EQ(kept.decode_seconds, static_cast<double>(kept.bytes) / 4.0 / kDecodeBandwidthBytesPerSecond);
  ASSERT_TRUE(find_scheme("int8-w8a8", &s).ok());
  ASSERT_TRUE(unit_cost(c, units[1], &s, &quant).ok());
  EXPECT_LT(quant.bytes, kept.bytes);
  EXPECT_EQ(quant.value(RecipeObjective::kSize), static_cast<double>(quant.bytes));
  EXPECT_EQ(quant.value(RecipeObjective::kSpeed), quant.decode_seconds);
}

TEST(RecipeObjective, ParsesSpeedAndSizeOnly) {
  RecipeObjective o;
  ASSERT_TRUE(parse_recipe_objective("size", &o).ok());
  EXPECT_EQ(o, RecipeObjective::kSize);
  ASSERT_TRUE(parse_recipe_objective("speed", &o).ok());
  EXPECT_EQ(o, RecipeObjective::kSpeed);
  Status s = parse_recipe_objective("latency", &o);
  EXPECT_NE(s.message().find("--objective: 'latency'"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace llmq
