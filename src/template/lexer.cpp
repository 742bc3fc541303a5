// The chat-template lexer (see lexer.hpp). It follows jinja2's lexer rule by rule, because the
// whitespace a template prints is decided here: a byte of difference is a different prompt.
#include "template/lexer.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "template/value.hpp"

namespace llmq::tmpl {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xc0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xe0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    *out += static_cast<char>(0xf0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

class Lexer {
 public:
  explicit Lexer(std::string src) : s_(std::move(src)) {
    for (size_t p = 0; p < s_.size(); ++p)
      if (s_[p] == '\n') newlines_.push_back(static_cast<int64_t>(p));
  }

  std::vector<Token> run() {
    bool line_starting = true;  // jinja2: the previous tag's match ended with a newline, or none yet
    size_t pos = 0;
    while (pos < s_.size()) {
      size_t start = std::string::npos;
      for (size_t p = s_.find('{', pos); p != std::string::npos; p = s_.find('{', p + 1)) {
        if (p + 1 < s_.size() && (s_[p + 1] == '{' || s_[p + 1] == '%' || s_[p + 1] == '#')) {
          start = p;
          break;
        }
      }
      if (start == std::string::npos) {
        push_text(s_.substr(pos), pos);
        break;
      }
      std::string text = s_.substr(pos, start - pos);
      const char kind = s_[start + 1];
      const char marker = start + 2 < s_.size() ? s_[start + 2] : '\0';
      if (marker == '-') {
        text.erase(std::find_if_not(text.rbegin(), text.rend(), is_space).base(), text.end());
      } else if (marker != '+' && kind != '{') {
        // lstrip_blocks: only spaces between the line's start and a block or comment tag go.
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            std::all_of(text.begin() + static_cast<std::ptrdiff_t>(l_pos), text.end(), is_space))
          text.erase(l_pos);
      }
      push_text(text, pos);
      size_t p = start + 2 + ((marker == '-' || marker == '+') ? 1 : 0);
      if (kind == '#') {
        const size_t end = s_.find("#}", p);
        if (end == std::string::npos) throw error("missing end of comment tag", start);
        const char before = end > p ? s_[end - 1] : '\0';
        pos = end + 2;
        pos = after_tag(pos, before == '-' ? '-' : before == '+' ? '+' : 0, true);
      } else {
        Token begin = make(kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, start);
        out_.push_back(begin);
        pos = lex_tag(p, kind == '%');
      }
      line_starting = pos > 0 && s_[pos - 1] == '\n';
    }
    out_.push_back(make(Tok::kEof, s_.size()));
    return std::move(out_);
  }

 private:
  Token make(Tok type, size_t at) const {
    Token t;
    t.type = type;
    const auto it = std::lower_bound(newlines_.begin(), newlines_.end(), static_cast<int64_t>(at));
    t.line = (it - newlines_.begin()) + 1;
    t.col = static_cast<int64_t>(at) - (it == newlines_.begin() ? -1 : *(it - 1));
    return t;
  }
  TemplateError error(const std::string& what, size_t at) const {
    const Token t = make(Tok::kEof, at);
    return TemplateError(what, t.line, t.col);
  }
  void push_text(const std::string& text, size_t at) {
    if (text.empty()) return;
    Token t = make(Tok::kText, at);
    t.text = text;
    out_.push_back(std::move(t));
  }
  // After a tag's end: '-' eats all whitespace; trim_blocks eats one newline after %} and #}.
  size_t after_tag(size_t pos, char marker, bool block) const {
    if (marker == '-') {
      while (pos < s_.size() && is_space(s_[pos])) ++pos;
    } else if (marker != '+' && block && pos < s_.size() && s_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  size_t lex_tag(size_t p, bool block) {
    int64_t depth = 0;  // open ( [ {: a }} inside {{ {'a': {'b': 1}} }} does not end the tag
    while (true) {
      while (p < s_.size() && is_space(s_[p])) ++p;
      if (p >= s_.size()) throw error(block ? "unexpected end of template: missing %}" : "unexpected end of template: missing }}", p);
      if (depth == 0) {
        const std::string end = block ? "%}" : "}}";
        char marker = 0;
        size_t q = p;
        if ((s_[q] == '-' || s_[q] == '+') && s_.compare(q + 1, 2, end) == 0) marker = s_[q++];
        if (s_.compare(q, 2, end) == 0) {
          out_.push_back(make(block ? Tok::kBlockEnd : Tok::kVarEnd, p));
          return after_tag(q + 2, marker, block);
        }
      }
      const char c = s_[p];
      if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else if (is_digit(c)) {
        p = lex_number(p);
      } else if (is_name_start(c)) {
        size_t e = p;
        while (e < s_.size() && is_name_char(s_[e])) ++e;
        Token t = make(Tok::kName, p);
        t.text = s_.substr(p, e - p);
        out_.push_back(std::move(t));
        p = e;
      } else {
        static const char* const kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* two : kTwo)
          if (s_.compare(p, 2, two) == 0) op = two;
        if (op.empty()) {
          if (std::string("+-*/%~<>=.,:|()[]{}").find(c) == std::string::npos)
            throw error(std::string("unexpected character '") + c + "'", p);
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          if (depth == 0) throw error("unexpected '" + op + "'", p);
          --depth;
        }
        Token t = make(Tok::kOp, p);
        t.text = op;
        out_.push_back(std::move(t));
        p += op.size();
      }
    }
  }

  // Python's unicode-escape decoding, which jinja2 applies to every string literal.
  size_t lex_string(size_t p) {
    const char q = s_[p];
    Token t = make(Tok::kString, p);
    size_t k = p + 1;
    std::string v;
    while (true) {
      if (k >= s_.size()) throw error("unterminated string", p);
      const char c = s_[k];
      if (c == q) break;
      if (c != '\\') { v += c; ++k; continue; }
      if (k + 1 >= s_.size()) throw error("unterminated string", p);
      const char e = s_[k + 1];
      k += 2;
      switch (e) {
        case 'n': v += '\n'; break;
        case 't': v += '\t'; break;
        case 'r': v += '\r'; break;
        case '\\': v += '\\'; break;
        case '\'': v += '\''; break;
        case '"': v += '"'; break;
        case 'a': v += '\a'; break;
        case 'b': v += '\b'; break;
        case 'f': v += '\f'; break;
        case 'v': v += '\v'; break;
        case '\n': break;
        case 'x': case 'u': case 'U': {
          const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int d = 0; d < n; ++d) {
            const int h = k < s_.size() ? hex_value(s_[k]) : -1;
            if (h < 0) throw error("truncated \\" + std::string(1, e) + " escape in a string", k);
            cp = cp * 16 + static_cast<uint32_t>(h);
            ++k;
          }
          if (cp > 0x10ffff) throw error("illegal Unicode character in a string", k);
          append_utf8(cp, &v);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int d = 0; d < 2 && k < s_.size() && s_[k] >= '0' && s_[k] <= '7'; ++d, ++k)
              cp = cp * 8 + static_cast<uint32_t>(s_[k] - '0');
            append_utf8(cp, &v);
          } else {
            v += '\\';  // Python keeps an unknown escape as written
            v += e;
          }
      }
    }
    t.text = std::move(v);
    out_.push_back(std::move(t));
    return k + 1;
  }

