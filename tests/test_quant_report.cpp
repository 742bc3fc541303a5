// The quantization report's renderers (issue 27): the HTML is well-formed XML with its figures,
// nothing not finite reaches a coordinate, every string is escaped, the recipe is highlighted, the
// page stays bounded for 80 layers x 8192 channels, and bad reports are refused by field.
// tests/check_report_html.py parses the example this writes with Python's XML parser (ctest
// quant_report_html_strict).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "llmq/quant_report.hpp"
#include "report/report_text.hpp"
#include "report/svg_canvas.hpp"

namespace llmq {
namespace {

const char* const kHostile = "</svg><script>alert(\"x&y\")</script><!-- '";
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();
// The page for 80 layers x 4 sites x 8192 channels of random absmax (every bin drawn, the worst
// case for the heatmaps) must stay under this: a browser opens it at once, and it can be mailed.
constexpr size_t kMaxPageBytes = 3u << 20;

const char* const kSites[] = {"attention input", "o_proj input", "mlp input", "down_proj input"};

QuantReportCandidate candidate(const std::string& name, double kl, double ms, int64_t bytes) {
  QuantReportCandidate c;
  c.name = name;
  c.kl_mean = kl;
  c.kl_mean_stderr = kl / 20;
  c.kl_p99 = kl * 8;
  c.kl_max = kl * 40;
  c.top1_agreement = 1 - kl * 3;
  c.ppl_ratio = 1 + kl;
  c.linear_weight_bytes = bytes;
  c.decode_ms_per_token = ms;
  c.decode_time_source = "bytes model at 3350 GB/s";
  return c;
}

// A report like `llmq recipe` would write, with random numbers, outlier channels, values that are
// not finite, and hostile strings in every place a string goes.
QuantReport example_report(uint64_t seed, int layers, int channels) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  QuantReport r;
  r.model = std::string("models/") + kHostile;
  r.date = "2026-12-01";
  r.llmq_version = "0.1.0";
  r.device = "bytes model at 3350 GB/s (H100 HBM3)";
  r.eval_data = "16 sequences x 128 tokens";
  r.budget = "kl<=0.01 & top1 > 0.9";
  r.objective = "speed";
  r.budget_kl_mean = 0.01;
  QuantReportCandidate base = candidate("bf16", 0.0, 10.0, int64_t{14} << 30);
  base.is_baseline = true;
  base.decode_time_source = "measured on NVIDIA H100 80GB HBM3";
  r.candidates.push_back(base);
  const char* const schemes[] = {"fp8-dynamic", "fp8-tensor-static", "int8-w8a8", "fp8-block"};
  for (const char* s : schemes) r.candidates.push_back(candidate(s, 1e-3 * (1 + 30 * unit(rng)), 5 + unit(rng), int64_t{7} << 30));
  r.candidates.push_back(candidate(kHostile, kNaN, kInf, -1));             // nothing measured
  r.candidates.push_back(candidate("int8-weight-only", 0.02, kNaN, int64_t{7} << 30));  // no decode time
  QuantReportCandidate recipe = candidate("recipe <mixed>", 0.004, 5.5, int64_t{8} << 30);
  recipe.is_recipe = true;
  r.candidates.push_back(recipe);
  r.sensitivity.schemes = {"fp8-dynamic", "int8-w8a8", kHostile};
  for (int l = 0; l < layers; ++l) {
    r.sensitivity.units.push_back("layer " + std::to_string(l) + " attention");
    r.sensitivity.units.push_back("layer " + std::to_string(l) + " mlp");
  }
  r.sensitivity.units.push_back("lm_head");
  for (size_t i = 0; i < r.sensitivity.units.size() * r.sensitivity.schemes.size(); ++i) {
    r.sensitivity.kl.push_back(i % 17 == 5 ? kNaN : std::pow(10.0, -6 + 4 * unit(rng)));
  }
  r.sensitivity.kl[1] = 0.0;
  r.sensitivity.kl[2] = kInf;
  for (int l = 0; l < layers; ++l) {
    for (const char* site : kSites) {
      QuantReportOutlierSite o;
      o.layer = l;
      o.site = site;
      o.module = "model.layers." + std::to_string(l) + "." + site;
      o.channel_absmax.resize(static_cast<size_t>(channels));
      // Sparse spikes of every size (1 to 512 times the rest), so neighbouring bins differ and
      // the heatmaps draw nearly every bin: the worst case for the page's size.
      for (auto& v : o.channel_absmax) {
        v = static_cast<float>(0.5 + unit(rng));
        if (rng() % 40 == 0) v *= static_cast<float>(1 << (rng() % 10));
      }
      o.channel_absmax[static_cast<size_t>(rng() % static_cast<uint64_t>(channels))] = 300.0f;  // an outlier channel
      if (l == 1) o.channel_absmax[3] = std::numeric_limits<float>::infinity();
      r.outliers.push_back(std::move(o));
    }
  }
  QuantReportOutlierSite head;
  head.site = kHostile;
  head.module = "lm_head";  // layer -1: outside the layers; no channels at all
  r.outliers.push_back(head);
  r.kept = {{"lm_head", "kept by default (vLLM does not quantize it)"}, {"model.layers.0.mlp", kHostile}};
  r.assignment = {{"layer 0 attention", "fp8-dynamic"}, {"layer 0 mlp", ""}, {"lm_head", ""}};
  r.notes = {std::string("A note with ") + kHostile};
  return r;
}

std::string render_html(const QuantReport& r) {
  std::string html;
  const Status st = render_quant_report_html(r, &html);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return html;
}

// A strict reading of the markup: every tag closed in order, only XML's five entities (and numeric
// references), no raw '<' or '&' in text. Returns "" or what is wrong and where.
std::string markup_problem(const std::string& page) {
  std::vector<std::string> open;
  size_t i = page.find("<html");
  if (page.rfind("<!DOCTYPE html>\n", 0) != 0 || i == std::string::npos) return "no doctype then <html>";
  const std::regex entity("^&(amp|lt|gt|quot|apos|#[0-9]+|#x[0-9a-fA-F]+);");
  for (; i < page.size(); ++i) {
    if (page[i] == '&') {
      if (!std::regex_search(page.substr(i, 12), entity)) return "bad entity at " + std::to_string(i);
      continue;
    }
    if (page[i] == '>') return "stray '>' at " + std::to_string(i);  // escape_xml writes &gt;
    if (page[i] != '<') continue;
    const size_t end = page.find('>', i);
    if (end == std::string::npos) return "unclosed tag at " + std::to_string(i);
    const std::string tag = page.substr(i + 1, end - i - 1);
    if (tag.find('<') != std::string::npos) return "'<' inside a tag at " + std::to_string(i);
    const bool closing = tag[0] == '/';
    const bool self_closing = tag.back() == '/';
    const std::string name = tag.substr(closing ? 1 : 0, tag.find_first_of(" /", 1) - (closing ? 1 : 0));
    if (closing) {
      if (open.empty() || open.back() != name) return "</" + name + "> closes <" + (open.empty() ? "" : open.back()) + ">";
      open.pop_back();
    } else if (!self_closing) {
      open.push_back(name);
    }
    i = end;
  }
  return open.empty() ? "" : "<" + open.back() + "> never closed";
}

std::vector<std::string> all_matches(const std::string& s, const std::string& pattern) {
  std::vector<std::string> out;
  const std::regex re(pattern);
  for (auto it = std::sregex_iterator(s.begin(), s.end(), re); it != std::sregex_iterator(); ++it) out.push_back((*it)[0]);
  return out;
}

TEST(QuantReport, HtmlIsWellFormedWithFiniteCoordinatesAndEscapedStrings) {
  const uint64_t seed = 7;
  const std::string html = render_html(example_report(seed, 6, 300));
  SCOPED_TRACE("seed " + std::to_string(seed) + ", 6 layers x 300 channels");
  EXPECT_EQ(markup_problem(html), "");
  // Every number-valued attribute is a finite number.
  const std::regex numeric_attr(R"re( (x|y|x1|y1|x2|y2|cx|cy|r|width|height|font-size|stroke-width)="([^"]*)")re");
  int64_t attributes = 0;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), numeric_attr); it != std::sregex_iterator(); ++it) {
    const std::string v = (*it)[2];
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    EXPECT_TRUE(*end == '\0' && std::isfinite(d)) << (*it)[0];
    ++attributes;
  }
  EXPECT_GT(attributes, 1000);
  for (const auto& a : all_matches(html, R"re((viewBox|points|transform)="[^"]*")re")) {
    EXPECT_EQ(a.find("nan"), std::string::npos) << a;
    EXPECT_EQ(a.find("inf"), std::string::npos) << a;
  }
  // Every chart: width, height and viewBox. Four sites' heatmaps, the sensitivity map, two scatters.
  const auto svgs = all_matches(html, "<svg [^>]*>");
  EXPECT_EQ(svgs.size(), 4u + 1u + 2u + 1u);  // + the hostile site's (empty) heatmap
  for (const auto& s : svgs) {
    EXPECT_NE(s.find(" width=\""), std::string::npos) << s;
    EXPECT_NE(s.find(" height=\""), std::string::npos) << s;
    EXPECT_NE(s.find(" viewBox=\"0 0 "), std::string::npos) << s;
  }
  // Nothing to fetch: the only URL is the SVG namespace.
  for (const auto& url : all_matches(html, "https?://[^\" ]*")) EXPECT_EQ(url, "http://www.w3.org/2000/svg");
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find(kHostile), std::string::npos);
  EXPECT_NE(html.find(report::escape_xml(kHostile)), std::string::npos);
  // Values not measured are dashes in the tables, never "nan" or "inf".
  EXPECT_TRUE(all_matches(html, "<td>-?(nan|inf)").empty());
  EXPECT_NE(html.find("<td>\xE2\x80\x94</td>"), std::string::npos);
}

