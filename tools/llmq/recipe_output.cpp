// What `llmq recipe` prints and writes about its search (recipe_output.hpp).
#include "recipe_output.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "eval_table.hpp"
#include "llmq/quantized_model.hpp"

namespace llmq::cli {
namespace {

const ChainPoint& chosen_point(const RecipeRun& run) { return run.search.points[static_cast<size_t>(run.search.chosen)]; }

// "uniform int8-w8a8" for a point with every unit under one scheme, "" for a mix.
std::string uniform_text(const RecipeRun& run, const ChainPoint& p) {
  return p.uniform_scheme < 0 ? "" : "uniform " + run.scheme_names[static_cast<size_t>(p.uniform_scheme)];
}

struct WalkCounts {
  int64_t evaluated = 0, uniform = 0;
};
WalkCounts walk_counts(const RecipeRun& run) {
  WalkCounts c;
  for (const ChainPoint& p : run.search.points) {
    c.evaluated += p.evaluated ? 1 : 0;
    c.uniform += p.uniform_scheme >= 0 ? 1 : 0;
  }
  return c;
}

std::string bandwidth_text() {
  return fmt::format("{:.0f} GB/s", kDecodeBandwidthBytesPerSecond / 1e9);
}

// "kl 0.0081 <= 0.01, top1 0.991 >= 0.99"
std::string budget_check_text(const AccuracyBudget& budget, const EvalAccumulator::Summary& s) {
  std::string text;
  for (const BudgetBound& b : budget.bounds) {
    const double v = budget_metric_value(s, b.metric);
    const bool met = bound_met(b, s);
    const char* op = b.metric == BudgetMetric::kTop1 ? (met ? ">=" : "<") : (met ? "<=" : ">");
    text += fmt::format("{}{} {:.6g} {} {:.6g}{}", text.empty() ? "" : ", ", budget_metric_name(b.metric), v, op,
                        b.limit, b.metric == BudgetMetric::kPplRatio ? "x" : "");
  }
  return text;
}

// The smallest KL a unit showed alone, and under which scheme.
std::pair<double, std::string> best_alone(const RecipeRun& run, size_t unit) {
  double best = std::numeric_limits<double>::infinity();
  std::string name = "-";
  for (size_t s = 0; s < run.scheme_names.size(); ++s)
    if (run.search.sensitivity[unit][s] < best) {
      best = run.search.sensitivity[unit][s];
      name = run.scheme_names[s];
    }
  return {best, name};
}

nlohmann::ordered_json summary_json(const EvalAccumulator::Summary& s) {
  return {{"kl_mean", s.kl.mean},          {"kl_mean_err", s.kl.stderr_},       {"kl_p99", s.kl_p99},
          {"kl_max", s.kl_max},            {"top1", s.top1_agreement.mean},     {"top1_err", s.top1_agreement.stderr_},
          {"ppl_ratio", s.ppl_ratio},      {"ppl_ratio_err", s.ppl_ratio_err}};
}

}  // namespace

std::string unit_choice(const RecipeRun& run, size_t unit) {
  const int option = chosen_point(run).assignment[unit];
  return option == kKeptOption ? "bf16 (kept)" : run.scheme_names[static_cast<size_t>(option)];
}

std::string recipe_row_name(const RecipeRun& run) {
  const std::string uniform = uniform_text(run, chosen_point(run));
  return uniform.empty() ? "recipe" : "recipe (" + uniform + ")";
}

std::string recipe_text(const RecipeRun& run) {
  const ChainPoint& chosen = chosen_point(run);
  const WalkCounts counts = walk_counts(run);
  const std::string uniform = uniform_text(run, chosen);
  std::string out = fmt::format("model: {}\ndata:  {}\ntokens scored: {}, context {}\n", run.model_description, run.data,
                                chosen.summary.tokens, run.context);
  out += fmt::format("budget: {} (objective: {})\n", run.budget.text, recipe_objective_name(run.objective));
  out += fmt::format("search: {} units x {} schemes = {} sensitivity evaluations; {} assignments to walk (the chain "
                     "and the uniform schemes, {} uniform), {} evaluated; assignment {}{} chosen, the first that "
                     "meets the budget\n\n",
                     run.units.size(), run.scheme_names.size(), run.units.size() * run.scheme_names.size(),
                     run.search.points.size(), counts.uniform, counts.evaluated, run.search.chosen,
                     uniform.empty() ? "" : " (" + uniform + ")");

  // Decode times: measured on the GPU with --device cuda, else the bytes model's.
  const bool measured = !run.measured_on.empty();
  std::vector<EvalRow> rows;
  for (const RecipeCandidate& c : run.candidates)
    rows.push_back({c.name, c.summary,
                    {fmt::format("{:.2f}", static_cast<double>(c.bytes) / 1e6),
                     measured && c.measured_ms < 0 ? std::string("-")
                                                   : fmt::format("{:.4f}", measured ? c.measured_ms : c.decode_seconds * 1e3),
                     budget_met(run.budget, c.summary) ? "yes" : "no"}});
  sort_by_kl(&rows);
  EvalTableOptions table;
  table.kl_p99 = false;
  table.extra_headers = {"MB", "decode ms", "meets"};
  table.extra_notes = {
      fmt::format("MB         bytes of the linear layers (weights and scales; what is kept, in BF16): every BF16 {:.2f}",
                  static_cast<double>(run.kept_bytes) / 1e6),
      measured ? fmt::format("decode ms  measured: {}; every BF16\n           {:.4f} (--json: the "
                             "bytes model's too)",
                             run.measured_on, run.kept_measured_ms)
               : fmt::format("decode ms  a model, not a measurement: one batch-1 decode step reading those bytes at {} (H100\n"
                             "           HBM3; routed experts count k/n); every BF16 {:.4f}",
                             bandwidth_text(), run.kept_decode_seconds * 1e3),
      "meets      whether the row meets the budget " + run.budget.text};
  out += eval_table_text(rows, table);

  out += "\nassignment (KL of the unit quantized alone, per scheme):\n";
  size_t name_width = 0;
  for (const RecipeUnit& u : run.units) name_width = std::max(name_width, u.name.size());
  for (size_t u = 0; u < run.units.size(); ++u) {
    std::string alone;
    for (size_t s = 0; s < run.scheme_names.size(); ++s)
      alone += fmt::format("{}{} {:.3g}", s == 0 ? "" : ", ", run.scheme_names[s], run.search.sensitivity[u][s]);
    out += fmt::format("  {:<{}}  {:<16}  {}\n", run.units[u].name, name_width, unit_choice(run, u), alone);
  }
  if (!run.always_kept.empty())
    out += fmt::format("  kept outside the search: {}\n", fmt::join(run.always_kept, ", "));
  out += "\nrecipe: " + budget_check_text(run.budget, chosen.summary) + "\n";
  for (const RecipeCandidate& c : run.candidates)
    if (c.is_checkpoint)
      out += c.name + ": " + budget_check_text(run.budget, c.summary) +
             (budget_met(run.budget, c.summary) ? "" : "  (kept layers are stored in BF16; the search measured them in float32)") + "\n";
  out += fmt::format("wrote {} (recipe.json inside)\n", run.out_dir);
  if (!run.report_html.empty()) out += fmt::format("report: {} and {}\n", run.report_html, run.report_markdown);
  return out;
}

nlohmann::ordered_json recipe_json(const RecipeRun& run) {
  nlohmann::ordered_json j;
  j["model"] = run.model_description;
  j["data"] = run.data;
  j["context"] = run.context;
  j["budget"] = run.budget.text;
  j["objective"] = recipe_objective_name(run.objective);
  j["cost_model"] = {{"decode", "batch-1 decode step reading every linear's bytes once; a model, not a measurement"},
                     {"bandwidth_bytes_per_second", kDecodeBandwidthBytesPerSecond},
                     {"kept_bytes_per_element", kKeptBytesPerElement}};
  j["schemes"] = run.scheme_names;
  j["units"] = nlohmann::ordered_json::array();
  for (size_t u = 0; u < run.units.size(); ++u) {
    // The model with only this unit quantized, per scheme: its KL is the unit's sensitivity.
    nlohmann::ordered_json sens = nlohmann::ordered_json::object();
    for (size_t s = 0; s < run.scheme_names.size(); ++s)
      sens[run.scheme_names[s]] = summary_json(run.search.sensitivity_summaries[u][s]);
    j["units"].push_back({{"name", run.units[u].name}, {"modules", run.units[u].modules}, {"choice", unit_choice(run, u)},
                          {"alone", sens}});
  }
  j["always_kept"] = run.always_kept;
  // The sequence walked: the chain's points and the uniform ones (named), cheapest first.
  j["points"] = nlohmann::ordered_json::array();
  for (const ChainPoint& p : run.search.points) {
    const std::string uniform = uniform_text(run, p);
    nlohmann::ordered_json point = {{"assignment", p.assignment},
                                    {"uniform", uniform.empty() ? nlohmann::ordered_json(nullptr)
                                                                : nlohmann::ordered_json(uniform)},
                                    {"cost", p.cost},
                                    {"predicted_kl", p.predicted_kl},
                                    {"evaluated", p.evaluated}};
    if (p.evaluated) {
      point["summary"] = summary_json(p.summary);
      point["meets_budget"] = p.meets_budget;
    }
    j["points"].push_back(std::move(point));
  }
  j["chosen"] = run.search.chosen;
  j["candidates"] = nlohmann::ordered_json::array();
  for (const RecipeCandidate& c : run.candidates) {
    nlohmann::ordered_json row = {{"name", c.name}, {"is_recipe", c.is_recipe}};
    row.update(summary_json(c.summary));
    row["bytes"] = c.bytes;
    row["decode_ms_model"] = c.decode_seconds * 1e3;
    row["decode_ms_measured"] = c.measured_ms >= 0 ? nlohmann::ordered_json(c.measured_ms) : nlohmann::ordered_json(nullptr);
    if (!c.measure_error.empty()) row["decode_measure_error"] = c.measure_error;
    row["meets_budget"] = budget_met(run.budget, c.summary);
    j["candidates"].push_back(std::move(row));
  }
  j["kept_bytes"] = run.kept_bytes;
  j["kept_decode_ms_model"] = run.kept_decode_seconds * 1e3;
  j["kept_decode_ms_measured"] =
      run.kept_measured_ms >= 0 ? nlohmann::ordered_json(run.kept_measured_ms) : nlohmann::ordered_json(nullptr);
  j["decode_measured_on"] = run.measured_on.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(run.measured_on);
  j["recipe"] = nlohmann::ordered_json::parse(recipe_to_json(run.recipe), nullptr, false);
  j["out"] = run.out_dir;
  j["report"] = run.report_html.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(run.report_html);
  return j;
}

QuantReport recipe_quant_report(const RecipeRun& run, const std::string& date, const std::string& version) {
  QuantReport r;
  r.model = run.model;
  r.date = date;
  r.llmq_version = version;
  const bool measured = !run.measured_on.empty();
  r.device = measured ? "decode measured: " + run.measured_on + " (the search's costs: the bytes model at " + bandwidth_text() + ")"
                      : "bytes model at " + bandwidth_text() + " (CPU search; decode times are modelled, not measured)";
  r.eval_data = fmt::format("{}; {} tokens scored, context {}", run.data, chosen_point(run).summary.tokens, run.context);
  r.budget = run.budget.text;
  r.objective = recipe_objective_name(run.objective);
  for (const BudgetBound& b : run.budget.bounds)
    if (b.metric == BudgetMetric::kKlMean) r.budget_kl_mean = b.limit;

  QuantReportCandidate base;
  base.name = "bf16";
  base.is_baseline = true;
  base.kl_mean = 0.0;  // the reference against itself
  base.top1_agreement = 1.0;
  base.ppl_ratio = 1.0;
  base.linear_weight_bytes = run.kept_bytes;
  base.decode_ms_per_token = measured ? run.kept_measured_ms : run.kept_decode_seconds * 1e3;
  base.decode_time_source = measured ? "measured: " + run.measured_on : "bytes model at " + bandwidth_text();
  r.candidates.push_back(base);
  for (const RecipeCandidate& c : run.candidates) {
    QuantReportCandidate q;
    q.name = c.name;
    q.is_recipe = c.is_recipe;
    q.kl_mean = c.summary.kl.mean;
    q.kl_mean_stderr = c.summary.kl.stderr_;
    q.kl_p99 = c.summary.kl_p99;
    q.kl_max = c.summary.kl_max;
    q.top1_agreement = c.summary.top1_agreement.mean;
    q.ppl_ratio = c.summary.ppl_ratio;
    q.linear_weight_bytes = c.bytes;
    q.decode_ms_per_token = measured && c.measured_ms >= 0 ? c.measured_ms : c.decode_seconds * 1e3;
    q.decode_time_source = measured && c.measured_ms < 0
                               ? "bytes model at " + bandwidth_text() + " (the GPU could not time it: " + c.measure_error + ")"
                               : base.decode_time_source;
    r.candidates.push_back(q);
  }

  for (const RecipeUnit& u : run.units) r.sensitivity.units.push_back(u.name);
  r.sensitivity.schemes = run.scheme_names;
  for (const auto& row : run.search.sensitivity) r.sensitivity.kl.insert(r.sensitivity.kl.end(), row.begin(), row.end());

  if (run.stats != nullptr) {
    // One site per distinct input: each layer's attention input (q_proj's), o_proj's, the MLP input
    // (the first gate's) and down_proj's (the first expert's for MoE), then lm_head's.
    std::set<std::pair<int64_t, std::string>> seen;
    for (const RecipeUnit& u : run.units)
      for (size_t i = 0; i < u.linears.size(); ++i) {
        const LinearRole role = u.linears[i].role;
        const char* site = role == LinearRole::kQ      ? "attention input"
                           : role == LinearRole::kO    ? "o_proj input"
                           : role == LinearRole::kGate ? "mlp input"
                           : role == LinearRole::kDown ? "down_proj input"
                           : role == LinearRole::kLmHead ? "lm_head input"
                                                         : nullptr;
        if (site == nullptr || !seen.insert({u.layer, site}).second) continue;
        const LinearStats* st = run.stats->find(u.modules[i]);
        if (st == nullptr) continue;
        r.outliers.push_back({u.layer, site, u.modules[i], st->input_channel_absmax});
      }
  }

  for (size_t u = 0; u < run.units.size(); ++u) {
    const std::string choice = unit_choice(run, u);
    r.assignment.push_back({run.units[u].name, choice});
    if (chosen_point(run).assignment[u] != kKeptOption) continue;
    const auto [kl, scheme] = best_alone(run, u);
    for (const std::string& m : run.units[u].modules)
      r.kept.push_back({m, fmt::format("{}: the first assignment meeting the budget keeps it (alone, its least KL is "
                                       "{:.3g} under {})",
                                       run.units[u].name, kl, scheme)});
  }
  for (const std::string& m : run.always_kept)
    r.kept.push_back({m, m == "lm_head" ? "lm_head: kept by default (--quantize-lm-head searches it too)"
                                        : "MoE router: kept (it decides the routing)"});

  if (measured)
    r.notes.push_back(fmt::format("Decode times are measured: {}. The search's costs were the bytes model's (a batch-1 "
                                  "decode step reading every linear layer's bytes once at {}); sizes are bytes.",
                                  run.measured_on, bandwidth_text()));
  else
    r.notes.push_back(fmt::format("Decode times and sizes are a model, not a measurement: a batch-1 decode step reads "
                                  "every linear layer's weights and scales once at {} (H100 SXM HBM3), routed experts "
                                  "counted at k/n; kept layers in BF16.",
                                  bandwidth_text()));
  const WalkCounts counts = walk_counts(run);
  const std::string uniform = uniform_text(run, chosen_point(run));
  r.notes.push_back(fmt::format("Search: {} sensitivity evaluations (each unit alone under each scheme), then {} of {} "
                                "assignments (the chain and {} uniform) evaluated in order, cheapest first; the first "
                                "to meet the budget was chosen{}.",
                                run.units.size() * run.scheme_names.size(), counts.evaluated, run.search.points.size(),
                                counts.uniform, uniform.empty() ? "" : ": " + uniform));
  for (const RecipeCandidate& c : run.candidates)
    if (c.is_checkpoint)
      r.notes.push_back(c.name + ", reloaded and evaluated afresh: " + budget_check_text(run.budget, c.summary) + ".");
  return r;
}

}  // namespace llmq::cli
