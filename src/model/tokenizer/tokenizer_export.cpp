// llama2.c tokenizer.bin -> Hugging Face tokenizer.json and tokenizer_config.json, written so that
// llmq's own reader (tokenizer_hf.cpp) and transformers encode text to the ids run.c gives.
//
// What makes the two agree:
// - run.c prepends the " " token to non-empty text and looks every character up among pieces that
//   hold spaces; tokenizer.json's normalizer prepends "▁" and turns spaces into "▁" (Prepend then
//   Replace, transformers' "legacy" Llama pipeline: no pre-tokenizer, so merges may span spaces
//   as run.c's do), and its pieces hold "▁" where the file has " ".
// - run.c merges the adjacent pair whose concatenation is the piece of highest score. A merge
//   list ranks pairs instead: every pair of pieces whose concatenation is a piece, ordered as
//   transformers' sentencepiece converter orders them (the product's score, higher first; then the
//   longer left piece, the longer right; then vocabulary order). Equal scores are where run.c's
//   "leftmost first" and a fixed rank can part; among pairs making the same piece they agree on
//   every text tested, but two different pieces with one score are refused.
// - Characters without a piece become their <0xNN> tokens (byte_fallback), so every one of the 256
//   must be there: tokenizers puts the <unk> of a character without them after the byte tokens of
//   the characters that follow it (transformers 5.17 / tokenizers 0.23.2), where run.c keeps text
//   order.
// - "<s>" / "</s>" / "<unk>" in text are text to run.c: tokenizer.json lists no added tokens, and
//   tokenizer_config.json sets split_special_tokens, which stops transformers from matching the
//   special tokens it registers from the config.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "llmq/tokenizer.hpp"
#include "model/tokenizer/tokenizer_bpe.hpp"

namespace llmq {
namespace {

using ojson = nlohmann::ordered_json;
using tokenizer_detail::CodePoint;
using tokenizer_detail::kInvalidCodePoint;
using tokenizer_detail::parse_byte_piece;
using tokenizer_detail::utf8_code_points;

constexpr const char* kSpaceSymbol = "\xE2\x96\x81";  // "▁" U+2581
// run.c's fixed ids (tokenizer_sentencepiece.cpp reads the file with the same ones).
constexpr int32_t kBos = 1, kEos = 2;

// A piece for a message: printable ASCII as is, every other byte as \xNN (the piece may not be
// UTF-8, and a newline inside quotes would hide where it ends).
std::string printable(const std::string& piece) {
  std::string s = "'";
  for (char c : piece) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x20 && b < 0x7F) {
      s += c;
      continue;
    }
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02X", b);
    s += buf;
  }
  return s + "'";
}

bool is_utf8(const std::string& s) {
  for (const CodePoint& c : utf8_code_points(s))
    if (c.value == kInvalidCodePoint && c.size == 1) return false;  // a real U+FFFD is 3 bytes
  return true;
}

// "<0x0A>": the spelling byte_fallback looks a byte up by.
std::string byte_piece(int byte) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "<0x%02X>", static_cast<unsigned>(byte));
  return buf;
}

// The piece tokenizer.json lists for token `id`: llama2.c's export wrote BOS / EOS as "\n<s>\n" /
// "\n</s>\n" (transformers' Llama names them "<s>" / "</s>"), byte tokens in the spelling
// byte_fallback looks up (<0x0A>, upper case), and "▁" for every space.
std::string hf_piece(int32_t id, const std::string& piece) {
  if (id == kBos && piece == "\n<s>\n") return "<s>";
  if (id == kEos && piece == "\n</s>\n") return "</s>";
  if (const int b = parse_byte_piece(piece); b >= 0) return byte_piece(b);
  std::string out;
  for (char c : piece) out += c == ' ' ? std::string(kSpaceSymbol) : std::string(1, c);
  return out;
}

struct Merge {
  int32_t left, right, product;
  float score;                  // the product's
  int64_t left_chars, right_chars;  // code points: transformers compares Python string lengths
};

ojson string_pattern(const std::string& s) { return ojson{{"String", s}}; }

