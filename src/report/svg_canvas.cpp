// The report's SVG writer, colour scale and axes (svg_canvas.hpp).
#include "report/svg_canvas.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "report/report_text.hpp"

namespace llmq {
namespace report {

const char* const kMissingColor = "#d9d9d9";
const char* const kRecipeColor = "#d62728";
const char* const kSchemeColor = "#1f5fa8";
const char* const kBudgetColor = "#2ca02c";

SvgCanvas::SvgCanvas(double width, double height, const std::string& label)
    : width_(std::isfinite(width) && width > 0 ? width : 1.0),
      height_(std::isfinite(height) && height > 0 ? height : 1.0),
      label_(label) {}

bool SvgCanvas::all_finite(std::initializer_list<double> values) {
  for (double v : values) {
    if (!std::isfinite(v)) {
      ++dropped_;
      return false;
    }
  }
  return true;
}

std::string SvgCanvas::title_element(const std::string& title) const {
  return title.empty() ? std::string() : "<title>" + escape_xml(title) + "</title>";
}

void SvgCanvas::rect(double x, double y, double w, double h, const std::string& fill, const std::string& title,
                     const std::string& stroke, double stroke_width) {
  if (!all_finite({x, y, w, h, stroke_width}) || w < 0 || h < 0) return;
  body_ += "<rect x=\"" + svg_number(x) + "\" y=\"" + svg_number(y) + "\" width=\"" + svg_number(w) +
           "\" height=\"" + svg_number(h) + "\" fill=\"" + escape_xml(fill) + "\"";
  if (stroke != "none") body_ += " stroke=\"" + escape_xml(stroke) + "\" stroke-width=\"" + svg_number(stroke_width) + "\"";
  if (title.empty()) {
    body_ += "/>";
  } else {
    body_ += ">" + title_element(title) + "</rect>";
  }
}

void SvgCanvas::line(double x1, double y1, double x2, double y2, const std::string& stroke, double stroke_width,
                     const std::string& dash) {
  if (!all_finite({x1, y1, x2, y2, stroke_width})) return;
  body_ += "<line x1=\"" + svg_number(x1) + "\" y1=\"" + svg_number(y1) + "\" x2=\"" + svg_number(x2) + "\" y2=\"" +
           svg_number(y2) + "\" stroke=\"" + escape_xml(stroke) + "\" stroke-width=\"" + svg_number(stroke_width) + "\"";
  if (!dash.empty()) body_ += " stroke-dasharray=\"" + escape_xml(dash) + "\"";
  body_ += "/>";
}

void SvgCanvas::circle(double cx, double cy, double r, const std::string& fill, const std::string& stroke,
                       double stroke_width, const std::string& title) {
  if (!all_finite({cx, cy, r, stroke_width}) || r < 0) return;
  body_ += "<circle cx=\"" + svg_number(cx) + "\" cy=\"" + svg_number(cy) + "\" r=\"" + svg_number(r) + "\" fill=\"" +
           escape_xml(fill) + "\" stroke=\"" + escape_xml(stroke) + "\" stroke-width=\"" + svg_number(stroke_width) +
           "\">" + title_element(title) + "</circle>";
}

void SvgCanvas::text(double x, double y, const std::string& text, double font_size, const std::string& anchor,
                     const std::string& fill, bool bold, double rotate_deg) {
  if (!all_finite({x, y, font_size, rotate_deg})) return;
  body_ += "<text x=\"" + svg_number(x) + "\" y=\"" + svg_number(y) + "\" font-size=\"" + svg_number(font_size) +
           "\" font-family=\"sans-serif\" text-anchor=\"" + escape_xml(anchor) + "\" fill=\"" + escape_xml(fill) + "\"";
  if (bold) body_ += " font-weight=\"bold\"";
  if (rotate_deg != 0.0) {
    body_ += " transform=\"rotate(" + svg_number(rotate_deg) + " " + svg_number(x) + " " + svg_number(y) + ")\"";
  }
  body_ += ">" + escape_xml(text) + "</text>";
}

void SvgCanvas::polygon(const std::vector<std::pair<double, double>>& points, const std::string& fill,
                        const std::string& title) {
  std::string list;
  for (const auto& p : points) {
    if (!all_finite({p.first, p.second})) return;
    if (!list.empty()) list += ' ';
    list += svg_number(p.first) + "," + svg_number(p.second);
  }
  body_ += "<polygon points=\"" + list + "\" fill=\"" + escape_xml(fill) + "\">" + title_element(title) + "</polygon>";
}

std::string SvgCanvas::finish() const {
  const std::string w = svg_number(width_);
  const std::string h = svg_number(height_);
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + w + "\" height=\"" + h + "\" viewBox=\"0 0 " + w +
         " " + h + "\" role=\"img\" aria-label=\"" + escape_xml(label_) + "\">" + title_element(label_) +
         "<rect x=\"0\" y=\"0\" width=\"" + w + "\" height=\"" + h + "\" fill=\"#ffffff\"/>" + body_ + "</svg>";
}

std::string ramp_color(double t) {
  // Stops picked by eye for a light-to-dark scale that stays readable printed in grey.
  static const double kStops[][3] = {
      {255, 250, 210}, {254, 217, 118}, {253, 141, 60}, {227, 26, 28}, {128, 0, 38}};
  constexpr int kLast = 4;
  if (!std::isfinite(t)) return kMissingColor;
  t = std::min(1.0, std::max(0.0, t));
  const double pos = t * kLast;
  const int i = std::min(kLast - 1, static_cast<int>(pos));
  const double f = pos - i;
  char buf[8];
  int rgb[3];
  for (int c = 0; c < 3; ++c) rgb[c] = static_cast<int>(std::lround(kStops[i][c] + f * (kStops[i + 1][c] - kStops[i][c])));
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
  return buf;
}

double LinearScale::map(double v) const {
  if (hi == lo) return (px_lo + px_hi) / 2;
  return px_lo + (v - lo) / (hi - lo) * (px_hi - px_lo);
}

double LogScale::map(double v) const {
  if (!(v > 0)) return px_lo;
  const double e = std::min(hi_exp, std::max(lo_exp, std::log10(v)));
  if (hi_exp == lo_exp) return (px_lo + px_hi) / 2;
  return px_lo + (e - lo_exp) / (hi_exp - lo_exp) * (px_hi - px_lo);
}

double nice_ceiling(double v) {
  const double p = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * p >= v * (1 - 1e-12)) return m * p;
  }
  return 10 * p;
}

std::vector<double> nice_ticks(double lo, double hi, int count) {
  std::vector<double> ticks;
  if (!std::isfinite(lo) || !std::isfinite(hi) || hi <= lo || count < 1) return ticks;
  const double step = nice_ceiling((hi - lo) / count);
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9 && ticks.size() < 64; t += step) {
    ticks.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

}  // namespace report
}  // namespace llmq
