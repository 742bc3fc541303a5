// The split patterns and character classes checked against an independent regex engine: Python's
// `regex` module (which, unlike `re`, knows \p{Lu}, \p{M}, ...; Debian's python3-regex) runs
// every Split pattern llmq reads (GPT-2, Llama 3, Qwen2, o200k) with findall over seeded random
// text that mixes scripts (Latin, Greek, Cyrillic, CJK, Arabic, Devanagari), combining marks,
// titlecase and modifier letters, digits of other scripts, letter and other numbers, emoji,
// Unicode spaces and look-alikes that are not White_Space, newlines, slashes and contractions in
// mixed case; llmq's hand-written split must give the same words. A second test compares the
// classes of every code point. Both skip, saying why, where python3 or `regex` is missing.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <unicode/uchar.h>
#include <unicode/uversion.h>

#include "model/tokenizer/tokenizer_bpe.hpp"
#include "support.hpp"

namespace llmq {
namespace {

namespace td = tokenizer_detail;
using json = nlohmann::json;
using Words = std::vector<std::string>;

constexpr uint64_t kSeed = 20250807;
constexpr int kRandomTexts = 3000;
constexpr int kMaxReports = 8;  // mismatches printed in full per pattern; all are counted

// Reads the job (patterns and texts, or a request for the class table) and writes the answers.
// Exit 3: no `regex` module.
const char* const kOracleScript = R"PY(
import json, sys
try:
    import regex
except ImportError:
    sys.exit(3)
with open(sys.argv[1], encoding="utf-8") as f:
    job = json.load(f)
out = {}
if "patterns" in job:
    out["words"] = [[regex.findall(p, t) for t in job["texts"]] for p in job["patterns"]]
if job.get("classes"):
    # One class per code point (surrogates left out), in llmq's CharClass order; run-length
    # encoded as [first code point, class] where the class changes.
    classes = [r"[\p{Lu}\p{Lt}]", r"\p{Ll}", r"[\p{Lm}\p{Lo}]", r"\p{M}", r"\p{N}", r"\s"]
    table = bytearray([6]) * 0x110000
    text = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    for k, p in enumerate(classes):
        for m in regex.finditer(p + "+", text):
            for ch in m.group():
                table[ord(ch)] = k
    runs = []
    for c in range(0x110000):
        if not runs or runs[-1][1] != table[c]:
            runs.append([c, table[c]])
    out["classes"] = runs
    out["regex_version"] = regex.__version__
with open(sys.argv[2], "w", encoding="utf-8") as f:
    json.dump(out, f)
)PY";

// Runs the oracle on `job`; false with `why` set when it cannot (the caller skips).
bool run_oracle(const json& job, json* answer, std::string* why) {
  const llmq::testing::TempDir dir("llmq_split_oracle");
  {
    std::ofstream(dir.file("oracle.py")) << kOracleScript;
    std::ofstream(dir.file("job.json")) << job.dump();
  }
  const std::string cmd = "python3 '" + dir.file("oracle.py") + "' '" + dir.file("job.json") + "' '" +
                          dir.file("answer.json") + "' > '" + dir.file("log.txt") + "' 2>&1";
  const int status = std::system(cmd.c_str());
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (rc == 127) {
    *why = "python3 is not installed (the oracle is Python's `regex` module)";
    return false;
  }
  if (rc == 3) {
    *why = "Python's `regex` module is not installed (Debian: python3-regex; pip: regex)";
    return false;
  }
  std::ifstream in(dir.file("answer.json"));
  if (rc != 0 || !in) {
    std::ifstream log(dir.file("log.txt"));
    std::stringstream text;
    text << log.rdbuf();
    ADD_FAILURE() << "the oracle script failed (exit " << rc << "):\n" << text.str();
    *why = "oracle failed";
    return false;
  }
  *answer = json::parse(in);
  return true;
}

// ---- seeded random text

struct Range {
  uint32_t first, last;
};
// Code points drawn from as a group, each group a kind of text.
struct Pool {
  const char* name;
  std::vector<Range> ranges;
};

const std::vector<Pool>& pools() {
  static const std::vector<Pool> p = {
      {"ascii lower", {{'a', 'z'}}},
      {"ascii upper", {{'A', 'Z'}}},
      {"ascii digits", {{'0', '9'}}},
      {"ascii punctuation", {{'!', '/'}, {':', '@'}, {'[', '`'}, {'{', '~'}, {'/', '/'}, {'\'', '\''}}},
      {"latin-1 letters", {{0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0xFF}, {0xAA, 0xAA}, {0xB5, 0xB5}, {0xBA, 0xBA}}},
      {"latin-1 signs and numbers", {{0xA1, 0xA9}, {0xAB, 0xB4}, {0xB6, 0xB9}, {0xBB, 0xBF}, {0xD7, 0xD7}}},
      {"latin extended (incl. long s)", {{0x100, 0x17F}, {0x180, 0x1C3}}},
      {"titlecase letters", {{0x1C5, 0x1C5}, {0x1C8, 0x1C8}, {0x1CB, 0x1CB}, {0x1F2, 0x1F2}, {0x1F88, 0x1F8F}, {0x1FBC, 0x1FBC}}},
      {"modifier letters", {{0x2B0, 0x2C1}, {0x2C6, 0x2D1}, {0x2E0, 0x2E4}, {0x30FC, 0x30FC}, {0x3005, 0x3005}, {0xFF70, 0xFF70}}},
      {"combining marks", {{0x300, 0x36F}, {0x483, 0x489}, {0x20DD, 0x20E0}, {0xFE0F, 0xFE0F}}},
      {"greek", {{0x391, 0x3A1}, {0x3A3, 0x3A9}, {0x3B1, 0x3C9}}},
      {"cyrillic", {{0x410, 0x44F}}},
      {"cjk", {{0x4E00, 0x4EFF}, {0x3041, 0x3096}, {0x30A1, 0x30FA}}},
      {"cjk punctuation and fullwidth", {{0x3001, 0x3003}, {0x300C, 0x300F}, {0xFF01, 0xFF5E}}},
      {"arabic letters", {{0x628, 0x64A}}},
      {"arabic marks", {{0x64B, 0x652}}},
      {"arabic digits", {{0x660, 0x669}, {0x6F0, 0x6F9}}},
      {"devanagari letters", {{0x915, 0x939}}},
      {"devanagari marks", {{0x900, 0x903}, {0x93E, 0x94D}}},
      {"devanagari digits", {{0x966, 0x96F}}},
      {"letter numbers", {{0x2160, 0x2188}, {0x3007, 0x3007}, {0x3021, 0x3029}}},
      {"other numbers", {{0x2070, 0x2070}, {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2460, 0x2473}, {0xBC, 0xBE}}},
      {"emoji", {{0x1F600, 0x1F64F}, {0x1F3FB, 0x1F3FF}, {0x200D, 0x200D}, {0x2764, 0x2764}}},
      {"math letters", {{0x1D400, 0x1D433}}},
      {"spaces", {{' ', ' '}, {'\t', '\r'}, {0x85, 0x85}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                  {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}}},
      {"not White_Space", {{0x200B, 0x200C}, {0xFEFF, 0xFEFF}, {0x180E, 0x180E}, {0x1C, 0x1F}, {0x2060, 0x2060}}},
  };
  return p;
}

const std::vector<std::string>& fragments() {
  static const std::vector<std::string> f = {
      "'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'rE", "'ve", "'VE", "'m", "'M", "'ll", "'Ll", "'LL", "'lL",
      "'d", "'D", "'\xC5\xBF" /* 'ſ */, "'", "''", "\r\n", "\r\n\r\n", "\n\n", " \n", "//", "/\n", " /", "://",
  };
  return f;
}

std::string utf8(uint32_t cp) { return td::utf8_encode(cp); }

class TextGenerator {
 public:
  explicit TextGenerator(uint64_t seed) : rng_(seed) {}

