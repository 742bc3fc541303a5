// TextStream and utf8_replace_invalid (include/llmq/text_stream.hpp). The UTF-8 replacement is
// held to ICU's conversion with U+FFFD substitution (which follows Unicode's maximal-subpart
// practice, as Python's errors="replace" does) on random byte strings, whole and fed in random
// pieces; the stream over a tokenizer whose tokens are single bytes and pieces of multi-byte
// characters must send valid UTF-8 deltas whose concatenation is the decoded text, cut before the
// first stop string, whatever the stop strings and however they straddle tokens.
#include <gtest/gtest.h>
#include <unicode/ustring.h>

#include <random>
#include <string>
#include <vector>

#include "llmq/text_stream.hpp"
#include "llmq/tokenizer.hpp"
#include "support.hpp"
#include "tokenizer_support.hpp"

namespace llmq::engine {
namespace {

// ICU: bytes -> UTF-16 with U+FFFD for ill-formed subparts -> UTF-8.
std::string icu_replace(const std::string& bytes) {
  UErrorCode err = U_ZERO_ERROR;
  int32_t n16 = 0, subs = 0;
  u_strFromUTF8WithSub(nullptr, 0, &n16, bytes.data(), static_cast<int32_t>(bytes.size()), 0xFFFD, &subs, &err);
  std::vector<UChar> u16(static_cast<size_t>(n16) + 1);
  err = U_ZERO_ERROR;
  u_strFromUTF8WithSub(u16.data(), n16 + 1, &n16, bytes.data(), static_cast<int32_t>(bytes.size()), 0xFFFD, &subs, &err);
  EXPECT_TRUE(U_SUCCESS(err));
  int32_t n8 = 0;
  err = U_ZERO_ERROR;
  u_strToUTF8(nullptr, 0, &n8, u16.data(), n16, &err);
  std::string out(static_cast<size_t>(n8), '\0');
  err = U_ZERO_ERROR;
  u_strToUTF8(out.data(), n8, &n8, u16.data(), n16, &err);
  return out;
}

bool valid_utf8(const std::string& s) {
  UErrorCode err = U_ZERO_ERROR;
  int32_t n16 = 0;
  u_strFromUTF8(nullptr, 0, &n16, s.data(), static_cast<int32_t>(s.size()), &err);
  return err == U_BUFFER_OVERFLOW_ERROR || U_SUCCESS(err);
}

// Bytes that mix well-formed characters of every length, their fragments and random bytes.
std::string random_bytes(std::mt19937& rng, int n) {
  static const std::vector<std::string> atoms = {"a", " ", "\n", "\xC3\xA9", "\xE4\xBD\xA0", "\xF0\x9F\x98\x80", "\xED\x9F\xBF",
                                                 "\xF4\x8F\xBF\xBF", "\xE0\xA0\x80", "\xF0\x90\x80\x80"};
  std::string s;
  for (int i = 0; i < n; ++i) {
    const unsigned r = rng() % 10;
    if (r < 5) {
      s += atoms[rng() % atoms.size()];
    } else if (r < 8) {
      const std::string& a = atoms[3 + rng() % (atoms.size() - 3)];
      s += a.substr(0, 1 + rng() % (a.size() - 1));  // a truncated character
    } else {
      s.push_back(static_cast<char>(rng() % 256));  // anything: overlongs, surrogates, F5..FF, stray continuations
    }
  }
  return s;
}

TEST(Utf8Replace, EqualsIcuWholeAndInPieces) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 3000; ++trial) {
    const std::string bytes = random_bytes(rng, 1 + static_cast<int>(rng() % 24));
    std::string whole;
    ASSERT_EQ(utf8_replace_invalid(bytes, true, &whole), static_cast<int64_t>(bytes.size()));
    ASSERT_EQ(whole, icu_replace(bytes)) << "trial " << trial;
    // Fed in pieces: the same text, and each emitted part valid UTF-8.
    std::string pending, streamed;
    for (size_t i = 0; i < bytes.size();) {
      const size_t take = std::min(bytes.size() - i, static_cast<size_t>(1 + rng() % 4));
      pending.append(bytes, i, take);
      i += take;
      std::string part;
      pending.erase(0, static_cast<size_t>(utf8_replace_invalid(pending, false, &part)));
      ASSERT_TRUE(valid_utf8(part));
      streamed += part;
    }
    utf8_replace_invalid(pending, true, &streamed);
    ASSERT_EQ(streamed, whole) << "trial " << trial;
  }
}

