// The search of `llmq recipe` (recipe_search.hpp): sensitivities, the chain of assignments from
// cheapest to every unit kept, the sequence of the chain's points and the uniform ones, and the
// walk along it to the first point that meets the budget.
//
// Why a tighter budget never chooses a less accurate assignment. The walk evaluates one fixed
// sequence in order: the chain's points and the uniform points, sorted by cost, then predicted KL,
// then chain order. The sequence depends on the sensitivities and costs only, never on the budget,
// so two budgets walk the same sequence, and its points are evaluated by the same deterministic
// evaluator. Let budget B' be tighter than B: every summary that meets B' meets B. The walk returns
// the first point meeting the budget, i for B and i' for B'. Point i' meets B', hence B, so
// i <= i': the tighter budget chooses a point no earlier. If i' != i, then i < i' and point i, being
// before the first point meeting B', fails B': some bound of B' is missed at i and met at i', so the
// choice under B' is measured strictly better on that bound; and since cost never falls along the
// sequence, it is no cheaper. Conversely a looser budget chooses the same point or an earlier one,
// no more expensive. Nothing is claimed unit by unit: a uniform point may have some unit at a less
// accurate option than the chain point before it. (A bisection over the sequence would evaluate
// fewer points but keeps only the order of the points, not this: where the metric is not monotone
// along the sequence, a tighter budget could land on a point measured worse.)
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "llmq/recipe_search.hpp"

