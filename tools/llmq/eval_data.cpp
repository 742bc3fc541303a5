// The evaluation data of `llmq eval` and `llmq recipe` (eval_data.hpp).
#include "eval_data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "llmq/model_io.hpp"
#include "llmq/tokenizer.hpp"

namespace llmq::cli {

void add_eval_data_options(CLI::App* cmd, EvalDataArgs* args) {
  cmd->add_option("--data", args->data, "token-id file; default: the model's own samples");
  cmd->add_option("--samples", args->samples, "without --data: sequences to sample")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--length", args->length, "without --data: tokens per sequence")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--seed", args->seed, "without --data: first sampling seed");
}

Status load_eval_data(const std::string& model_path, const ModelWeights& model, const EvalDataArgs& args,
                      std::vector<std::vector<int32_t>>* sequences, std::string* name) {
  if (args.data.empty()) {
    SlowStep step("sampling evaluation text from the model");
    LLMQ_RETURN_IF_ERROR(sample_token_sequences(model, args.samples, std::min(args.length, model.config.max_seq_len - 1),
                                                args.seed, sequences));
    // A model without BOS sampled after its EOS: the windows keep that token first (context, not
    // scored), as a BOS model's windows get BOS back.
    if (model.config.bos_token < 0)
      for (auto& s : *sequences) s.insert(s.begin(), model.config.text_start_token());
    step.done();
    *name = fmt::format("{} sequences sampled from the model (T=1, top-p 0.9, seeds {}..{})", args.samples, args.seed,
                        args.seed + static_cast<uint64_t>(args.samples) - 1);
    return {};
  }
  std::unique_ptr<Tokenizer> tokenizer;  // text data needs one; token-id files do not
  if (!is_builtin_model(model_path) && !Tokenizer::find(model_path).empty())
    LLMQ_RETURN_IF_ERROR(Tokenizer::load(model_path, &tokenizer));
  LLMQ_RETURN_IF_ERROR(read_token_sequences(args.data, model.config.vocab_size, sequences, tokenizer.get()));
  *name = args.data;
  return {};
}

Status sample_sequences_on_gpu(TensorParallelRuntime& runtime, int64_t max_batch, int32_t start, int64_t count, int64_t length,
                               uint64_t seed, std::vector<std::vector<int32_t>>* out) {
  if (max_batch < 1) return invalid_argument("sampling on the GPU: max_batch " + std::to_string(max_batch));
  out->clear();
  Status st;
  for (int64_t first = 0; first < count && st.ok(); first += max_batch) {
    const int64_t n = std::min(max_batch, count - first);
    SamplingOptions s;
    s.temperature = 1.0f;
    s.top_p = 0.9f;
    s.seed = seed + static_cast<uint64_t>(first);
    std::vector<std::vector<int32_t>> batch;
    runtime.reset();
    st = runtime.generate(std::vector<int32_t>(static_cast<size_t>(n), start), length, s, &batch);
    for (auto& b : batch) out->push_back(std::move(b));
  }
  runtime.reset();
  return st;
}

Status eval_stats(const ModelWeights& model, const std::string& stats_path, bool needed, int64_t context,
                  CalibrationStats* out, bool* have) {
  *have = false;
  if (!stats_path.empty()) {
    LLMQ_RETURN_IF_ERROR(CalibrationStats::load(stats_path, out));
  } else if (needed) {
    if (model.config.text_start_token() < 0)
      return invalid_argument("--stats: the scheme needs calibration statistics, and the model's config names neither BOS "
                              "nor EOS to sample calibration text after; run llmq calibrate --data FILE and give --stats");
    LLMQ_RETURN_IF_ERROR(calibrate_on_samples(model, 32, std::min<int64_t>(128, model.config.max_seq_len - 1),
                                              std::min(context, model.config.max_seq_len), out));
    std::fprintf(stderr, "llmq: no --stats: calibrated on 32 sampled sequences (seeds 1000..1031), %lld tokens\n",
                 static_cast<long long>(out->tokens));
  } else {
    return {};
  }
  *have = true;
  return {};
}

}  // namespace llmq::cli
