// A llama2.c tokenizer written as tokenizer.json + tokenizer_config.json (llama2c_tokenizer_to_hf)
// and read back with llmq's own tokenizer.json reader gives the llama2.c tokenizer's ids and text
// on varied and seeded random texts: a vocabulary written here (equal-score splits, an overlap,
// pieces with spaces, tabs, multi-byte characters) and, when present, llama2.c's tok512.bin. Also:
// what it refuses, each refusal naming the file and the piece; export_quantized's side files; and
// `llmq quantize` of a llama2.c model (one written here, and stories260K) keeping its tokenizer.
// With LLMQ_HF_CHECK_DIR set, the quantize tests leave the tokenizer files and the ids llmq gives
// there for scripts/hf_tokenizer_check.py, which asks transformers for its ids.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include "llmq/export.hpp"
#include "llmq/model.hpp"
#include "support.hpp"
#include "tokenizer_support.hpp"
#include "transformer_support.hpp"

namespace llmq {
namespace {

using namespace tokenizer_test;  // NOLINT: the suite's shared helpers

constexpr uint64_t kSeed = 20250101;
constexpr int kRandomTexts = 400;
constexpr int kMaxRandomChars = 24;

std::string models_dir() { return testing::testdata_dir() + "/../models"; }

// <unk> <s> </s>, the 256 byte tokens, then characters and the pieces merges make from them, every
// score distinct: "abc" and " ab" have two splits each, "aaa" = "a"+"aa" = "aa"+"a" overlaps,
// pieces hold inner and trailing spaces, tabs, 2- and 3-byte characters; "<", "s", ">" make "<s>"
// in text plain text.
std::vector<BinPiece> rich_pieces() {
  std::vector<BinPiece> p = {{"<unk>", 0.0f}, {"\n<s>\n", 0.0f}, {"\n</s>\n", 0.0f}};
  for (int b = 0; b < 256; ++b) p.push_back({hex_piece(b), 0.0f});
  const char* const pieces[] = {" ",   "a",  "b",   "c",        "\t",  "\xC3\xA9", "\xE6\x97\xA5",
                                "<",   ">",  "s",   ".",        ",",   " a",       "ab",
                                " ab", "bc", "abc", "  ",       "aa",  "aaa",      " b",
                                "a b", ". ", "\t\t", " \xC3\xA9", "<s",  "\xC3\xA9\xE6\x97\xA5"};
  float score = -1.0f;
  for (const char* s : pieces) p.push_back({s, score--});
  return p;
}

std::vector<std::string> fixed_texts() {
  return {"",           "a",        " a",           "  a",       "a ",       "a  ",       "   ",
          "ab abc",     "aaaa bbbb", "abcabc aaa",  "a\nb",      "\n",       "\n\n a\n",  "a\tb\t\tc",
          "\t",         "\xC3\xA9\xE6\x97\xA5 \xC3\xA9", "\xC3\xBC", "\xF0\x9F\x98\x80", "a\xF0\x9F\x98\x80" "b",
          "<s>",        "</s>",     "<unk> <s>a",   "a.b, c. ",  "x y z",    kUtf8Text,   kAsciiText};
}

// Seeded texts from `alphabet` (characters or whole pieces), of 0..kMaxRandomChars draws.
std::vector<std::string> random_texts(const std::vector<std::string>& alphabet, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> out;
  for (int c = 0; c < kRandomTexts; ++c) {
    std::string text;
    const auto len = static_cast<int>(rng() % (kMaxRandomChars + 1));
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    out.push_back(text);
  }
  return out;
}

// Converts `bin_path` and writes tokenizer.json and tokenizer_config.json into `dir`.
HfTokenizerFiles write_hf_files(const std::string& bin_path, const std::string& dir) {
  HfTokenizerFiles files;
  const Status st = llama2c_tokenizer_to_hf(bin_path, &files);
  EXPECT_TRUE(st.ok()) << st.to_string();
  fs::create_directories(dir);
  write_file(dir + "/tokenizer.json", files.tokenizer_json);
  write_file(dir + "/tokenizer_config.json", files.tokenizer_config_json);
  return files;
}

// The same ids with and without BOS, and decode gives the text back through both.
void expect_same(const Tokenizer& bin, const Tokenizer& hf, const std::string& text, const std::string& what) {
  for (bool bos : {false, true}) {
    const Ids want = encode(bin, text, bos);
    const Ids got = encode(hf, text, bos);
    EXPECT_EQ(got, want) << what << " bos=" << bos << " text='" << text << "'";
    EXPECT_EQ(hf.decode(got), text) << what << " bos=" << bos;
    EXPECT_EQ(bin.decode(want), text) << what << " bos=" << bos;
  }
}

// The characters of every piece that is text (not <unk>, BOS, EOS or a byte token), spaces,
// newlines, tabs, and characters no piece has (2- and 4-byte), as random-text alphabet.
std::vector<std::string> alphabet_of(const std::vector<std::string>& pieces) {
  std::vector<std::string> out = {" ", " ", "\n", "\t", "\xC3\xBC", "\xF0\x9F\x98\x80"};
  for (size_t id = 259; id < pieces.size(); ++id)
    if (!pieces[id].empty()) out.push_back(pieces[id]);
  return out;
}

// The pieces of a tokenizer.bin, for alphabets.
std::vector<std::string> texts_of(const std::vector<BinPiece>& pieces) {
  std::vector<std::string> out;
  for (const BinPiece& p : pieces) out.push_back(p.text);
  return out;
}

TEST(TokenizerExport, WrittenFilesSayWhatTransformersNeeds) {
  TempDir dir;
  write_file(dir.file("tokenizer.bin"), llama2c_bin(rich_pieces()));
  const HfTokenizerFiles files = write_hf_files(dir.file("tokenizer.bin"), dir.file("hf"));
  EXPECT_EQ(files.bos, kBos);
  EXPECT_EQ(files.eos, kEos);
  const json tj = json::parse(files.tokenizer_json);
  const json cfg = json::parse(files.tokenizer_config_json);
  EXPECT_EQ(cfg["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_EQ(cfg["bos_token"], "<s>");
  EXPECT_EQ(cfg["eos_token"], "</s>");
  EXPECT_EQ(cfg["unk_token"], "<unk>");
  EXPECT_EQ(cfg["add_bos_token"], true);
  EXPECT_EQ(cfg["add_eos_token"], false);
  EXPECT_EQ(cfg["split_special_tokens"], true) << "\"<s>\" in text is text to run.c";
  EXPECT_EQ(cfg["clean_up_tokenization_spaces"], false);
  const json& model = tj["model"];
  EXPECT_EQ(model["type"], "BPE");
  EXPECT_EQ(model["byte_fallback"], true);
  EXPECT_EQ(model["unk_token"], "<unk>");
  EXPECT_TRUE(tj["added_tokens"].empty());
  const json& vocab = model["vocab"];
  EXPECT_EQ(vocab.size(), rich_pieces().size());
  EXPECT_EQ(vocab["<s>"], kBos);
  EXPECT_EQ(vocab["</s>"], kEos);
  EXPECT_EQ(vocab["<0x0A>"], byte_id(0x0A));
  EXPECT_EQ(vocab[std::string(kSpace) + "a"], 271) << "\" a\" is \"▁a\"";
  for (const auto& [piece, id] : vocab.items()) EXPECT_EQ(piece.find(' '), std::string::npos) << piece;
  const auto merges = model["merges"].get<std::vector<std::string>>();
  auto rank = [&merges](const std::string& m) {
    return static_cast<int64_t>(std::find(merges.begin(), merges.end(), m) - merges.begin());
  };
  const std::string sp = kSpace;
  // Higher score first ("▁a" -13 before "ab" -14); among the splits of one piece the longer left
  // piece first, as transformers' converter orders them.
  EXPECT_LT(rank(sp + " a"), rank("a b"));
  EXPECT_LT(rank("ab c"), rank("a bc"));
  EXPECT_LT(rank("aa a"), rank("a aa"));
  EXPECT_LT(rank(sp + "a b"), rank(sp + " ab"));
  EXPECT_LT(rank("a " + sp + "b"), static_cast<int64_t>(merges.size())) << "a▁b = a + ▁b";
  EXPECT_EQ(rank("\xC3\xA9 \xE6\x97\xA5"), static_cast<int64_t>(merges.size()) - 1) << "the lowest score last";
}

TEST(TokenizerExport, ReadBackMatchesLlama2c) {
  TempDir dir;
  const std::vector<BinPiece> pieces = rich_pieces();
  write_file(dir.file("tokenizer.bin"), llama2c_bin(pieces));
  write_hf_files(dir.file("tokenizer.bin"), dir.file("hf"));
  const auto bin = load_ok(dir.file("tokenizer.bin"));
  const auto hf = load_ok(dir.file("hf"));
  ASSERT_TRUE(bin && hf);
  EXPECT_NE(hf->description().find("tokenizer.json sentencepiece-style"), std::string::npos) << hf->description();
  EXPECT_EQ(hf->vocab_size(), bin->vocab_size());
  EXPECT_EQ(hf->bos(), kBos);
  EXPECT_EQ(hf->eos(), kEos);
  for (const std::string& t : fixed_texts()) expect_same(*bin, *hf, t, "fixed");
  for (const std::string& t : random_texts(alphabet_of(texts_of(pieces)), kSeed))
    expect_same(*bin, *hf, t, "REPRO seed=" + std::to_string(kSeed));
  const Ids literal = encode(*hf, "<s>", false);
  EXPECT_EQ(std::count(literal.begin(), literal.end(), kBos), 0) << "\"<s>\" in text is text, never BOS";
  for (int32_t id = 0; id < hf->vocab_size(); ++id) {
    std::string a, b;
    ASSERT_TRUE(bin->decode_token(kBos, id, &a).ok());
    ASSERT_TRUE(hf->decode_token(kBos, id, &b).ok());
    EXPECT_EQ(b, a) << "token " << id << " after BOS";
    ASSERT_TRUE(bin->decode_token(byte_id('a'), id, &a).ok());
    ASSERT_TRUE(hf->decode_token(byte_id('a'), id, &b).ok());
    EXPECT_EQ(b, a) << "token " << id;
  }
}

TEST(TokenizerExport, Tok512ReadBackMatches) {
  const std::string path = models_dir() + "/tok512.bin";
  if (!std::ifstream(path).good()) GTEST_SKIP() << "SKIPPED: " << path << " not found (llama2.c's tok512.bin)";
  TempDir dir;
  write_hf_files(path, dir.file("hf"));
  const auto bin = load_ok(path);
  const auto hf = load_ok(dir.file("hf"));
  ASSERT_TRUE(bin && hf);
  EXPECT_EQ(hf->vocab_size(), 512);
  std::vector<std::string> pieces;
  for (int32_t id = 0; id < bin->vocab_size(); ++id) {
    std::string p;
    ASSERT_TRUE(bin->decode_token(byte_id('a'), id, &p).ok());
    pieces.push_back(p);
  }
  for (const std::string& t : fixed_texts()) expect_same(*bin, *hf, t, "tok512 fixed");
  for (const std::string& t : random_texts(alphabet_of(pieces), kSeed))
    expect_same(*bin, *hf, t, "tok512 REPRO seed=" + std::to_string(kSeed));
  EXPECT_EQ(hf->decode(encode(*hf, "Once upon a time, there was a little girl.", true)),
            "Once upon a time, there was a little girl.");
}

TEST(TokenizerExport, RefusesWhatItCannotKeep) {
  TempDir dir;
  const std::string path = dir.file("tokenizer.bin");
  struct Case {
    std::string what;
    std::vector<BinPiece> extra;
    std::string needle;
  };
  const Case cases[] = {
      {"not UTF-8", {{"\xFF\xFE", -100.0f}}, "'\\xFF\\xFE' is not UTF-8"},
      {"holds U+2581", {{"a\xE2\x96\x81", -100.0f}}, "U+2581"},
      {"duplicate piece", {{"ab", -100.0f}}, "are both 'ab'"},
      {"two products, one score", {{"ca", -50.0f}, {"cb", -50.0f}}, "same score"},
      {"NaN score", {{"zz", std::nanf("")}}, "'zz' has score nan"},
      {"BOS renamed but made by a merge", {{"\n", -60.0f}, {"\n<s>", -61.0f}}, "names '<s>'"},
  };
  HfTokenizerFiles files;
  for (const Case& c : cases) {
    std::vector<BinPiece> pieces = rich_pieces();
    pieces.insert(pieces.end(), c.extra.begin(), c.extra.end());
    write_file(path, llama2c_bin(pieces));
    const Status st = llama2c_tokenizer_to_hf(path, &files);
    EXPECT_FALSE(st.ok()) << c.what;
    EXPECT_NE(st.message().find(path), std::string::npos) << c.what << ": " << st.message();
    EXPECT_NE(st.message().find(c.needle), std::string::npos) << c.what << ": " << st.message();
  }
  // A missing byte token: the <unk> standing in for a character without its bytes comes out after
  // the byte tokens of the characters that follow it in tokenizers (transformers 5.17, tokenizers
  // 0.23.2: scripts/hf_tokenizer_check.py saw it), before them in run.c.
  std::vector<BinPiece> pieces = rich_pieces();
  pieces[static_cast<size_t>(byte_id(0xF0))].text = "F0";
  write_file(path, llama2c_bin(pieces));
  Status st = llama2c_tokenizer_to_hf(path, &files);
  EXPECT_NE(st.message().find("lacks the byte token <0xF0>"), std::string::npos) << st.message();
  write_file(path, llama2c_bin({{"<unk>", 0.0f}, {"\n<s>\n", 0.0f}}));
  st = llama2c_tokenizer_to_hf(path, &files);
  EXPECT_NE(st.message().find("2 tokens"), std::string::npos) << st.message();
  EXPECT_FALSE(llama2c_tokenizer_to_hf(dir.file("absent.bin"), &files).ok());
}

// The one text the files cannot keep: U+2581 is a space to tokenizer.json (and to sentencepiece,
// which trained the vocabulary), while run.c spells it in byte tokens.
TEST(TokenizerExport, SpaceSymbolInTextIsASpace) {
  TempDir dir;
  write_file(dir.file("tokenizer.bin"), llama2c_bin(rich_pieces()));
  write_hf_files(dir.file("tokenizer.bin"), dir.file("hf"));
  const auto bin = load_ok(dir.file("tokenizer.bin"));
  const auto hf = load_ok(dir.file("hf"));
  ASSERT_TRUE(bin && hf);
  const std::string text = std::string("a") + kSpace + "b";
  EXPECT_EQ(encode(*hf, text, false), encode(*hf, "a b", false));
  EXPECT_EQ(encode(*bin, text, false), (Ids{271, byte_id(0xE2), byte_id(0x96), byte_id(0x81), 261}));
}

// ---- export_quantized's side files, and `llmq quantize` of a llama2.c model

DefaultModelOptions small_model_options(int64_t vocab) {
  DefaultModelOptions o;
  o.dim = 128;
  o.hidden_dim = 256;
  o.n_layers = 1;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.vocab_size = vocab;
  o.max_seq_len = 64;
  return o;
}

TEST(ExportSideFiles, WrittenBesideConfigOrRefused) {
  TempDir dir;
  const ModelWeights model = make_default_model(small_model_options(300));
  const auto source = memory_weight_source(model);
  Scheme scheme;
  ASSERT_TRUE(find_scheme(kDefaultScheme, &scheme).ok());
  ExportSummary sum;
  for (const std::string& bad : {"", ".hidden", "../x", "a/b", "config.json", "model.safetensors",
                                 "model-00001-of-00002.safetensors", "model.safetensors.index.json"}) {
    ExportOptions options;
    options.side_files = {{bad, "x"}};
    const Status st = export_quantized(*source, scheme, nullptr, dir.file("out"), options, &sum);
    EXPECT_FALSE(st.ok()) << "'" << bad << "'";
    EXPECT_NE(st.message().find("side file '" + bad + "'"), std::string::npos) << st.message();
    EXPECT_FALSE(fs::exists(dir.file("out"))) << "refused before anything is written";
  }
  ExportOptions options;
  options.side_files = {{"a.json", "{}"}, {"a.json", "{}"}};
  EXPECT_FALSE(export_quantized(*source, scheme, nullptr, dir.file("out"), options, &sum).ok()) << "twice";
  options.side_files = {{"tokenizer.json", "{\"x\": 1}\n"}, {"notes.txt", ""}};
  const Status st = export_quantized(*source, scheme, nullptr, dir.file("out"), options, &sum);
  ASSERT_TRUE(st.ok()) << st.to_string();
  std::ifstream in(dir.file("out/tokenizer.json"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "{\"x\": 1}\n");
  EXPECT_TRUE(fs::is_regular_file(dir.file("out/notes.txt")));
}

// Runs `llmq quantize` as a child process; its exit status.
int run_quantize(const std::vector<std::string>& args, const std::string& log) {
  const int pid = testing::spawn_with_log(LLMQ_CLI_PATH, args, log);
  if (pid < 0) return -1;
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// For scripts/hf_tokenizer_check.py: <LLMQ_HF_CHECK_DIR>/<name>/ (the tokenizer files, and
// config.json when there is one) and <name>.ids.json, the texts with the ids llmq gives from that directory (and
// from the llama2.c file) and its decoded text.
void leave_for_transformers(const std::string& name, const std::string& out_dir, const Tokenizer& bin,
                            const Tokenizer& hf, const std::vector<std::string>& texts) {
  const char* check_dir = std::getenv("LLMQ_HF_CHECK_DIR");
  if (check_dir == nullptr || *check_dir == '\0') return;
  const std::string dest = std::string(check_dir) + "/" + name;
  fs::create_directories(dest);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "config.json"})
    if (fs::exists(out_dir + "/" + f))
      fs::copy_file(out_dir + "/" + f, dest + "/" + f, fs::copy_options::overwrite_existing);
  json rows = json::array();
  for (const std::string& t : texts)
    rows.push_back({{"text", t},
                    {"ids", encode(hf, t, false)},
                    {"ids_bos", encode(hf, t, true)},
                    {"llama2c_ids", encode(bin, t, false)},
                    {"decoded", hf.decode(encode(hf, t, false))}});
  write_file(dest + ".ids.json", rows.dump(1) + "\n");
}

// `llmq quantize --model <llama2.c .bin>` with the tokenizer beside it: the output carries
// tokenizer.json and tokenizer_config.json, llmq reads them back to the llama2.c ids, and
// config.json's BOS / EOS are the tokenizer's.
void check_quantize_keeps_tokenizer(const std::string& name, const std::string& model, const std::string& bin_path,
                                    const std::vector<std::string>& alphabet) {
  TempDir dir;
  const std::string out = dir.file("out");
  ASSERT_EQ(run_quantize({"quantize", "--model", model, "-o", out}, dir.file("log")), 0) << slurp(dir.file("log"));
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "config.json"})
    EXPECT_TRUE(fs::is_regular_file(out + "/" + f)) << f;
  const json config = json::parse(slurp(out + "/config.json"));
  EXPECT_EQ(config["bos_token_id"], kBos);
  EXPECT_EQ(config["eos_token_id"], kEos);
  const json tok_config = json::parse(slurp(out + "/tokenizer_config.json"));
  EXPECT_EQ(json::parse(slurp(out + "/tokenizer.json"))["model"]["vocab"][tok_config["bos_token"].get<std::string>()],
            kBos);
  const auto bin = load_ok(bin_path);
  const auto hf = load_ok(out);
  ASSERT_TRUE(bin && hf);
  std::vector<std::string> texts = fixed_texts();
  for (const std::string& t : random_texts(alphabet, kSeed)) texts.push_back(t);
  for (const std::string& t : texts) expect_same(*bin, *hf, t, name);
  texts.push_back(std::string("a") + kSpace + "b");  // the one known difference, reported there
  leave_for_transformers(name, out, *bin, *hf, texts);
}

// An empty piece is never made from text and decodes to nothing, in both (transformers loads it:
// scripts/hf_tokenizer_check.py's "empty_piece" case).
TEST(TokenizerExport, EmptyPiece) {
  TempDir dir;
  std::vector<BinPiece> pieces = rich_pieces();
  pieces.push_back({"", -100.0f});
  write_file(dir.file("tokenizer.bin"), llama2c_bin(pieces));
  write_hf_files(dir.file("tokenizer.bin"), dir.file("hf"));
  const auto bin = load_ok(dir.file("tokenizer.bin"));
  const auto hf = load_ok(dir.file("hf"));
  ASSERT_TRUE(bin && hf);
  std::string piece = "poison";
  ASSERT_TRUE(hf->decode_token(kBos, static_cast<int32_t>(pieces.size()) - 1, &piece).ok());
  EXPECT_EQ(piece, "");
  std::vector<std::string> texts = fixed_texts();
  for (const std::string& t : random_texts(alphabet_of(texts_of(pieces)), kSeed)) texts.push_back(t);
  for (const std::string& t : texts) expect_same(*bin, *hf, t, "with an empty piece");
  leave_for_transformers("empty_piece", dir.file("hf"), *bin, *hf, texts);
}

TEST(QuantizeKeepsTokenizer, Llama2cModelWrittenHere) {
  TempDir dir;
  const std::vector<BinPiece> pieces = rich_pieces();
  ModelWeights model = make_default_model(small_model_options(static_cast<int64_t>(pieces.size())));
  transformer_test::write_bytes(dir.file("model.bin"), transformer_test::v1_bytes(model, false));
  write_file(dir.file("tokenizer.bin"), llama2c_bin(pieces));
  check_quantize_keeps_tokenizer("synthetic", dir.file("model.bin"), dir.file("tokenizer.bin"),
                                 alphabet_of(texts_of(pieces)));
}

TEST(QuantizeKeepsTokenizer, Stories260K) {
  const std::string model = models_dir() + "/stories260K.bin", tok = models_dir() + "/tok512.bin";
  if (!std::ifstream(model).good() || !std::ifstream(tok).good())
    GTEST_SKIP() << "SKIPPED: " << model << " or " << tok << " not found";
  const auto bin = load_ok(tok);
  ASSERT_TRUE(bin);
  std::vector<std::string> pieces;
  for (int32_t id = 0; id < bin->vocab_size(); ++id) {
    std::string p;
    ASSERT_TRUE(bin->decode_token(byte_id('a'), id, &p).ok());
    pieces.push_back(p);
  }
  check_quantize_keeps_tokenizer("stories260K", model, tok, alphabet_of(pieces));
}

}  // namespace
}  // namespace llmq