ojson tokenizer_json(const std::vector<std::string>& hf, const std::vector<Merge>& merges, int32_t unk) {
  ojson vocab = ojson::object();
  for (size_t id = 0; id < hf.size(); ++id) vocab[hf[id]] = static_cast<int64_t>(id);
  ojson merge_list = ojson::array();
  // "left right": no piece holds a space (they became "▁"), which every tokenizers version reads.
  for (const Merge& m : merges)
    merge_list.push_back(hf[static_cast<size_t>(m.left)] + " " + hf[static_cast<size_t>(m.right)]);
  const std::string& bos = hf[kBos];
  auto special = [](const std::string& name, int type_id) {
    return ojson{{"SpecialToken", {{"id", name}, {"type_id", type_id}}}};
  };
  auto sequence = [](const char* name, int type_id) {
    return ojson{{"Sequence", {{"id", name}, {"type_id", type_id}}}};
  };
  ojson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = ojson::array();
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "Prepend"}, {"prepend", kSpaceSymbol}},
                       {{"type", "Replace"}, {"pattern", string_pattern(" ")}, {"content", kSpaceSymbol}}}}};
  j["pre_tokenizer"] = nullptr;
  // BOS before the text, as run.c's encode(bos = 1) and transformers' Llama do.
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {special(bos, 0), sequence("A", 0)}},
                         {"pair", {special(bos, 0), sequence("A", 0), special(bos, 1), sequence("B", 1)}},
                         {"special_tokens", {{bos, {{"id", bos}, {"ids", {kBos}}, {"tokens", {bos}}}}}}};
  // "▁" back to spaces, byte tokens back to bytes, and the one space the normalizer prepended off.
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Replace"}, {"pattern", string_pattern(kSpaceSymbol)}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", unk >= 0 ? ojson(hf[static_cast<size_t>(unk)]) : ojson(nullptr)},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", true},
                {"vocab", std::move(vocab)},
                {"merges", std::move(merge_list)}};
  return j;
}

ojson tokenizer_config_json(const std::vector<std::string>& hf, int32_t unk) {
  ojson j;
  // The generic class loads tokenizer.json as written; LlamaTokenizerFast may rebuild the
  // pipeline from its own defaults (a Metaspace that does not prepend before a leading space).
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  j["bos_token"] = hf[kBos];
  j["eos_token"] = hf[kEos];
  j["unk_token"] = unk >= 0 ? ojson(hf[static_cast<size_t>(unk)]) : ojson(nullptr);
  j["add_bos_token"] = true;
  j["add_eos_token"] = false;
  j["clean_up_tokenization_spaces"] = false;  // decode gives the text back, " ." included
  j["split_special_tokens"] = true;           // "<s>" in text is text, as to run.c
  return j;
}

