// What the report's sections share: HTML tables, finding the recipe and the baseline, and the
// summary of one site's channel absmax (report_sections.hpp).
#include <algorithm>
#include <cmath>

#include "report/report_sections.hpp"
#include "report/report_text.hpp"

namespace llmq {
namespace report {

std::string html_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
                       const std::vector<std::string>& row_classes) {
  std::string out = "<table><thead><tr>";
  for (const auto& h : header) out += "<th>" + escape_xml(h) + "</th>";
  out += "</tr></thead><tbody>";
  for (size_t r = 0; r < rows.size(); ++r) {
    const bool has_class = r < row_classes.size() && !row_classes[r].empty();
    out += has_class ? "<tr class=\"" + escape_xml(row_classes[r]) + "\">" : std::string("<tr>");
    for (const auto& cell : rows[r]) out += "<td>" + escape_xml(cell) + "</td>";
    out += "</tr>";
  }
  return out + "</tbody></table>";
}

const QuantReportCandidate* find_recipe(const QuantReport& report) {
  for (const auto& c : report.candidates) {
    if (c.is_recipe) return &c;
  }
  return nullptr;
}

const QuantReportCandidate* find_baseline(const QuantReport& report) {
  for (const auto& c : report.candidates) {
    if (c.is_baseline) return &c;
  }
  return nullptr;
}

std::string candidate_label(const QuantReportCandidate& c) {
  if (c.is_recipe) return c.name + " (chosen)";
  if (c.is_baseline) return c.name + " (baseline)";
  return c.name;
}

std::string format_kl_with_error(const QuantReportCandidate& c) {
  std::string s = format_significant(c.kl_mean, 3);
  if (std::isfinite(c.kl_mean) && std::isfinite(c.kl_mean_stderr)) {
    s += " \xC2\xB1 " + format_significant(c.kl_mean_stderr, 2);
  }
  return s;
}

ChannelSummary summarize_channels(const std::vector<float>& absmax) {
  ChannelSummary s;
  s.channels = static_cast<int64_t>(absmax.size());
  std::vector<float> finite;
  finite.reserve(absmax.size());
  for (float v : absmax) {
    if (std::isfinite(v)) {
      finite.push_back(v);
    } else {
      ++s.nonfinite;
    }
  }
  const double nan = std::nan("");
  s.max = s.median = s.ratio = nan;
  if (finite.empty()) return s;
  s.max = *std::max_element(finite.begin(), finite.end());
  const size_t mid = finite.size() / 2;
  std::nth_element(finite.begin(), finite.begin() + static_cast<std::ptrdiff_t>(mid), finite.end());
  double median = finite[mid];
  if (finite.size() % 2 == 0) {
    median = (median + *std::max_element(finite.begin(), finite.begin() + static_cast<std::ptrdiff_t>(mid))) / 2;
  }
  s.median = median;
  if (median > 0) s.ratio = s.max / median;
  // The top channels: a partial sort of indices by value (largest first, lower index on ties).
  std::vector<int64_t> order;
  order.reserve(finite.size());
  for (size_t i = 0; i < absmax.size(); ++i) {
    if (std::isfinite(absmax[i])) order.push_back(static_cast<int64_t>(i));
  }
  const size_t k = std::min<size_t>(kTopChannels, order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](int64_t a, int64_t b) {
                      if (absmax[a] != absmax[b]) return absmax[a] > absmax[b];
                      return a < b;
                    });
  s.top.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
  return s;
}

std::string format_top_channels(const ChannelSummary& s, const std::vector<float>& absmax) {
  if (s.top.empty()) return kMissing;
  std::string out;
  for (int64_t c : s.top) {
    if (!out.empty()) out += ", ";
    out += std::to_string(c) + " (" + format_significant(absmax[static_cast<size_t>(c)], 3) + ")";
  }
  return out;
}

std::string outlier_row_label(const QuantReportOutlierSite& site) {
  if (site.layer >= 0) return "layer " + std::to_string(site.layer);
  return site.module.empty() ? std::string("no layer") : site.module;
}

}  // namespace report
}  // namespace llmq
