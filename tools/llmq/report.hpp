// The report `llmq` prints with no arguments: the format table and the round-trip error of each
// scaling method on a seeded activation tensor with outlier channels, plus the W8A8 GEMM error of
// the paper's schemes (SmoothQuant included) on that tensor times synthetic weights.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llmq/quant_spec.hpp"
#include "llmq/status.hpp"

namespace llmq::cli {

struct ReportOptions {
  int64_t rows = 128;    // tokens
  int64_t cols = 1024;   // hidden size (K)
  int64_t out_features = 256;  // N of the GEMM table
  uint64_t seed = 1;
  bool json = false;
};

struct ReportCell {
  double sqnr_db = 0;      // 10 log10(sum x^2 / sum (x - x_hat)^2)
  double clipped_pct = 0;  // elements that saturated
  bool applicable = true;  // false: the method does not apply to this format
};

struct ReportRow {
  std::string label;
  std::vector<ReportCell> cells;  // one per format column
};

struct Report {
  std::vector<std::string> formats;
  std::vector<ReportRow> roundtrip;
  std::vector<ReportRow> gemm;  // cells: relative Frobenius error of X W^T, as SQNR
};

Status build_report(const ReportOptions& options, Report* out);
std::string format_table_text();
std::string report_text(const ReportOptions& options, const Report& report);
std::string report_json(const ReportOptions& options, const Report& report);

}  // namespace llmq::cli
