// Per-unit sensitivity: a heatmap of the KL of quantizing one unit alone (rows: units in forward
// order, columns: schemes; colour on a log scale, the value printed in each cell, the chosen scheme
// of each unit outlined) with its legend, and the same numbers as a table.
#include <algorithm>
#include <cmath>
#include <map>

#include "report/report_sections.hpp"
#include "report/report_text.hpp"
#include "report/svg_canvas.hpp"

namespace llmq {
namespace report {

namespace {

constexpr double kCellWidth = 66, kCellHeight = 16;
constexpr double kCharWidth = 6.2;   // of an 11px sans-serif character, estimated
constexpr double kTurn = 40;         // degrees the scheme names are turned
constexpr double kLegendWidth = 150;
constexpr size_t kMaxLabelChars = 40;  // longer unit names are cut (the cell's tooltip has them whole)
constexpr int kLegendSteps = 10;

std::string shorten(const std::string& s) { return shorten_label(s, kMaxLabelChars); }

}  // namespace

std::string sensitivity_section(const QuantReport& report) {
  const QuantReportSensitivity& sens = report.sensitivity;
  std::string out = "<section id=\"sensitivity\"><h2>Per-unit sensitivity</h2>";
  if (sens.units.empty() || sens.schemes.empty()) {
    return out + "<p>No sensitivity was measured.</p></section>";
  }
  const size_t n_units = sens.units.size(), n_schemes = sens.schemes.size();
  double lo = HUGE_VAL, hi = -HUGE_VAL;
  for (double v : sens.kl) {
    if (std::isfinite(v) && v > 0) {
      lo = std::min(lo, std::floor(std::log10(v)));
      hi = std::max(hi, std::ceil(std::log10(v)));
    }
  }
  if (lo > hi) lo = -4, hi = -1;
  if (hi == lo) hi = lo + 1;
  const auto shade = [&](double v) -> double {  // position on the colour scale; NaN for missing
    if (!std::isfinite(v)) return std::nan("");
    if (v <= 0) return 0.0;
    return (std::log10(v) - lo) / (hi - lo);
  };
  std::map<std::string, std::string> chosen;
  for (const auto& a : report.assignment) chosen[a.unit] = a.scheme;

  size_t longest = 0;
  for (const auto& u : sens.units) longest = std::max(longest, std::min(u.size(), kMaxLabelChars + 1));
  const double left = 12 + kCharWidth * static_cast<double>(longest);
  const double grid_w = kCellWidth * static_cast<double>(n_schemes);
  const double grid_h = kCellHeight * static_cast<double>(n_units);
  // The turned scheme names reach up and to the right: room for the longest above the grid, and
  // for the last ones past it.
  const double turn = kTurn * 3.14159265358979 / 180;
  double grid_top = 40, right = left + grid_w + kLegendWidth;
  for (size_t s = 0; s < n_schemes; ++s) {
    const double px = kCharWidth * static_cast<double>(shorten(sens.schemes[s]).size());
    grid_top = std::max(grid_top, std::sin(turn) * px + 20);
    right = std::max(right, left + kCellWidth * (static_cast<double>(s) + 0.5) + std::cos(turn) * px + 12);
  }
  const double width = right;
  const double height = grid_top + std::max(grid_h, 260.0) + 12;
  SvgCanvas svg(width, height, "KL of quantizing one unit alone, units by schemes");
  for (size_t s = 0; s < n_schemes; ++s) {
    const double cx = left + kCellWidth * (static_cast<double>(s) + 0.5);
    svg.text(cx, grid_top - 8, shorten(sens.schemes[s]), 11, "start", "#222222", false, -kTurn);
  }
  for (size_t u = 0; u < n_units; ++u) {
    const double y = grid_top + kCellHeight * static_cast<double>(u);
    svg.text(left - 6, y + kCellHeight - 4, shorten(sens.units[u]), 11, "end");
    const auto it = chosen.find(sens.units[u]);
    for (size_t s = 0; s < n_schemes; ++s) {
      const double v = sens.kl[u * n_schemes + s];
      const double t = shade(v);
      const double x = left + kCellWidth * static_cast<double>(s);
      const bool is_chosen = it != chosen.end() && it->second == sens.schemes[s];
      svg.rect(x, y, kCellWidth, kCellHeight, ramp_color(t),
               sens.units[u] + " under " + sens.schemes[s] + ": KL " + format_significant(v, 3) +
                   (is_chosen ? " (chosen)" : ""),
               is_chosen ? "#000000" : "#ffffff", is_chosen ? 2.0 : 0.5);
      svg.text(x + kCellWidth / 2, y + kCellHeight - 4, format_significant(v, 2), 10, "middle",
               std::isfinite(t) && t > 0.6 ? "#ffffff" : "#222222");
    }
  }
  // Legend: the colour scale in steps, a swatch for "not measured" and one for "chosen".
  const double lx = left + grid_w + 24;
  const double step_h = 18;
  const double legend_top = grid_top + 20;  // below the turned names
  svg.text(lx, grid_top + 8, "KL (log scale)", 11);
  for (int i = 0; i < kLegendSteps; ++i) {
    const double t = 1.0 - (i + 0.5) / kLegendSteps;
    svg.rect(lx, legend_top + step_h * i, 18, step_h, ramp_color(t));
  }
  svg.text(lx + 24, legend_top + 10, "1e" + std::to_string(static_cast<int>(hi)), 10);
  svg.text(lx + 24, legend_top + step_h * kLegendSteps, "1e" + std::to_string(static_cast<int>(lo)) + " or 0", 10);
  const double ly = legend_top + step_h * kLegendSteps + 16;
  svg.rect(lx, ly, 18, 12, kMissingColor);
  svg.text(lx + 24, ly + 10, "not measured", 10);
  svg.rect(lx, ly + 20, 18, 12, "#ffffff", "", "#000000", 2.0);
  svg.text(lx + 24, ly + 30, "chosen scheme", 10);

  out += "<figure>" + svg.finish() +
         "<figcaption>" +
         escape_xml("Each cell is the mean KL against the reference when only that unit is quantized with that "
                    "scheme and everything else stays in high precision; darker is more sensitive. Outlined: the "
                    "scheme the recipe chose for the unit.") +
         "</figcaption></figure>";
  std::vector<std::string> header{"unit"};
  header.insert(header.end(), sens.schemes.begin(), sens.schemes.end());
  std::vector<std::vector<std::string>> rows;
  for (size_t u = 0; u < n_units; ++u) {
    std::vector<std::string> row{sens.units[u]};
    for (size_t s = 0; s < n_schemes; ++s) row.push_back(format_significant(sens.kl[u * n_schemes + s], 3));
    rows.push_back(std::move(row));
  }
  return out + html_table(header, rows) + "</section>";
}

}  // namespace report
}  // namespace llmq
