// The evaluation inputs of `llmq eval` and `llmq recipe`: a token-id or text file (--data), or
// sequences the model samples itself (--samples, --length, --seed), and the calibration statistics. One reader, so that a recipe's
// budget is met on the same tokens `llmq eval` scores with the same options.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "llmq/calibration.hpp"
#include "llmq/model.hpp"
#include "llmq/status.hpp"
#include "llmq/tensor_parallel.hpp"

namespace llmq::cli {

struct EvalDataArgs {
  std::string data;  // token-id or text file; "" samples from the model
  int64_t samples = 80;
  int64_t length = 128;
  uint64_t seed = 1;
};

// --data, --samples, --length, --seed.
void add_eval_data_options(CLI::App* cmd, EvalDataArgs* args);

// The sequences, and a line that names them (the file, or the samples and their seeds). Text data
// is read with the tokenizer found beside `model_path` (none for the built-in models).
Status load_eval_data(const std::string& model_path, const ModelWeights& model, const EvalDataArgs& args,
                      std::vector<std::vector<int32_t>>* sequences, std::string* name);

// `count` sequences of `length` tokens the model on `runtime` samples after the token `start`
// (temperature 1, top-p 0.9, as sample_token_sequences on the CPU), in batches of `max_batch` (at
// most the runtime's); for models the host does not hold. The draws are the GPU sampler's, so the
// text is not the CPU's for the same seed. Leaves the runtime reset.
Status sample_sequences_on_gpu(TensorParallelRuntime& runtime, int64_t max_batch, int32_t start, int64_t count, int64_t length,
                               uint64_t seed, std::vector<std::vector<int32_t>>* out);

// Calibration statistics for the schemes being evaluated: the --stats file when given, else, when
// `needed`, measured on 32 sequences the model samples (seeds 1000.., other text than the evaluation
// data's, as the FP8 paper advises) in windows of `context`, with a note on stderr. *have says
// whether `out` holds statistics.
Status eval_stats(const ModelWeights& model, const std::string& stats_path, bool needed, int64_t context,
                  CalibrationStats* out, bool* have);

}  // namespace llmq::cli
