// Builds and prints the default report (see report.hpp). Everything is computed with the
// library's public API, so the numbers are what a user of the API would get.
#include "report.hpp"

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "llmq/gemm.hpp"
#include "llmq/quantize_tensor.hpp"
#include "llmq/scale.hpp"
#include "llmq/synthetic.hpp"

namespace llmq::cli {
namespace {

const DType kRoundTripFormats[] = {DType::kE4M3, DType::kE5M2, DType::kI8, DType::kI4};
const DType kGemmFormats[] = {DType::kE4M3, DType::kE5M2, DType::kI8};

double sqnr_db(const std::vector<double>& ref, const std::vector<double>& approx) {
  double signal = 0, noise = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    signal += ref[i] * ref[i];
    noise += (ref[i] - approx[i]) * (ref[i] - approx[i]);
  }
  if (noise == 0) return INFINITY;
  return 10.0 * std::log10(signal / noise);
}

struct RoundTripMethod {
  std::string label;
  std::function<QuantSpec(DType)> spec;
};

std::vector<RoundTripMethod> roundtrip_methods() {
  auto base = [](Granularity g) {
    return [g](DType d) {
      QuantSpec s = QuantSpec::per_tensor(d);
      s.granularity = g;
      return s;
    };
  };
  auto with = [](std::function<QuantSpec(DType)> make, std::function<void(QuantSpec&)> edit) {
    return [make, edit](DType d) {
      QuantSpec s = make(d);
      edit(s);
      return s;
    };
  };
  const auto tensor = base(Granularity::kPerTensor);
  const auto token = base(Granularity::kPerToken);
  return {
      {"unit scale (s = 1)", with(tensor, [](QuantSpec& s) { s.method = ScaleMethod::kUnit; })},
      {"per-tensor absmax", tensor},
      {"per-tensor absmax, backoff 0.5", with(tensor, [](QuantSpec& s) { s.backoff = 0.5f; })},
      {"per-tensor power-of-two", with(tensor, [](QuantSpec& s) { s.scale_rounding = ScaleRounding::kPowerOfTwo; })},
      {"per-tensor hw set {2^-8,2^-4,1,16}", with(tensor, [](QuantSpec& s) {
         s.scale_rounding = ScaleRounding::kHardwareSet;
         s.hardware_scales = {0x1p-8f, 0x1p-4f, 1.0f, 16.0f};
       })},
      {"per-tensor MSE search", with(tensor, [](QuantSpec& s) { s.method = ScaleMethod::kMseSearch; })},
      {"per-tensor MSE, pow2 set", with(tensor, [](QuantSpec& s) {
         s.method = ScaleMethod::kMseSearch;
         s.candidates = CandidateSet::kPowerOfTwo;
       })},
      {"per-token absmax", token},
      {"per-token MSE search", with(token, [](QuantSpec& s) { s.method = ScaleMethod::kMseSearch; })},
      {"per-input-channel absmax", base(Granularity::kPerInputChannel)},
      {"block 1x128", [](DType d) { return QuantSpec::per_block(d, 1, 128); }},
      {"block 128x128", [](DType d) { return QuantSpec::per_block(d, 128, 128); }},
      {"group 32", [](DType d) { return QuantSpec::per_group(d, 32); }},
      {"per-token asymmetric (ints only)", with(token, [](QuantSpec& s) { s.symmetric = false; })},
  };
}

Status roundtrip_cell(const std::vector<float>& x, const ReportOptions& o, const QuantSpec& spec,
                      ReportCell* cell) {
  QuantizedTensor q;
  LLMQ_RETURN_IF_ERROR(quantize(matrix_view(x.data(), o.rows, o.cols), spec, &q));
  std::vector<float> y(x.size());
  LLMQ_RETURN_IF_ERROR(dequantize(q, matrix_view(y.data(), o.rows, o.cols)));
  cell->sqnr_db = sqnr_db(std::vector<double>(x.begin(), x.end()), std::vector<double>(y.begin(), y.end()));
  cell->clipped_pct = 100.0 * static_cast<double>(q.clipped) / static_cast<double>(x.size());
  return {};
}

std::vector<double> reference_product(const std::vector<float>& x, const std::vector<float>& w,
                                      int64_t m, int64_t n, int64_t k) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) acc += double{x[static_cast<size_t>(i * k + p)]} * w[static_cast<size_t>(j * k + p)];
      c[static_cast<size_t>(i * n + j)] = acc;
    }
  return c;
}

