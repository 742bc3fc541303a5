// Tokenizers: llama2.c's tokenizer.bin written here and encoded as run.c encodes (hand-worked ids
// and a seeded random comparison with run.c's own merge loop), errors that name the file
// (tokenizer.bin and tokenizer.json), decoding of out-of-range ids, and text data read through a
// tokenizer. Byte-level BPE is tested in test_tokenizer_byte_level_bpe.cpp, sentencepiece
// tokenizer.json / tokenizer.model and finding a model's tokenizer in test_tokenizer_sentencepiece.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmq/model_io.hpp"
#include "llmq/tokenizer.hpp"
#include "support.hpp"
#include "tokenizer_support.hpp"

namespace llmq {
namespace {

using namespace tokenizer_test;  // NOLINT: the suite's shared helpers

// ---- llama2.c tokenizer.bin

constexpr int32_t kBinSpace = 259, kBinA = 260, kBinB = 261, kBinAa = 262, kBinSpaceB = 263, kBinAb = 264;
std::vector<BinPiece> bin_pieces() {
  // llama2.c's export: "▁" became " ", BOS / EOS became "\n<s>\n" / "\n</s>\n".
  std::vector<BinPiece> p = {{"<unk>", 0.0f}, {"\n<s>\n", 0.0f}, {"\n</s>\n", 0.0f}};
  for (int b = 0; b < 256; ++b) p.push_back({hex_piece(b), 0.0f});
  p.push_back({" ", -1.0f});
  p.push_back({"a", -2.0f});
  p.push_back({"b", -2.0f});
  p.push_back({"aa", -3.0f});
  p.push_back({" b", -1.5f});
  p.push_back({"ab", -4.0f});
  return p;
}

TEST(Llama2cTokenizer, EncodesLikeRunC) {
  TempDir dir;
  write_file(dir.file("tokenizer.bin"), llama2c_bin(bin_pieces()));
  write_file(dir.file("model.bin"), "not read by the tokenizer");
  const auto tok = load_ok(dir.file("model.bin"));  // a checkpoint path: tokenizer.bin beside it
  ASSERT_TRUE(tok);
  EXPECT_NE(tok->description().find("llama2.c"), std::string::npos) << tok->description();
  EXPECT_EQ(tok->vocab_size(), kBinAb + 1);
  EXPECT_EQ(tok->bos(), kBos);
  EXPECT_EQ(tok->eos(), kEos);
  // The " " dummy prefix, then "a a" at two places with equal scores: the leftmost merges.
  EXPECT_EQ(encode(*tok, "aaa", true), (Ids{kBos, kBinSpace, kBinAa, kBinA}));
  // " b" (-1.5) before "ab" (-4).
  EXPECT_EQ(encode(*tok, "ab b", false), (Ids{kBinSpace, kBinAb, kBinSpaceB}));
  EXPECT_EQ(encode(*tok, "bb", false), (Ids{kBinSpaceB, kBinB}));
  EXPECT_EQ(encode(*tok, "aab", false), (Ids{kBinSpace, kBinAa, kBinB})) << "\"aa\" (-3) before \"ab\" (-4)";
  EXPECT_EQ(encode(*tok, "", true), (Ids{kBos})) << "run.c adds no dummy prefix to empty text";
  EXPECT_EQ(encode(*tok, "\xE6\x97\xA5", false), (Ids{kBinSpace, byte_id(0xE6), byte_id(0x97), byte_id(0xA5)}));
  std::string piece = "poison";
  ASSERT_TRUE(tok->decode_token(kBos, kBinSpace, &piece).ok());
  EXPECT_EQ(piece, "") << "run.c drops the leading space after BOS";
  ASSERT_TRUE(tok->decode_token(kBinA, kBinSpaceB, &piece).ok());
  EXPECT_EQ(piece, " b");
  ASSERT_TRUE(tok->decode_token(kBinA, kBos, &piece).ok());
  EXPECT_EQ(piece, "");
  EXPECT_EQ(tok->decode({kBos, kBinSpace, kBinAa, kBinA}), "aaa");
  for (const std::string& text : {std::string(kUtf8Text), std::string(kAsciiText), std::string(" ab  b")})
    expect_round_trip(*tok, text, "llama2.c");
}

// run.c's encode as written there: rescan every adjacent pair, merge the best (strictly higher
// score wins, so the leftmost of equals), repeat. The reference for the heap-based merge loop.
Ids run_c_encode(const std::vector<BinPiece>& pieces, const std::string& text) {
  auto lookup = [&](const std::string& s) {
    for (size_t i = 0; i < pieces.size(); ++i)
      if (pieces[i].text == s) return static_cast<int32_t>(i);
    return -1;
  };
  Ids ids = {kBos};
  if (!text.empty()) ids.push_back(lookup(" "));
  for (char c : text) ids.push_back(lookup(std::string(1, c)));  // the test alphabet is ASCII pieces
  while (true) {
    float best_score = -1e10f;
    int32_t best_id = -1;
    size_t best_idx = 0;
    for (size_t i = 1; i + 1 < ids.size(); ++i) {
      const int32_t id = lookup(pieces[static_cast<size_t>(ids[i])].text + pieces[static_cast<size_t>(ids[i + 1])].text);
      if (id != -1 && pieces[static_cast<size_t>(id)].score > best_score) {
        best_score = pieces[static_cast<size_t>(id)].score;
        best_id = id;
        best_idx = i;
      }
    }
    if (best_id == -1) break;
    ids[best_idx] = best_id;
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best_idx) + 1);
  }
  return ids;
}

