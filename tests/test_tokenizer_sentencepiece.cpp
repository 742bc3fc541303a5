// Sentencepiece-style tokenizers: a Llama 2 style tokenizer.json (normalizer and Metaspace
// pipelines) and a tokenizer.model written with a hand-made protobuf encoder, encodings checked
// against ids worked out by hand (merge order by rank and by score, byte fallback, whitespace),
// round trips, errors that name the file, and which file a model path loads.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmq/tokenizer.hpp"
#include "support.hpp"
#include "tokenizer_support.hpp"

namespace llmq {
namespace {

using namespace tokenizer_test;  // NOLINT: the suite's shared helpers

// ---- sentencepiece-style BPE in tokenizer.json (Llama 2)
// Ids: <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF> at 3..258 (tokenizer_support.hpp), then
// the pieces below.

constexpr int32_t kSp = 259, kH = 260, kE = 261, kL = 262, kO = 263, kSpH = 264, kLl = 265, kSpHe = 266, kLlo = 267,
                  kSpHello = 268, kW = 269, kR = 270, kD = 271;

json llama2_vocab() {
  json vocab = {{"<unk>", kUnk}, {"<s>", kBos}, {"</s>", kEos}};
  for (int b = 0; b < 256; ++b) vocab[hex_piece(b)] = byte_id(b);
  const std::string s = kSpace;
  const std::pair<std::string, int32_t> pieces[] = {{s, kSp},        {"h", kH},     {"e", kE},          {"l", kL},
                                                    {"o", kO},       {s + "h", kSpH}, {"ll", kLl},      {s + "he", kSpHe},
                                                    {"llo", kLlo},   {s + "hello", kSpHello}, {"w", kW}, {"r", kR}, {"d", kD}};
  for (const auto& [piece, id] : pieces) vocab[piece] = id;
  return vocab;
}

// `pipeline`: "normalizer" (Prepend + Replace, as Llama 2 ships) or "metaspace" (newer files).
void write_llama2_json(const std::string& path, const std::string& pipeline) {
  const std::string s = kSpace;
  const json model = {{"type", "BPE"}, {"vocab", llama2_vocab()},
                      {"merges", json::array({s + " h", "l l", s + "h e", "ll o", s + "he llo"})},
                      {"byte_fallback", true}, {"fuse_unk", true}, {"unk_token", "<unk>"}};
  const json added = json::array({{{"id", kUnk}, {"content", "<unk>"}, {"special", true}},
                                  {{"id", kBos}, {"content", "<s>"}, {"special", true}},
                                  {{"id", kEos}, {"content", "</s>"}, {"special", true}}});
  json j = {{"added_tokens", added}, {"model", model}, {"pre_tokenizer", nullptr}, {"normalizer", nullptr}};
  if (pipeline == "normalizer") {
    j["normalizer"] = {{"type", "Sequence"},
                       {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", s}},
                                                    {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", s}}})}};
  } else {
    j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", s}, {"prepend_scheme", "first"}, {"split", true}};
  }
  write_file(path, j.dump());
}

TEST(SentencePieceJson, EncodesByRankWithByteFallback) {
  TempDir dir;
  write_llama2_json(dir.file("tokenizer.json"), "normalizer");
  const auto tok = load_ok(dir.path());
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->bos(), kBos);
  EXPECT_EQ(tok->eos(), kEos);
  EXPECT_EQ(tok->vocab_size(), kD + 1);
  EXPECT_EQ(encode(*tok, "hello", true), (Ids{kBos, kSpHello}));
  EXPECT_EQ(encode(*tok, "hello world", false), (Ids{kSpHello, kSp, kW, kO, kR, kL, kD}));
  // é has no piece: its two UTF-8 bytes.
  EXPECT_EQ(encode(*tok, "h\xC3\xA9", false), (Ids{kSpH, byte_id(0xC3), byte_id(0xA9)}));
  // Added tokens are cut out first and the "▁" prefix goes on each piece of text (HF's legacy
  // Llama 2 behaviour).
  EXPECT_EQ(encode(*tok, "a<s>b", false), (Ids{kSp, byte_id('a'), kBos, kSp, byte_id('b')}));
  EXPECT_EQ(encode(*tok, "", true), (Ids{kBos}));
}

TEST(SentencePieceJson, DecodeStripsThePrefixAfterBos) {
  TempDir dir;
  write_llama2_json(dir.file("tokenizer.json"), "normalizer");
  const auto tok = load_ok(dir.file("tokenizer.json"));
  ASSERT_TRUE(tok);
  std::string piece = "poison";
  ASSERT_TRUE(tok->decode_token(kBos, kSpHello, &piece).ok());
  EXPECT_EQ(piece, "hello");
  ASSERT_TRUE(tok->decode_token(kSpHello, kSpH, &piece).ok());
  EXPECT_EQ(piece, " h");
  ASSERT_TRUE(tok->decode_token(kSpH, byte_id(0x0A), &piece).ok());
  EXPECT_EQ(piece, "\n");
  ASSERT_TRUE(tok->decode_token(kSpH, kBos, &piece).ok());
  EXPECT_EQ(piece, "");
  EXPECT_EQ(tok->decode({kBos, kSpHello, kSp, kW, kO, kR, kL, kD}), "hello world");
  for (const std::string& text : {std::string(kUtf8Text), std::string(kAsciiText), std::string(" leading space"),
                                 std::string("")})
    expect_round_trip(*tok, text, "llama2 json");
}

TEST(SentencePieceJson, MetaspacePreTokenizerMatchesNormalizer) {
  TempDir a, b;
  write_llama2_json(a.file("tokenizer.json"), "normalizer");
  write_llama2_json(b.file("tokenizer.json"), "metaspace");
  const auto ta = load_ok(a.path());
  const auto tb = load_ok(b.path());
  ASSERT_TRUE(ta && tb);
  for (const std::string& text : {std::string("hello world"), std::string(kUtf8Text), std::string("hello  hello")}) {
    EXPECT_EQ(encode(*ta, text, true), encode(*tb, text, true)) << text;
    EXPECT_EQ(tb->decode(encode(*tb, text, true)), text);
  }
}

// ---- sentencepiece tokenizer.model, written with a hand-made protobuf encoder

std::string varint(uint64_t v) {
  std::string s;
  while (v >= 0x80) {
    s += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  s += static_cast<char>(v);
  return s;
}
std::string key(uint32_t field, int wire_type) { return varint((static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type)); }
std::string length_field(uint32_t field, const std::string& bytes) { return key(field, 2) + varint(bytes.size()) + bytes; }
std::string varint_field(uint32_t field, int64_t v) { return key(field, 0) + varint(static_cast<uint64_t>(v)); }
std::string float_field(uint32_t field, float f) {
  uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof bits);
  std::string s = key(field, 5);
  for (int i = 0; i < 4; ++i) s += static_cast<char>((bits >> (8 * i)) & 0xFF);
  return s;
}

constexpr int64_t kTypeNormal = 1, kTypeUnknown = 2, kTypeControl = 3, kTypeUserDefined = 4, kTypeByte = 6;
constexpr int64_t kModelTypeUnigram = 1, kModelTypeBpe = 2;

struct SpPiece {
  std::string text;
  float score;
  int64_t type;
};

// Pieces after the 259 <unk> <s> </s> and byte pieces; scores chosen so that score order and
// left-to-right order disagree.
constexpr int32_t kSpmSpace = 259, kSpmA = 260, kSpmB = 261, kSpmC = 262, kSpmAb = 263, kSpmBc = 264, kSpmSpaceA = 265,
                  kSpmSep = 266, kSpmAa = 267;
std::vector<SpPiece> spm_pieces() {
  std::vector<SpPiece> p = {{"<unk>", 0.0f, kTypeUnknown}, {"<s>", 0.0f, kTypeControl}, {"</s>", 0.0f, kTypeControl}};
  for (int b = 0; b < 256; ++b) p.push_back({hex_piece(b), 0.0f, kTypeByte});
  const std::string s = kSpace;
  p.push_back({s, -2.0f, kTypeNormal});
  p.push_back({"a", -3.0f, kTypeNormal});
  p.push_back({"b", -3.0f, kTypeNormal});
  p.push_back({"c", -3.0f, kTypeNormal});
  p.push_back({"ab", -5.0f, kTypeNormal});
  p.push_back({"bc", -1.0f, kTypeNormal});
  p.push_back({s + "a", -4.0f, kTypeNormal});
  p.push_back({"<sep>", 0.0f, kTypeUserDefined});
  p.push_back({"aa", -6.0f, kTypeNormal});
  return p;
}

// `remove_extra_whitespaces` < 0 leaves the field out (its default is true).
std::string spm_model(const std::vector<SpPiece>& pieces, int64_t model_type, int64_t remove_extra_whitespaces) {
  std::string m;
  for (const SpPiece& p : pieces) {
    std::string piece = length_field(1, p.text) + float_field(2, p.score);
    if (p.type != kTypeNormal) piece += varint_field(3, p.type);  // NORMAL is the default
    m += length_field(1, piece);
  }
  // TrainerSpec: model_type, a string field to skip (model_prefix), unk/bos/eos ids, pad_id -1.
  const std::string trainer = varint_field(3, model_type) + length_field(2, "tiny") + varint_field(40, kUnk) +
                              varint_field(41, kBos) + varint_field(42, kEos) + varint_field(43, -1);
  m += length_field(2, trainer);
  std::string normalizer = length_field(1, "identity") + varint_field(3, 1);
  if (remove_extra_whitespaces >= 0) normalizer += varint_field(4, remove_extra_whitespaces);
  m += length_field(3, normalizer);
  return m;
}

TEST(SentencePieceModel, EncodesByScore) {
  TempDir dir;
  write_file(dir.file("tokenizer.model"), spm_model(spm_pieces(), kModelTypeBpe, 0));
  const auto tok = load_ok(dir.path());
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->vocab_size(), kSpmAa + 1);
  EXPECT_EQ(tok->bos(), kBos);
  EXPECT_EQ(tok->eos(), kEos);
  EXPECT_NE(tok->description().find("sentencepiece"), std::string::npos) << tok->description();
  // "▁abc": "bc" (-1) beats "▁a" (-4) and "ab" (-5); then "▁a"; "▁abc" is not a piece.
  EXPECT_EQ(encode(*tok, "abc", true), (Ids{kBos, kSpmSpaceA, kSpmBc}));
  // "▁aaa": "▁a" (-4) before "aa" (-6), then the remaining "a a".
  EXPECT_EQ(encode(*tok, "aaa", false), (Ids{kSpmSpaceA, kSpmAa}));
  EXPECT_EQ(encode(*tok, "bab", false), (Ids{kSpmSpace, kSpmB, kSpmAb}));
  EXPECT_EQ(encode(*tok, "ca", false), (Ids{kSpmSpace, kSpmC, kSpmA})) << "no piece joins them";
  // User-defined pieces are matched whole; control pieces are not ("<s>" in text is bytes).
  EXPECT_EQ(encode(*tok, "a<sep>b", false), (Ids{kSpmSpaceA, kSpmSep, kSpmB}));
  EXPECT_EQ(encode(*tok, "<s>", false), (Ids{kSpmSpace, byte_id('<'), byte_id('s'), byte_id('>')}));
  EXPECT_EQ(encode(*tok, "\xC3\xA9", false), (Ids{kSpmSpace, byte_id(0xC3), byte_id(0xA9)}));
  // remove_extra_whitespaces is off here: a double space is two "▁".
  EXPECT_EQ(encode(*tok, "a  b", false), (Ids{kSpmSpaceA, kSpmSpace, kSpmSpace, kSpmB}));
  for (const std::string& text : {std::string(kUtf8Text), std::string(kAsciiText), std::string("abc cab a<sep>b")})
    expect_round_trip(*tok, text, "sentencepiece model");
}

TEST(SentencePieceModel, RemovesExtraWhitespaceByDefault) {
  TempDir dir;
  write_file(dir.file("tokenizer.model"), spm_model(spm_pieces(), kModelTypeBpe, -1));
  const auto tok = load_ok(dir.file("tokenizer.model"));
  ASSERT_TRUE(tok);
  EXPECT_EQ(encode(*tok, "  a   b ", false), (Ids{kSpmSpaceA, kSpmSpace, kSpmB}));
  EXPECT_EQ(encode(*tok, "  a   b ", false), encode(*tok, "a b", false));
}

TEST(SentencePieceModel, ErrorsNameTheFile) {
  TempDir dir;
  const std::string path = dir.file("tokenizer.model");
  const std::string good = spm_model(spm_pieces(), kModelTypeBpe, 0);
  std::unique_ptr<Tokenizer> tok;
  struct Case {
    std::string what;
    std::string bytes;
    std::string needle;
  };
  const Case cases[] = {
      {"truncated inside a piece", good.substr(0, 100), "past the end"},
      {"truncated inside a varint", good.substr(0, 1) + "\xFF", "varint"},
      {"varint longer than 10 bytes", key(5, 0) + std::string(11, '\xFF'), "varint longer"},
      {"score with the wrong wire type", length_field(1, length_field(1, "a") + varint_field(2, 7)), "wire type"},
      {"group wire type", key(9, 3), "wire type 3"},
      {"no pieces", length_field(3, varint_field(3, 1)), "no pieces"},
      {"unigram model", spm_model(spm_pieces(), kModelTypeUnigram, 0), "UNIGRAM"},
      {"empty file", "", "no pieces"},
  };
  for (const Case& c : cases) {
    write_file(path, c.bytes);
    const Status st = Tokenizer::load(path, &tok);
    EXPECT_FALSE(st.ok()) << c.what;
    EXPECT_NE(st.message().find(path), std::string::npos) << c.what << ": " << st.message();
    EXPECT_NE(st.message().find(c.needle), std::string::npos) << c.what << ": " << st.message();
  }
}

// ---- finding the tokenizer of a model path

TEST(TokenizerLoad, PrefersTokenizerJsonThenModel) {
  TempDir dir;
  write_file(dir.file("tokenizer.model"), spm_model(spm_pieces(), kModelTypeBpe, 0));
  EXPECT_EQ(Tokenizer::find(dir.path()), dir.file("tokenizer.model"));
  write_llama2_json(dir.file("tokenizer.json"), "normalizer");
  EXPECT_EQ(Tokenizer::find(dir.path()), dir.file("tokenizer.json"));
  const auto tok = load_ok(dir.path());
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->description().rfind("tokenizer.json", 0), 0u) << tok->description();
}

TEST(TokenizerLoad, MissingTokenizerListsWhatWasLookedFor) {
  TempDir dir;
  std::unique_ptr<Tokenizer> tok;
  EXPECT_EQ(Tokenizer::find(dir.path()), "");
  Status st = Tokenizer::load(dir.path(), &tok);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(dir.file("tokenizer.json")), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(dir.file("tokenizer.model")), std::string::npos) << st.message();
  write_file(dir.file("model.bin"), "checkpoint");
  st = Tokenizer::load(dir.file("model.bin"), &tok);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(dir.file("tokenizer.bin")), std::string::npos) << st.message();
  EXPECT_FALSE(Tokenizer::load("default", &tok).ok());
  EXPECT_FALSE(Tokenizer::load(dir.file("nope"), &tok).ok());
}

}  // namespace
}  // namespace llmq
