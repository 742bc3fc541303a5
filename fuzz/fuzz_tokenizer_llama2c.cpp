// llama2.c tokenizer.bin: max_token_length, then score, length and bytes per token; parsed from
// memory, then used (tokenizer_fuzz_support.hpp).
#include "tokenizer_fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return llmq::fuzz::fuzz_tokenizer_file(llmq::tokenizer_detail::parse_llama2c_tokenizer, "tokenizer.bin", data, size);
}
