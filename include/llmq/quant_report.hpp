// The quantization report (issue 27): what `llmq recipe` found, as one self-contained HTML file
// (inline SVG, no script, nothing fetched; opens offline) and a short Markdown summary beside it.
// The report is a plain record of strings and numbers, filled by whoever measured them; the
// renderers only draw it, so they depend on nothing but this header. A number that is not finite
// means "not measured" and is printed as an em dash, never drawn.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "llmq/status.hpp"

namespace llmq {

// One quantized (or unquantized) model that was evaluated against the reference: every uniform
// scheme, the high-precision baseline and the chosen recipe.
struct QuantReportCandidate {
  static constexpr double kNotMeasured = std::numeric_limits<double>::quiet_NaN();

  std::string name;           // "fp8-dynamic", "bf16", "recipe"
  bool is_recipe = false;     // the chosen assignment (at most one): highlighted everywhere
  bool is_baseline = false;   // the high-precision model the others are compared with
  double kl_mean = kNotMeasured;         // mean KL(reference || candidate) per token, nats
  double kl_mean_stderr = kNotMeasured;  // its standard error
  double kl_p99 = kNotMeasured;
  double kl_max = kNotMeasured;
  double top1_agreement = kNotMeasured;  // fraction of tokens whose argmax matches, [0, 1]
  double ppl_ratio = kNotMeasured;       // perplexity / the reference's perplexity
  int64_t linear_weight_bytes = -1;      // bytes of the linear layers' weights (and scales); < 0: unknown
  double decode_ms_per_token = kNotMeasured;
  // How decode_ms_per_token was obtained: "bytes model at 3350 GB/s", "measured on NVIDIA H100".
  std::string decode_time_source;
};

// The KL of quantizing one unit alone (everything else in high precision), per scheme.
struct QuantReportSensitivity {
  std::vector<std::string> units;    // "layer 3 attention", "layer 3 mlp", "lm_head"; forward order
  std::vector<std::string> schemes;  // the columns
  std::vector<double> kl;            // [units x schemes], row-major; not finite: not measured
};

// The per-channel absmax of one linear input (CalibrationStats' LinearStats::input_channel_absmax).
struct QuantReportOutlierSite {
  int64_t layer = -1;          // the decoder layer; < 0: outside the layers (the lm_head input)
  std::string site;            // which input of the layer: "attention input", "o_proj input", ...
  std::string module;          // a linear that reads it: "model.layers.3.self_attn.q_proj"
  std::vector<float> channel_absmax;  // [in_features]; finite values must be >= 0
};

// A module kept in high precision, and why ("lm_head: kept by default", "KL 0.02 alone > budget").
struct QuantReportKept {
  std::string module;
  std::string reason;
};

// The chosen scheme of one unit ("" or a high-precision dtype name for a kept unit).
struct QuantReportAssignment {
  std::string unit;
  std::string scheme;
};

struct QuantReport {
  std::string model;           // path or name as the user gave it
  std::string date;            // given by the caller (the library reads no clock): "2026-12-01"
  std::string llmq_version;
  std::string device;          // where it was measured, or the latency model: "bytes model at 3350 GB/s"
  std::string eval_data;       // what the evaluation ran on: "64 sequences x 256 tokens of wiki.txt"
  std::string budget;          // as given: "kl<=0.01", "top1>=0.99", "ppl<=1.01x"
  std::string objective;       // "speed" or "size"
  // The budget's bound on mean KL, drawn as a line on the accuracy charts; not finite when the
  // budget is on another metric.
  double budget_kl_mean = QuantReportCandidate::kNotMeasured;
  std::vector<QuantReportCandidate> candidates;
  QuantReportSensitivity sensitivity;
  std::vector<QuantReportOutlierSite> outliers;
  std::vector<QuantReportKept> kept;
  std::vector<QuantReportAssignment> assignment;
  std::vector<std::string> notes;  // free sentences shown under the summary
};

// Is the report drawable? Refused, naming the field: a sensitivity matrix whose size is not
// units x schemes, more than one candidate flagged as the recipe, a negative finite channel absmax.
Status check_quant_report(const QuantReport& report);

// One HTML document (well-formed XML after its doctype, so it parses strictly): a summary, the
// accuracy-vs-decode-time and accuracy-vs-size charts, the sensitivity heatmap, the activation
// outliers and the tables behind them. Its size is bounded whatever the channel counts: channels are
// drawn in bins (each the max of its channels), and the captions say so.
Status render_quant_report_html(const QuantReport& report, std::string* out);

// The same tables, short: every candidate, what was kept and why, the chosen assignment, and the
// most sensitive units and largest outliers.
Status render_quant_report_markdown(const QuantReport& report, std::string* out);

}  // namespace llmq
