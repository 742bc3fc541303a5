// llama2.c checkpoints (legacy and v1 headers, shared or separate classifier), read from memory
// through the same stream loader a file goes through. An accepted file yields weights of the
// shapes its config says.
#include <sstream>

#include "fuzz_support.hpp"
#include "llmq/model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmq;
  const std::string source = "fuzz.bin";
  std::istringstream in(fuzz::as_string(data, size));
  ModelWeights w;
  const Status st = load_llama2c(source, in, &w);
  fuzz::require_named_error(st, source);
  if (!st.ok()) return 0;
  const ModelConfig& c = w.config;
  fuzz::require(c.validate().ok(), "accepted a config validate() refuses");
  fuzz::require(w.token_embedding.numel() == c.vocab_size * c.dim, "embedding size");
  fuzz::require(static_cast<int64_t>(w.layers.size()) == c.n_layers, "layer count");
  fuzz::require(w.lm_head.weight.numel() == c.vocab_size * c.dim, "classifier size");
  return 0;
}