TEST(QuantReport, TheRecipeIsHighlightedOnce) {
  const QuantReport r = example_report(11, 3, 64);
  const std::string html = render_html(r);
  const auto recipe_rows = all_matches(html, "<tr class=\"recipe\"><td>[^<]*</td>");
  ASSERT_EQ(recipe_rows.size(), 1u);
  EXPECT_EQ(recipe_rows[0], "<tr class=\"recipe\"><td>recipe &lt;mixed&gt; (chosen)</td>");
  // In both charts its point is the large red one.
  EXPECT_EQ(all_matches(html, "<circle [^>]*r=\"7.0\" fill=\"#d62728\"").size(), 2u);
  QuantReport none = r;
  for (auto& c : none.candidates) c.is_recipe = false;
  const std::string plain = render_html(none);
  EXPECT_TRUE(all_matches(plain, "<tr class=\"recipe\">").empty());
  EXPECT_NE(plain.find("No recipe is among the candidates"), std::string::npos);
}

TEST(QuantReport, MarkdownHasOneRowPerCandidateAndEscapes) {
  const QuantReport r = example_report(3, 4, 128);
  std::string md;
  ASSERT_TRUE(render_quant_report_markdown(r, &md).ok());
  const size_t start = md.find("## Candidates");
  const size_t end = md.find("## ", start + 3);
  ASSERT_NE(start, std::string::npos);
  const std::string table = md.substr(start, end - start);
  const auto rows = all_matches(table, "\n\\|[^\n]*");
  ASSERT_EQ(rows.size(), r.candidates.size() + 2) << table;  // the header and its rule
  EXPECT_EQ(all_matches(table, "\n\\| \\*\\*recipe &lt;mixed&gt; \\(chosen\\)\\*\\*").size(), 1u) << table;
  EXPECT_EQ(md.find("<script"), std::string::npos);
  EXPECT_EQ(md.find("nan"), std::string::npos);
  // A pipe in a name cannot split a cell: every row of the table has the header's column count.
  QuantReport piped = r;
  piped.candidates[1].name = "a|b\nc";
  ASSERT_TRUE(render_quant_report_markdown(piped, &md).ok());
  EXPECT_NE(md.find("| a\\|b c |"), std::string::npos);
}

