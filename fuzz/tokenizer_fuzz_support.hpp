// What the tokenizer targets check once a tokenizer file is accepted: encoding text (a fixed
// sample with ASCII, UTF-8, a broken UTF-8 byte and special-looking tokens, then a slice of the
// fuzz input itself) gives ids inside the vocabulary, and every such id decodes.
#pragma once

#include <memory>
#include <vector>

#include "fuzz_support.hpp"
#include "llmq/tokenizer.hpp"
#include "model/tokenizer/tokenizer_bpe.hpp"

namespace llmq::fuzz {

inline void exercise_tokenizer(const Tokenizer& tok, const std::string& input) {
  static const std::string kSample =
      "Hello, world! It's 2026: 12345 tokens\n\t  x\xC3\xA9\xE2\x96\x81\xF0\x9F\x98\x80 <s></s><unk> \xFF\xC3";
  // The input is often a whole file; a prefix keeps one execution short.
  constexpr size_t kInputText = 512;
  for (const std::string& text : {kSample, input.substr(0, kInputText)}) {
    std::vector<int32_t> ids;
    const Status st = tok.encode(text, /*add_bos=*/true, &ids);
    if (!st.ok()) continue;  // byte fallback may be missing: an error is a valid answer
    int32_t prev = -1;
    for (int32_t id : ids) {
      require(id >= 0 && id < tok.vocab_size(), "encode gave an id outside the vocabulary", std::to_string(id));
      std::string piece;
      require(tok.decode_token(prev, id, &piece).ok(), "an encoded id does not decode", std::to_string(id));
      prev = id;
    }
    (void)tok.decode(ids);
  }
}

using TokenizerParser = Status (*)(const std::string& path, const std::string& bytes, std::unique_ptr<Tokenizer>* out);

// One tokenizer target: parse the input as `file_name`, then use what was accepted. The file sits
// in a directory that does not exist: tokenizer.json looks beside itself for
// tokenizer_config.json and config.json, and a fuzz run must not depend on where it runs.
inline int fuzz_tokenizer_file(TokenizerParser parse, const char* file_name, const uint8_t* data, size_t size) {
  const std::string source = std::string("/nonexistent-llmq-fuzz/") + file_name;
  const std::string bytes = as_string(data, size);
  std::unique_ptr<Tokenizer> tok;
  const Status st = parse(source, bytes, &tok);
  require_named_error(st, source);
  if (st.ok()) exercise_tokenizer(*tok, bytes);
  return 0;
}

}  // namespace llmq::fuzz
