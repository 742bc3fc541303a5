// The sections of the HTML report, one file each (report_summary.cpp, report_tradeoff.cpp,
// report_sensitivity.cpp, report_outliers.cpp), and what they share: HTML tables and the summary
// of one site's channel absmax that the Markdown prints too. Each returns XHTML-style markup: every
// tag closed, every attribute quoted, every string escaped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llmq/quant_report.hpp"

namespace llmq {
namespace report {

std::string summary_section(const QuantReport& report);      // what, where, budget, the choice
// "Chosen: recipe, 2 module(s) kept in high precision. Its mean KL ... Decode 1.6x as fast as ..."
std::string choice_sentence(const QuantReport& report);
std::string tradeoff_section(const QuantReport& report);      // the two scatter charts + candidate table
std::string sensitivity_section(const QuantReport& report);   // heatmap units x schemes + table
std::string outliers_section(const QuantReport& report);      // heatmaps layers x channel bins + table
std::string kept_section(const QuantReport& report);          // kept modules and the assignment

// An HTML table; `row_classes[i]` (may be shorter than rows, "" for none) becomes row i's class.
// Cells are escaped here.
std::string html_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
                       const std::vector<std::string>& row_classes = {});

// The chosen recipe among the candidates, or nullptr.
const QuantReportCandidate* find_recipe(const QuantReport& report);
const QuantReportCandidate* find_baseline(const QuantReport& report);
// A candidate's name as the tables print it: "recipe (chosen)", "bf16 (baseline)".
std::string candidate_label(const QuantReportCandidate& c);
// "0.00123 ± 0.00004" (mean KL and its standard error).
std::string format_kl_with_error(const QuantReportCandidate& c);

// One linear input's channel absmax, summarized (non-finite channels counted apart).
struct ChannelSummary {
  int64_t channels = 0;
  int64_t nonfinite = 0;
  double max = 0;       // over finite channels; NaN when none
  double median = 0;    // over finite channels; NaN when none
  double ratio = 0;     // max / median; NaN when undefined
  std::vector<int64_t> top;  // up to kTopChannels indices of the largest finite channels, largest first
};
constexpr int kTopChannels = 3;
ChannelSummary summarize_channels(const std::vector<float>& absmax);
// "4095 (812), 17 (344)": the top channels and their absmax.
std::string format_top_channels(const ChannelSummary& s, const std::vector<float>& absmax);
// Row label of an outlier site: "layer 3" or, outside the layers, the module name.
std::string outlier_row_label(const QuantReportOutlierSite& site);

}  // namespace report
}  // namespace llmq
