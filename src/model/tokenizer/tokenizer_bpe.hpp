// Tokenizer internals shared by the loaders (tokenizer_hf.cpp, tokenizer_sentencepiece.cpp):
// UTF-8 and code point classes, the GPT-2 byte <-> unicode map, the hand-written pre-tokenizers
// (tokenizer_text.cpp), and one BPE tokenizer that every file format is turned into
// (tokenizer_bpe.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "llmq/tokenizer.hpp"

namespace llmq::tokenizer_detail {

// ---- UTF-8 and character classes ----

// A code point of a UTF-8 string and where its bytes are. A byte that does not start a valid
// sequence is one code point of value kInvalidCodePoint, so no input is rejected.
inline constexpr uint32_t kInvalidCodePoint = 0xFFFD;
struct CodePoint {
  uint32_t value;
  int64_t begin;  // byte offset
  int64_t size;   // bytes, 1..4
};
std::vector<CodePoint> utf8_code_points(const std::string& s);
std::string utf8_encode(uint32_t cp);
// Unicode canonical composition (NFC, ICU's normalizer), as tokenizers' NFC normalizer applies it.
// Text that is not valid UTF-8 is returned as it is (NFC is defined on code points only).
std::string nfc(const std::string& text);

// What the split patterns tell code points apart by: the Unicode general category (ICU's
// u_charType) grouped as the patterns group it, and Unicode's White_Space property for \s (what
// Oniguruma, the regex engine of Hugging Face tokenizers, and Python's `regex` match by \s). The
// Unicode version is the system ICU's (Debian 12: ICU 72, Unicode 15.0).
//   \p{L} = kUpper kLower kCaseless, \p{N} = kNumber, \s = kSpace, [^\s\p{L}\p{N}] = kMark kOther;
//   o200k's [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] = kUpper kCaseless kMark,
//         its [\p{Ll}\p{Lm}\p{Lo}\p{M}]     = kLower kCaseless kMark.
enum class CharClass : uint8_t {
  kUpper,     // Lu, Lt
  kLower,     // Ll
  kCaseless,  // Lm, Lo
  kMark,      // Mn, Mc, Me (not letters: GPT-2 and Llama 3 count them as punctuation)
  kNumber,    // Nd, Nl, No
  kSpace,     // White_Space, checked first (its characters are Cc, Zs, Zl, Zp: none of the above)
  kOther,     // punctuation, symbols, other controls, format (U+200B), private use, unassigned
};
CharClass classify(uint32_t cp);
inline bool is_letter(CharClass c) {
  return c == CharClass::kUpper || c == CharClass::kLower || c == CharClass::kCaseless;
}

// GPT-2's reversible byte -> printable character map (bytes 33..126, 161..172, 174..255 map to
// themselves, the rest to 256, 257, ... in byte order), as UTF-8 strings.
const std::array<std::string, 256>& byte_to_unicode();
// The byte a mapped code point stands for, or -1.
int byte_from_unicode(uint32_t cp);

// ---- pre-tokenizers: split text into words that BPE merges within ----

enum class SplitKind {
  kGpt2,       // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3,     // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,k}| ?[^\s\p{L}\p{N}]+[\r\n]*|
               //   \s*[\r\n]+|\s+(?!\S)|\s+     (Llama 3: k = 3; Qwen2: k = 1)
  kO200k,      // [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|...)?|
               //   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|...)?|
               //   \p{N}{1,k}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
               //   (GPT-4o, gpt-oss: tiktoken's o200k_base, k = 3)
  kMetaspace,  // a new word before every "▁" (HF Metaspace, split = true)
};
struct Splitter {
  SplitKind kind = SplitKind::kGpt2;
  int64_t max_digits = 3;  // kLlama3, kO200k
  std::string marker;      // kMetaspace
};
// The Split pre-tokenizer regexes llmq reads, as tokenizer.json spells them, and what each becomes
// (tokenizer_hf.cpp; GPT-2's is also what a ByteLevel pre-tokenizer with use_regex means).
struct SplitPattern {
  const char* regex;
  SplitKind kind;
  int64_t max_digits;
};
const std::vector<SplitPattern>& split_patterns();
// Appends the words of `text` (which concatenate back to it) to `out`.
void split_words(const std::string& text, const Splitter& splitter, std::vector<std::string>* out);

// ---- normalization, applied to text outside special tokens ----

struct NormalizeOp {
  enum class Kind { kPrepend, kReplace, kCollapseSpaces, kNfc } kind = Kind::kReplace;
  std::string from;  // kReplace: what is replaced
  std::string to;    // kReplace: its replacement; kPrepend: what is prepended
  bool first_only = false;       // kPrepend: only to the text's first segment (Metaspace "first")
  bool skip_if_present = false;  // kPrepend: not when the text already starts with it (Metaspace)
};

// ---- the BPE tokenizer every format becomes ----

struct SpecialToken {
  std::string content;
  int32_t id = 0;
};

struct BpeSpec {
  std::string source;       // the file, for messages
  std::string description;  // Tokenizer::description()
  std::vector<std::string> pieces;  // id -> piece: byte-level characters, "▁" pieces, raw text
  // Pieces a word's characters are looked up in and merges may produce (a sentencepiece model
  // leaves out its control, unknown, unused and byte pieces).
  std::vector<bool> mergeable;
  // Merge order. kRank: tokenizer.json merges, the lowest rank first. kScore: sentencepiece and
  // llama2.c, the adjacent pair whose concatenation is a piece with the highest score first.
  // Ties go to the leftmost pair in both, as Hugging Face and run.c do.
  enum class MergeMode { kRank, kScore } merge_mode = MergeMode::kRank;
  std::vector<std::pair<int32_t, int32_t>> merges;  // kRank, by rank: (left, right) ids
  std::vector<float> scores;                         // kScore, per id
  bool byte_level = false;      // pieces are GPT-2 byte-mapped characters
  bool byte_fallback = false;   // characters without a piece become their <0xNN> tokens
  bool ignore_merges = false;   // a word that is a piece is taken whole (Llama 3)
  bool fuse_unk = false;        // consecutive <unk> become one
  int32_t unk = -1;
  int32_t bos = -1;
  int32_t eos = -1;
  // Tokens that end a generation (Tokenizer::end_ids); empty: EOS alone, when there is one.
  std::vector<int32_t> end_ids;
  std::vector<int32_t> control;        // ids that decode to "" (sentencepiece control pieces)
  std::vector<SpecialToken> specials;  // matched literally in the text, before anything else
  std::vector<NormalizeOp> normalize;
  // sentencepiece normalizes the whole text and then finds special pieces in it; tokenizer.json
  // finds added tokens first and normalizes each piece of text between them.
  bool normalize_whole_text = false;
  std::vector<Splitter> splitters;  // applied in order; none: each text segment is one word
  std::string space_symbol;         // decode: what stands for a space ("▁"; "" = nothing)
  bool strip_leading_space = false; // decode: drop the space the normalizer prepended
};

class BpeTokenizer final : public Tokenizer {
 public:
  // Checks the spec (ids in range, merges of known pieces) and builds the lookup tables.
  static Status create(BpeSpec spec, std::unique_ptr<Tokenizer>* out);

