// Helpers shared by the tokenizer tests (test_tokenizer_byte_level_bpe.cpp,
// test_tokenizer_sentencepiece.cpp, test_tokenizer.cpp): test texts, a temporary directory, files
// written byte for byte, loading and encoding that report their status, round trips, and the ids
// every sentencepiece-style vocabulary here starts with, and llama2.c tokenizer.bin files.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmq/tokenizer.hpp"
#include "support.hpp"

namespace llmq {
namespace tokenizer_test {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Ids = std::vector<int32_t>;

// Text with 2-, 3- and 4-byte UTF-8, an em dash (punctuation above ASCII) and CJK letters.
const char* const kUtf8Text = "h\xC3\xA9llo w\xC3\xB6rld 123 \xE2\x80\x94 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80";
const char* const kAsciiText = "Hello, World!\n\tTabs  and   spaces, digits 1234567 and (parens) ";
const char* const kSpace = "\xE2\x96\x81";  // "▁"

// ---- files

// A temporary directory per test (tests/support.hpp), named after this suite.
class TempDir : public llmq::testing::TempDir {
 public:
  TempDir() : llmq::testing::TempDir("llmq_tokenizer") {}
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string hex_piece(int byte) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", byte);
  return buf;
}

inline std::unique_ptr<Tokenizer> load_ok(const std::string& path) {
  std::unique_ptr<Tokenizer> tok;
  const Status st = Tokenizer::load(path, &tok);
  EXPECT_TRUE(st.ok()) << path << ": " << st.to_string();
  return tok;
}

inline Ids encode(const Tokenizer& tok, const std::string& text, bool add_bos) {
  Ids ids;
  const Status st = tok.encode(text, add_bos, &ids);
  EXPECT_TRUE(st.ok()) << "'" << text << "': " << st.to_string();
  return ids;
}

// Sets ids to an impossible value first, so a decoder that leaves them alone cannot pass.
inline void expect_round_trip(const Tokenizer& tok, const std::string& text, const std::string& what) {
  for (bool bos : {false, true}) {
    const Ids ids = encode(tok, text, bos);
    EXPECT_EQ(tok.decode(ids), text) << what << " bos=" << bos << " text='" << text << "'";
  }
}

// ---- sentencepiece-style vocabularies (Llama 2 tokenizer.json, tokenizer.model, llama2.c
// ---- tokenizer.bin): <unk> <s> </s>, then the 256 byte tokens <0x00>..<0xFF> at 3..258.

constexpr int32_t kUnk = 0, kBos = 1, kEos = 2, kByte0 = 3;
constexpr int32_t byte_id(int byte) { return kByte0 + byte; }

// ---- llama2.c tokenizer.bin: max_token_length, then per piece float32 score, int32 length, bytes.

struct BinPiece {
  std::string text;
  float score;
};
// The file llama2.c's export writes for `pieces`, byte for byte.
inline std::string llama2c_bin(const std::vector<BinPiece>& pieces) {
  int32_t max_len = 0;
  for (const BinPiece& p : pieces) max_len = std::max(max_len, static_cast<int32_t>(p.text.size()));
  std::string out(reinterpret_cast<const char*>(&max_len), 4);
  for (const BinPiece& p : pieces) {
    const auto len = static_cast<int32_t>(p.text.size());
    out.append(reinterpret_cast<const char*>(&p.score), 4);
    out.append(reinterpret_cast<const char*>(&len), 4);
    out += p.text;
  }
  return out;
}

}  // namespace tokenizer_test
}  // namespace llmq
