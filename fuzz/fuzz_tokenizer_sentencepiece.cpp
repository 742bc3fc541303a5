// sentencepiece tokenizer.model: the protobuf ModelProto llmq reads by hand (pieces, trainer and
// normalizer specs); parsed from memory, then used (tokenizer_fuzz_support.hpp).
#include "tokenizer_fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return llmq::fuzz::fuzz_tokenizer_file(llmq::tokenizer_detail::parse_sentencepiece_model, "tokenizer.model", data,
                                         size);
}
