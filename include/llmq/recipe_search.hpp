// The search behind `llmq recipe`: which linear layers to quantize under which scheme so that the
// model meets an accuracy budget ("kl<=0.01", "top1>=0.99", "ppl<=1.01x") at the least cost (decode
// time or bytes). The model is cut into units (per layer its attention and its MLP; lm_head when
// asked), each unit's sensitivity to each candidate scheme is measured (the KL of the model with
// only that unit quantized), and a chain of assignments is built from every unit at its cheapest
// scheme to every unit kept in high precision. The chain's points and one uniform point per scheme
// (every unit under it) are merged by cost into one sequence, and the first point of it whose full
// evaluation meets the budget is the recipe. Everything here is pure logic over callbacks: the
// caller says how an assignment is evaluated (a quantized model in memory, or a fake in tests).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "llmq/eval_metrics.hpp"
#include "llmq/model.hpp"
#include "llmq/quant_recipe.hpp"
#include "llmq/scheme.hpp"
#include "llmq/status.hpp"

namespace llmq {

// ---- The accuracy budget ----------------------------------------------------------------------

enum class BudgetMetric {
  kKlMean,    // "kl":   mean KL(base || quantized) in nats, bounded above
  kTop1,      // "top1": top-1 agreement with the base model in [0, 1], bounded below
  kPplRatio,  // "ppl":  perplexity ratio quantized / base, bounded above, written with an x
};
const char* budget_metric_name(BudgetMetric metric);  // "kl", "top1", "ppl"

struct BudgetBound {
  BudgetMetric metric = BudgetMetric::kKlMean;
  double limit = 0.0;
  std::string text;  // as written, "kl<=0.01"
};

// Every bound must hold. At most one bound per metric.
struct AccuracyBudget {
  std::vector<BudgetBound> bounds;
  std::string text;  // the whole budget as given
};

// "kl<=0.01", "top1>=0.99", "ppl<=1.01x", or several joined by commas ("kl<=0.01,top1>=0.98";
// spaces around the parts are allowed). Refused, naming the text: an unknown metric, the wrong
// direction (a lower bound on KL bounds nothing), a limit no model can meet (kl < 0, top1 > 1,
// ppl ratio <= 0) or that every model meets (top1 <= 0), ppl without its x, a number that is not
// one finite number, a metric named twice, an empty budget.
Status parse_accuracy_budget(const std::string& text, AccuracyBudget* out);

// The value of a metric in an evaluation's summary (KL mean, top-1 agreement mean, PPL ratio).
double budget_metric_value(const EvalAccumulator::Summary& summary, BudgetMetric metric);
// Does the summary meet the bound / every bound? A non-finite value meets nothing.
bool bound_met(const BudgetBound& bound, const EvalAccumulator::Summary& summary);
bool budget_met(const AccuracyBudget& budget, const EvalAccumulator::Summary& summary);

// ---- The units and their costs ----------------------------------------------------------------

enum class RecipeUnitKind { kAttention, kMlp, kLmHead };

// A group of linear layers that always get one scheme. q/k/v share one (engines fuse them into one
// GEMM), gate/up too; a unit is at least that coarse: a layer's attention (q, k, v, o) or its MLP
// (gate, up, down, or every expert's; the MoE router stays in high precision).
struct RecipeUnit {
  std::string name;  // "layers.3.attention", "layers.3.mlp", "lm_head"
  RecipeUnitKind kind = RecipeUnitKind::kAttention;
  int64_t layer = -1;                // -1 for lm_head
  std::vector<LinearId> linears;     // in forward order
  std::vector<std::string> modules;  // their Hugging Face module names (LinearId::hf_name)
};

// The units of a model, in forward order; lm_head last and only when `include_lm_head` (refused
// for a model whose lm_head is tied to the embedding: it has no weight of its own to quantize).
Status recipe_units(const ModelConfig& config, bool include_lm_head, std::vector<RecipeUnit>* out);

// What the search minimises. The costs are a model, not a measurement: a batch-1 decode step streams
// every weight it uses once and is bound by memory bandwidth, so its time is the bytes it reads
// (weights plus their scales) over kDecodeBandwidthBytesPerSecond. Decode reads only the experts the
// router picks: an expert's bytes count n_experts_per_token / n_experts of the time (the expected
// share under uniform routing). Size counts every byte of the checkpoint's linear layers. For dense
// models the two orders agree; they differ on MoE models.
enum class RecipeObjective { kSpeed, kSize };
Status parse_recipe_objective(const std::string& text, RecipeObjective* out);  // "speed" or "size"
const char* recipe_objective_name(RecipeObjective objective);

// H100 SXM's HBM3 bandwidth, 3.35 TB/s (the data sheet's figure; real kernels reach 80-90% of it).
// A constant of the cost model: it scales every time alike, so it changes no choice.
inline constexpr double kDecodeBandwidthBytesPerSecond = 3.35e12;
// A linear layer kept in high precision is stored and streamed as BF16.
inline constexpr int64_t kKeptBytesPerElement = 2;

// The stored bytes of one weight [rows, cols] under a scheme: the elements in the weight's format,
// its float32 scales (one per block of the weight's granularity), an integer zero point per block
// when asymmetric, and the float32 input scale of a static activation scheme. Errors name the
// scheme (a block shape that does not fit).
Status scheme_weight_bytes(const Scheme& scheme, int64_t rows, int64_t cols, int64_t* bytes);

struct UnitCost {
  int64_t bytes = 0;               // stored bytes of the unit's weights (+ scales)
  double decode_seconds = 0.0;     // modelled time of one batch-1 decode step to read them
  double value(RecipeObjective objective) const {
    return objective == RecipeObjective::kSpeed ? decode_seconds : static_cast<double>(bytes);
  }
};
// The unit's cost under `scheme`, or kept in BF16 when `scheme` is null.
Status unit_cost(const ModelConfig& config, const RecipeUnit& unit, const Scheme* scheme, UnitCost* out);

// ---- The search -------------------------------------------------------------------------------

// An assignment gives each unit the index of a candidate scheme, or kKeptOption (high precision).
inline constexpr int kKeptOption = -1;
using RecipeAssignment = std::vector<int>;

// Evaluates a batch of assignments (each a whole model: every unit quantized as assigned) against
// the base model, one summary per assignment in order. Batches let the caller share the base
// model's forward passes between candidates.
using EvaluateAssignmentsFn = std::function<Status(const std::vector<RecipeAssignment>& assignments,
                                                   std::vector<EvalAccumulator::Summary>* summaries)>;

struct RecipeSearchProblem {
  std::vector<std::string> unit_names;      // for messages and the report
  std::vector<std::string> scheme_names;    // the candidates (kept is implicit)
  std::vector<std::vector<double>> cost;    // [unit][scheme]: the objective's cost (> 0, finite)
  std::vector<double> kept_cost;            // [unit]: cost kept in high precision
};

struct RecipeSearchOptions {
  AccuracyBudget budget;
  int64_t batch = 1;  // assignments per call of the evaluator (>= 1)
  // Called as the search goes: the stage ("sensitivity", "search") and its evaluations done / at
  // most to do.
  std::function<void(const std::string& stage, int64_t done, int64_t total)> progress;
};

struct ChainPoint {
  RecipeAssignment assignment;
  double cost = 0.0;              // sum of the units' costs
  double predicted_kl = 0.0;      // sum of the units' sensitivities (what ordered the chain)
  // The scheme index when every unit is under that one scheme (a uniform point, whether it came from
  // the chain or was added beside it); -1 for a mix or when a unit is kept.
  int uniform_scheme = -1;
  bool evaluated = false;
  EvalAccumulator::Summary summary;  // when evaluated
  bool meets_budget = false;         // when evaluated
};

struct RecipeSearchResult {
  // sensitivity[u][s]: KL mean of the model with only unit u quantized under scheme s.
  std::vector<std::vector<double>> sensitivity;
  std::vector<std::vector<EvalAccumulator::Summary>> sensitivity_summaries;
  // The sequence the walk evaluates (build_recipe_sequence): the chain's points and the uniform
  // ones, cheapest first, all kept last.
  std::vector<ChainPoint> points;
  int64_t chosen = -1;  // index into points
};

// The chain from sensitivities and costs (pure; exposed for tests and the report). Each unit's
// options are its candidates with a finite sensitivity that no cheaper-or-equal option matches in
// accuracy, in order of cost, with kept last. The chain starts with every unit at its cheapest
// option; each step moves the one unit, to the one more expensive option, that buys the largest
// drop of sensitivity per unit of added cost (ties: the smaller unit index, then the cheaper
// option), until every unit is kept. Cost rises strictly along the chain and no unit ever moves
// back to a cheaper option.
Status build_recipe_chain(const RecipeSearchProblem& problem, const std::vector<std::vector<double>>& sensitivity,
                          std::vector<ChainPoint>* chain);

// The sequence the search walks (pure; exposed for tests): the chain's points and, for every scheme
// that is an option for every unit (a finite sensitivity and cheaper than keeping the unit), the
// uniform point with every unit under it. Sensitivities do not add up, so a uniform point can
// measure better than the chain's point of the same cost; without it the walk could choose a mix
// that a uniform scheme beats at no more cost. Sorted by cost, then predicted KL, then the chain's
// order (uniform points after the chain's, in scheme order); an assignment appears once (a chain
// point that is uniform is labelled so). Cost never falls along it; all kept is last.
Status build_recipe_sequence(const RecipeSearchProblem& problem, const std::vector<std::vector<double>>& sensitivity,
                             std::vector<ChainPoint>* points);

// The recipe of an assignment over `units`: one group per scheme in use, named after the scheme,
// targeting its units' modules by exact name (every loader matches exact names alike); the modules
// of kept units listed in `ignore`, so the file says what was kept. Every unit kept gives a recipe
// with no groups (resolve_recipe refuses it: there is nothing to quantize). Errors: an assignment of
// another length, or an option that is neither kKeptOption nor a scheme index.
Status recipe_from_assignment(const std::vector<RecipeUnit>& units, const std::vector<std::string>& scheme_names,
                              const RecipeAssignment& assignment, QuantRecipe* out);

// Measure every sensitivity (units x schemes evaluations), build the sequence (the chain and the
// uniform points), and evaluate its points in order, cheapest first, until one meets the budget:
// that point is chosen. Its summary is a full evaluation of that assignment. A tighter budget
// chooses a point no earlier, no cheaper and measured strictly better on a bound the looser choice
// missed (or the same point); recipe_search.cpp argues why. When no point meets it, not even every
// unit kept, the error says so with the best metric reached.
Status search_recipe(const RecipeSearchProblem& problem, const EvaluateAssignmentsFn& evaluate,
                     const RecipeSearchOptions& options, RecipeSearchResult* result);

}  // namespace llmq
