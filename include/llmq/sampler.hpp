// Token sampling exactly as llama2.c's run.c does it, so generation reproduces it token for token:
// greedy argmax at temperature 0; otherwise logits / temperature, softmax, then multinomial or
// top-p (nucleus) sampling driven by run.c's xorshift64* generator.
#pragma once

#include <cstdint>
#include <functional>
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
  // Generation also ends when one of these is sampled (EOS); the stop token is not returned.
  std::vector<int32_t> stop_tokens;
  // Called with every generated token as soon as it is sampled (streaming).
  std::function<void(int32_t token)> on_token;
};

// What a generate() call did, for tokens/s: the prompt's forward passes and the generated tokens'.
struct GenerateStats {
  int64_t prompt_tokens = 0;    // positions fed from the prompt (BOS included)
  double prompt_seconds = 0;
  int64_t generated_tokens = 0;  // tokens returned
  double decode_seconds = 0;
  int32_t stop_token = -1;       // the BOS / stop token that ended generation, -1 when steps ran out
};

// run.c's generate loop: feed the prompt (BOS first when the model has one), then sample until
// `steps` positions or BOS (or a stop token). Returns the generated token ids (not the prompt).
Status generate(Transformer* model, const std::vector<int32_t>& prompt, const GenerateOptions& options,
                std::vector<int32_t>* out, GenerateStats* stats = nullptr);

}  // namespace llmq
