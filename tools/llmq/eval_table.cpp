// The accuracy table of `llmq eval` and `llmq demo` (eval_table.hpp).
#include "eval_table.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace llmq::cli {

void sort_by_kl(std::vector<EvalRow>* rows) {
  std::stable_sort(rows->begin(), rows->end(),
                   [](const EvalRow& a, const EvalRow& b) {
                     // NaN (a broken candidate) sorts last and is never marked best.
                     const double x = a.summary.kl.mean, y = b.summary.kl.mean;
                     if (std::isnan(x) || std::isnan(y)) return !std::isnan(x) && std::isnan(y);
                     return x < y;
                   });
}

std::string with_error(double value, double error, int decimals) {
  return fmt::format("{:.{}f} +- {:.{}f}", value, decimals, error, decimals);
}

int decimals_for(const std::vector<double>& values, int min_decimals) {
  double smallest = 0;
  for (double v : values)
    if (std::isfinite(v) && std::fabs(v) > 0 && (smallest == 0 || std::fabs(v) < smallest)) smallest = std::fabs(v);
  if (smallest == 0) return min_decimals;
  const int digits = static_cast<int>(std::ceil(-std::log10(smallest))) + 1;
  return std::clamp(digits, min_decimals, 8);
}

namespace {

// Left-aligned first column, the rest right-aligned, two spaces between columns.
std::string table_line(const std::vector<std::string>& cells, const std::vector<size_t>& widths) {
  std::string line;
  for (size_t i = 0; i < cells.size(); ++i) {
    if (i > 0) line += "  ";
    line += i == 0 ? fmt::format("{:<{}}", cells[i], widths[i]) : fmt::format("{:>{}}", cells[i], widths[i]);
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line + "\n";
}

}  // namespace

std::string eval_table_text(const std::vector<EvalRow>& rows, const EvalTableOptions& options) {
  std::vector<double> kl, ratio_err;
  for (const EvalRow& r : rows) {
    kl.push_back(r.summary.kl.mean);
    ratio_err.push_back(r.summary.ppl_ratio_err);
  }
  const int kl_decimals = decimals_for(kl, 4);
  const int ratio_decimals = decimals_for(ratio_err, 3);
  std::vector<std::vector<std::string>> table;
  std::vector<std::string> header = {"scheme", "mean KL"};
  if (options.kl_p99) header.push_back("KL p99");
  header.insert(header.end(), {"top-1 %", "PPL ratio"});
  if (options.delta_p) header.push_back("dp %");
  header.insert(header.end(), options.extra_headers.begin(), options.extra_headers.end());
  table.push_back(header);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& s = rows[i].summary;
    std::vector<std::string> cells = {(i == 0 && rows.size() > 1 ? "* " : "  ") + rows[i].label,
                                      with_error(s.kl.mean, s.kl.stderr_, kl_decimals)};
    if (options.kl_p99) cells.push_back(fmt::format("{:.{}f}", s.kl_p99, std::max(3, kl_decimals - 1)));
    cells.push_back(with_error(100 * s.top1_agreement.mean, 100 * s.top1_agreement.stderr_, 1));
    cells.push_back(with_error(s.ppl_ratio, s.ppl_ratio_err, ratio_decimals));
    if (options.delta_p) cells.push_back(with_error(100 * s.delta_p.mean, 100 * s.delta_p.stderr_, 2));
    cells.insert(cells.end(), rows[i].extra.begin(), rows[i].extra.end());
    table.push_back(cells);
  }
  table[0][0] = "  " + table[0][0];
  std::vector<size_t> widths(header.size(), 0);
  for (const auto& row : table)
    for (size_t c = 0; c < row.size() && c < widths.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  std::string out;
  for (const auto& row : table) out += table_line(row, widths);
  out += "\n";
  if (rows.size() > 1) out += "* the closest to the unquantized model: the lowest mean KL. Rows are sorted by it.\n";
  out += "mean KL    KL divergence of the quantized model's next-token distribution from the unquantized\n"
         "           one, in nats per token (0: the same distribution)\n";
  if (options.kl_p99) out += "KL p99     the 99th percentile of the per-token KL\n";
  out += "top-1 %    tokens where both models rank the same next token first\n"
         "PPL ratio  perplexity of the quantized model / the unquantized one (1: no loss)\n";
  if (options.delta_p) out += "dp %       mean change of the probability given to the true next token, in points\n";
  for (const std::string& note : options.extra_notes) out += note + "\n";
  out += "+-         one standard error of the mean\n";
  return out;
}

}  // namespace llmq::cli
