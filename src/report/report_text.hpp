// Text for the quantization report: escaping for HTML/XML and Markdown, and numbers printed with
// the precision each quantity deserves. Every formatter prints "—" for a value that is not finite
// (or a size that is unknown), so no "nan" or "inf" reaches the page.
#pragma once

#include <cstdint>
#include <string>

namespace llmq {
namespace report {

extern const char* const kMissing;  // "—", the em dash printed for a missing value

// Valid UTF-8 of `s` with every character XML 1.0 forbids (C0 controls but tab and newline, and
// bytes that are not UTF-8) replaced by U+FFFD, and & < > " ' written as references: safe in text
// and in a quoted attribute.
std::string escape_xml(const std::string& s);

// One Markdown table cell or line: & < > as references (no HTML can form), the punctuation Markdown
// would take as formatting (\ ` * _ [ ] |) backslash-escaped, line breaks as spaces.
std::string escape_markdown(const std::string& s);

// `s` cut to at most `max_bytes` bytes (never inside a UTF-8 character) plus "…" when it was longer.
std::string shorten_label(const std::string& s, size_t max_bytes);

std::string format_significant(double v, int digits);  // "0.00123", "1.2e-07"; "—" if not finite
std::string format_fixed(double v, int decimals);       // "0.9987"; "—" if not finite
std::string format_bytes(int64_t bytes);                // "1.23 GiB", "512 KiB"; "—" if < 0
std::string format_ms(double ms);                       // "12.3 ms", "0.456 ms"; "—" if not finite

// An SVG coordinate or length: "%.1f". Only for finite values; the SVG writer checks first.
std::string svg_number(double v);

}  // namespace report
}  // namespace llmq