// One W8A8 scheme: how to quantize activations and weights, optionally with SmoothQuant and with
// activation scales calibrated on a second batch (static) instead of measured at run time.
struct GemmScheme {
  std::string label;
  QuantSpec (*act)(DType);
  QuantSpec (*weight)(DType);
  float smooth_alpha = -1.0f;  // >= 0: SmoothQuant with this alpha
  bool static_activations = false;
  float static_backoff = 1.0f;  // beta of the calibrated activation scale (eq. 15a / 27)
};

QuantSpec unit_tensor(DType d) {
  QuantSpec s = QuantSpec::per_tensor(d);
  s.method = ScaleMethod::kUnit;
  return s;
}
QuantSpec mse_channel(DType d) {
  QuantSpec s = QuantSpec::per_channel(d);
  s.method = ScaleMethod::kMseSearch;
  return s;
}
QuantSpec block_1x128(DType d) { return QuantSpec::per_block(d, 1, 128); }
QuantSpec block_128x128(DType d) { return QuantSpec::per_block(d, 128, 128); }

const GemmScheme kGemmSchemes[] = {
    {"unit scale x unit scale", unit_tensor, unit_tensor},
    {"static per-tensor x per-channel", QuantSpec::per_tensor, QuantSpec::per_channel, -1.0f, true},
    {"per-tensor x per-tensor", QuantSpec::per_tensor, QuantSpec::per_tensor},
    {"per-tensor x per-channel", QuantSpec::per_tensor, QuantSpec::per_channel},
    {"per-token x per-channel", QuantSpec::per_token, QuantSpec::per_channel},
    {"per-token x per-channel MSE", QuantSpec::per_token, mse_channel},
    {"block 1x128 x block 128x128", block_1x128, block_128x128},
    {"SmoothQuant 0.5: static per-tensor x per-channel", QuantSpec::per_tensor, QuantSpec::per_channel, 0.5f, true},
    {"SmoothQuant 0.5: static, backoff 0.5 x per-channel", QuantSpec::per_tensor, QuantSpec::per_channel, 0.5f, true, 0.5f},
    {"SmoothQuant 0.5: per-tensor x per-channel", QuantSpec::per_tensor, QuantSpec::per_channel, 0.5f},
    {"SmoothQuant 0.5: per-token x per-channel", QuantSpec::per_token, QuantSpec::per_channel, 0.5f},
};

