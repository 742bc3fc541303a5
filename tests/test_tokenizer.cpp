// Tokenizers: tiny tokenizer files of every supported form written here (a byte-level BPE
// tokenizer.json in GPT-2 and Llama 3 flavours, a Llama 2 style tokenizer.json, a sentencepiece
// tokenizer.model from a hand-made protobuf encoder, a llama2.c tokenizer.bin), encodings checked
// against ids worked out by hand (merge order by rank and by score, leftmost ties, byte fallback,
// special tokens), decode(encode(text)) round trips on ASCII and UTF-8, the hand-written split
// patterns word by word, which file a model path loads, errors that name the file, and text data.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmq/model_io.hpp"
#include "llmq/tokenizer.hpp"
#include "support.hpp"
#include "model/tokenizer_bpe.hpp"

namespace llmq {
namespace {

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

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
  }
  s += static_cast<char>(0x80 | (cp & 0x3F));
  return s;
}

// GPT-2's byte map, built as its bytes_to_unicode() describes it: the printable bytes keep their
// code point, the other 68 take 256, 257, ... in byte order.
std::string byte_char(int byte) {
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
    if (b == byte) return utf8(cp);
  }
  return "";
}

std::string hex_piece(int byte) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", byte);
  return buf;
}

std::unique_ptr<Tokenizer> load_ok(const std::string& path) {
  std::unique_ptr<Tokenizer> tok;
  const Status st = Tokenizer::load(path, &tok);
  EXPECT_TRUE(st.ok()) << path << ": " << st.to_string();
  return tok;
}

Ids encode(const Tokenizer& tok, const std::string& text, bool add_bos) {
  Ids ids;
  const Status st = tok.encode(text, add_bos, &ids);
  EXPECT_TRUE(st.ok()) << "'" << text << "': " << st.to_string();
  return ids;
}

// Sets ids to an impossible value first, so a decoder that leaves them alone cannot pass.
void expect_round_trip(const Tokenizer& tok, const std::string& text, const std::string& what) {
  for (bool bos : {false, true}) {
    const Ids ids = encode(tok, text, bos);
    EXPECT_EQ(tok.decode(ids), text) << what << " bos=" << bos << " text='" << text << "'";
  }
}

// ---- byte-level BPE tokenizer.json (GPT-2 / Llama 3 flavours)
// Ids 0..255 are the 256 byte characters in byte order, so the id of a lone byte is the byte.

constexpr int32_t kGt = 256, kHe = 257, kGthe = 258, kCa = 259, kCat = 260, kGcat = 261, kBc = 262, kAb = 263,
                  k34 = 264, kAa = 265, kEndOfText = 266, kBegin = 267, kXyz = 268, kSep = 269;
constexpr int64_t kByteLevelVocab = 270;

json byte_level_model(bool ignore_merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const std::string g = byte_char(' ');  // "Ġ"
  vocab[g + "t"] = kGt;
  vocab["he"] = kHe;
  vocab[g + "the"] = kGthe;
  vocab["ca"] = kCa;
  vocab["cat"] = kCat;
  vocab[g + "cat"] = kGcat;
  vocab["bc"] = kBc;
  vocab["ab"] = kAb;
  vocab["34"] = k34;
  vocab["aa"] = kAa;
  vocab["xyz"] = kXyz;  // no merges make it: only ignore_merges finds it
  // Both merge spellings: "a b" strings and ["a", "b"] pairs (tokenizers >= 0.20).
  const json merges = json::array({g + " t", "h e", json::array({g + "t", "he"}), "c a", "ca t", g + " cat", "b c",
                                   "a b", "3 4", "a a"});
  return {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"byte_fallback", false},
          {"ignore_merges", ignore_merges}, {"dropout", nullptr}, {"unk_token", nullptr}};
}

json added_tokens_json() {
  return json::array({{{"id", kEndOfText}, {"content", "<|endoftext|>"}, {"special", true}},
                      {{"id", kBegin}, {"content", "<|begin|>"}, {"special", true}},
                      {{"id", kSep}, {"content", "<|sep|>"}, {"special", true}}});
}

