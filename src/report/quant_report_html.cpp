// render_quant_report_html: the report as one HTML page with its figures inline (quant_report.hpp).
// The page is XHTML-style (every tag closed, attributes quoted, only XML's five entities), so it is
// well-formed XML after its doctype; it loads nothing, runs no script and names no font file.
#include "llmq/quant_report.hpp"
#include "report/report_sections.hpp"
#include "report/report_text.hpp"

namespace llmq {

namespace {

// No '<' or '&' in here: the page must stay well-formed XML.
const char* const kStyle =
    "body{font-family:sans-serif;margin:24px auto;max-width:1200px;color:#222;line-height:1.4}"
    "h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:32px}"
    "h3{font-size:15px}"
    "dl{display:grid;grid-template-columns:max-content auto;gap:2px 16px}dt{font-weight:bold}dd{margin:0}"
    "table{border-collapse:collapse;font-size:13px;margin:8px 0}"
    "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "th:first-child,td:first-child{text-align:left}"
    "thead th{background:#f2f2f2}"
    "tr.recipe td{background:#fde0dd;font-weight:bold}"
    "tr.baseline td{color:#555}"
    "figure{margin:8px 0}figcaption{font-size:13px;color:#444;max-width:1000px}"
    ".charts svg{margin-right:12px}"
    ".choice{font-size:15px}"
    "svg{display:inline-block;vertical-align:top}";

}  // namespace

Status render_quant_report_html(const QuantReport& report, std::string* out) {
  if (out == nullptr) return invalid_argument("render_quant_report_html: out is null");
  LLMQ_RETURN_IF_ERROR(check_quant_report(report));
  const std::string title = "Quantization report: " + (report.model.empty() ? std::string("model") : report.model);
  std::string page = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>";
  page += "<title>" + report::escape_xml(title) + "</title><style>" + kStyle + "</style></head><body>";
  page += "<h1>" + report::escape_xml(title) + "</h1>";
  page += report::summary_section(report);
  page += report::tradeoff_section(report);
  page += report::sensitivity_section(report);
  page += report::kept_section(report);
  page += report::outliers_section(report);
  page += "<p class=\"footer\">" +
          report::escape_xml("Written by llmq " + report.llmq_version + (report.date.empty() ? "" : " on " + report.date) +
                             ".") +
          "</p></body></html>\n";
  *out = std::move(page);
  return Status::ok_status();
}

}  // namespace llmq
