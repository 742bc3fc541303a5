// Text handling for the tokenizers: UTF-8 decoding, the character classes of the split patterns
// (exact Unicode general categories and White_Space, from ICU), GPT-2's byte <-> unicode map, and
// the split patterns of GPT-2, Llama 3 / Qwen2 and o200k (GPT-4o, gpt-oss) written out by hand:
// std::regex has no \p{L}, and the patterns are simple enough to follow alternative by
// alternative, which also makes their backtracking explicit. Each *_match_end gives the match a
// backtracking regex engine (Oniguruma in Hugging Face tokenizers, Python's `regex`) finds at a
// position: the leftmost alternative that matches, each quantifier as long as the rest allows.
#include <climits>
#include <vector>

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "model/tokenizer/tokenizer_bpe.hpp"

namespace llmq::tokenizer_detail {
namespace {

bool is_continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

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

// The groups of classes the patterns name (CharClass in tokenizer_bpe.hpp lists them).
bool is_number(CharClass c) { return c == CharClass::kNumber; }
// [^\s\p{L}\p{N}]: punctuation, symbols, marks.
bool is_punct(CharClass c) { return c == CharClass::kMark || c == CharClass::kOther; }
// o200k's [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and [\p{Ll}\p{Lm}\p{Lo}\p{M}].
bool in_upper_class(CharClass c) {
  return c == CharClass::kUpper || c == CharClass::kCaseless || c == CharClass::kMark;
}
bool in_lower_class(CharClass c) {
  return c == CharClass::kLower || c == CharClass::kCaseless || c == CharClass::kMark;
}

// [^\r\n\p{L}\p{N}] at i: the one character a Llama 3 / o200k word may start with.
bool word_lead_at(const Decoded& d, int64_t i) {
  return i < static_cast<int64_t>(d.cp.size()) && !is_newline(d.cp[i]) && !is_letter(d.cls[i]) &&
         !is_number(d.cls[i]);
}

// (?i:...) compares by Unicode simple case folding, as Oniguruma and Python's `regex` do: "'S"
// and "'ſ" (U+017F, long s, folds to s) are contractions too.
uint32_t fold_case(uint32_t c) {
  return static_cast<uint32_t>(u_foldCase(static_cast<UChar32>(c), U_FOLD_CASE_DEFAULT));
}

// Length in code points of the contraction 's 't 're 've 'm 'll 'd at i, or 0.
int64_t contraction_at(const Decoded& d, int64_t i, bool ignore_case) {
  const int64_t n = static_cast<int64_t>(d.cp.size());
  if (i + 1 >= n || d.cp[i] != '\'') return 0;
  auto at = [&](int64_t k) { return ignore_case ? fold_case(d.cp[k]) : d.cp[k]; };
  const uint32_t a = at(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= n) return 0;
  const uint32_t b = at(i + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// The end of the run of characters from i whose class is in the group.
int64_t run_end(const Decoded& d, int64_t i, bool (*in_group)(CharClass)) {
  const int64_t n = static_cast<int64_t>(d.cls.size());
  while (i < n && in_group(d.cls[i])) ++i;
  return i;
}
bool is_space(CharClass c) { return c == CharClass::kSpace; }

// \p{N}{1,k} at a number.
int64_t digits_end(const Decoded& d, int64_t i, int64_t max_digits) {
  const int64_t n = static_cast<int64_t>(d.cls.size());
  int64_t k = i;
  while (k < n && k - i < max_digits && is_number(d.cls[k])) ++k;
  return k;
}

// \s*[\r\n]+ at i: whitespace up to and including its last newline; -1 when it has none.
int64_t newline_run_end(const Decoded& d, int64_t i) {
  const int64_t k = run_end(d, i, is_space);
  for (int64_t j = k - 1; j >= i; --j)
    if (is_newline(d.cp[j])) return j + 1;
  return -1;
}

// The whitespace alternatives every pattern ends with: \s+(?!\S)|\s+. On a run of whitespace
// followed by a non-space, the first backs off one character so the last space can start the
// next word (" world"); a single whitespace character before a non-space falls to \s+.
int64_t whitespace_end(const Decoded& d, int64_t i) {
  const int64_t n = static_cast<int64_t>(d.cls.size());
  const int64_t k = run_end(d, i, is_space);
  if (k == n || k - i == 1) return k;
  return k - 1;
}

// Where the GPT-2 pattern's match starting at i ends.
int64_t gpt2_match_end(const Decoded& d, int64_t i) {
  const int64_t n = static_cast<int64_t>(d.cp.size());
  if (const int64_t len = contraction_at(d, i, /*ignore_case=*/false)) return i + len;
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional leading space, then a run of one group.
  const int64_t start = (d.cp[i] == ' ' && i + 1 < n) ? i + 1 : i;
  const CharClass c = d.cls[start];
  if (is_letter(c)) return run_end(d, start, is_letter);
  if (is_number(c)) return run_end(d, start, is_number);
  if (is_punct(c)) return run_end(d, start, is_punct);
  return whitespace_end(d, i);
}

// Where the Llama 3 pattern's match starting at i ends (digit runs of at most max_digits).
int64_t llama3_match_end(const Decoded& d, int64_t i, int64_t max_digits) {
  const int64_t n = static_cast<int64_t>(d.cp.size());
  if (const int64_t len = contraction_at(d, i, /*ignore_case=*/true)) return i + len;
  const CharClass c = d.cls[i];
  // [^\r\n\p{L}\p{N}]?\p{L}+: a word takes one preceding non-newline, non-digit character
  // (" hello", "(hello", "\thello").
  if (is_letter(c)) return run_end(d, i, is_letter);
  if (word_lead_at(d, i) && i + 1 < n && is_letter(d.cls[i + 1])) return run_end(d, i + 1, is_letter);
  if (is_number(c)) return digits_end(d, i, max_digits);
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*': punctuation keeps the newlines after it.
  const int64_t start = (d.cp[i] == ' ' && i + 1 < n) ? i + 1 : i;
  if (is_punct(d.cls[start])) {
    int64_t k = run_end(d, start, is_punct);
    while (k < n && is_newline(d.cp[k])) ++k;
    return k;
  }
  if (const int64_t k = newline_run_end(d, i); k >= 0) return k;
  return whitespace_end(d, i);
}

// o200k's words, where U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], W = [\p{Ll}\p{Lm}\p{Lo}\p{M}] and C =
// (?i:'s|'t|'re|'ve|'m|'ll|'d). The optional lead [^\r\n\p{L}\p{N}]? is tried taken, then not:
// a mark can be the lead or the word itself. Each returns the end of its match at i, or -1.

// [^\r\n\p{L}\p{N}]?U*W+C?: camel-case words split before each capital ("camelCase" -> "camel",
// "Case"). U* is greedy and gives characters back until W+ can start: U and W share Lm, Lo and
// the marks, so W+ may start inside U's run ("ABCdef": U* = "ABC", W+ = "def"; "日本": U* = "日",
// W+ = "本", one word; "ABC" alone has no W+ and falls to the next alternative).
int64_t o200k_lower_word_end(const Decoded& d, int64_t i) {
  const int64_t n = static_cast<int64_t>(d.cls.size());
  for (int64_t s = word_lead_at(d, i) ? i + 1 : i; s >= i; --s) {
    const int64_t upper_end = run_end(d, s, in_upper_class);
    for (int64_t w = upper_end; w >= s; --w) {
      if (w == n || !in_lower_class(d.cls[w])) continue;
      const int64_t k = run_end(d, w, in_lower_class);  // W+ greedy; C? never needs it shorter
      return k + contraction_at(d, k, /*ignore_case=*/true);
    }
  }
  return -1;
}

// [^\r\n\p{L}\p{N}]?U+W*C?: capitals the first alternative could not end in lower case
// ("HTTP", "ǅ" U+01C5 titlecase).
int64_t o200k_upper_word_end(const Decoded& d, int64_t i) {
  for (int64_t s = word_lead_at(d, i) ? i + 1 : i; s >= i; --s) {
    const int64_t upper_end = run_end(d, s, in_upper_class);
    if (upper_end == s) continue;
    const int64_t k = run_end(d, upper_end, in_lower_class);
    return k + contraction_at(d, k, /*ignore_case=*/true);
  }
  return -1;
}

// Where the o200k pattern's match starting at i ends.
int64_t o200k_match_end(const Decoded& d, int64_t i, int64_t max_digits) {
  const int64_t n = static_cast<int64_t>(d.cp.size());
  if (const int64_t k = o200k_lower_word_end(d, i); k >= 0) return k;
  if (const int64_t k = o200k_upper_word_end(d, i); k >= 0) return k;
  if (is_number(d.cls[i])) return digits_end(d, i, max_digits);
  // ' ?[^\s\p{L}\p{N}]+[\r\n/]*': punctuation keeps the newlines and slashes after it.
  const int64_t start = (d.cp[i] == ' ' && i + 1 < n) ? i + 1 : i;
  if (is_punct(d.cls[start])) {
    int64_t k = run_end(d, start, is_punct);
    while (k < n && (is_newline(d.cp[k]) || d.cp[k] == '/')) ++k;
    return k;
  }
  if (const int64_t k = newline_run_end(d, i); k >= 0) return k;
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
  const auto c = static_cast<UChar32>(cp);
  if (u_isUWhiteSpace(c)) return CharClass::kSpace;
  switch (static_cast<UCharCategory>(u_charType(c))) {
    case U_UPPERCASE_LETTER:
    case U_TITLECASE_LETTER:
      return CharClass::kUpper;
    case U_LOWERCASE_LETTER:
      return CharClass::kLower;
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return CharClass::kCaseless;
    case U_NON_SPACING_MARK:
    case U_COMBINING_SPACING_MARK:
    case U_ENCLOSING_MARK:
      return CharClass::kMark;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return CharClass::kNumber;
    default:
      return CharClass::kOther;
  }
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
    int64_t j = 0;
    switch (splitter.kind) {
      case SplitKind::kGpt2:
        j = gpt2_match_end(d, i);
        break;
      case SplitKind::kLlama3:
        j = llama3_match_end(d, i, splitter.max_digits);
        break;
      case SplitKind::kO200k:
        j = o200k_match_end(d, i, splitter.max_digits);
        break;
      case SplitKind::kMetaspace:  // split above
        break;
    }
    out->push_back(text.substr(static_cast<size_t>(d.offset[i]), static_cast<size_t>(d.offset[j] - d.offset[i])));
    i = j;
  }
}

std::string nfc(const std::string& text) {
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* normalizer = unorm2_getNFCInstance(&err);
  if (U_FAILURE(err) || text.size() > static_cast<size_t>(INT32_MAX / 4)) return text;
  // UTF-8 -> UTF-16 (ICU's normalizer works on UTF-16), strictly: invalid bytes stay as they are.
  int32_t n16 = 0;
  u_strFromUTF8(nullptr, 0, &n16, text.data(), static_cast<int32_t>(text.size()), &err);
  if (err != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(err)) return text;
  err = U_ZERO_ERROR;
  std::vector<UChar> in(static_cast<size_t>(n16) + 1);
  u_strFromUTF8(in.data(), n16 + 1, &n16, text.data(), static_cast<int32_t>(text.size()), &err);
  if (U_FAILURE(err)) return text;
  if (unorm2_isNormalized(normalizer, in.data(), n16, &err) && U_SUCCESS(err)) return text;
  err = U_ZERO_ERROR;
  // Composition never lengthens text by more than 3x (Unicode's stated bound for NFC is 3x).
  std::vector<UChar> out(static_cast<size_t>(n16) * 3 + 1);
  const int32_t m16 = unorm2_normalize(normalizer, in.data(), n16, out.data(), static_cast<int32_t>(out.size()), &err);
  if (U_FAILURE(err)) return text;
  int32_t n8 = 0;
  u_strToUTF8(nullptr, 0, &n8, out.data(), m16, &err);
  if (err != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(err)) return text;
  err = U_ZERO_ERROR;
  std::string result(static_cast<size_t>(n8), '\0');
  u_strToUTF8(result.data(), n8, &n8, out.data(), m16, &err);
  return U_FAILURE(err) && err != U_STRING_NOT_TERMINATED_WARNING ? text : result;
}

}  // namespace llmq::tokenizer_detail