  Status encode(const std::string& text, bool add_bos, std::vector<int32_t>* out) const override;
  Status decode_token(int32_t prev, int32_t token, std::string* piece) const override;

 private:
  struct MergeResult {
    int32_t rank;
    int32_t merged;
  };
  explicit BpeTokenizer(BpeSpec spec);
  std::string normalize(const std::string& text, bool at_start) const;
  Status encode_segment(const std::string& text, bool at_start, std::vector<int32_t>* out) const;
  Status encode_word(const std::string& word, std::vector<int32_t>* out) const;
  // The id the pair merges into and its priority (lower merges first); false when it does not.
  bool find_merge(int32_t left, int32_t right, double* priority, int32_t* merged) const;
  void merge_symbols(std::vector<int32_t>* ids) const;

  BpeSpec spec_;
  std::unordered_map<std::string, int32_t> lookup_;          // mergeable piece -> id
  std::unordered_map<uint64_t, MergeResult> merge_ranks_;    // (left << 32 | right) -> merge
  std::array<int32_t, 256> byte_tokens_{};                   // byte -> <0xNN> id, or -1
  std::vector<int16_t> byte_of_token_;                       // id -> byte of a <0xNN> token, or -1
  std::vector<uint8_t> decodes_empty_;                       // id -> BOS, EOS, control
  std::vector<uint8_t> is_special_;                          // id -> added token (decoded verbatim)
  std::array<bool, 256> special_first_byte_{};               // quick reject for special matching
};

// "<0x0A>" -> 10; -1 for anything else.
int parse_byte_piece(const std::string& piece);

// ---- loaders ----
Status load_tokenizer_json(const std::string& path, std::unique_ptr<Tokenizer>* out);
Status load_sentencepiece_model(const std::string& path, std::unique_ptr<Tokenizer>* out);
Status load_llama2c_tokenizer(const std::string& path, std::unique_ptr<Tokenizer>* out);
// The same over the file's bytes already in memory (the load_* functions read the file and call
// these; the fuzz targets call them directly). `path` names the file in errors; tokenizer.json
// also looks beside it for tokenizer_config.json and config.json (BOS / EOS ids).
Status parse_tokenizer_json(const std::string& path, const std::string& text, std::unique_ptr<Tokenizer>* out);
Status parse_sentencepiece_model(const std::string& path, const std::string& data, std::unique_ptr<Tokenizer>* out);
Status parse_llama2c_tokenizer(const std::string& path, const std::string& data, std::unique_ptr<Tokenizer>* out);

// A llama2.c tokenizer's pieces (bytes as stored: spaces, not "▁") and scores, id by id; an error
// naming the file and byte offset when it is cut short or a length is out of range. Read by
// parse_llama2c_tokenizer and by llama2c_tokenizer_to_hf (tokenizer_export.cpp).
Status read_llama2c_pieces(const std::string& path, const std::string& data, std::vector<std::string>* pieces,
                           std::vector<float>* scores);

// The whole file; an IoError naming it when it cannot be read.
Status read_whole_file(const std::string& path, std::string* out);

}  // namespace llmq::tokenizer_detail
