// The report's opening summary (what was measured, where, under which budget, what was chosen)
// and the section on what was kept in high precision and the chosen assignment.
#include <cmath>

#include "report/report_sections.hpp"
#include "report/report_text.hpp"

namespace llmq {
namespace report {

namespace {

std::string or_missing(const std::string& s) { return s.empty() ? std::string(kMissing) : s; }

std::string definition(const std::string& term, const std::string& value) {
  return "<dt>" + escape_xml(term) + "</dt><dd>" + escape_xml(or_missing(value)) + "</dd>";
}

// "the recipe's KL 0.0031 is within the budget's 0.01" — or nothing when either is unknown.
std::string budget_sentence(const QuantReport& report, const QuantReportCandidate& recipe) {
  if (!std::isfinite(report.budget_kl_mean) || !std::isfinite(recipe.kl_mean)) return "";
  const bool within = recipe.kl_mean <= report.budget_kl_mean;
  return " Its mean KL " + format_significant(recipe.kl_mean, 3) + (within ? " is within" : " is NOT within") +
         " the budget's " + format_significant(report.budget_kl_mean, 3) + ".";
}

std::string ratio_sentence(const char* what, double baseline, double recipe, const char* unit_word) {
  if (!(baseline > 0) || !(recipe > 0) || !std::isfinite(baseline) || !std::isfinite(recipe)) return "";
  return std::string(" ") + what + " " + format_significant(baseline / recipe, 3) + "x " + unit_word + " the baseline.";
}

}  // namespace

std::string choice_sentence(const QuantReport& report) {
  const QuantReportCandidate* recipe = find_recipe(report);
  const QuantReportCandidate* baseline = find_baseline(report);
  if (recipe == nullptr) return "No recipe is among the candidates: this report shows the uniform schemes only.";
  std::string choice = "Chosen: " + recipe->name + ", " + std::to_string(report.kept.size()) +
                       " module(s) kept in high precision." + budget_sentence(report, *recipe);
  if (baseline != nullptr) {
    // Decode time per token: baseline / recipe is how many times faster the recipe decodes.
    choice += ratio_sentence("Decode", baseline->decode_ms_per_token, recipe->decode_ms_per_token, "as fast as");
    choice += ratio_sentence("Linear weights", static_cast<double>(baseline->linear_weight_bytes),
                             static_cast<double>(recipe->linear_weight_bytes), "smaller than");
  }
  return choice;
}

std::string summary_section(const QuantReport& report) {
  std::string out = "<section id=\"summary\"><h2>Summary</h2><dl>";
  out += definition("model", report.model);
  out += definition("date", report.date);
  out += definition("llmq", report.llmq_version);
  out += definition("device / latency model", report.device);
  out += definition("evaluated on", report.eval_data);
  out += definition("budget", report.budget);
  out += definition("objective", report.objective);
  out += "</dl>";
  out += "<p class=\"choice\">" + escape_xml(choice_sentence(report)) + "</p>";
  for (const auto& note : report.notes) out += "<p>" + escape_xml(note) + "</p>";
  return out + "</section>";
}

std::string kept_section(const QuantReport& report) {
  std::string out = "<section id=\"kept\"><h2>Kept in high precision, and the assignment</h2>";
  if (report.kept.empty()) {
    out += "<p>No module was kept in high precision.</p>";
  } else {
    std::vector<std::vector<std::string>> rows;
    for (const auto& k : report.kept) rows.push_back({or_missing(k.module), or_missing(k.reason)});
    out += html_table({"module kept", "why"}, rows);
  }
  if (report.assignment.empty()) {
    out += "<p>No per-unit assignment was given.</p>";
  } else {
    std::vector<std::vector<std::string>> rows;
    for (const auto& a : report.assignment) rows.push_back({or_missing(a.unit), a.scheme.empty() ? "kept" : a.scheme});
    out += "<h3>Chosen scheme of each unit</h3>" + html_table({"unit", "scheme"}, rows);
  }
  return out + "</section>";
}

}  // namespace report
}  // namespace llmq