  // Segments of one kind each (words, numbers, spaces, punctuation, contractions), or a soup of
  // characters from any pool.
  std::string text() {
    std::string s;
    if (chance(0.25)) {
      for (int k = uniform(1, 24); k > 0; --k) s += utf8(pick(any_pool()));
      return s;
    }
    for (int k = uniform(1, 12); k > 0; --k) s += segment();
    return s;
  }

 private:
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < p; }

  uint32_t pick(const Pool& p) {
    uint64_t total = 0;
    for (const Range& r : p.ranges) total += r.last - r.first + 1;
    uint64_t k = std::uniform_int_distribution<uint64_t>(0, total - 1)(rng_);
    for (const Range& r : p.ranges) {
      if (k <= r.last - r.first) return r.first + static_cast<uint32_t>(k);
      k -= r.last - r.first + 1;
    }
    return '?';
  }
  const Pool& pool(const char* name) {
    for (const Pool& p : pools())
      if (std::string(p.name) == name) return p;
    throw std::logic_error(name);
  }
  const Pool& any_pool() { return pools()[static_cast<size_t>(uniform(0, static_cast<int>(pools().size()) - 1))]; }

  // A word of one script, sometimes with marks among its letters and case changes.
  std::string word() {
    static const char* const kScripts[] = {"ascii lower", "ascii upper", "latin-1 letters", "latin extended (incl. long s)",
                                           "greek", "cyrillic", "cjk", "arabic letters", "devanagari letters",
                                           "titlecase letters", "modifier letters", "math letters"};
    const Pool& letters = pool(kScripts[uniform(0, static_cast<int>(std::size(kScripts)) - 1)]);
    std::string w;
    const int n = uniform(1, 8);
    for (int k = 0; k < n; ++k) {
      w += utf8(pick(chance(0.15) ? pool(chance(0.5) ? "ascii upper" : "ascii lower") : letters));
      if (chance(0.15)) w += utf8(pick(pool(chance(0.3) ? "combining marks"
                                            : chance(0.5) ? "arabic marks" : "devanagari marks")));
    }
    return w;
  }

