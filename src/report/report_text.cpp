// Escaping and number formatting for the quantization report (report_text.hpp).
#include "report/report_text.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace llmq {
namespace report {

const char* const kMissing = "\xE2\x80\x94";

namespace {

const char* const kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The length of the valid UTF-8 sequence starting at s[i] (1-4), or 0 when it is not one
// (overlong forms, surrogates and code points above U+10FFFF count as invalid).
size_t utf8_sequence_length(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  uint32_t cp = 0;
  if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1Fu; }
  else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0Fu; }
  else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07u; }
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0u) != 0x80u) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3Fu);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
  if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
  if (cp == 0xFFFE || cp == 0xFFFF) return 0;  // not characters in XML 1.0
  return n;
}

// Appends s[i..] one character at a time through `one_ascii`, replacing what XML cannot hold.
template <typename AsciiFn>
std::string escape_with(const std::string& s, AsciiFn one_ascii) {
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(s, i);
    if (n == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    if (n > 1) {
      out.append(s, i, n);
      i += n;
      continue;
    }
    const char c = s[i++];
    const bool control = static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r';
    if (control || c == 0x7F) {
      out += kReplacement;
    } else {
      one_ascii(c, &out);
    }
  }
  return out;
}

bool append_xml_reference(char c, std::string* out) {
  switch (c) {
    case '&': *out += "&amp;"; return true;
    case '<': *out += "&lt;"; return true;
    case '>': *out += "&gt;"; return true;
    case '"': *out += "&quot;"; return true;
    case '\'': *out += "&#39;"; return true;
    default: return false;
  }
}

std::string printf_double(const char* format, int precision, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, precision, v);
  return buf;
}

}  // namespace

std::string escape_xml(const std::string& s) {
  return escape_with(s, [](char c, std::string* out) {
    if (!append_xml_reference(c, out)) out->push_back(c);
  });
}

std::string escape_markdown(const std::string& s) {
  return escape_with(s, [](char c, std::string* out) {
    switch (c) {
      case '&': *out += "&amp;"; return;  // no character reference or HTML tag can form
      case '<': *out += "&lt;"; return;
      case '>': *out += "&gt;"; return;
      case '\\': case '`': case '*': case '_': case '[': case ']': case '|':
        out->push_back('\\');
        out->push_back(c);
        return;
      case '\n': case '\r': case '\t':
        out->push_back(' ');
        return;
      default:
        out->push_back(c);
    }
  });
}

std::string shorten_label(const std::string& s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0u) == 0x80u) --cut;  // not inside a character
  return s.substr(0, cut) + "\xE2\x80\xA6";
}

std::string format_significant(double v, int digits) {
  if (!std::isfinite(v)) return kMissing;
  if (v == 0) return "0";
  const double magnitude = std::fabs(v);
  // Plain decimals between 1e-3 and 1e6 read better than exponents ("1000", not "%g"'s "1e+03");
  // outside, "%.*e" keeps the digits.
  if (magnitude >= 1e-3 && magnitude < 1e6) {
    const int decimals = std::max(0, digits - 1 - static_cast<int>(std::floor(std::log10(magnitude))));
    return printf_double("%.*f", decimals, v);
  }
  return printf_double("%.*e", digits - 1, v);
}

std::string format_fixed(double v, int decimals) {
  if (!std::isfinite(v)) return kMissing;
  return printf_double("%.*f", decimals, v);
}

std::string format_bytes(int64_t bytes) {
  if (bytes < 0) return kMissing;
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 6) {
    v /= 1024.0;
    ++unit;
  }
  if (unit == 0) return std::to_string(bytes) + " B";
  return printf_double("%.*f", v < 10 ? 2 : (v < 100 ? 1 : 0), v) + " " + kUnits[unit];
}

std::string format_ms(double ms) {
  if (!std::isfinite(ms)) return kMissing;
  return format_significant(ms, 3) + " ms";
}

std::string svg_number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  // "-0.0" reads as a glitch; the value is zero.
  if (std::string(buf) == "-0.0") return "0.0";
  return buf;
}

}  // namespace report
}  // namespace llmq
