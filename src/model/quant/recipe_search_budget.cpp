// The accuracy budget of `llmq recipe`: its parser and the test of an evaluation against it.
#include <charconv>
#include <cmath>

#include "llmq/recipe_search.hpp"

namespace llmq {
namespace {

// Budgets are a few bounds; anything longer is not one.
constexpr size_t kMaxBudgetChars = 256;

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  return s.substr(b, e - b);
}

// One finite number and nothing else (from_chars: no locale, no leading '+' or spaces).
bool parse_number(const std::string& s, double* out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, *out);
  return ec == std::errc() && ptr == end && std::isfinite(*out);
}

Status parse_bound(const std::string& part, const std::string& whole, BudgetBound* out) {
  const std::string where = "--budget '" + whole + "': '" + part + "'";
  const size_t op = part.find_first_of("<>=");
  if (op == std::string::npos)
    return invalid_argument(where + " has no comparison (write kl<=0.01, top1>=0.99 or ppl<=1.01x)");
  const std::string name = trim(part.substr(0, op));
  std::string rest = part.substr(op);
  const bool upper = rest.compare(0, 2, "<=") == 0, lower = rest.compare(0, 2, ">=") == 0;
  if (!upper && !lower) return invalid_argument(where + ": the comparison must be <= or >=");
  rest = trim(rest.substr(2));

  if (name == "kl") {
    out->metric = BudgetMetric::kKlMean;
    if (!upper) return invalid_argument(where + ": KL is bounded from above (kl<=...)");
  } else if (name == "top1") {
    out->metric = BudgetMetric::kTop1;
    if (!lower) return invalid_argument(where + ": top-1 agreement is bounded from below (top1>=...)");
  } else if (name == "ppl") {
    out->metric = BudgetMetric::kPplRatio;
    if (!upper) return invalid_argument(where + ": the perplexity ratio is bounded from above (ppl<=...x)");
    if (rest.empty() || rest.back() != 'x')
      return invalid_argument(where + ": ppl takes a ratio to the unquantized model's perplexity, written with "
                                      "an x (ppl<=1.01x)");
    rest.pop_back();
  } else {
    return invalid_argument(where + ": unknown metric '" + name + "' (kl, top1 or ppl)");
  }
  double limit = 0.0;
  if (!parse_number(rest, &limit)) return invalid_argument(where + ": '" + rest + "' is not a finite number");
  // Limits that no model meets, or that every model meets, are mistakes, not budgets.
  if (out->metric == BudgetMetric::kKlMean && limit < 0.0)
    return invalid_argument(where + ": KL is never negative");
  if (out->metric == BudgetMetric::kTop1 && (limit <= 0.0 || limit > 1.0))
    return invalid_argument(where + ": top-1 agreement is a fraction; the limit must be in (0, 1]");
  if (out->metric == BudgetMetric::kPplRatio && limit <= 0.0)
    return invalid_argument(where + ": a perplexity ratio is positive");
  out->limit = limit;
  out->text = part;
  return {};
}

}  // namespace

const char* budget_metric_name(BudgetMetric metric) {
  switch (metric) {
    case BudgetMetric::kKlMean: return "kl";
    case BudgetMetric::kTop1: return "top1";
    case BudgetMetric::kPplRatio: return "ppl";
  }
  return "?";
}

Status parse_accuracy_budget(const std::string& text, AccuracyBudget* out) {
  if (text.size() > kMaxBudgetChars)
    return invalid_argument("--budget: " + std::to_string(text.size()) + " characters; a budget is at most " +
                            std::to_string(kMaxBudgetChars));
  AccuracyBudget budget;
  budget.text = text;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string part = trim(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (part.empty()) return invalid_argument("--budget '" + text + "': an empty bound (kl<=0.01, top1>=0.99, ppl<=1.01x)");
    BudgetBound bound;
    LLMQ_RETURN_IF_ERROR(parse_bound(part, text, &bound));
    for (const BudgetBound& b : budget.bounds)
      if (b.metric == bound.metric)
        return invalid_argument("--budget '" + text + "': " + budget_metric_name(bound.metric) + " is bounded twice");
    budget.bounds.push_back(bound);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  *out = std::move(budget);
  return {};
}

double budget_metric_value(const EvalAccumulator::Summary& summary, BudgetMetric metric) {
  switch (metric) {
    case BudgetMetric::kKlMean: return summary.kl.mean;
    case BudgetMetric::kTop1: return summary.top1_agreement.mean;
    case BudgetMetric::kPplRatio: return summary.ppl_ratio;
  }
  return std::nan("");
}

bool bound_met(const BudgetBound& bound, const EvalAccumulator::Summary& summary) {
  const double v = budget_metric_value(summary, bound.metric);
  if (!std::isfinite(v)) return false;
  return bound.metric == BudgetMetric::kTop1 ? v >= bound.limit : v <= bound.limit;
}

bool budget_met(const AccuracyBudget& budget, const EvalAccumulator::Summary& summary) {
  if (budget.bounds.empty()) return false;  // an unparsed budget holds nothing
  for (const BudgetBound& b : budget.bounds)
    if (!bound_met(b, summary)) return false;
  return true;
}

}  // namespace llmq