Status gemm_cell(const std::vector<float>& x, const std::vector<float>& x_calibration,
                 const std::vector<float>& w, const std::vector<double>& ref, const ReportOptions& o,
                 const GemmScheme& scheme, DType d, ReportCell* cell) {
  const int64_t m = o.rows, n = o.out_features, k = o.cols;
  // Calibration (the MEASURE phase): per-input-channel absmax of a second batch and of W.
  const MatrixView xc{x_calibration.data(), DType::kF32, static_cast<int64_t>(x_calibration.size()) / k, k, k, 1};
  const MatrixView wm{w.data(), DType::kF32, n, k, k, 1};
  const std::vector<float> act_absmax = column_absmax(xc);
  std::vector<float> smooth(static_cast<size_t>(k), 1.0f);
  const bool smoothed = scheme.smooth_alpha >= 0.0f;
  if (smoothed)
    LLMQ_RETURN_IF_ERROR(smoothquant_factors(act_absmax, column_absmax(wm), scheme.smooth_alpha, &smooth));

  QuantSpec act = scheme.act(d);
  ScaleSet act_scale;
  if (scheme.static_activations) {
    act.source = ScaleSource::kStatic;
    act.backoff = scheme.static_backoff;
    act_scale.scales = Tensor(DType::kF32, {1, 1});
    act_scale.scales.data_as<float>()[0] = smoothed_activation_scale(act_absmax, smooth, act);  // eq. 27
    act_scale.block = {m, k};
  }
  QuantizedTensor qa, qb;
  LLMQ_RETURN_IF_ERROR(quantize(matrix_view(x.data(), m, k), act, &qa,
                                scheme.static_activations ? &act_scale : nullptr,
                                smoothed ? smooth.data() : nullptr));
  if (smoothed) {
    Tensor w_smoothed;  // W S_c (eq. 28)
    LLMQ_RETURN_IF_ERROR(smooth_weight(matrix_view(w.data(), n, k), smooth, &w_smoothed));
    LLMQ_RETURN_IF_ERROR(quantize(w_smoothed.view(), scheme.weight(d), &qb));
  } else {
    LLMQ_RETURN_IF_ERROR(quantize(matrix_view(w.data(), n, k), scheme.weight(d), &qb));
  }
  std::vector<float> c(static_cast<size_t>(m * n));
  LLMQ_RETURN_IF_ERROR(quantized_gemm(GemmOperand::of(qa), GemmOperand::of(qb), matrix_view(c.data(), m, n)));
  cell->sqnr_db = sqnr_db(ref, std::vector<double>(c.begin(), c.end()));
  cell->clipped_pct = 100.0 * static_cast<double>(qa.clipped) / static_cast<double>(x.size());
  return {};
}

std::string fmt_cell(const ReportCell& c) {
  if (!c.applicable) return "-";
  if (std::isinf(c.sqnr_db)) return "exact";
  std::string s = fmt::format("{:.1f}", c.sqnr_db);
  if (c.clipped_pct > 0) s += fmt::format(" ({:.2g}% clip)", c.clipped_pct);
  return s;
}

std::string table(const std::string& title, const std::vector<std::string>& columns,
                  const std::vector<ReportRow>& rows) {
  size_t label_width = 6;
  for (const auto& r : rows) label_width = std::max(label_width, r.label.size());
  constexpr size_t kCell = 18;
  std::string out = title + "\n";
  out += fmt::format("{:<{}}", "method", label_width);
  for (const auto& c : columns) out += fmt::format(" | {:>{}}", c, kCell);
  out += "\n" + std::string(label_width, '-');
  for (size_t i = 0; i < columns.size(); ++i) out += "-+-" + std::string(kCell, '-');
  out += "\n";
  for (const auto& r : rows) {
    out += fmt::format("{:<{}}", r.label, label_width);
    for (const auto& c : r.cells) out += fmt::format(" | {:>{}}", fmt_cell(c), kCell);
    out += "\n";
  }
  return out;
}

}  // namespace

Status build_report(const ReportOptions& o, Report* out) {
  Report report;
  const auto x = synthetic_activations(o.rows, o.cols, o.seed);
  for (DType d : kRoundTripFormats) report.formats.push_back(dtype_name(d));
  for (const auto& method : roundtrip_methods()) {
    ReportRow row{method.label, {}};
    for (DType d : kRoundTripFormats) {
      ReportCell cell;
      const QuantSpec spec = method.spec(d);
      if (!spec.symmetric && is_fp8(d)) {
        cell.applicable = false;  // zero points are for integer formats
      } else {
        LLMQ_RETURN_IF_ERROR(roundtrip_cell(x, o, spec, &cell));
      }
      row.cells.push_back(cell);
    }
    report.roundtrip.push_back(row);
  }
  // The calibration batch is 4x the evaluation batch, drawn with another seed (same channels).
  const auto x_calibration = synthetic_activations(4 * o.rows, o.cols, o.seed + 1);
  const auto w = synthetic_weights(o.out_features, o.cols, o.seed);
  const auto ref = reference_product(x, w, o.rows, o.out_features, o.cols);
  for (const auto& scheme : kGemmSchemes) {
    ReportRow row{scheme.label, {}};
    for (DType d : kGemmFormats) {
      ReportCell cell;
      LLMQ_RETURN_IF_ERROR(gemm_cell(x, x_calibration, w, ref, o, scheme, d, &cell));
      row.cells.push_back(cell);
    }
    report.gemm.push_back(row);
  }
  *out = std::move(report);
  return {};
}