TEST(QuantReport, PageSizeIsBoundedFor80LayersOf8192Channels) {
  const std::string html = render_html(example_report(5, 80, 8192));
  EXPECT_LT(html.size(), kMaxPageBytes);
  EXPECT_EQ(markup_problem(html), "");
  // 320 rows share 32768 cells: 102 bins per row of 81 channels, and the caption says so.
  EXPECT_NE(html.find("drawn in 102 bins of 81 channels, each bin the max of its channels"), std::string::npos);
}

TEST(QuantReport, BinsKeepTheirLargestChannel) {
  QuantReport r;
  QuantReportOutlierSite o;
  o.layer = 0;
  o.site = "mlp input";
  o.channel_absmax.assign(8192, 1.0f);
  r.outliers.push_back(o);
  const std::string top_color = "fill=\"" + report::ramp_color(1.0) + "\"";
  std::string flat = render_html(r);
  r.outliers[0].channel_absmax[5000] = 1000.0f;  // one channel, inside a bin of 32
  std::string spiked = render_html(r);
  // The legend's swatch, plus the bin holding channel 5000 when it is there.
  EXPECT_EQ(all_matches(flat, top_color).size(), 1u);
  EXPECT_EQ(all_matches(spiked, top_color).size(), 2u);
  EXPECT_NE(spiked.find("<td>5000 (1000), 0 (1.00), 1 (1.00)</td>"), std::string::npos);
}

