// Activation outliers: for each linear-input site (attention input, o_proj input, ...), a heatmap of
// layers x channels whose colour is each channel's absmax over the median channel's of that layer,
// and a table of every site's max, median, ratio and top channels. Channels are drawn in bins, each
// the max of its channels, so 80 layers x 8192 channels stays a page of a few megabytes at most.
#include <algorithm>
#include <cmath>
#include <map>

#include "report/report_sections.hpp"
#include "report/report_text.hpp"
#include "report/svg_canvas.hpp"

namespace llmq {
namespace report {

namespace {

// Bounds on what the heatmaps draw, whatever the model: at most kMaxCells cells over all of them
// (each row gets kMaxCells / rows bins, between kMinBins and kMaxBins) and kMaxDrawnRows rows.
constexpr int64_t kMaxCells = 32768;
constexpr int64_t kMinBins = 16, kMaxBins = 256;
constexpr int64_t kMaxDrawnRows = kMaxCells / kMinBins;
constexpr int kLevels = 8;  // colour levels: ratio < 2, 2-4, ..., >= 128 (powers of two)
constexpr double kGridWidth = 640, kLeft = 78, kTop = 16, kBottom = 40, kLegendWidth = 150;

struct SiteGroup {
  std::string site;
  std::vector<const QuantReportOutlierSite*> rows;  // sorted by layer
  int64_t channels = 0;                             // the widest row
};

std::vector<SiteGroup> group_by_site(const std::vector<QuantReportOutlierSite>& outliers) {
  std::vector<SiteGroup> groups;
  std::map<std::string, size_t> index;
  for (const auto& o : outliers) {
    auto it = index.find(o.site);
    if (it == index.end()) {
      it = index.emplace(o.site, groups.size()).first;
      groups.push_back(SiteGroup{o.site, {}, 0});
    }
    SiteGroup& g = groups[it->second];
    g.rows.push_back(&o);
    g.channels = std::max(g.channels, static_cast<int64_t>(o.channel_absmax.size()));
  }
  for (auto& g : groups) {
    std::stable_sort(g.rows.begin(), g.rows.end(), [](const QuantReportOutlierSite* a, const QuantReportOutlierSite* b) {
      return a->layer < b->layer;
    });
  }
  return groups;
}

// -1: the bin holds a channel that is not finite; 0..kLevels-1: floor(log2(max / median)).
int level_of(double bin_max, bool nonfinite, double median) {
  if (nonfinite) return -1;
  if (!(median > 0)) return bin_max > 0 ? kLevels - 1 : 0;
  const double ratio = bin_max / median;
  if (!(ratio >= 2)) return 0;
  return static_cast<int>(std::min<double>(kLevels - 1, std::floor(std::log2(ratio))));
}

std::string level_color(int level) { return level < 0 ? "#000000" : ramp_color(static_cast<double>(level) / (kLevels - 1)); }

std::string site_heatmap(const SiteGroup& g, int64_t channels_per_bin, int64_t max_rows) {
  const int64_t bins = (g.channels + channels_per_bin - 1) / channels_per_bin;
  const int64_t n_rows = std::min<int64_t>(static_cast<int64_t>(g.rows.size()), max_rows);
  const double row_h = n_rows > 48 ? 6 : 12;
  const double cell_w = kGridWidth / static_cast<double>(std::max<int64_t>(bins, 1));
  const double grid_h = row_h * static_cast<double>(n_rows);
  const double height = kTop + std::max(grid_h, 200.0) + kBottom;
  SvgCanvas svg(kLeft + kGridWidth + kLegendWidth, height, g.site + ": channel absmax over the median, layers by channels");
  const int64_t label_every = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(11.0 / row_h)));
  for (int64_t r = 0; r < n_rows; ++r) {
    const QuantReportOutlierSite& row = *g.rows[static_cast<size_t>(r)];
    const std::vector<float>& v = row.channel_absmax;
    const double y = kTop + row_h * static_cast<double>(r);
    const int64_t row_bins = (static_cast<int64_t>(v.size()) + channels_per_bin - 1) / channels_per_bin;
    const ChannelSummary sum = summarize_channels(v);
    const std::string tip = outlier_row_label(row) + " " + g.site + ": max " + format_significant(sum.max, 3) +
                            ", median " + format_significant(sum.median, 3) + ", top channels " +
                            format_top_channels(sum, v);
    svg.rect(kLeft, y, row_bins > 0 ? cell_w * static_cast<double>(row_bins) : kGridWidth, row_h,
             row_bins > 0 ? level_color(0) : kMissingColor, tip);
    if (r % label_every == 0) svg.text(kLeft - 6, y + row_h - 1, shorten_label(outlier_row_label(row), 11), std::min(11.0, row_h + 4), "end");
    // Bins, then runs of equal level drawn as one rectangle (level 0 is the row's background).
    std::vector<int> levels(static_cast<size_t>(row_bins));
    int64_t best_bin = -1;
    double best = -1;
    for (int64_t b = 0; b < row_bins; ++b) {
      double m = 0;
      bool nonfinite = false;
      const int64_t end = std::min<int64_t>(static_cast<int64_t>(v.size()), (b + 1) * channels_per_bin);
      for (int64_t c = b * channels_per_bin; c < end; ++c) {
        const float x = v[static_cast<size_t>(c)];
        if (!std::isfinite(x)) {
          nonfinite = true;
        } else if (x > m) {
          m = x;
        }
      }
      levels[static_cast<size_t>(b)] = level_of(m, nonfinite, sum.median);
      if (m > best) best = m, best_bin = b;
    }
    for (int64_t b = 0; b < row_bins;) {
      int64_t e = b + 1;
      while (e < row_bins && levels[static_cast<size_t>(e)] == levels[static_cast<size_t>(b)]) ++e;
      if (levels[static_cast<size_t>(b)] != 0) {
        svg.rect(kLeft + cell_w * static_cast<double>(b), y, cell_w * static_cast<double>(e - b), row_h,
                 level_color(levels[static_cast<size_t>(b)]));
      }
      b = e;
    }
    if (best_bin >= 0 && best > 0) {
      svg.rect(kLeft + cell_w * static_cast<double>(best_bin), y, cell_w, row_h, "none", "", "#000000", 1.0);
    }
  }
  const double axis_y = kTop + grid_h;
  svg.line(kLeft, axis_y, kLeft + kGridWidth, axis_y, "#444444");
  for (int q = 0; q <= (g.channels > 0 ? 4 : 0); ++q) {
    const int64_t channel = g.channels * q / 4;
    const double x = kLeft + kGridWidth * q / 4.0;
    svg.line(x, axis_y, x, axis_y + 4, "#444444");
    svg.text(x, axis_y + 16, std::to_string(channel), 10, "middle");
  }
  svg.text(kLeft + kGridWidth / 2, axis_y + 32, "input channel", 11, "middle");
  const double lx = kLeft + kGridWidth + 18;
  svg.text(lx, kTop + 10, "absmax / median", 11);
  static const char* const kLevelNames[kLevels] = {"< 2x", "2-4x", "4-8x", "8-16x", "16-32x", "32-64x", "64-128x", ">= 128x"};
  for (int l = 0; l < kLevels; ++l) {
    const double ly = kTop + 18 + 16.0 * l;
    svg.rect(lx, ly, 16, 12, level_color(l), "", "#999999", 0.5);
    svg.text(lx + 22, ly + 10, kLevelNames[l], 10);
  }
  const double ly = kTop + 18 + 16.0 * kLevels;
  svg.rect(lx, ly, 16, 12, level_color(-1));
  svg.text(lx + 22, ly + 10, "not finite", 10);
  svg.rect(lx, ly + 16, 16, 12, kMissingColor);
  svg.text(lx + 22, ly + 26, "no channels", 10);
  svg.rect(lx, ly + 32, 16, 12, "none", "", "#000000", 1.0);
  svg.text(lx + 22, ly + 42, "largest bin", 10);
  return svg.finish();
}

}  // namespace