std::string format_table_text() {
  std::string out = "Formats (llmq/format.hpp; conversions bit-exact against PyTorch and cuda_fp8.h)\n";
  out += fmt::format("{:<10} | {:>4} | {:>5} | {:>4} | {:>10} | {:>12} | {:>12} | {:>3} | {}\n", "format", "bits",
                     "E/M", "bias", "max", "min normal", "min subnorm", "Inf", "NaN");
  out += std::string(100, '-') + "\n";
  for (DType d : kQuantizedDTypes) {
    const FormatInfo& f = format_info(d);
    std::string nan = "none";
    switch (f.nan) {
      case NanEncoding::kAllOnes: nan = "S.1111.111"; break;
      case NanEncoding::kIeee: nan = "exp all ones, mant != 0"; break;
      case NanEncoding::kNegativeZero: nan = "0x80 (no -0)"; break;
      case NanEncoding::kNone: break;
    }
    if (f.is_integer) {
      out += fmt::format("{:<10} | {:>4} | {:>5} | {:>4} | {:>10} | {:>12} | {:>12} | {:>3} | {}\n", f.name, f.bits,
                         "-", "-", fmt::format("[{}, {}]", f.qmin, f.qmax), "1", "-", "no", nan);
    } else {
      out += fmt::format("{:<10} | {:>4} | {:>5} | {:>4} | {:>10g} | {:>12.6g} | {:>12.6g} | {:>3} | {}\n", f.name,
                         f.bits, fmt::format("{}/{}", f.exponent_bits, f.mantissa_bits), f.exponent_bias,
                         f.max_finite, f.min_normal, f.min_subnormal, f.has_inf ? "yes" : "no", nan);
    }
  }
  return out;
}

std::string report_text(const ReportOptions& o, const Report& report) {
  std::string out = format_table_text() + "\n";
  std::vector<std::string> rt_cols, gemm_cols;
  for (const auto& f : report.formats) rt_cols.push_back(f + " SQNR dB");
  for (DType d : kGemmFormats) gemm_cols.push_back(std::string(dtype_name(d)) + " SQNR dB");
  out += table(fmt::format("Round trip of a seeded activation tensor [{} x {}] with outlier channels "
                           "(seed {}; higher is better)",
                           o.rows, o.cols, o.seed),
               rt_cols, report.roundtrip);
  out += "\n";
  out += table(fmt::format("W8A8 GEMM X[{} x {}] * W[{} x {}]^T against the float64 product "
                           "(weights synthetic, SmoothQuant calibrated on a second batch)",
                           o.rows, o.cols, o.out_features, o.cols),
               gemm_cols, report.gemm);
  return out;
}

std::string report_json(const ReportOptions& o, const Report& report) {
  nlohmann::json j;
  j["tensor"] = {{"rows", o.rows}, {"cols", o.cols}, {"seed", o.seed}, {"out_features", o.out_features}};
  auto rows_json = [](const std::vector<ReportRow>& rows, const std::vector<std::string>& formats) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& r : rows) {
      nlohmann::json row = {{"method", r.label}};
      for (size_t i = 0; i < r.cells.size(); ++i)
        if (r.cells[i].applicable) row[formats[i]] = {{"sqnr_db", std::isinf(r.cells[i].sqnr_db) ? 1e9 : r.cells[i].sqnr_db},
                           {"clipped_pct", r.cells[i].clipped_pct}};
      arr.push_back(row);
    }
    return arr;
  };
  std::vector<std::string> gemm_formats;
  for (DType d : kGemmFormats) gemm_formats.push_back(dtype_name(d));
  j["roundtrip"] = rows_json(report.roundtrip, report.formats);
  j["gemm"] = rows_json(report.gemm, gemm_formats);
  return j.dump(2);
}

}  // namespace llmq::cli