// A llama2.c tokenizer: <unk> <s> </s>, the 256 byte tokens, then pieces that are whole and
// partial multi-byte characters and words that stop strings can straddle.
std::unique_ptr<Tokenizer> test_tokenizer(const testing::TempDir& dir, std::vector<std::string>* pieces) {
  using namespace tokenizer_test;
  std::vector<BinPiece> bin = {{"<unk>", 0}, {"<s>", 0}, {"</s>", 0}};
  for (int b = 0; b < 256; ++b) bin.push_back({hex_piece(b), 0});
  *pieces = {"STOP", "ST", "OP", "END", "\xE4\xBD", "\xA0", "\xE4\xBD\xA0\xE5\xA5\xBD", "\xF0\x9F", "\x98\x80", "ab", " the",
             "\n\n", "sto", "p!"};
  for (const std::string& p : *pieces) bin.push_back({p, 1.0f});
  write_file(dir.file("tokenizer.bin"), llama2c_bin(bin));
  return load_ok(dir.file("tokenizer.bin"));
}

TEST(TextStream, DeltasAreValidUtf8AndConcatenateToTheTextCutBeforeTheFirstStop) {
  const testing::TempDir dir("text_stream");
  std::vector<std::string> pieces;
  std::unique_ptr<Tokenizer> tok = test_tokenizer(dir, &pieces);
  ASSERT_NE(tok, nullptr);
  const std::vector<std::vector<std::string>> stop_sets = {{}, {"STOP"}, {"\xE4\xBD\xA0"}, {"END", "stop!", "\n\n"}, {"a"}, {"ST", "STOP"}};
  std::mt19937 rng(7);
  int stopped_runs = 0;
  for (int trial = 0; trial < 600; ++trial) {
    std::vector<int32_t> ids;
    // Pieces, the single letters stop strings are made of (so they straddle tokens often), and
    // any byte.
    static const std::string letters = "STOPENDstop!a\n";
    for (int i = 1 + static_cast<int>(rng() % 30); i > 0; --i) {
      const unsigned r = rng() % 10;
      if (r < 4) ids.push_back(static_cast<int32_t>(259 + rng() % pieces.size()));
      else if (r < 8) ids.push_back(static_cast<int32_t>(3 + static_cast<unsigned char>(letters[rng() % letters.size()])));
      else ids.push_back(static_cast<int32_t>(3 + rng() % 256));
    }
    const std::vector<std::string>& stops = stop_sets[static_cast<size_t>(trial) % stop_sets.size()];
    TextStreamOptions o;
    o.stop = stops;
    TextStream stream;
    ASSERT_TRUE(TextStream::create(tok.get(), o, &stream).ok());
    std::string sent;
    bool stopped = false;
    for (int32_t id : ids) {
      std::string delta;
      ASSERT_TRUE(stream.push(id, &delta, &stopped).ok());
      ASSERT_TRUE(valid_utf8(delta)) << "trial " << trial;
      sent += delta;
      if (stopped) break;
    }
    if (!stopped) {
      std::string delta;
      stream.finish(&delta);
      ASSERT_TRUE(valid_utf8(delta));
      sent += delta;
    }
    // The oracle: the whole sequence decoded at once, replaced as ICU does, cut before the earliest stop.
    std::string want = icu_replace(tok->decode(ids));
    size_t cut = std::string::npos;
    for (const std::string& s : stops) cut = std::min(cut, want.find(s));
    if (cut != std::string::npos) want.resize(cut);
    ASSERT_EQ(sent, want) << "trial " << trial;
    ASSERT_EQ(stream.text(), want);
    ASSERT_EQ(stopped, cut != std::string::npos) << "trial " << trial;
    stopped_runs += stopped ? 1 : 0;
  }
  EXPECT_GT(stopped_runs, 50) << "the stop strings should be met often";
}

TEST(TextStream, RefusesBadStopStrings) {
  const testing::TempDir dir("text_stream_bad");
  std::vector<std::string> pieces;
  std::unique_ptr<Tokenizer> tok = test_tokenizer(dir, &pieces);
  TextStream stream;
  TextStreamOptions o;
  o.stop = {"ok", ""};
  Status st = TextStream::create(tok.get(), o, &stream);
  EXPECT_NE(st.message().find("stop[1]: 0 bytes"), std::string::npos) << st.to_string();
  o.stop = {"\xE4\xBD"};
  st = TextStream::create(tok.get(), o, &stream);
  EXPECT_NE(st.message().find("stop[0]: not valid UTF-8"), std::string::npos) << st.to_string();
  o.stop.assign(65, "x");
  st = TextStream::create(tok.get(), o, &stream);
  EXPECT_NE(st.message().find("65 strings, at most 64"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace llmq::engine