namespace llmq {
namespace {

struct Rung {
  int option = kKeptOption;  // scheme index or kKeptOption
  double cost = 0.0;
  double sensitivity = 0.0;
};

Status check_problem(const RecipeSearchProblem& p) {
  const size_t n = p.unit_names.size();
  if (n == 0) return invalid_argument("recipe search: the model has no units to assign");
  if (p.scheme_names.empty()) return invalid_argument("recipe search: no candidate schemes");
  if (p.scheme_names.size() > static_cast<size_t>(std::numeric_limits<int>::max() / 2))
    return invalid_argument("recipe search: too many candidate schemes");
  if (p.cost.size() != n || p.kept_cost.size() != n)
    return invalid_argument("recipe search: costs for " + std::to_string(p.cost.size()) + " units (" +
                            std::to_string(p.kept_cost.size()) + " kept), expected " + std::to_string(n));
  for (size_t u = 0; u < n; ++u) {
    if (p.cost[u].size() != p.scheme_names.size())
      return invalid_argument("recipe search: unit " + p.unit_names[u] + " has " + std::to_string(p.cost[u].size()) +
                              " scheme costs, expected " + std::to_string(p.scheme_names.size()));
    for (size_t s = 0; s <= p.cost[u].size(); ++s) {
      const double c = s < p.cost[u].size() ? p.cost[u][s] : p.kept_cost[u];
      if (!std::isfinite(c) || c <= 0.0)
        return invalid_argument("recipe search: unit " + p.unit_names[u] + ": cost of " +
                                (s < p.scheme_names.size() ? p.scheme_names[s] : std::string("kept")) +
                                " is not a positive finite number");
    }
  }
  return {};
}

// A unit's options worth having, cheapest first: a candidate stays only if it is cheaper than
// keeping the unit and strictly more accurate than every cheaper-or-equal candidate; kept closes
// the list (sensitivity 0: the unit is the base model's). Candidates with a non-finite sensitivity
// (the evaluation of that unit broke) are dropped.
std::vector<Rung> unit_ladder(const RecipeSearchProblem& p, const std::vector<double>& sensitivity, size_t u) {
  std::vector<Rung> candidates;
  for (size_t s = 0; s < p.scheme_names.size(); ++s)
    if (std::isfinite(sensitivity[s]) && p.cost[u][s] < p.kept_cost[u])
      candidates.push_back({static_cast<int>(s), p.cost[u][s], sensitivity[s]});
  std::stable_sort(candidates.begin(), candidates.end(), [](const Rung& a, const Rung& b) {
    return a.cost != b.cost ? a.cost < b.cost : a.sensitivity < b.sensitivity;
  });
  std::vector<Rung> ladder;
  double best = std::numeric_limits<double>::infinity();
  for (const Rung& r : candidates)
    if (r.sensitivity < best) {
      ladder.push_back(r);
      best = r.sensitivity;
    }
  ladder.push_back({kKeptOption, p.kept_cost[u], 0.0});
  return ladder;
}

ChainPoint make_point(const std::vector<std::vector<Rung>>& ladders, const std::vector<size_t>& at) {
  ChainPoint point;
  for (size_t u = 0; u < ladders.size(); ++u) {
    const Rung& r = ladders[u][at[u]];
    point.assignment.push_back(r.option);
    point.cost += r.cost;
    point.predicted_kl += r.sensitivity;
  }
  return point;
}

// Every unit under scheme s, or nothing when s is no option for some unit (its evaluation broke,
// or it costs no less than keeping the unit).
bool uniform_point(const RecipeSearchProblem& p, const std::vector<std::vector<double>>& sensitivity, size_t s,
                   ChainPoint* point) {
  *point = ChainPoint{};
  for (size_t u = 0; u < p.unit_names.size(); ++u) {
    if (!std::isfinite(sensitivity[u][s]) || !(p.cost[u][s] < p.kept_cost[u])) return false;
    point->assignment.push_back(static_cast<int>(s));
    point->cost += p.cost[u][s];
    point->predicted_kl += sensitivity[u][s];
  }
  point->uniform_scheme = static_cast<int>(s);
  return true;
}

std::string format_value(double v) {
  std::ostringstream s;
  s.precision(6);
  s << v;
  return s.str();
}

}  // namespace

Status build_recipe_chain(const RecipeSearchProblem& problem, const std::vector<std::vector<double>>& sensitivity,
                          std::vector<ChainPoint>* chain) {
  LLMQ_RETURN_IF_ERROR(check_problem(problem));
  const size_t n = problem.unit_names.size();
  if (sensitivity.size() != n)
    return invalid_argument("recipe search: sensitivities for " + std::to_string(sensitivity.size()) +
                            " units, expected " + std::to_string(n));
  std::vector<std::vector<Rung>> ladders;
  for (size_t u = 0; u < n; ++u) {
    if (sensitivity[u].size() != problem.scheme_names.size())
      return invalid_argument("recipe search: unit " + problem.unit_names[u] + " has " +
                              std::to_string(sensitivity[u].size()) + " sensitivities, expected " +
                              std::to_string(problem.scheme_names.size()));
    ladders.push_back(unit_ladder(problem, sensitivity[u], u));
  }
  std::vector<size_t> at(n, 0);
  std::vector<ChainPoint> points{make_point(ladders, at)};
  while (true) {
    // The move that buys the most accuracy per added cost. Looking past the next rung lets a unit
    // skip an option whose step is poor value when the one after it is good value.
    double best_gain = -1.0;
    size_t best_u = n, best_j = 0;
    for (size_t u = 0; u < n; ++u) {
      const Rung& from = ladders[u][at[u]];
      for (size_t j = at[u] + 1; j < ladders[u].size(); ++j) {
        const Rung& to = ladders[u][j];
        const double gain = (from.sensitivity - to.sensitivity) / (to.cost - from.cost);
        if (gain > best_gain) {
          best_gain = gain;
          best_u = u;
          best_j = j;
        }
      }
    }
    if (best_u == n) break;  // every unit kept
    at[best_u] = best_j;
    points.push_back(make_point(ladders, at));
  }
  *chain = std::move(points);
  return {};
}

Status build_recipe_sequence(const RecipeSearchProblem& problem, const std::vector<std::vector<double>>& sensitivity,
                             std::vector<ChainPoint>* points) {
  std::vector<ChainPoint> sequence;
  LLMQ_RETURN_IF_ERROR(build_recipe_chain(problem, sensitivity, &sequence));
  const size_t chain_length = sequence.size();
  for (size_t s = 0; s < problem.scheme_names.size(); ++s) {
    ChainPoint uniform;
    if (!uniform_point(problem, sensitivity, s, &uniform)) continue;
    auto same = std::find_if(sequence.begin(), sequence.begin() + static_cast<std::ptrdiff_t>(chain_length),
                             [&](const ChainPoint& c) { return c.assignment == uniform.assignment; });
    if (same != sequence.begin() + static_cast<std::ptrdiff_t>(chain_length))
      same->uniform_scheme = uniform.uniform_scheme;  // the chain has it already: once, labelled
    else
      sequence.push_back(std::move(uniform));
  }
  // Stable: among equal cost and predicted KL the chain's points keep their order, before the
  // uniform points in scheme order.
  std::stable_sort(sequence.begin(), sequence.end(), [](const ChainPoint& a, const ChainPoint& b) {
    return a.cost != b.cost ? a.cost < b.cost : a.predicted_kl < b.predicted_kl;
  });
  *points = std::move(sequence);
  return {};
}

Status search_recipe(const RecipeSearchProblem& problem, const EvaluateAssignmentsFn& evaluate,
                     const RecipeSearchOptions& options, RecipeSearchResult* result) {
  LLMQ_RETURN_IF_ERROR(check_problem(problem));
  if (options.budget.bounds.empty()) return invalid_argument("recipe search: an empty budget");
  if (options.batch < 1) return invalid_argument("recipe search: batch " + std::to_string(options.batch) + " < 1");
  const size_t n = problem.unit_names.size(), n_schemes = problem.scheme_names.size();
  auto run = [&](const std::vector<RecipeAssignment>& batch, std::vector<EvalAccumulator::Summary>* out) -> Status {
    out->clear();
    LLMQ_RETURN_IF_ERROR(evaluate(batch, out));
    if (out->size() != batch.size())
      return Status(StatusCode::kInternal, "recipe search: the evaluator returned " + std::to_string(out->size()) +
                                               " summaries for " + std::to_string(batch.size()) + " assignments");
    return {};
  };

  // Sensitivities: unit u alone under scheme s, every other unit kept.
  RecipeSearchResult r;
  r.sensitivity.assign(n, std::vector<double>(n_schemes, 0.0));
  r.sensitivity_summaries.assign(n, std::vector<EvalAccumulator::Summary>(n_schemes));
  const int64_t total = static_cast<int64_t>(n * n_schemes);
  const size_t batch_size = static_cast<size_t>(options.batch);
  for (int64_t first = 0; first < total; first += options.batch) {
    const int64_t last = std::min<int64_t>(total, first + options.batch);
    std::vector<RecipeAssignment> batch;
    for (int64_t k = first; k < last; ++k) {
      RecipeAssignment a(n, kKeptOption);
      a[static_cast<size_t>(k) / n_schemes] = static_cast<int>(static_cast<size_t>(k) % n_schemes);
      batch.push_back(std::move(a));
    }
    std::vector<EvalAccumulator::Summary> summaries;
    LLMQ_RETURN_IF_ERROR(run(batch, &summaries));
    for (int64_t k = first; k < last; ++k) {
      const size_t u = static_cast<size_t>(k) / n_schemes, s = static_cast<size_t>(k) % n_schemes;
      r.sensitivity_summaries[u][s] = summaries[static_cast<size_t>(k - first)];
      r.sensitivity[u][s] = summaries[static_cast<size_t>(k - first)].kl.mean;
    }
    if (options.progress) options.progress("sensitivity", last, total);
  }

  LLMQ_RETURN_IF_ERROR(build_recipe_sequence(problem, r.sensitivity, &r.points));

  // The walk: every point in order until the first that meets the budget (see the top of the file
  // for why in order and not by bisection).
  const int64_t points = static_cast<int64_t>(r.points.size());
  for (size_t first = 0; first < r.points.size() && r.chosen < 0; first += batch_size) {
    const size_t last = std::min(r.points.size(), first + batch_size);
    std::vector<RecipeAssignment> batch;
    for (size_t i = first; i < last; ++i) batch.push_back(r.points[i].assignment);
    std::vector<EvalAccumulator::Summary> summaries;
    LLMQ_RETURN_IF_ERROR(run(batch, &summaries));
    for (size_t i = first; i < last; ++i) {
      ChainPoint& p = r.points[i];
      p.evaluated = true;
      p.summary = summaries[i - first];
      p.meets_budget = budget_met(options.budget, p.summary);
      if (p.meets_budget && r.chosen < 0) r.chosen = static_cast<int64_t>(i);
    }
    if (options.progress) options.progress("search", static_cast<int64_t>(last), points);
  }
  if (r.chosen < 0) {
    // Even every unit kept missed it: the budget asks more than the base model gives against
    // itself (a ppl ratio below 1), or the evaluation of the base model is not the base model's.
    const EvalAccumulator::Summary& kept = r.points.back().summary;
    std::string reached;
    for (const BudgetBound& b : options.budget.bounds)
      reached += std::string(reached.empty() ? "" : ", ") + budget_metric_name(b.metric) + " " +
                 format_value(budget_metric_value(kept, b.metric));
    *result = std::move(r);
    return invalid_argument("--budget '" + options.budget.text +
                            "': no assignment meets it, not even every unit kept in high precision (" + reached +
                            " there)");
  }
  *result = std::move(r);
  return {};
}

}  // namespace llmq