TEST(QuantReport, RefusesBadReportsNamingTheField) {
  std::string out = "untouched";
  QuantReport r = example_report(1, 2, 16);
  r.sensitivity.kl.pop_back();
  Status st = render_quant_report_html(r, &out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("sensitivity.kl"), std::string::npos) << st.message();
  r = example_report(1, 2, 16);
  r.candidates[1].is_recipe = true;
  st = render_quant_report_markdown(r, &out);
  EXPECT_NE(st.message().find("candidates: two are flagged as the recipe"), std::string::npos) << st.message();
  r = example_report(1, 2, 16);
  r.outliers[3].channel_absmax[9] = -2.0f;
  st = render_quant_report_html(r, &out);
  EXPECT_NE(st.message().find("outliers[3]"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("channel_absmax[9]"), std::string::npos) << st.message();
  EXPECT_EQ(out, "untouched");
}

TEST(QuantReport, EmptyReportStillRenders) {
  const std::string html = render_html(QuantReport{});
  EXPECT_EQ(markup_problem(html), "");
  EXPECT_NE(html.find("No sensitivity was measured"), std::string::npos);
}

TEST(QuantReportText, EscapesWhatXmlCannotHold) {
  EXPECT_EQ(report::escape_xml("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
  // A control character and bytes that are not UTF-8 (a lone continuation byte, an overlong '/',
  // a cut-off sequence) each become U+FFFD; valid multi-byte characters stay.
  EXPECT_EQ(report::escape_xml(std::string("x\x01y\x80z\xC0\xAF\xE2\x82", 9) + "\xC3\xA9"),
            "x\xEF\xBF\xBDy\xEF\xBF\xBDz\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xC3\xA9");
  EXPECT_EQ(report::escape_markdown("*a*_|`[x]\\"), "\\*a\\*\\_\\|\\`\\[x\\]\\\\");
  // Labels are cut between characters, never inside one.
  EXPECT_EQ(report::shorten_label("ab\xC3\xA9", 3), "ab\xE2\x80\xA6");
  EXPECT_EQ(report::shorten_label("ab\xC3\xA9", 4), "ab\xC3\xA9");
}

TEST(QuantReportText, NumbersHaveTheirPrecisionAndMissingIsADash) {
  EXPECT_EQ(report::format_significant(1000, 3), "1000");
  EXPECT_EQ(report::format_significant(0.00123456, 3), "0.00123");
  EXPECT_EQ(report::format_significant(1.5e-7, 2), "1.5e-07");
  EXPECT_EQ(report::format_significant(kNaN, 3), "\xE2\x80\x94");
  EXPECT_EQ(report::format_significant(-kInf, 3), "\xE2\x80\x94");
  EXPECT_EQ(report::format_bytes(-1), "\xE2\x80\x94");
  EXPECT_EQ(report::format_bytes(int64_t{7} << 30), "7.00 GiB");
  EXPECT_EQ(report::format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(report::format_ms(kNaN), "\xE2\x80\x94");
}

TEST(QuantReportText, SvgDropsElementsWithNonFiniteCoordinates) {
  report::SvgCanvas svg(100, 50, "test");
  svg.rect(1, 2, 3, 4, "#000000");
  svg.rect(kNaN, 2, 3, 4, "#000000");
  svg.line(0, 0, kInf, 1, "#000000");
  svg.circle(1, 1, -kInf, "#000000", "none", 1);
  svg.text(1, kNaN, "t", 10);
  svg.polygon({{0, 0}, {1, kNaN}}, "#000000");
  EXPECT_EQ(svg.dropped(), 5);
  const std::string s = svg.finish();
  EXPECT_EQ(s.find("nan"), std::string::npos);
  EXPECT_EQ(s.find("inf"), std::string::npos);
  EXPECT_EQ(all_matches(s, "<rect ").size(), 2u);  // the background and the one finite rectangle
}

// Writes an example page and its Markdown for eyeballing and for tests/check_report_html.py:
// to $LLMQ_QUANT_REPORT_OUT if set (the checker's temporary folder), else beside this binary.
TEST(QuantReportExample, WritesTheExamplePage) {
  const char* dir = std::getenv("LLMQ_QUANT_REPORT_OUT");
  const std::string base = std::string(dir != nullptr ? dir : LLMQ_QUANT_REPORT_EXAMPLE_DIR) + "/quant_report_example";
  const QuantReport r = example_report(2026, 12, 2048);
  std::string html, md;
  ASSERT_TRUE(render_quant_report_html(r, &html).ok());
  ASSERT_TRUE(render_quant_report_markdown(r, &md).ok());
  for (const auto& [path, text] : {std::pair<std::string, const std::string*>{base + ".html", &html}, {base + ".md", &md}}) {
    std::ofstream f(path, std::ios::binary);
    f << *text;
    f.close();
    ASSERT_TRUE(f.good()) << path;
  }
  std::ifstream back(base + ".html", std::ios::binary);
  const std::string read((std::istreambuf_iterator<char>(back)), std::istreambuf_iterator<char>());
  EXPECT_EQ(read, html);
}

}  // namespace
}  // namespace llmq