std::string outliers_section(const QuantReport& report) {
  std::string out = "<section id=\"outliers\"><h2>Activation outliers (absmax by input channel)</h2>";
  if (report.outliers.empty()) return out + "<p>No calibration statistics were given.</p></section>";
  const std::vector<SiteGroup> groups = group_by_site(report.outliers);
  const int64_t total_rows = static_cast<int64_t>(report.outliers.size());
  const int64_t bins_per_row = std::min(kMaxBins, std::max(kMinBins, kMaxCells / std::max<int64_t>(total_rows, 1)));
  int64_t rows_left = kMaxDrawnRows;
  for (const SiteGroup& g : groups) {
    const int64_t channels_per_bin = std::max<int64_t>(1, (g.channels + bins_per_row - 1) / bins_per_row);
    const int64_t bins = (g.channels + channels_per_bin - 1) / channels_per_bin;
    const int64_t drawn = std::min<int64_t>(rows_left, static_cast<int64_t>(g.rows.size()));
    out += "<h3>" + escape_xml(g.site.empty() ? std::string("(unnamed site)") : g.site) + "</h3>";
    if (drawn <= 0) {
      out += "<p>" + escape_xml("Not drawn: the heatmaps hold at most " + std::to_string(kMaxDrawnRows) +
                                " rows; the table below has every site.") + "</p>";
      continue;
    }
    rows_left -= drawn;
    std::string caption = "Rows: layers; columns: input channels 0-" + std::to_string(std::max<int64_t>(g.channels - 1, 0));
    if (channels_per_bin > 1) {
      caption += ", drawn in " + std::to_string(bins) + " bins of " + std::to_string(channels_per_bin) +
                 " channels, each bin the max of its channels";
    }
    caption += ". Colour: the channel's absmax over the median channel's absmax of that layer (the outliers "
               "per-tensor scaling has to cover); the largest bin of each layer is outlined.";
    if (drawn < static_cast<int64_t>(g.rows.size())) {
      caption += " Only the first " + std::to_string(drawn) + " of " + std::to_string(g.rows.size()) +
                 " layers are drawn (the heatmaps hold at most " + std::to_string(kMaxDrawnRows) +
                 " rows); the table below has every site.";
    }
    out += "<figure>" + site_heatmap(g, channels_per_bin, drawn) + "<figcaption>" + escape_xml(caption) +
           "</figcaption></figure>";
  }
  std::vector<std::vector<std::string>> rows;
  for (const SiteGroup& g : groups) {
    for (const QuantReportOutlierSite* o : g.rows) {
      const ChannelSummary s = summarize_channels(o->channel_absmax);
      rows.push_back({o->layer >= 0 ? std::to_string(o->layer) : std::string(kMissing), o->site, o->module,
                      std::to_string(s.channels), format_significant(s.max, 3), format_significant(s.median, 3),
                      format_significant(s.ratio, 3), format_top_channels(s, o->channel_absmax),
                      std::to_string(s.nonfinite)});
    }
  }
  out += "<h3>Every site</h3>" +
         html_table({"layer", "site", "module", "channels", "max absmax", "median", "max / median", "top channels",
                     "not finite"},
                    rows);
  return out + "</section>";
}

}  // namespace report
}  // namespace llmq