TEST(Llama2cTokenizer, MatchesRunCOnRandomText) {
  constexpr uint64_t kSeed = 20240917;
  constexpr int kCases = 300;
  constexpr int kMaxLength = 40;
  TempDir dir;
  std::vector<BinPiece> pieces = bin_pieces();
  // Pieces that chain and compete: equal scores, and merges of merges.
  pieces.push_back({"ba", -2.5f});
  pieces.push_back({"aab", -3.0f});
  pieces.push_back({" aa", -3.0f});
  pieces.push_back({"bab", -2.0f});
  write_file(dir.file("tokenizer.bin"), llama2c_bin(pieces));
  const auto tok = load_ok(dir.file("tokenizer.bin"));
  ASSERT_TRUE(tok);
  std::mt19937_64 rng(kSeed);
  const char alphabet[] = {'a', 'b', ' '};
  for (int c = 0; c < kCases; ++c) {
    std::string text;
    const auto len = static_cast<int>(rng() % kMaxLength);
    for (int i = 0; i < len; ++i) text += alphabet[rng() % 3];
    EXPECT_EQ(encode(*tok, text, true), run_c_encode(pieces, text)) << "REPRO seed=" << kSeed << " case=" << c
                                                                     << " text='" << text << "'";
    EXPECT_EQ(tok->decode(encode(*tok, text, true)), text);
  }
}

TEST(Llama2cTokenizer, FindsTokNBin) {
  TempDir dir;
  write_file(dir.file("tok512.bin"), llama2c_bin(bin_pieces()));
  write_file(dir.file("stories260K.bin"), "checkpoint");
  EXPECT_EQ(Tokenizer::find(dir.file("stories260K.bin")), dir.file("tok512.bin"));
  const auto tok = load_ok(dir.file("stories260K.bin"));
  ASSERT_TRUE(tok);
  EXPECT_EQ(encode(*tok, "ab b", false), (Ids{kBinSpace, kBinAb, kBinSpaceB}));
}

TEST(Llama2cTokenizer, ErrorsNameTheFile) {
  TempDir dir;
  const std::string path = dir.file("tokenizer.bin");
  const std::string good = llama2c_bin(bin_pieces());
  std::string too_long = good;
  const int32_t huge = 1000;
  std::memcpy(&too_long[4 + 4], &huge, 4);  // the first token's length
  struct Case {
    std::string what;
    std::string bytes;
    std::string needle;
  };
  const Case cases[] = {
      {"truncated inside a piece", good.substr(0, good.size() - 1), "past the end"},
      {"truncated inside a header", good.substr(0, 4 + 6), "ends inside"},
      {"shorter than the header", good.substr(0, 3), "header"},
      {"length over max_token_length", too_long, "max_token_length"},
      {"no tokens", good.substr(0, 4), "no tokens"},
      {"zero max_token_length", std::string(4, '\0'), "max_token_length"},
  };
  std::unique_ptr<Tokenizer> tok;
  for (const Case& c : cases) {
    write_file(path, c.bytes);
    const Status st = Tokenizer::load(path, &tok);
    EXPECT_FALSE(st.ok()) << c.what;
    EXPECT_NE(st.message().find(path), std::string::npos) << c.what << ": " << st.message();
    EXPECT_NE(st.message().find(c.needle), std::string::npos) << c.what << ": " << st.message();
  }
}

