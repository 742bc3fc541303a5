// render_quant_report_markdown: the report's tables, short (quant_report.hpp). The figures and the
// full sensitivity and outlier tables are in the HTML page; this is what fits in a pull request.
#include <algorithm>
#include <cmath>

#include "llmq/quant_report.hpp"
#include "report/report_sections.hpp"
#include "report/report_text.hpp"

namespace llmq {

namespace {

using report::escape_markdown;
using report::format_significant;

constexpr size_t kShortRows = 10;  // rows of the "most sensitive" and "largest outliers" tables

std::string md_row(const std::vector<std::string>& cells, bool bold = false) {
  std::string row = "|";
  for (const auto& c : cells) {
    const std::string text = escape_markdown(c);
    row += " " + (bold && !text.empty() ? "**" + text + "**" : text) + " |";
  }
  return row + "\n";
}

// The first `text_columns` columns are left-aligned text, the rest right-aligned numbers.
std::string md_header(const std::vector<std::string>& cells, size_t text_columns = 1) {
  std::string sep = "|";
  for (size_t i = 0; i < cells.size(); ++i) sep += i < text_columns ? "---|" : "---:|";
  return md_row(cells) + sep + "\n";
}

std::string or_missing(const std::string& s) { return s.empty() ? std::string(report::kMissing) : s; }

// The units whose worst scheme costs most, with their best and worst scheme.
std::string sensitivity_table(const QuantReportSensitivity& s) {
  struct Row {
    size_t unit;
    size_t worst, best;
    double worst_kl, best_kl;
  };
  std::vector<Row> rows;
  const size_t n = s.schemes.size();
  for (size_t u = 0; u < s.units.size(); ++u) {
    Row r{u, n, n, -HUGE_VAL, HUGE_VAL};
    for (size_t k = 0; k < n; ++k) {
      const double v = s.kl[u * n + k];
      if (!std::isfinite(v)) continue;
      if (v > r.worst_kl) r.worst_kl = v, r.worst = k;
      if (v < r.best_kl) r.best_kl = v, r.best = k;
    }
    if (r.worst < n) rows.push_back(r);
  }
  if (rows.empty()) return "No sensitivity was measured.\n";
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.worst_kl > b.worst_kl; });
  std::string out = md_header({"unit", "worst scheme", "its KL", "best scheme", "its KL"}, 2);
  for (size_t i = 0; i < std::min(kShortRows, rows.size()); ++i) {
    const Row& r = rows[i];
    out += md_row({s.units[r.unit], s.schemes[r.worst], format_significant(r.worst_kl, 3), s.schemes[r.best],
                   format_significant(r.best_kl, 3)});
  }
  if (rows.size() > kShortRows) out += "\n(" + std::to_string(rows.size() - kShortRows) + " more units in the HTML report.)\n";
  return out;
}

std::string outlier_table(const std::vector<QuantReportOutlierSite>& outliers) {
  struct Row {
    const QuantReportOutlierSite* site;
    report::ChannelSummary summary;
  };
  std::vector<Row> rows;
  for (const auto& o : outliers) rows.push_back({&o, report::summarize_channels(o.channel_absmax)});
  if (rows.empty()) return "No calibration statistics were given.\n";
  // Largest ratio first; sites without one (no finite channel, median 0) last.
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    const bool fa = std::isfinite(a.summary.ratio), fb = std::isfinite(b.summary.ratio);
    if (fa != fb) return fa;
    return fa && a.summary.ratio > b.summary.ratio;
  });
  std::string out = md_header({"layer", "site", "module", "max absmax", "median", "max / median", "top channels"}, 3);
  for (size_t i = 0; i < std::min(kShortRows, rows.size()); ++i) {
    const Row& r = rows[i];
    out += md_row({r.site->layer >= 0 ? std::to_string(r.site->layer) : std::string(report::kMissing), r.site->site,
                   r.site->module, format_significant(r.summary.max, 3), format_significant(r.summary.median, 3),
                   format_significant(r.summary.ratio, 3), report::format_top_channels(r.summary, r.site->channel_absmax)});
  }
  if (rows.size() > kShortRows) out += "\n(" + std::to_string(rows.size() - kShortRows) + " more sites in the HTML report.)\n";
  return out;
}

}  // namespace

Status render_quant_report_markdown(const QuantReport& report, std::string* out) {
  if (out == nullptr) return invalid_argument("render_quant_report_markdown: out is null");
  LLMQ_RETURN_IF_ERROR(check_quant_report(report));
  std::string md = "# Quantization report: " + escape_markdown(report.model.empty() ? "model" : report.model) + "\n\n";
  const std::pair<const char*, const std::string*> facts[] = {
      {"date", &report.date},         {"llmq", &report.llmq_version}, {"device / latency model", &report.device},
      {"evaluated on", &report.eval_data}, {"budget", &report.budget}, {"objective", &report.objective}};
  for (const auto& f : facts) md += std::string("- ") + f.first + ": " + escape_markdown(or_missing(*f.second)) + "\n";
  md += "\n" + escape_markdown(report::choice_sentence(report)) + "\n";
  for (const auto& note : report.notes) md += "\n" + escape_markdown(note) + "\n";

  md += "\n## Candidates\n\n";
  md += md_header({"model", "KL mean \xC2\xB1 s.e.", "KL p99", "KL max", "top-1 agreement", "PPL ratio",
                   "linear weights", "decode / token", "decode time from"});
  for (const auto& c : report.candidates) {
    md += md_row({report::candidate_label(c), report::format_kl_with_error(c), format_significant(c.kl_p99, 3),
                  format_significant(c.kl_max, 3), report::format_fixed(c.top1_agreement, 4),
                  report::format_fixed(c.ppl_ratio, 4), report::format_bytes(c.linear_weight_bytes),
                  report::format_ms(c.decode_ms_per_token), or_missing(c.decode_time_source)},
                 c.is_recipe);
  }
  md += "\n## Kept in high precision\n\n";
  if (report.kept.empty()) {
    md += "Nothing was kept in high precision.\n";
  } else {
    md += md_header({"module", "why"}, 2);
    for (const auto& k : report.kept) md += md_row({or_missing(k.module), or_missing(k.reason)});
  }
  md += "\n## Chosen scheme of each unit\n\n";
  if (report.assignment.empty()) {
    md += "No per-unit assignment was given.\n";
  } else {
    md += md_header({"unit", "scheme"}, 2);
    for (const auto& a : report.assignment) md += md_row({or_missing(a.unit), a.scheme.empty() ? "kept" : a.scheme});
  }
  md += "\n## Most sensitive units (KL when only the unit is quantized)\n\n" + sensitivity_table(report.sensitivity);
  md += "\n## Largest activation outliers (absmax by input channel)\n\n" + outlier_table(report.outliers);
  *out = std::move(md);
  return Status::ok_status();
}

}  // namespace llmq
