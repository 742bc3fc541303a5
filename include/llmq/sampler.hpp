// Token sampling exactly as llama2.c's run.c does it, so generation reproduces it token for token:
// greedy argmax at temperature 0; otherwise logits / temperature, softmax, then multinomial or
// top-p (nucleus) sampling driven by run.c's xorshift64* generator.
#pragma once

#include <cstdint>
#include <vector>

#include "llmq/status.hpp"
#include "llmq/transformer.hpp"

namespace llmq {

class Sampler {
 public:
  Sampler(int64_t vocab_size, float temperature, float topp, uint64_t seed);
  int32_t sample(float* logits);  // modifies logits in place (as run.c does)

 private:
  uint32_t random_u32();
  float random_f32();
  int64_t vocab_size_;
  float temperature_;
  float topp_;
  uint64_t state_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

struct GenerateOptions {
  int64_t steps = 256;  // total positions, prompt included (run.c's -n)
  float temperature = 1.0f;
  float topp = 0.9f;
  uint64_t seed = 0;  // run.c uses time(NULL) when 0; llmq requires an explicit seed for sampling
};

// run.c's generate loop: feed the prompt (BOS first), then sample until `steps` positions or BOS.
// Returns the generated token ids (not the prompt).
Status generate(Transformer* model, const std::vector<int32_t>& prompt, const GenerateOptions& options,
                std::vector<int32_t>* out);

}  // namespace llmq