Status convert(const std::string& path, const std::string& data, HfTokenizerFiles* out) {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  LLMQ_RETURN_IF_ERROR(tokenizer_detail::read_llama2c_pieces(path, data, &pieces, &scores));
  auto refuse = [&path](const std::string& why) {
    return invalid_argument(path + ": cannot be written as tokenizer.json: " + why);
  };
  auto token = [&pieces](int32_t id) {
    return "token " + std::to_string(id) + " " + printable(pieces[static_cast<size_t>(id)]);
  };
  const auto n = static_cast<int64_t>(pieces.size());
  if (n <= kEos)
    return refuse("it has " + std::to_string(n) + " tokens, and llama2.c's BOS and EOS are ids 1 and 2");
  if (n > INT32_MAX) return refuse(std::to_string(n) + " tokens do not fit int32 ids");

  std::vector<std::string> hf(static_cast<size_t>(n));
  std::unordered_map<std::string, int32_t> bin_ids, hf_ids;  // piece -> id, in the file and in tokenizer.json
  std::array<bool, 256> have_byte{};
  for (int32_t id = 0; id < n; ++id) {
    const std::string& p = pieces[static_cast<size_t>(id)];
    if (!std::isfinite(scores[static_cast<size_t>(id)]))
      return refuse(token(id) + " has score " + std::to_string(scores[static_cast<size_t>(id)]) +
                    ", which gives its merges no order");
    if (!is_utf8(p)) return refuse(token(id) + " is not UTF-8 text, which tokenizer.json holds");
    if (p.find(kSpaceSymbol) != std::string::npos)
      return refuse(token(id) + " holds U+2581 \"\xE2\x96\x81\", which tokenizer.json uses for a space: it could not "
                    "tell this piece from one with a space");
    hf[static_cast<size_t>(id)] = hf_piece(id, p);
    if (const auto [it, fresh] = hf_ids.emplace(hf[static_cast<size_t>(id)], id); !fresh)
      return refuse(token(id) + " and " + token(it->second) + " are both '" + it->first +
                    "' in tokenizer.json, whose vocabulary maps each piece to one id");
    bin_ids.emplace(p, id);
    if (const int b = parse_byte_piece(p); b >= 0) have_byte[static_cast<size_t>(b)] = true;
  }
  const auto unk_it = bin_ids.find("<unk>");
  const int32_t unk = unk_it == bin_ids.end() ? -1 : unk_it->second;
  // run.c takes ids 3..258 for the bytes without looking; a vocabulary that lacks one spells some
  // character as <unk>, which transformers puts out of order (above).
  for (int b = 0; b < 256; ++b)
    if (!have_byte[static_cast<size_t>(b)])
      return refuse("it lacks the byte token " + byte_piece(b) + " (every character needs its bytes' tokens)");

  // Every split of every piece, at character boundaries (run.c's symbols are whole characters or
  // byte tokens), into two pieces: the pairs run.c merges.
  std::vector<Merge> merges;
  for (int32_t id = 0; id < n; ++id) {
    const std::string& p = pieces[static_cast<size_t>(id)];
    const std::vector<CodePoint> chars = utf8_code_points(p);
    const auto total = static_cast<int64_t>(chars.size());
    std::vector<Merge> local;
    for (int64_t k = 1; k < total; ++k) {
      const auto at = static_cast<size_t>(chars[static_cast<size_t>(k)].begin);
      const auto l = bin_ids.find(p.substr(0, at));
      const auto r = bin_ids.find(p.substr(at));
      if (l != bin_ids.end() && r != bin_ids.end())
        local.push_back({l->second, r->second, id, scores[static_cast<size_t>(id)], k, total - k});
    }
    std::sort(local.begin(), local.end(), [](const Merge& a, const Merge& b) {
      return a.left != b.left ? a.left < b.left : a.right < b.right;
    });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  // transformers' order; stable, so equal keys keep the product's id order, then the pair's.
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.left_chars != b.left_chars) return a.left_chars > b.left_chars;
    return a.right_chars > b.right_chars;
  });
  std::unordered_map<float, int32_t> product_of_score;  // -0.0 and 0.0 are one key, as they compare equal
  for (const Merge& m : merges) {
    const std::string& left = hf[static_cast<size_t>(m.left)];
    const std::string& right = hf[static_cast<size_t>(m.right)];
    if (left + right != hf[static_cast<size_t>(m.product)])
      return refuse(token(m.left) + " and " + token(m.right) + " merge into " + token(m.product) +
                    ", which tokenizer.json names '" + hf[static_cast<size_t>(m.product)] + "', not '" + left + right +
                    "'");
    const auto [it, fresh] = product_of_score.emplace(m.score, m.product);
    if (!fresh && it->second != m.product)
      return refuse(token(it->second) + " and " + token(m.product) +
                    " are both made by merges and have the same score " + std::to_string(m.score) +
                    ": run.c merges whichever pair comes first in the text, which a merge list (one rank per "
                    "pair) cannot say");
  }

  out->tokenizer_json = tokenizer_json(hf, merges, unk).dump(2) + "\n";
  out->tokenizer_config_json = tokenizer_config_json(hf, unk).dump(2) + "\n";
  out->bos = kBos;
  out->eos = kEos;
  out->vocab_size = n;
  return {};
}

}  // namespace

Status llama2c_tokenizer_to_hf(const std::string& path, HfTokenizerFiles* out) {
  std::string data;
  LLMQ_RETURN_IF_ERROR(tokenizer_detail::read_whole_file(path, &data));
  return convert(path, data, out);
}

}  // namespace llmq