// ---- tokenizer.json errors; decoding out-of-range ids

TEST(TokenizerJson, ErrorsNameTheFile) {
  TempDir dir;
  const std::string path = dir.file("tokenizer.json");
  json unknown_merge = json::parse(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2},
      "merges": ["a b", "a c"]}, "pre_tokenizer": {"type": "ByteLevel"}})");
  json unmade_merge = unknown_merge;
  unmade_merge["model"]["merges"] = json::array({"b a"});
  json unigram = {{"model", {{"type", "Unigram"}, {"vocab", json::array()}}}};
  json odd_regex = unknown_merge;
  odd_regex["model"]["merges"] = json::array();
  odd_regex["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}};
  json bad_added = unknown_merge;
  bad_added["model"]["merges"] = json::array();
  bad_added["added_tokens"] = json::array({{{"id", "x"}, {"content", "<x>"}}});
  struct Case {
    std::string what;
    std::string text;
    std::string needle;
  };
  const Case cases[] = {
      {"not JSON", "{\"model\": ", "not valid JSON"},
      {"merge of an unknown piece", unknown_merge.dump(), "merges[1]"},
      {"merge whose result is not a piece", unmade_merge.dump(), "not in the vocabulary"},
      {"unigram model", unigram.dump(), "Unigram"},
      {"unknown split pattern", odd_regex.dump(), "Split pattern"},
      {"bad added token", bad_added.dump(), "added_tokens[0]"},
  };
  std::unique_ptr<Tokenizer> tok;
  for (const Case& c : cases) {
    write_file(path, c.text);
    const Status st = Tokenizer::load(path, &tok);
    EXPECT_FALSE(st.ok()) << c.what;
    EXPECT_NE(st.message().find(path), std::string::npos) << c.what << ": " << st.message();
    EXPECT_NE(st.message().find(c.needle), std::string::npos) << c.what << ": " << st.message();
  }
}

TEST(TokenizerDecode, OutOfRangeIds) {
  TempDir dir;
  write_file(dir.file("tokenizer.bin"), llama2c_bin(bin_pieces()));
  const auto tok = load_ok(dir.file("tokenizer.bin"));
  ASSERT_TRUE(tok);
  std::string piece;
  EXPECT_FALSE(tok->decode_token(-1, static_cast<int32_t>(tok->vocab_size()), &piece).ok());
  EXPECT_FALSE(tok->decode_token(-1, -5, &piece).ok());
  EXPECT_EQ(tok->decode({kBinA, -5, kBinA}), "a\xEF\xBF\xBD" "a");
}

// ---- text data

TEST(TextData, LinesBecomeSequencesWithBos) {
  TempDir dir;
  write_file(dir.file("tokenizer.bin"), llama2c_bin(bin_pieces()));
  const auto tok = load_ok(dir.file("tokenizer.bin"));
  ASSERT_TRUE(tok);
  const std::string data = dir.file("data.txt");
  write_file(data, "aaa\n\n   \nab b\r\n");
  const std::vector<Ids> expected = {{kBos, kBinSpace, kBinAa, kBinA}, {kBos, kBinSpace, kBinAb, kBinSpaceB}};
  std::vector<Ids> seqs = {{-1}};
  Status st = read_text_sequences(data, *tok, &seqs);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(seqs, expected);

  // read_token_sequences: text needs a tokenizer, and says which files provide one.
  st = read_token_sequences(data, 0, &seqs);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("tokenizer.json"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("tokenizer.bin"), std::string::npos) << st.message();
  seqs = {{-1}};
  st = read_token_sequences(data, tok->vocab_size(), &seqs, tok.get());
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(seqs, expected);
  // Ids the model's vocabulary does not have are an error.
  st = read_token_sequences(data, kBinSpace, &seqs, tok.get());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("outside"), std::string::npos) << st.message();
  // A file of ids stays ids with a tokenizer too.
  write_file(data, "5 6 7\n8\n");
  st = read_token_sequences(data, 0, &seqs, tok.get());
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(seqs, (std::vector<Ids>{{5, 6, 7}, {8}}));
  write_file(data, "\n \n");
  EXPECT_FALSE(read_text_sequences(data, *tok, &seqs).ok());
}

}  // namespace
}  // namespace llmq
