// Token data files (calibration and evaluation inputs): token ids separated by white space, one
// sequence per line, or text encoded with the model's tokenizer. The file is read whole and parsed
// from memory, so the parser can be driven without a file (fuzz/fuzz_token_file.cpp).
#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include "llmq/model_io.hpp"
#include "llmq/tokenizer.hpp"
#include "model/checkpoint/input_file.hpp"

namespace llmq {
namespace {

Status read_file_text(const std::string& path, std::string* out) {
  return read_input_file("--data", path, kMaxSideFileBytes, out);
}

// The id a word spells: decimal digits only, at most 18 of them once leading zeros are dropped (so
// below 2^63 before any comparison): no sign, no wrap-around, no prefix taken from a longer word.
// The one rule for ids in data files and on the command line.
bool parse_id_word(const std::string& word, long long* id) {
  if (word.empty() || word.find_first_not_of("0123456789") != std::string::npos) return false;
  const std::string significant = word.substr(std::min(word.find_first_not_of('0'), word.size()));
  if (significant.size() > 18) return false;
  *id = significant.empty() ? 0 : std::stoll(significant);
  return true;
}

}  // namespace

Status parse_token_sequences(const std::string& source, const std::string& text, int64_t vocab_size,
                             std::vector<std::vector<int32_t>>* out, const Tokenizer* tokenizer) {
  out->clear();
  std::istringstream in(text);
  std::string line;
  int64_t line_no = 0;
  // Ids are int32 even when the vocabulary is unknown (vocab_size <= 0): a larger number must be
  // refused, not wrapped into some other id.
  const int64_t limit = vocab_size > 0 ? vocab_size : int64_t{std::numeric_limits<int32_t>::max()} + 1;
  while (std::getline(in, line)) {
    ++line_no;
    std::istringstream ls(line);
    std::vector<int32_t> seq;
    std::string word;
    while (ls >> word) {
      long long v = 0;
      // A signed number is an id out of range, not text: "-1" names no token of any vocabulary.
      const bool signed_number = (word[0] == '-' || word[0] == '+') && word.size() > 1 &&
                                 word.find_first_not_of("0123456789", 1) == std::string::npos;
      if (signed_number)
        return invalid_argument("--data: " + source + ":" + std::to_string(line_no) + ": token id " + word +
                                " is outside the vocabulary [0, " + std::to_string(limit) + ")");
      if (!parse_id_word(word, &v)) {
        if (tokenizer == nullptr)
          return invalid_argument("--data: " + source + ":" + std::to_string(line_no) + ": '" + word +
                                  "' is not a token id; text needs the model's tokenizer: a tokenizer.json or "
                                  "tokenizer.model (Hugging Face) or tokenizer.bin (llama2.c) beside the model "
                                  "enables text, else give token ids");
        // Not all ids: the whole file is text (a line of digits in it is text too).
        LLMQ_RETURN_IF_ERROR(parse_text_sequences(source, text, *tokenizer, out));
        for (const auto& s : *out)
          for (int32_t id : s)
            if (vocab_size > 0 && id >= vocab_size)
              return invalid_argument("--data: " + source + ": the tokenizer gave id " + std::to_string(id) +
                                      ", outside the model's vocabulary [0, " + std::to_string(vocab_size) + ")");
        return {};
      }
      if (v < 0 || v >= limit)
        return invalid_argument("--data: " + source + ":" + std::to_string(line_no) + ": token id " + word +
                                " is outside the vocabulary [0, " + std::to_string(limit) + ")");
      seq.push_back(static_cast<int32_t>(v));
    }
    if (!seq.empty()) out->push_back(std::move(seq));
  }
  if (out->empty()) return invalid_argument("--data: " + source + " holds no token ids");
  return {};
}

Status parse_token_ids(const std::string& what, const std::string& text, int64_t vocab_size, std::vector<int32_t>* out) {
  std::vector<int32_t> ids;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    long long v = 0;
    if (!parse_id_word(word, &v) || v >= vocab_size)
      return invalid_argument(what + ": '" + word + "' is not a token id of this model (decimal, in [0, " +
                              std::to_string(vocab_size) + "))");
    ids.push_back(static_cast<int32_t>(v));
  }
  *out = std::move(ids);
  return {};
}

Status parse_text_sequences(const std::string& source, const std::string& text, const Tokenizer& tok,
                            std::vector<std::vector<int32_t>>* out) {
  out->clear();
  std::istringstream in(text);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t\v\f") == std::string::npos) continue;
    std::vector<int32_t> seq;
    if (Status st = tok.encode(line, /*add_bos=*/true, &seq); !st.ok())
      return {st.code(), "--data: " + source + ":" + std::to_string(line_no) + ": " + st.message()};
    out->push_back(std::move(seq));
  }
  if (out->empty()) return invalid_argument("--data: " + source + " holds no text");
  return {};
}

Status read_token_sequences(const std::string& path, int64_t vocab_size, std::vector<std::vector<int32_t>>* out,
                            const Tokenizer* tokenizer) {
  std::string text;
  LLMQ_RETURN_IF_ERROR(read_file_text(path, &text));
  return parse_token_sequences(path, text, vocab_size, out, tokenizer);
}

Status read_text_sequences(const std::string& path, const Tokenizer& tok, std::vector<std::vector<int32_t>>* out) {
  std::string text;
  LLMQ_RETURN_IF_ERROR(read_file_text(path, &text));
  return parse_text_sequences(path, text, tok, out);
}

}  // namespace llmq
