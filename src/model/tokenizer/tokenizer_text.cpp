// Text handling for the tokenizers: UTF-8 decoding, the character classes of the GPT-2 / Llama 3
// split patterns, GPT-2's byte <-> unicode map, and the split patterns themselves written out by
// hand (std::regex has no \p{L}; the patterns are simple enough to follow alternative by
// alternative, which also makes their backtracking explicit).
#include <algorithm>
#include <iterator>

#include "model/tokenizer/tokenizer_bpe.hpp"

namespace llmq::tokenizer_detail {
namespace {

bool is_continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

// Non-ASCII code points that are not letters, as [first, last] ranges in ascending order. Not the
// full Unicode tables: the spaces (all of Unicode's White_Space), the digits and number forms of
// Latin-1, Arabic, Devanagari, CJK and fullwidth text, and the punctuation and symbol blocks that
// real text uses (dashes, quotes, currency, arrows, math, box drawing, emoji). Everything not
// listed is a letter, which is right for the letters of every script and wrong only for rarer
// marks and digits, where it changes how text splits into words, never what it decodes to.
struct ClassRange {
  uint32_t first;
  uint32_t last;
  CharClass cls;
};
constexpr ClassRange kNonAsciiClasses[] = {
    {0x0080, 0x0084, CharClass::kOther},   // C1 controls
    {0x0085, 0x0085, CharClass::kSpace},   // next line
    {0x0086, 0x009F, CharClass::kOther},   // C1 controls
    {0x00A0, 0x00A0, CharClass::kSpace},   // no-break space
    {0x00A1, 0x00A9, CharClass::kOther},   // ¡ ¢ £ ¤ ¥ ¦ § ¨ ©
    {0x00AB, 0x00B1, CharClass::kOther},   // « ¬ soft hyphen ® ¯ ° ±
    {0x00B2, 0x00B3, CharClass::kNumber},  // ² ³
    {0x00B4, 0x00B4, CharClass::kOther},   // ´
    {0x00B6, 0x00B8, CharClass::kOther},   // ¶ · ¸
    {0x00B9, 0x00B9, CharClass::kNumber},  // ¹
    {0x00BB, 0x00BB, CharClass::kOther},   // »
    {0x00BC, 0x00BE, CharClass::kNumber},  // ¼ ½ ¾
    {0x00BF, 0x00BF, CharClass::kOther},   // ¿
    {0x00D7, 0x00D7, CharClass::kOther},   // ×
    {0x00F7, 0x00F7, CharClass::kOther},   // ÷
    {0x0300, 0x036F, CharClass::kOther},   // combining diacritical marks (\p{M})
    {0x0660, 0x0669, CharClass::kNumber},  // Arabic-Indic digits
    {0x06F0, 0x06F9, CharClass::kNumber},  // extended Arabic-Indic digits
    {0x0966, 0x096F, CharClass::kNumber},  // Devanagari digits
    {0x1680, 0x1680, CharClass::kSpace},   // Ogham space mark
    {0x2000, 0x200A, CharClass::kSpace},   // en quad .. hair space
    {0x200B, 0x2027, CharClass::kOther},   // zero-width chars, dashes, quotes, bullets
    {0x2028, 0x2029, CharClass::kSpace},   // line / paragraph separator
    {0x202A, 0x202E, CharClass::kOther},   // bidi controls
    {0x202F, 0x202F, CharClass::kSpace},   // narrow no-break space
    {0x2030, 0x205E, CharClass::kOther},   // per mille, primes, ‹ › ‼ ...
    {0x205F, 0x205F, CharClass::kSpace},   // medium mathematical space
    {0x2060, 0x206F, CharClass::kOther},   // word joiner, invisible operators
    {0x2070, 0x2070, CharClass::kNumber},  // superscript zero
    {0x2074, 0x2079, CharClass::kNumber},  // superscript four .. nine
    {0x207A, 0x207E, CharClass::kOther},   // superscript signs
    {0x2080, 0x2089, CharClass::kNumber},  // subscript digits
    {0x208A, 0x208E, CharClass::kOther},   // subscript signs
    {0x20A0, 0x20FF, CharClass::kOther},   // currency, combining marks for symbols
    {0x2150, 0x2182, CharClass::kNumber},  // vulgar fractions, Roman numerals
    {0x2185, 0x2189, CharClass::kNumber},  // Roman numeral forms
    {0x2190, 0x245F, CharClass::kOther},   // arrows, math operators, technical, control pictures
    {0x2460, 0x249B, CharClass::kNumber},  // circled and parenthesized numbers
    {0x249C, 0x24E9, CharClass::kOther},   // parenthesized and circled letters (symbols)
    {0x24EA, 0x24FF, CharClass::kNumber},  // more circled numbers
    {0x2500, 0x2775, CharClass::kOther},   // box drawing, shapes, misc symbols, dingbats
    {0x2776, 0x2793, CharClass::kNumber},  // dingbat circled digits
    {0x2794, 0x2BFF, CharClass::kOther},   // arrows, math symbols, misc symbols and arrows
    {0x2E00, 0x2E7F, CharClass::kOther},   // supplemental punctuation
    {0x3000, 0x3000, CharClass::kSpace},   // ideographic space
    {0x3001, 0x3004, CharClass::kOther},   // 、 。 〃 〄
    {0x3007, 0x3007, CharClass::kNumber},  // 〇
    {0x3008, 0x3020, CharClass::kOther},   // CJK brackets, marks
    {0x3021, 0x3029, CharClass::kNumber},  // Hangzhou numerals
    {0x302A, 0x3030, CharClass::kOther},   // tone marks, wavy dash
    {0x3038, 0x303A, CharClass::kNumber},  // Hangzhou numerals
    {0x303D, 0x303F, CharClass::kOther},
    {0xE000, 0xF8FF, CharClass::kOther},   // private use
    {0xFE00, 0xFE0F, CharClass::kOther},   // variation selectors
    {0xFE10, 0xFE6F, CharClass::kOther},   // vertical, compatibility and small forms
    {0xFEFF, 0xFEFF, CharClass::kOther},   // byte order mark
    {0xFF01, 0xFF0F, CharClass::kOther},   // fullwidth punctuation
    {0xFF10, 0xFF19, CharClass::kNumber},  // fullwidth digits
    {0xFF1A, 0xFF20, CharClass::kOther},
    {0xFF3B, 0xFF40, CharClass::kOther},
    {0xFF5B, 0xFF65, CharClass::kOther},
    {0xFFE0, 0xFFFF, CharClass::kOther},   // fullwidth signs, specials (U+FFFD)
    {0x1F000, 0x1FAFF, CharClass::kOther}, // mahjong, cards, emoji, pictographs
    {0xE0000, 0xE007F, CharClass::kOther}, // tags
};

CharClass classify_ascii(uint32_t c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CharClass::kLetter;
  if (c >= '0' && c <= '9') return CharClass::kNumber;
  if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return CharClass::kSpace;  // \t \n \v \f \r
  return CharClass::kOther;
}

// The code points of `text` with their classes, and the byte offset where each one starts (plus
// the end), so a word of code points [i, j) is the bytes [offset[i], offset[j]).
struct Decoded {
  std::vector<uint32_t> cp;
  std::vector<CharClass> cls;
  std::vector<int64_t> offset;
};

Decoded decode_text(const std::string& text) {
  Decoded d;
  for (const CodePoint& c : utf8_code_points(text)) {
    d.cp.push_back(c.value);
    d.cls.push_back(classify(c.value));
    d.offset.push_back(c.begin);
  }
  d.offset.push_back(static_cast<int64_t>(text.size()));
  return d;
}

bool is_newline(uint32_t c) { return c == '\r' || c == '\n'; }

uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c; }

// Length in code points of the contraction 's 't 're 've 'm 'll 'd at i, or 0.
int64_t contraction_at(const Decoded& d, int64_t i, bool ignore_case) {
  const int64_t n = static_cast<int64_t>(d.cp.size());
  if (d.cp[i] != '\'' || i + 1 >= n) return 0;
  auto at = [&](int64_t k) { return ignore_case ? ascii_lower(d.cp[k]) : d.cp[k]; };
  const uint32_t a = at(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= n) return 0;
  const uint32_t b = at(i + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

int64_t run_end(const Decoded& d, int64_t i, CharClass cls) {
  const int64_t n = static_cast<int64_t>(d.cls.size());
  while (i < n && d.cls[i] == cls) ++i;
  return i;
}

// The whitespace alternatives both patterns end with: \s+(?!\S)|\s+. On a run of whitespace
// followed by a non-space, the first backs off one character so the last space can start the
// next word (" world"); a single whitespace character before a non-space falls to \s+.
int64_t whitespace_end(const Decoded& d, int64_t i) {
  const int64_t n = static_cast<int64_t>(d.cls.size());
  const int64_t k = run_end(d, i, CharClass::kSpace);
  if (k == n || k - i == 1) return k;
  return k - 1;
}

// Where the GPT-2 pattern's match starting at i ends.
int64_t gpt2_match_end(const Decoded& d, int64_t i) {
  const int64_t n = static_cast<int64_t>(d.cp.size());
  if (const int64_t len = contraction_at(d, i, /*ignore_case=*/false)) return i + len;
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional leading space, then a run of one class.
  const int64_t start = (d.cp[i] == ' ' && i + 1 < n) ? i + 1 : i;
  if (d.cls[start] != CharClass::kSpace) return run_end(d, start, d.cls[start]);
  return whitespace_end(d, i);
}

// Where the Llama 3 pattern's match starting at i ends (digit runs of at most max_digits).
int64_t llama3_match_end(const Decoded& d, int64_t i, int64_t max_digits) {
  const int64_t n = static_cast<int64_t>(d.cp.size());
  if (const int64_t len = contraction_at(d, i, /*ignore_case=*/true)) return i + len;
  const CharClass c = d.cls[i];
  // [^\r\n\p{L}\p{N}]?\p{L}+: a word takes one preceding non-newline, non-digit character
  // (" hello", "(hello", "\thello").
  if (c == CharClass::kLetter) return run_end(d, i, CharClass::kLetter);
  if (c != CharClass::kNumber && !is_newline(d.cp[i]) && i + 1 < n && d.cls[i + 1] == CharClass::kLetter)
    return run_end(d, i + 1, CharClass::kLetter);
  // \p{N}{1,k}
  if (c == CharClass::kNumber) {
    int64_t k = i;
    while (k < n && k - i < max_digits && d.cls[k] == CharClass::kNumber) ++k;
    return k;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*': punctuation keeps the newlines after it.
  const int64_t start = (d.cp[i] == ' ' && i + 1 < n) ? i + 1 : i;
  if (d.cls[start] == CharClass::kOther) {
    int64_t k = run_end(d, start, CharClass::kOther);
    while (k < n && is_newline(d.cp[k])) ++k;
    return k;
  }
  // \s*[\r\n]+: whitespace up to and including its last newline.
  const int64_t k = run_end(d, i, CharClass::kSpace);
  for (int64_t j = k - 1; j >= i; --j)
    if (is_newline(d.cp[j])) return j + 1;
  return whitespace_end(d, i);
}

}  // namespace

std::vector<CodePoint> utf8_code_points(const std::string& s) {
  std::vector<CodePoint> out;
  const int64_t n = static_cast<int64_t>(s.size());
  int64_t i = 0;
  while (i < n) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    int64_t len = 0;
    uint32_t cp = 0;
    uint32_t min_value = 0;
    if (b0 < 0x80) {
      len = 1, cp = b0;
    } else if ((b0 & 0xE0) == 0xC0) {
      len = 2, cp = b0 & 0x1Fu, min_value = 0x80;
    } else if ((b0 & 0xF0) == 0xE0) {
      len = 3, cp = b0 & 0x0Fu, min_value = 0x800;
    } else if ((b0 & 0xF8) == 0xF0) {
      len = 4, cp = b0 & 0x07u, min_value = 0x10000;
    }
    bool valid = len > 0 && i + len <= n;
    for (int64_t k = 1; valid && k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      valid = is_continuation(b);
      cp = (cp << 6) | (b & 0x3Fu);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not characters.
    valid = valid && cp >= min_value && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    if (!valid) {
      out.push_back({kInvalidCodePoint, i, 1});
      ++i;
      continue;
    }
    out.push_back({cp, i, len});
    i += len;
  }
  return out;
}

std::string utf8_encode(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

CharClass classify(uint32_t cp) {
  if (cp < 0x80) return classify_ascii(cp);
  const auto it = std::upper_bound(std::begin(kNonAsciiClasses), std::end(kNonAsciiClasses), cp,
                                   [](uint32_t v, const ClassRange& r) { return v < r.first; });
  if (it != std::begin(kNonAsciiClasses)) {
    const ClassRange& r = *std::prev(it);
    if (cp <= r.last) return r.cls;
  }
  return CharClass::kLetter;
}

namespace {
// The code point each byte maps to: printable Latin-1 bytes stand for themselves so common text
// stays readable in the vocabulary; the others are moved past 255 so no byte maps to whitespace
// or a control character (which BPE vocab files cannot hold).
std::array<uint32_t, 256> byte_code_points() {
  std::array<uint32_t, 256> map{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    map[b] = printable ? b : next++;
  }
  return map;
}
}  // namespace

const std::array<std::string, 256>& byte_to_unicode() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    const std::array<uint32_t, 256> cps = byte_code_points();
    for (size_t b = 0; b < 256; ++b) t[b] = utf8_encode(cps[b]);
    return t;
  }();
  return table;
}

int byte_from_unicode(uint32_t cp) {
  // The inverse covers code points 0..323 (256 + the 68 moved bytes).
  static const std::vector<int> inverse = [] {
    std::vector<int> inv(512, -1);
    const std::array<uint32_t, 256> cps = byte_code_points();
    for (int b = 0; b < 256; ++b) inv[cps[static_cast<size_t>(b)]] = b;
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

void split_words(const std::string& text, const Splitter& splitter, std::vector<std::string>* out) {
  if (text.empty()) return;
  if (splitter.kind == SplitKind::kMetaspace) {
    // HF Metaspace's MergedWithNext: each marker starts a word ("▁a▁▁b" -> "▁a", "▁", "▁b").
    size_t begin = 0;
    size_t pos = splitter.marker.empty() ? std::string::npos : text.find(splitter.marker, 1);
    while (pos != std::string::npos) {
      out->push_back(text.substr(begin, pos - begin));
      begin = pos;
      pos = text.find(splitter.marker, pos + splitter.marker.size());
    }
    out->push_back(text.substr(begin));
    return;
  }
  const Decoded d = decode_text(text);
  const int64_t n = static_cast<int64_t>(d.cp.size());
  int64_t i = 0;
  while (i < n) {
    const int64_t j = splitter.kind == SplitKind::kGpt2 ? gpt2_match_end(d, i)
                                                        : llama3_match_end(d, i, splitter.max_digits);
    out->push_back(text.substr(static_cast<size_t>(d.offset[i]), static_cast<size_t>(d.offset[j] - d.offset[i])));
    i = j;
  }
}

}  // namespace llmq::tokenizer_detail