  size_t lex_number(size_t p) {
    size_t e = p;
    auto digits = [&] { while (e < s_.size() && (is_digit(s_[e]) || (s_[e] == '_' && e + 1 < s_.size() && is_digit(s_[e + 1])))) ++e; };
    digits();
    bool is_float = false;
    if (e + 1 < s_.size() && s_[e] == '.' && is_digit(s_[e + 1])) {
      ++e;
      digits();
      is_float = true;
    }
    if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t x = e + 1;
      if (x < s_.size() && (s_[x] == '+' || s_[x] == '-')) ++x;
      if (x < s_.size() && is_digit(s_[x])) {
        e = x;
        digits();
        is_float = true;
      }
    }
    std::string text = s_.substr(p, e - p);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    Token t = make(is_float ? Tok::kFloat : Tok::kInt, p);
    t.text = text;
    if (is_float) {
      t.f = std::strtod(text.c_str(), nullptr);
    } else {
      errno = 0;
      t.i = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) throw error("integer literal out of range: " + text, p);
    }
    out_.push_back(std::move(t));
    return e;
  }

  std::string s_;
  std::vector<int64_t> newlines_;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> lex_template(const std::string& source) {
  // jinja2 reads \r\n and \r as \n, and (keep_trailing_newline=False) drops one final newline.
  std::string s;
  s.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      s += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      s += source[k];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return Lexer(std::move(s)).run();
}

}  // namespace llmq::tmpl
