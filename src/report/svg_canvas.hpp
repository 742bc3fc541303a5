// A small SVG writer for the report's charts. Every element is written whole or not at all: an
// element with a coordinate or length that is not finite is dropped (and counted), so no "nan" or
// "inf" ever reaches an attribute. Text is escaped; styles are presentation attributes, so each
// <svg> also renders on its own (copied out of the page into a file).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace llmq {
namespace report {

class SvgCanvas {
 public:
  // `label`: what the chart shows, for screen readers (aria-label) and as the <title>.
  SvgCanvas(double width, double height, const std::string& label);

  // `fill` and `stroke` are colours from this code ("#1f77b4", "none"); `title` (escaped) is the
  // element's tooltip.
  void rect(double x, double y, double w, double h, const std::string& fill, const std::string& title = "",
            const std::string& stroke = "none", double stroke_width = 1.0);
  void line(double x1, double y1, double x2, double y2, const std::string& stroke, double stroke_width = 1.0,
            const std::string& dash = "");
  void circle(double cx, double cy, double r, const std::string& fill, const std::string& stroke,
              double stroke_width, const std::string& title = "");
  // anchor: "start", "middle" or "end"; rotate_deg turns the text around (x, y).
  void text(double x, double y, const std::string& text, double font_size, const std::string& anchor = "start",
            const std::string& fill = "#222222", bool bold = false, double rotate_deg = 0.0);
  void polygon(const std::vector<std::pair<double, double>>& points, const std::string& fill,
               const std::string& title = "");

  int64_t dropped() const { return dropped_; }  // elements left out for a non-finite coordinate
  std::string finish() const;                   // "<svg ...>...</svg>"

 private:
  bool all_finite(std::initializer_list<double> values);
  std::string title_element(const std::string& title) const;

  double width_;
  double height_;
  std::string label_;
  std::string body_;
  int64_t dropped_ = 0;
};

// A colour of the report's sequential scale (pale yellow -> orange -> dark red) for t in [0, 1]
// (clamped); "#rrggbb".
std::string ramp_color(double t);
extern const char* const kMissingColor;   // cells with no measurement
extern const char* const kRecipeColor;    // the chosen recipe, wherever it is drawn
extern const char* const kSchemeColor;    // the other candidates
extern const char* const kBudgetColor;    // the budget line

// Where a value lands on an axis between two pixel positions.
struct LinearScale {
  double lo = 0, hi = 1;      // the domain
  double px_lo = 0, px_hi = 1;
  double map(double v) const;
};

// log10 axis over [10^lo_exp, 10^hi_exp]; values <= 0 map to px_lo (the floor).
struct LogScale {
  double lo_exp = -6, hi_exp = 0;
  double px_lo = 0, px_hi = 1;
  double map(double v) const;
};

// About `count` round ticks (1, 2 or 5 x 10^k apart) covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int count);
// The smallest round number (1, 2, 5 x 10^k) >= v, for an axis' upper end; v > 0.
double nice_ceiling(double v);

}  // namespace report
}  // namespace llmq
