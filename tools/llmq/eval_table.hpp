// The accuracy table `llmq eval` and `llmq demo` print: one row per candidate, sorted by mean KL,
// the best marked, every column explained once under it; at most 100 columns for scheme names
// up to 20 characters.
#pragma once

#include <string>
#include <vector>

#include "llmq/eval_metrics.hpp"

namespace llmq::cli {

struct EvalRow {
  std::string label;
  EvalAccumulator::Summary summary;
  std::vector<std::string> extra;  // more cells after the accuracy columns (the demo's size, speed)
};

// Rows sorted by mean KL, lowest first (ties keep their order).
void sort_by_kl(std::vector<EvalRow>* rows);

struct EvalTableOptions {
  bool kl_p99 = true;   // the KL p99 column
  bool delta_p = true;  // the dp column
  std::vector<std::string> extra_headers;  // name the EvalRow::extra cells
  std::vector<std::string> extra_notes;    // explain them in the footer
};
std::string eval_table_text(const std::vector<EvalRow>& rows, const EvalTableOptions& options = {});

// "0.1616 +- 0.0031": `decimals` after the point for both.
std::string with_error(double value, double error, int decimals);

// Decimals that show the smallest positive value of a column with about 2 significant digits
// (at least `min_decimals`, at most 8).
int decimals_for(const std::vector<double>& values, int min_decimals);

}  // namespace llmq::cli
