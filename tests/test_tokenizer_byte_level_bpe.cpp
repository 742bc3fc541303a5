// Byte-level BPE tokenizers: a tiny tokenizer.json in GPT-2, Llama 3 and o200k (gpt-oss) flavours
// written here, encodings checked against ids worked out by hand (merge order by rank, special
// tokens, digit splitting, whole words, camel case), decode(encode(text)) round trips on ASCII and
// UTF-8, and the hand-written split patterns, character classes and GPT-2 byte map checked word by
// word (test_tokenizer_split_oracle.cpp checks the patterns against Python's `regex` too).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmq/model.hpp"
#include "llmq/tokenizer.hpp"
#include "model/tokenizer/tokenizer_bpe.hpp"
#include "support.hpp"
#include "tokenizer_support.hpp"

namespace llmq {
namespace {

using namespace tokenizer_test;  // NOLINT: the suite's shared helpers

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

// gpt-oss / GPT-4o: tiktoken's o200k_base pattern, spelled as their tokenizer.json spells it.
const char* const kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr int32_t kAcapB = kByteLevelVocab, kNquote = kByteLevelVocab + 1;  // "aB", "N'": o200k only

// The pipeline of gpt-oss's tokenizer.json: Split (o200k, Isolated) then ByteLevel without its
// regex, a ByteLevel decoder, no normalizer or post-processor, and a BPE model with every field
// it spells (ignore_merges on). Two merges cross o200k's word boundaries: "a B" (camel case
// splits) and "N '" (a contraction stays in its word).
void write_o200k_dir(const TempDir& dir) {
  json model = byte_level_model(true);
  model["vocab"]["aB"] = kAcapB;
  model["vocab"]["N'"] = kNquote;
  model["merges"].push_back(json::array({"a", "B"}));
  model["merges"].push_back(json::array({"N", "'"}));
  model["fuse_unk"] = false;
  model["continuing_subword_prefix"] = nullptr;
  model["end_of_word_suffix"] = nullptr;
  const json pre = {{"type", "Sequence"},
                    {"pretokenizers",
                     json::array({{{"type", "Split"}, {"pattern", {{"Regex", kO200kPattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                                  {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}};
  const json j = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr},
                  {"added_tokens", added_tokens_json()}, {"normalizer", nullptr}, {"pre_tokenizer", pre},
                  {"post_processor", nullptr},
                  {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
                  {"model", model}};
  write_file(dir.file("tokenizer.json"), j.dump());
  write_file(dir.file("tokenizer_config.json"),
             json{{"bos_token", "<|begin|>"}, {"eos_token", "<|endoftext|>"}}.dump());
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

// Instruct models end a turn with one of several tokens (Llama 3.1: <|end_of_text|>, <|eom_id|>,
// <|eot_id|>): every eos_token_id of config.json and generation_config.json is an end id, EOS
// first, each once; an entry that is no token of the vocabulary is refused naming its file.
TEST(ByteLevelBpe, EndIdsComeFromEosAndBothConfigFiles) {
  TempDir dir;
  write_llama3_dir(dir);
  {
    const auto tok = load_ok(dir.file("tokenizer.json"));
    ASSERT_TRUE(tok);
    EXPECT_EQ(tok->end_ids(), (Ids{kEndOfText})) << "no config files: EOS alone";
  }
  write_file(dir.file("config.json"), json{{"eos_token_id", kSep}}.dump());
  write_file(dir.file("generation_config.json"), json{{"eos_token_id", json::array({kEndOfText, kXyz, kSep})}}.dump());
  {
    const auto tok = load_ok(dir.file("tokenizer.json"));
    ASSERT_TRUE(tok);
    EXPECT_EQ(tok->eos(), kSep) << "without tokenizer_config.json, EOS is config.json's";
    EXPECT_EQ(tok->end_ids(), (Ids{kSep, kEndOfText, kXyz}));
  }
  for (const json& bad : {json(kByteLevelVocab), json(-1), json("<|eot|>"), json::array({kSep, 1.5}),
                          json(uint64_t{1} << 63)}) {
    write_file(dir.file("generation_config.json"), json{{"eos_token_id", bad}}.dump());
    std::unique_ptr<Tokenizer> tok;
    const Status st = Tokenizer::load(dir.file("tokenizer.json"), &tok);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad.dump();
    EXPECT_NE(st.message().find("generation_config.json: eos_token_id"), std::string::npos) << st.message();
  }
}

// generation_end_ids (what `llmq run`, `serve` and `chat` stop on): config.json's EOS first (the
// model's, even with no tokenizer to read), then the tokenizer's end ids, each once.
TEST(ByteLevelBpe, GenerationEndIdsJoinTheModelsEosAndTheTokenizers) {
  TempDir dir;
  write_llama3_dir(dir);
  const auto tok = load_ok(dir.file("tokenizer.json"));
  ASSERT_TRUE(tok);
  ModelConfig c;
  c.eos_token = kXyz;
  EXPECT_EQ(generation_end_ids(c, tok.get()), (Ids{kXyz, kEndOfText}));
  EXPECT_EQ(generation_end_ids(c, nullptr), (Ids{kXyz})) << "token-id prompts still stop at EOS";
  c.eos_token = kEndOfText;
  EXPECT_EQ(generation_end_ids(c, tok.get()), (Ids{kEndOfText})) << "once";
  c.eos_token = -1;
  EXPECT_EQ(generation_end_ids(c, tok.get()), (Ids{kEndOfText}));
  EXPECT_TRUE(generation_end_ids(c, nullptr).empty());
}

TEST(ByteLevelBpe, O200kSplitsCamelCaseAndKeepsContractions) {
  TempDir dir;
  write_o200k_dir(dir);
  const auto tok = load_ok(dir.file("tokenizer.json"));
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->vocab_size(), kByteLevelVocab + 2);
  EXPECT_EQ(tok->bos(), kBegin);
  EXPECT_EQ(tok->eos(), kEndOfText);
  // "aB" is two words ("a", "B"): the "a B" merge cannot apply.
  EXPECT_EQ(encode(*tok, "aB", false), (Ids{'a', 'B'}));
  EXPECT_EQ(encode(*tok, "ab", false), (Ids{kAb}));
  // "DON'T" is one word, so "N '" merges (Llama 3 splits it "DON" "'T").
  EXPECT_EQ(encode(*tok, "DON'T", false), (Ids{'D', 'O', kNquote, 'T'}));
  EXPECT_EQ(encode(*tok, "12345", false), (Ids{'1', '2', '3', '4', '5'}));
  EXPECT_EQ(encode(*tok, "xyz", false), (Ids{kXyz})) << "ignore_merges";
  EXPECT_EQ(encode(*tok, "the cat<|sep|>", true), (Ids{kBegin, 't', kHe, kGcat, kSep}));
  for (const std::string& text :
       {std::string(kUtf8Text), std::string(kAsciiText), std::string(""), std::string("HTTPServer's camelCase/\n"),
        std::string("\xC7\x85ungla \xE0\xA4\x95\xE0\xA5\x8D\xE0\xA4\xB7 \xD9\xA3\xD9\xA3\xD9\xA3\xD9\xA3 "
                    "\xE6\x97\xA5\xE6\x9C\xAC\xE2\x80\x8B!\xCC\x81x"),
        std::string("a<|sep|>b <|sep|>"), std::string("\x01\x7F\xFF bytes \xC3")})
    expect_round_trip(*tok, text, "o200k");
}

// Qwen2 / Qwen3 declare an NFC normalizer: decomposed text encodes as its composed form. The
// expected compositions are Unicode's (UAX #15): e + U+0301 is U+00E9, the Angstrom sign U+212B is
// U+00C5 (a singleton), Hangul jamo U+1100 U+1161 is the syllable U+AC00, and an already composed
// text is left as it is.
TEST(ByteLevelBpe, NfcNormalizerComposes) {
  TempDir dir;
  json j = {{"version", "1.0"},
            {"added_tokens", added_tokens_json()},
            {"normalizer", {{"type", "NFC"}}},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
            {"post_processor", nullptr},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model", byte_level_model(false)}};
  write_file(dir.file("tokenizer.json"), j.dump(1));
  const auto tok = load_ok(dir.file("tokenizer.json"));
  ASSERT_NE(tok, nullptr);
  const struct {
    const char* decomposed;
    const char* composed;
  } cases[] = {{"caf" "e\xCC\x81", "caf\xC3\xA9"},
               {"\xE2\x84\xAB", "\xC3\x85"},
               {"\xE1\x84\x80\xE1\x85\xA1", "\xEA\xB0\x80"},
               {"A\xCC\x8A and o\xCC\x88", "\xC3\x85 and \xC3\xB6"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.composed);
    EXPECT_EQ(encode(*tok, c.decomposed, false), encode(*tok, c.composed, false));
    EXPECT_NE(encode(*tok, c.decomposed, false).size(), 0u);
  }
  // Bytes that are not UTF-8 are not text NFC is defined on: encoded as they are, byte by byte.
  const std::string bad = "ab\xC3(\xFF";
  EXPECT_EQ(tokenizer_detail::nfc(bad), bad);
  // Python's unicodedata as the oracle over mixed decomposed text, where python3 exists.
  const std::string sample = "e\xCC\x81\xE2\x84\xAB\xE1\x84\x80\xE1\x85\xA1x\xCC\xA3\xCC\x87 \xEF\xAC\x81 n\xCC\x83";
  write_file(dir.file("in.txt"), sample);
  const std::string cmd = "python3 -c \"import sys,unicodedata; t=open(sys.argv[1],encoding='utf-8').read(); "
                          "open(sys.argv[2],'w',encoding='utf-8').write(unicodedata.normalize('NFC', t))\" '" +
                          dir.file("in.txt") + "' '" + dir.file("out.txt") + "' 2>/dev/null";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "python3 is not installed (the NFC oracle is its unicodedata)";
  std::ifstream f(dir.file("out.txt"), std::ios::binary);
  const std::string want((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(tokenizer_detail::nfc(sample), want);
  EXPECT_NE(want, sample);
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

TEST(PreTokenizer, O200kPattern) {
  using tokenizer_detail::SplitKind;
  // Words end before a capital that follows lower case; capitals lead a word; contractions stay in it.
  EXPECT_EQ(split("HTTPServer's camelCase DON'T don't I'm", SplitKind::kO200k, 3),
            (Words{"HTTPServer's", " camel", "Case", " DON'T", " don't", " I'm"}));
  // (?i) folds U+017F (long s) to s: "'ſ" is a contraction.
  EXPECT_EQ(split("x'\xC5\xBF'LL", SplitKind::kO200k, 3), (Words{"x'\xC5\xBF", "'LL"}));
  // Slashes and newlines stay with the punctuation before them.
  EXPECT_EQ(split("a/\n/b //\n", SplitKind::kO200k, 3), (Words{"a", "/\n/", "b", " //\n"}));
  // A combining mark may lead a word or be one; Llama 3 counts it as punctuation.
  EXPECT_EQ(split("!\xCC\x81" "abc \xCC\x81", SplitKind::kO200k, 3), (Words{"!\xCC\x81" "abc", " \xCC\x81"}));
  EXPECT_EQ(split("!\xCC\x81" "abc \xCC\x81", SplitKind::kLlama3, 3), (Words{"!\xCC\x81", "abc", " \xCC\x81"}));
  // क्ष: the virama (Mn) joins the letters in o200k and splits them in Llama 3.
  EXPECT_EQ(split("\xE0\xA4\x95\xE0\xA5\x8D\xE0\xA4\xB7", SplitKind::kO200k, 3),
            (Words{"\xE0\xA4\x95\xE0\xA5\x8D\xE0\xA4\xB7"}));
  EXPECT_EQ(split("\xE0\xA4\x95\xE0\xA5\x8D\xE0\xA4\xB7", SplitKind::kLlama3, 3),
            (Words{"\xE0\xA4\x95", "\xE0\xA5\x8D\xE0\xA4\xB7"}));
  // Arabic-Indic digits in threes; Ⅻ (a letter number) and 2 are one number.
  EXPECT_EQ(split("\xD9\xA3\xD9\xA3\xD9\xA3\xD9\xA3 \xE2\x85\xAB" "2", SplitKind::kO200k, 3),
            (Words{"\xD9\xA3\xD9\xA3\xD9\xA3", "\xD9\xA3", " ", "\xE2\x85\xAB" "2"}));
  // U+200B is not whitespace: it leads the word after it; U+00A0 is.
  EXPECT_EQ(split("a\xE2\x80\x8B" "b\xC2\xA0" "c", SplitKind::kO200k, 3),
            (Words{"a", "\xE2\x80\x8B" "b", "\xC2\xA0" "c"}));
  EXPECT_EQ(split("x \n \n  y\tz", SplitKind::kO200k, 3), (Words{"x", " \n \n", " ", " y", "\tz"}));
}

TEST(PreTokenizer, CharacterClassesAndByteMap) {
  using tokenizer_detail::CharClass;
  using tokenizer_detail::classify;
  EXPECT_EQ(classify(0x2014), CharClass::kOther);     // em dash
  EXPECT_EQ(classify(0x00A0), CharClass::kSpace);     // no-break space
  EXPECT_EQ(classify(0x3000), CharClass::kSpace);     // ideographic space
  EXPECT_EQ(classify(0x0085), CharClass::kSpace);     // next line (a C1 control, White_Space)
  EXPECT_EQ(classify(0x200B), CharClass::kOther);     // zero-width space: not White_Space
  EXPECT_EQ(classify(0x001C), CharClass::kOther);     // file separator: Python's isspace(), not White_Space
  EXPECT_EQ(classify(0x00E9), CharClass::kLower);     // é
  EXPECT_EQ(classify(0x00C9), CharClass::kUpper);     // É
  EXPECT_EQ(classify(0x01C5), CharClass::kUpper);     // ǅ titlecase
  EXPECT_EQ(classify(0x02B0), CharClass::kCaseless);  // ʰ modifier letter
  EXPECT_EQ(classify(0x65E5), CharClass::kCaseless);  // 日
  EXPECT_EQ(classify(0x0301), CharClass::kMark);      // combining acute
  EXPECT_EQ(classify(0x093F), CharClass::kMark);      // Devanagari vowel sign i (Mc)
  EXPECT_EQ(classify(0x20DD), CharClass::kMark);      // combining enclosing circle (Me)
  EXPECT_EQ(classify(0xFF11), CharClass::kNumber);    // fullwidth 1
  EXPECT_EQ(classify(0x00B2), CharClass::kNumber);    // ²
  EXPECT_EQ(classify(0x0663), CharClass::kNumber);    // ٣
  EXPECT_EQ(classify(0x216B), CharClass::kNumber);    // Ⅻ (Nl)
  EXPECT_EQ(classify(0x1F600), CharClass::kOther);    // emoji
  EXPECT_EQ(classify(tokenizer_detail::kInvalidCodePoint), CharClass::kOther);
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

}  // namespace
}  // namespace llmq
