// Evaluation of quantized models against the unquantized one over token sequences: each sequence
// is cut into windows of `context` tokens, each window starts with BOS (a model without one: with
// its first token, context only) and an empty KV cache, and
// every position's next-token distribution is compared (see eval_metrics.hpp). The base model runs
// once per window and every candidate after it, so memory holds one window of logits per model.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "llmq/eval_metrics.hpp"
#include "llmq/status.hpp"
#include "llmq/transformer.hpp"

namespace llmq {

struct EvalOptions {
  int64_t context = 256;    // window length in tokens (BOS included, when the model has one)
  int64_t max_tokens = 0;   // stop after this many scored tokens (0: all)
  std::function<void(int64_t scored, int64_t total)> progress;  // called after each window
  // Threads that run the base model and the candidates of a window at the same time (each model
  // is one task; a window's logits are held for at most `threads` models at once besides the
  // base). > 1 means each candidate is called from any thread, concurrently with the others:
  // candidates must not share state (a GPU runtime bound to one host thread's device is not).
  // The results are the same for every thread count.
  int threads = 1;
  // Threads that score a window's positions (the metrics over the vocabulary of every position),
  // shared by the candidates scored at once; 0: `threads`. Any thread that may run: the scoring
  // touches no model. The results are the same for every count.
  int scoring_threads = 0;
};

Status evaluate(Transformer* base, const std::vector<Transformer*>& candidates,
                const std::vector<std::vector<int32_t>>& sequences, const EvalOptions& options,
                std::vector<EvalAccumulator>* results);

// A candidate that is not a CPU Transformer (the GPU runtime): given one window's tokens, fill
// `logits` with [tokens.size(), vocab] next-token logits, every position, from an empty cache.
using WindowLogitsFn = std::function<Status(const std::vector<int32_t>& tokens, std::vector<float>* logits)>;
// A CPU Transformer as a WindowLogitsFn (`t` must outlive it; one caller at a time).
WindowLogitsFn transformer_window_logits(Transformer* t);
Status evaluate_windows(Transformer* base, const std::vector<WindowLogitsFn>& candidates,
                        const std::vector<std::vector<int32_t>>& sequences, const EvalOptions& options,
                        std::vector<EvalAccumulator>* results);
// The same with a base that is not a CPU Transformer either (the unquantized model on the GPU
// runtime): `config` is the model's (BOS, vocabulary, context), `base` gives its window logits.
Status evaluate_windows(const ModelConfig& config, const WindowLogitsFn& base, const std::vector<WindowLogitsFn>& candidates,
                        const std::vector<std::vector<int32_t>>& sequences, const EvalOptions& options,
                        std::vector<EvalAccumulator>* results);

}  // namespace llmq