  std::string run_of(const Pool& p, int lo, int hi) {
    std::string s;
    for (int k = uniform(lo, hi); k > 0; --k) s += utf8(pick(p));
    return s;
  }

  std::string segment() {
    switch (uniform(0, 9)) {
      case 0:
      case 1:
      case 2:
        return word();
      case 3:
        return fragments()[static_cast<size_t>(uniform(0, static_cast<int>(fragments().size()) - 1))];
      case 4: {
        static const char* const kDigits[] = {"ascii digits", "arabic digits", "devanagari digits", "letter numbers",
                                              "other numbers"};
        return run_of(pool(kDigits[uniform(0, 4)]), 1, 7);
      }
      case 5:
        return chance(0.5) ? std::string(static_cast<size_t>(uniform(1, 3)), ' ') : run_of(pool("spaces"), 1, 4);
      case 6:
        return run_of(pool(chance(0.6) ? "ascii punctuation" : chance(0.5) ? "latin-1 signs and numbers"
                                                                           : "cjk punctuation and fullwidth"),
                      1, 3);
      case 7:
        return run_of(pool(chance(0.5) ? "emoji" : "not White_Space"), 1, 2);
      case 8:
        return utf8(pick(any_pool()));
      default:
        return " ";
    }
  }

  std::mt19937_64 rng_;
};

// Hand-picked texts first: each is a place where a simpler reading of a pattern goes wrong.
std::vector<std::string> oracle_texts() {
  std::vector<std::string> texts = {
      "HTTPServer's camelCase DON'T don't I'm",  // o200k: words split at capitals, contractions kept
      "x'\xC5\xBF'LL 'S'Ll",                     // (?i) folds U+017F long s to s
      "\xC7\x85ungla \xCA\xB0" "ello",           // ǅ titlecase, ʰ modifier letter
      "!\xCC\x81" "abc \xCC\x81",                 // a combining mark leads a word (o200k) or is punctuation
      "\xD9\xA3\xD9\xA3\xD9\xA3\xD9\xA3 \xE2\x85\xAB" "2 \xE0\xA5\xAD\xC2\xB2",  // ٣ digits, Ⅻ, ७, ²
      "a/\n/b //\n x/y",                          // o200k keeps slashes and newlines after punctuation
      "a\xE2\x80\x8B" "b\xC2\xA0" "c\xE3\x80\x80" "d\xE2\x80\x83" "e",  // U+200B is no space; the others are
      "\xE0\xA4\x95\xE0\xA5\x8D\xE0\xA4\xB7\xE0\xA4\xBF",  // क्षि: virama (Mn) and a vowel sign (Mc)
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x83\x8B\xE3\x83\xA5\xE3\x83\xBC\xE3\x82\xB9",  // 日本語ニュース
      "x \n \n  y\tz\r\n\r\n  \xC2\x85w",
      "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD\xE2\x80\x8D\xF0\x9F\x98\x80 ok",  // emoji, skin tone (Sk), ZWJ
      "", " ", "  ", "\n", "'", "'s", "a", "A", "1", "\xCC\x81",
  };
  TextGenerator gen(kSeed);
  for (int k = 0; k < kRandomTexts; ++k) texts.push_back(gen.text());
  return texts;
}

std::string code_points(const std::string& text) {
  std::string out;
  char buf[16];
  for (const td::CodePoint& c : td::utf8_code_points(text)) {
    std::snprintf(buf, sizeof buf, "%sU+%04X", out.empty() ? "" : " ", c.value);
    out += buf;
  }
  return out;
}

