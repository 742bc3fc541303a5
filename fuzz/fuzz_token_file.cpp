// Token data files (--data of calibrate / eval): token ids per line, or text encoded with the
// model's tokenizer. Each input is read twice: without a tokenizer and an unknown vocabulary
// (ids must still be int32), and with a small llama2.c tokenizer and its vocabulary (text falls
// back to the tokenizer). Accepted sequences are non-empty and inside the vocabulary.
#include "format_writers.hpp"
#include "fuzz_support.hpp"
#include "llmq/model_io.hpp"
#include "llmq/tokenizer.hpp"
#include "model/tokenizer/tokenizer_bpe.hpp"

namespace {

const llmq::Tokenizer& small_tokenizer() {
  static const std::unique_ptr<llmq::Tokenizer> tok = [] {
    std::unique_ptr<llmq::Tokenizer> t;
    const llmq::Status st =
        llmq::tokenizer_detail::parse_llama2c_tokenizer("story-tokenizer.bin", llmq::fuzz::story_tokenizer_file(), &t);
    llmq::fuzz::require(st.ok(), "the fixed tokenizer does not load:", st.message());
    return t;
  }();
  return *tok;
}

void check(const llmq::Status& st, const std::vector<std::vector<int32_t>>& seqs, int64_t vocab_size) {
  if (!st.ok()) return;
  llmq::fuzz::require(!seqs.empty(), "OK with no sequences");
  for (const auto& seq : seqs) {
    llmq::fuzz::require(!seq.empty(), "an empty sequence");
    for (int32_t id : seq)
      llmq::fuzz::require(id >= 0 && (vocab_size <= 0 || id < vocab_size), "id outside the vocabulary",
                          std::to_string(id));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmq;
  const std::string source = "fuzz-tokens.txt";
  const std::string text = fuzz::as_string(data, size);
  std::vector<std::vector<int32_t>> seqs;
  Status st = parse_token_sequences(source, text, /*vocab_size=*/0, &seqs);
  fuzz::require_named_error(st, source);
  check(st, seqs, 0);
  const Tokenizer& tok = small_tokenizer();
  st = parse_token_sequences(source, text, tok.vocab_size(), &seqs, &tok);
  fuzz::require_named_error(st, source);
  check(st, seqs, tok.vocab_size());
  return 0;
}
