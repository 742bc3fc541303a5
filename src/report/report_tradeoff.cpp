// Accuracy against decode time and against size: two scatter charts (mean KL on a log axis, each
// candidate labelled, the recipe in red, the budget as a dashed line) and the candidates' table.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <set>

#include "report/report_sections.hpp"
#include "report/report_text.hpp"
#include "report/svg_canvas.hpp"

namespace llmq {
namespace report {

namespace {

constexpr double kWidth = 480, kHeight = 340;
constexpr double kLeft = 72, kRight = 24, kTop = 18, kBottom = 52;
constexpr double kFloorBand = 26;  // below the log axis: where KL 0 (the baseline) is drawn
constexpr int kMaxDecades = 12;     // a wider KL range is cut at its top 12 decades
constexpr size_t kMaxLabelChars = 24;  // a longer name is cut in the chart (the table has it whole)

// A tick or a user-given bound: as few digits as it has ("5", "0.01", "2.5e-05").
std::string format_tick(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// Where each point's label goes: beside the point, or moved up or down (with a leader line) until
// it overlaps no label placed before it. Widths are estimated (about 0.6 em a character).
class LabelPlacer {
 public:
  // The label's baseline y, or NaN when every tried place overlaps (then it is left out).
  double place(double x, double y, double font_size, const std::string& text, bool right_aligned) {
    const double w = 0.6 * font_size * static_cast<double>(text.size()) + 4;
    const double x0 = right_aligned ? x - w : x, x1 = right_aligned ? x : x + w;
    for (int k = 0; k < kTries; ++k) {
      const double dy = (k % 2 == 1 ? 1 : -1) * font_size * 1.15 * ((k + 1) / 2);
      const double yb = y + dy;
      const double y0 = yb - font_size, y1 = yb + 2;
      bool clear = true;
      for (const Box& b : placed_) {
        if (x0 < b.x1 && b.x0 < x1 && y0 < b.y1 && b.y0 < y1) {
          clear = false;
          break;
        }
      }
      if (clear) {
        placed_.push_back({x0, x1, y0, y1});
        return yb;
      }
    }
    return std::nan("");
  }

 private:
  struct Box {
    double x0, x1, y0, y1;
  };
  static constexpr int kTries = 15;
  std::vector<Box> placed_;
};

struct Axis {
  std::string title;
  std::function<double(const QuantReportCandidate&)> value;  // NaN when not known
};

// The decades the KL axis spans: every finite positive KL and the budget, at least one decade.
LogScale kl_scale(const QuantReport& report) {
  double lo = HUGE_VAL, hi = -HUGE_VAL;
  auto take = [&](double v) {
    if (std::isfinite(v) && v > 0) {
      lo = std::min(lo, std::floor(std::log10(v)));
      hi = std::max(hi, std::ceil(std::log10(v)));
    }
  };
  for (const auto& c : report.candidates) take(c.kl_mean);
  // The budget widens the axis only as far as kMaxDecades allows: the points come first.
  const double budget = report.budget_kl_mean;
  if (std::isfinite(budget) && budget > 0) {
    const double e = std::log10(budget);
    if (lo > hi || (std::max(hi, std::ceil(e)) - std::min(lo, std::floor(e)) <= kMaxDecades)) take(budget);
  }
  if (lo > hi) lo = -4, hi = -1;
  if (hi == lo) hi = lo + 1;
  lo = std::max(lo, hi - kMaxDecades);
  LogScale s;
  s.lo_exp = lo;
  s.hi_exp = hi;
  s.px_lo = kHeight - kBottom - kFloorBand;
  s.px_hi = kTop;
  return s;
}

bool budget_on_chart(const QuantReport& report, const LogScale& y) {
  const double b = report.budget_kl_mean;
  return std::isfinite(b) && b > 0 && std::log10(b) >= y.lo_exp && std::log10(b) <= y.hi_exp;
}

std::string scatter_chart(const QuantReport& report, const Axis& axis, std::vector<std::string>* not_drawn) {
  SvgCanvas svg(kWidth, kHeight, "mean KL against " + axis.title);
  const LogScale y = kl_scale(report);
  double x_max = 0;
  for (const auto& c : report.candidates) {
    const double v = axis.value(c);
    if (std::isfinite(v)) x_max = std::max(x_max, v);
  }
  LinearScale x;
  x.lo = 0;
  x.hi = x_max > 0 ? nice_ceiling(x_max * 1.08) : 1.0;
  x.px_lo = kLeft;
  x.px_hi = kWidth - kRight;
  const double plot_bottom = kHeight - kBottom;
  // Grid and axes.
  const int decade_step = static_cast<int>(std::ceil((y.hi_exp - y.lo_exp) / 6.0));
  for (double e = y.lo_exp; e <= y.hi_exp; e += decade_step) {
    const double py = y.map(std::pow(10.0, e));
    svg.line(kLeft, py, kWidth - kRight, py, "#e4e4e4");
    svg.text(kLeft - 6, py + 4, "1e" + std::to_string(static_cast<int>(e)), 11, "end");
  }
  svg.text(kLeft - 6, plot_bottom - kFloorBand / 2 + 4, "0", 11, "end");
  // The break between the log axis and the band where KL 0 sits.
  svg.line(kLeft - 4, plot_bottom - kFloorBand + 6, kLeft + 4, plot_bottom - kFloorBand + 2, "#444444");
  for (double t : nice_ticks(x.lo, x.hi, 5)) {
    const double px = x.map(t);
    svg.line(px, kTop, px, plot_bottom, "#e4e4e4");
    svg.text(px, plot_bottom + 16, format_tick(t), 11, "middle");
  }
  svg.line(kLeft, plot_bottom, kWidth - kRight, plot_bottom, "#444444");
  svg.line(kLeft, kTop, kLeft, plot_bottom, "#444444");
  svg.text((kLeft + kWidth - kRight) / 2, kHeight - 12, axis.title, 12, "middle");
  svg.text(16, (kTop + plot_bottom) / 2, "mean KL (log scale)", 12, "middle", "#222222", false, -90);
  if (budget_on_chart(report, y)) {
    const double py = y.map(report.budget_kl_mean);
    svg.line(kLeft, py, kWidth - kRight, py, kBudgetColor, 1.5, "6 4");
    svg.text(kWidth - kRight - 4, py - 5, "budget: KL " + format_tick(report.budget_kl_mean), 11, "end", kBudgetColor);
  }
  // The recipe last, so it is drawn on top.
  std::vector<const QuantReportCandidate*> order;
  for (const auto& c : report.candidates) {
    if (!c.is_recipe) order.push_back(&c);
  }
  if (const QuantReportCandidate* r = find_recipe(report)) order.push_back(r);
  // Points first (the recipe last, on top), then labels, the recipe's placed first so it is never moved.
  struct Drawn {
    const QuantReportCandidate* c;
    double px, py;
  };
  std::vector<Drawn> drawn;
  for (const QuantReportCandidate* c : order) {
    const double xv = axis.value(*c);
    if (!std::isfinite(xv) || xv < 0 || !std::isfinite(c->kl_mean)) {
      not_drawn->push_back(c->name);
      continue;
    }
    const double px = x.map(xv);
    const double py = c->kl_mean > 0 ? y.map(c->kl_mean) : plot_bottom - kFloorBand / 2;
    const std::string tip = candidate_label(*c) + ": mean KL " + format_significant(c->kl_mean, 3) + ", " +
                            axis.title + " " + format_significant(xv, 4);
    svg.circle(px, py, c->is_recipe ? 7 : 4.5, c->is_recipe ? kRecipeColor : kSchemeColor,
               c->is_recipe ? "#000000" : "#ffffff", 1.2, tip);
    drawn.push_back({c, px, py});
  }
  std::reverse(drawn.begin(), drawn.end());
  LabelPlacer labels;
  for (const Drawn& d : drawn) {
    const bool recipe = d.c->is_recipe;
    const double font = recipe ? 12 : 11;
    const bool right_half = d.px > (kLeft + kWidth - kRight) / 2;
    const double lx = right_half ? d.px - 9 : d.px + 9;
    const std::string name = shorten_label(d.c->name, kMaxLabelChars);
    const double ly = labels.place(lx, d.py + 4, font, name, right_half);
    if (!std::isfinite(ly)) continue;  // no free place: the table and the tooltip still name it
    if (std::fabs(ly - (d.py + 4)) > 1) svg.line(d.px, d.py, lx, ly - 4, "#999999", 0.6);
    svg.text(lx, ly, name, font, right_half ? "end" : "start", recipe ? kRecipeColor : kSchemeColor, recipe);
  }
  return svg.finish();
}

std::string decode_sources(const QuantReport& report) {
  std::set<std::string> seen;
  std::string out;
  for (const auto& c : report.candidates) {
    if (!std::isfinite(c.decode_ms_per_token) || c.decode_time_source.empty()) continue;
    if (seen.insert(c.decode_time_source).second) out += (out.empty() ? "" : "; ") + c.decode_time_source;
  }
  return out.empty() ? std::string("not stated") : out;
}

std::string names_list(const std::vector<std::string>& names) {
  std::set<std::string> unique(names.begin(), names.end());
  std::string out;
  for (const auto& n : unique) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

std::string tradeoff_section(const QuantReport& report) {
  // Sizes in MiB, or GiB when the largest is over 10 GiB.
  int64_t max_bytes = 0;
  for (const auto& c : report.candidates) max_bytes = std::max(max_bytes, c.linear_weight_bytes);
  const bool gib = max_bytes > (int64_t{10} << 30);
  const double unit = gib ? 1073741824.0 : 1048576.0;
  const Axis time{"decode time per token (ms)",
                  [](const QuantReportCandidate& c) { return c.decode_ms_per_token; }};
  const Axis size{gib ? "linear weights (GiB)" : "linear weights (MiB)", [unit](const QuantReportCandidate& c) {
                    return c.linear_weight_bytes < 0 ? std::nan("") : static_cast<double>(c.linear_weight_bytes) / unit;
                  }};
  std::vector<std::string> no_time, no_size;
  std::string out = "<section id=\"tradeoff\"><h2>Accuracy against decode time and size</h2><figure><div class=\"charts\">";
  out += scatter_chart(report, time, &no_time);
  out += scatter_chart(report, size, &no_size);
  std::string caption =
      "Each point is one model evaluated against the reference: every uniform scheme, the baseline and the "
      "chosen recipe (red, larger). Up is less accurate; mean KL 0 (the baseline) sits on the bottom band. ";
  if (budget_on_chart(report, kl_scale(report))) {
    caption += "The dashed green line is the budget on mean KL. ";
  } else if (std::isfinite(report.budget_kl_mean) && report.budget_kl_mean > 0) {
    caption += "The budget on mean KL (" + format_tick(report.budget_kl_mean) + ") is too far from every point to draw. ";
  } else if (!report.budget.empty()) {
    caption += "The budget (" + report.budget + ") is not on mean KL, so no line is drawn. ";
  }
  caption += "Decode time: " + decode_sources(report) + ".";
  if (!no_time.empty()) caption += " Not on the time chart (no decode time or KL): " + names_list(no_time) + ".";
  if (!no_size.empty()) caption += " Not on the size chart (no size or KL): " + names_list(no_size) + ".";
  out += "</div><figcaption>" + escape_xml(caption) + "</figcaption></figure>";

  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> classes;
  for (const auto& c : report.candidates) {
    rows.push_back({candidate_label(c), format_kl_with_error(c), format_significant(c.kl_p99, 3),
                    format_significant(c.kl_max, 3), format_fixed(c.top1_agreement, 4), format_fixed(c.ppl_ratio, 4),
                    format_bytes(c.linear_weight_bytes), format_ms(c.decode_ms_per_token),
                    c.decode_time_source.empty() ? std::string(kMissing) : c.decode_time_source});
    classes.push_back(c.is_recipe ? "recipe" : (c.is_baseline ? "baseline" : ""));
  }
  out += html_table({"model", "KL mean \xC2\xB1 s.e.", "KL p99", "KL max", "top-1 agreement", "PPL ratio",
                     "linear weights", "decode / token", "decode time from"},
                    rows, classes);
  return out + "</section>";
}

}  // namespace report
}  // namespace llmq