std::string show(const Words& words) {
  json j = words;
  return j.dump();
}

TEST(SplitOracle, EveryPatternMatchesPythonRegex) {
  const std::vector<std::string> texts = oracle_texts();
  std::vector<std::string> patterns;
  for (const td::SplitPattern& p : td::split_patterns()) patterns.push_back(p.regex);
  json answer;
  std::string why;
  if (!run_oracle({{"patterns", patterns}, {"texts", texts}}, &answer, &why)) GTEST_SKIP() << why;
  ASSERT_EQ(answer["words"].size(), patterns.size());
  for (size_t p = 0; p < patterns.size(); ++p) {
    const td::SplitPattern& pattern = td::split_patterns()[p];
    const td::Splitter splitter{pattern.kind, pattern.max_digits, ""};
    int mismatches = 0;
    for (size_t t = 0; t < texts.size(); ++t) {
      const Words want = answer["words"][p][t].get<Words>();
      Words got;
      td::split_words(texts[t], splitter, &got);
      if (got == want) continue;
      if (++mismatches <= kMaxReports)
        ADD_FAILURE() << "REPRO seed=" << kSeed << " text #" << t << " pattern " << pattern.regex << "\n  text: "
                      << json(texts[t]).dump() << " (" << code_points(texts[t]) << ")\n  python regex: " << show(want)
                      << "\n  llmq:         " << show(got);
    }
    EXPECT_EQ(mismatches, 0) << "of " << texts.size() << " texts, pattern " << pattern.regex;
    std::printf("[ ORACLE   ] %zu texts, %d differ: %s\n", texts.size(), mismatches, pattern.regex);
  }
}

// Assigned characters whose general category a later Unicode changed: where this ICU predates the
// change and python's `regex` follows it, the two differ by version, not by a mistake.
struct CategoryChange {
  uint32_t cp;
  int unicode_major;  // the version that changed it
  td::CharClass before, after;
};
constexpr CategoryChange kCategoryChanges[] = {
    {0x0295, 16, td::CharClass::kLower, td::CharClass::kCaseless},  // ʕ: Ll -> Lo in Unicode 16.0
};

bool changed_since_icu(uint32_t cp, int got, int want) {
  UVersionInfo icu;
  u_getUnicodeVersion(icu);
  for (const CategoryChange& c : kCategoryChanges)
    if (c.cp == cp && icu[0] < c.unicode_major && got == static_cast<int>(c.before) &&
        want == static_cast<int>(c.after))
      return true;
  return false;
}

TEST(SplitOracle, CharacterClassesOfEveryCodePoint) {
  json answer;
  std::string why;
  if (!run_oracle({{"classes", true}}, &answer, &why)) GTEST_SKIP() << why;
  const json& runs = answer["classes"];
  ASSERT_TRUE(runs.is_array() && !runs.empty());
  static const char* const kNames[] = {"Lu/Lt", "Ll", "Lm/Lo", "M", "N", "White_Space", "other"};
  int64_t assigned_mismatches = 0, skew = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto first = runs[r][0].get<uint32_t>();
    const auto last = r + 1 < runs.size() ? runs[r + 1][0].get<uint32_t>() - 1 : 0x10FFFFu;
    const auto want = runs[r][1].get<int>();
    for (uint32_t cp = first; cp <= last; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;  // surrogates: no text holds them
      const int got = static_cast<int>(td::classify(cp));
      if (got == want) continue;
      // Python's `regex` may carry a newer Unicode than this ICU: a character it knows and ICU
      // does not (ICU: unassigned, so "other"), or one it has recategorized, is version skew,
      // counted but not an error.
      if (u_charType(static_cast<UChar32>(cp)) == U_UNASSIGNED || changed_since_icu(cp, got, want)) {
        ++skew;
        continue;
      }
      if (++assigned_mismatches <= kMaxReports)
        ADD_FAILURE() << "U+" << std::hex << cp << std::dec << ": python regex " << kNames[want] << ", llmq "
                      << kNames[got];
    }
  }
  EXPECT_EQ(assigned_mismatches, 0);
  std::printf("[ ORACLE   ] classes of all code points: ICU %s (Unicode %s) and python regex %s differ at %lld "
              "code points, and at %lld more where python's Unicode is newer (assigned or recategorized since)\n",
              U_ICU_VERSION, U_UNICODE_VERSION, answer["regex_version"].get<std::string>().c_str(),
              static_cast<long long>(assigned_mismatches), static_cast<long long>(skew));
}

}  // namespace
}  // namespace llmq
