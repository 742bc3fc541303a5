// Hugging Face tokenizer.json: BPE with byte-level or sentencepiece-style pipelines, added tokens,
// merges in both spellings; parsed from memory, then used (tokenizer_fuzz_support.hpp).
#include "tokenizer_fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return llmq::fuzz::fuzz_tokenizer_file(llmq::tokenizer_detail::parse_tokenizer_json, "tokenizer.json", data, size);
}