const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

void write_gpt2_dir(const TempDir& dir) {
  const json j = {{"version", "1.0"},
                  {"added_tokens", added_tokens_json()},
                  {"normalizer", nullptr},
                  {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
                  {"post_processor", nullptr},
                  {"decoder", {{"type", "ByteLevel"}}},
                  {"model", byte_level_model(false)}};
  write_file(dir.file("tokenizer.json"), j.dump(1));
  write_file(dir.file("tokenizer_config.json"),
             json{{"bos_token", "<|begin|>"}, {"eos_token", {{"content", "<|endoftext|>"}}}}.dump());
}

void write_llama3_dir(const TempDir& dir) {
  const json pre = {{"type", "Sequence"},
                    {"pretokenizers",
                     json::array({{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                                  {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}};
  // BOS from the post-processor template, EOS by name: no tokenizer_config.json here.
  const json post = {{"type", "TemplateProcessing"},
                     {"single", json::array({{{"SpecialToken", {{"id", "<|begin|>"}, {"type_id", 0}}}},
                                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                     {"special_tokens", {{"<|begin|>", {{"id", "<|begin|>"}, {"ids", json::array({kBegin})}}}}}};
  const json j = {{"added_tokens", added_tokens_json()}, {"normalizer", nullptr}, {"pre_tokenizer", pre},
                  {"post_processor", post}, {"decoder", {{"type", "ByteLevel"}}}, {"model", byte_level_model(true)}};
  write_file(dir.file("tokenizer.json"), j.dump());
}

TEST(ByteLevelBpe, Gpt2EncodesByMergeRank) {
  TempDir dir;
  write_gpt2_dir(dir);
  const auto tok = load_ok(dir.path());
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->vocab_size(), kByteLevelVocab);
  EXPECT_EQ(tok->bos(), kBegin);
  EXPECT_EQ(tok->eos(), kEndOfText);
  EXPECT_NE(tok->description().find("byte-level"), std::string::npos) << tok->description();
  // "the" -> t + he; " cat" -> Ġ c a t -> Ġ ca t -> Ġ cat -> Ġcat.
  EXPECT_EQ(encode(*tok, "the cat", false), (Ids{'t', kHe, kGcat}));
  EXPECT_EQ(encode(*tok, " the", false), (Ids{kGthe}));
  EXPECT_EQ(encode(*tok, "the", true), (Ids{kBegin, 't', kHe}));
  // "b c" (rank 6) merges before "a b" (rank 7) although "a b" is further left.
  EXPECT_EQ(encode(*tok, "abc", false), (Ids{'a', kBc}));
  // Equal ranks: the leftmost pair first.
  EXPECT_EQ(encode(*tok, "aaa", false), (Ids{kAa, 'a'}));
  // GPT-2 keeps a digit run whole, so "3 4" can merge inside it.
  EXPECT_EQ(encode(*tok, "12345", false), (Ids{'1', '2', k34, '5'}));
  // Without ignore_merges a word that is a piece is still built by merges.
  EXPECT_EQ(encode(*tok, "xyz", false), (Ids{'x', 'y', 'z'}));
  // Bytes map to their characters: newline and UTF-8 bytes are single-byte tokens.
  EXPECT_EQ(encode(*tok, "a\nb", false), (Ids{'a', '\n', 'b'}));
  EXPECT_EQ(encode(*tok, "h\xC3\xA9", false), (Ids{'h', 0xC3, 0xA9}));
  EXPECT_EQ(encode(*tok, "", true), (Ids{kBegin}));
}

TEST(ByteLevelBpe, SpecialTokensMatchFirst) {
  TempDir dir;
  write_gpt2_dir(dir);
  const auto tok = load_ok(dir.path());
  ASSERT_TRUE(tok);
  EXPECT_EQ(encode(*tok, "cat<|endoftext|>the", false), (Ids{kCat, kEndOfText, 't', kHe}));
  EXPECT_EQ(encode(*tok, "<|sep|><|sep|>", false), (Ids{kSep, kSep}));
  // A near miss is ordinary text.
  EXPECT_EQ(encode(*tok, "<|sep", false), (Ids{'<', '|', 's', 'e', 'p'}));
  std::string piece = "poison";
  ASSERT_TRUE(tok->decode_token(-1, kSep, &piece).ok());
  EXPECT_EQ(piece, "<|sep|>");
  piece = "poison";
  ASSERT_TRUE(tok->decode_token('a', kEndOfText, &piece).ok());
  EXPECT_EQ(piece, "") << "EOS decodes to nothing";
  piece = "poison";
  ASSERT_TRUE(tok->decode_token(-1, kGthe, &piece).ok());
  EXPECT_EQ(piece, " the") << "byte-level pieces keep their leading space";
}

TEST(ByteLevelBpe, Llama3SplitsDigitsAndUsesWholeWords) {
  TempDir dir;
  write_llama3_dir(dir);
  const auto tok = load_ok(dir.file("tokenizer.json"));
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->bos(), kBegin) << "from the TemplateProcessing post-processor";
  EXPECT_EQ(tok->eos(), kEndOfText) << "by its conventional name";
  // "123" "45": the split between 3 and 4 stops the "3 4" merge.
  EXPECT_EQ(encode(*tok, "12345", false), (Ids{'1', '2', '3', '4', '5'}));
  // ignore_merges: a word that is a piece is taken whole.
  EXPECT_EQ(encode(*tok, "xyz", false), (Ids{kXyz}));
  EXPECT_EQ(encode(*tok, "the cat", true), (Ids{kBegin, 't', kHe, kGcat}));
}

TEST(ByteLevelBpe, RoundTripsAsciiAndUtf8) {
  for (bool llama3 : {false, true}) {
    TempDir dir;
    if (llama3)
      write_llama3_dir(dir);
    else
      write_gpt2_dir(dir);
    const auto tok = load_ok(dir.path());
    ASSERT_TRUE(tok);
    const std::string what = llama3 ? "llama3" : "gpt2";
    for (const std::string& text : {std::string(kUtf8Text), std::string(kAsciiText), std::string(""),
                                   std::string("a<|sep|>b <|sep|>"), std::string("\x01\x7F\xFF bytes \xC3")})
      expect_round_trip(*tok, text, what);
  }
}

// ---- the split patterns, word by word

std::vector<std::string> split(const std::string& text, tokenizer_detail::SplitKind kind, int64_t max_digits) {
  std::vector<std::string> words;
  tokenizer_detail::split_words(text, {kind, max_digits, ""}, &words);
  return words;
}

using Words = std::vector<std::string>;

TEST(PreTokenizer, Gpt2Pattern) {
  using tokenizer_detail::SplitKind;
  EXPECT_EQ(split("I'm  ok!!\n\nHi 12345 (x)  ", SplitKind::kGpt2, 0),
            (Words{"I", "'m", " ", " ok", "!!", "\n", "\n", "Hi", " 12345", " (", "x", ")", "  "}));
  // Contractions are case-sensitive in GPT-2's pattern.
  EXPECT_EQ(split("DON'T don't", SplitKind::kGpt2, 0), (Words{"DON", "'", "T", " don", "'t"}));
  EXPECT_EQ(split(kUtf8Text, SplitKind::kGpt2, 0),
            (Words{"h\xC3\xA9llo", " w\xC3\xB6rld", " 123", " \xE2\x80\x94", " \xE6\x97\xA5\xE6\x9C\xAC",
                   " \xF0\x9F\x98\x80"}));
  // The em dash is punctuation, not a letter: it separates the words around it.
  EXPECT_EQ(split("a\xE2\x80\x94" "b", SplitKind::kGpt2, 0), (Words{"a", "\xE2\x80\x94", "b"}));
}

TEST(PreTokenizer, Llama3Pattern) {
  using tokenizer_detail::SplitKind;
  EXPECT_EQ(split("I'm  ok!!\n\nHi 12345 (x)  ", SplitKind::kLlama3, 3),
            (Words{"I", "'m", " ", " ok", "!!\n\n", "Hi", " ", "123", "45", " (", "x", ")", "  "}));
  // Qwen2: one digit per word.
  EXPECT_EQ(split("x 2024", SplitKind::kLlama3, 1), (Words{"x", " ", "2", "0", "2", "4"}));
  // Case-insensitive contractions; a word takes one preceding punctuation character.
  EXPECT_EQ(split("DON'T (hello)", SplitKind::kLlama3, 3), (Words{"DON", "'T", " (", "hello", ")"}));
  EXPECT_EQ(split("a\xE2\x80\x94" "b", SplitKind::kLlama3, 3), (Words{"a", "\xE2\x80\x94" "b"}));
  // Whitespace up to the last newline is one word; a tab may lead a word.
  EXPECT_EQ(split("x \n \n  y\tz", SplitKind::kLlama3, 3), (Words{"x", " \n \n", " ", " y", "\tz"}));
  EXPECT_EQ(split(kUtf8Text, SplitKind::kLlama3, 3),
            (Words{"h\xC3\xA9llo", " w\xC3\xB6rld", " ", "123", " \xE2\x80\x94", " \xE6\x97\xA5\xE6\x9C\xAC",
                   " \xF0\x9F\x98\x80"}));
}

TEST(PreTokenizer, CharacterClassesAndByteMap) {
  using tokenizer_detail::CharClass;
  using tokenizer_detail::classify;
  EXPECT_EQ(classify(0x2014), CharClass::kOther);   // em dash
  EXPECT_EQ(classify(0x00A0), CharClass::kSpace);   // no-break space
  EXPECT_EQ(classify(0x3000), CharClass::kSpace);   // ideographic space
  EXPECT_EQ(classify(0x00E9), CharClass::kLetter);  // é
  EXPECT_EQ(classify(0x65E5), CharClass::kLetter);  // 日
  EXPECT_EQ(classify(0xFF11), CharClass::kNumber);  // fullwidth 1
  EXPECT_EQ(classify(0x00B2), CharClass::kNumber);  // ²
  EXPECT_EQ(classify(0x1F600), CharClass::kOther);  // emoji
  // GPT-2's well-known characters: "Ġ" for space, "Ċ" for newline, "Ń" for the soft hyphen.
  EXPECT_EQ(tokenizer_detail::byte_to_unicode()[' '], "\xC4\xA0");
  EXPECT_EQ(tokenizer_detail::byte_to_unicode()['\n'], "\xC4\x8A");
  EXPECT_EQ(tokenizer_detail::byte_to_unicode()[0xAD], "\xC5\x83");
  EXPECT_EQ(tokenizer_detail::byte_to_unicode()['a'], "a");
  for (int b = 0; b < 256; ++b) {
    const std::string c = tokenizer_detail::byte_to_unicode()[static_cast<size_t>(b)];
    ASSERT_EQ(c, byte_char(b)) << "byte " << b;
    const auto cps = tokenizer_detail::utf8_code_points(c);
    ASSERT_EQ(cps.size(), 1u);
    EXPECT_EQ(tokenizer_detail::byte_from_unicode(cps[0].value), b);
  }
}

// ---- sentencepiece-style BPE in tokenizer.json (Llama 2)
// Ids: <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF> at 3..258, then the pieces below.

constexpr int32_t kUnk = 0, kBos = 1, kEos = 2, kByte0 = 3;
constexpr int32_t kSp = 259, kH = 260, kE = 261, kL = 262, kO = 263, kSpH = 264, kLl = 265, kSpHe = 266, kLlo = 267,
                  kSpHello = 268, kW = 269, kR = 270, kD = 271;
constexpr int32_t byte_id(int byte) { return kByte0 + byte; }

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

// ---- llama2.c tokenizer.bin

struct BinPiece {
  std::string text;
  float score;
};
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

std::string llama2c_bin(const std::vector<BinPiece>& pieces) {
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

// ---- finding the tokenizer of a model path; tokenizer.json errors

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
