// Windowed evaluation of candidates against a base model (see llmq/evaluate.hpp).
#include "llmq/evaluate.hpp"

namespace llmq {

Status evaluate(Transformer* base, const std::vector<Transformer*>& candidates,
                const std::vector<std::vector<int32_t>>& sequences, const EvalOptions& options,
                std::vector<EvalAccumulator>* results) {
  const ModelConfig& c = base->config();
  std::vector<WindowLogitsFn> fns;
  for (Transformer* t : candidates) {
    if (t->config().vocab_size != c.vocab_size)
      return invalid_argument("candidate model: vocabulary " + std::to_string(t->config().vocab_size) +
                              " differs from the base model's " + std::to_string(c.vocab_size));
    fns.push_back([t, vocab = c.vocab_size](const std::vector<int32_t>& tokens, std::vector<float>* logits) {
      const int64_t n = static_cast<int64_t>(tokens.size());
      logits->resize(static_cast<size_t>(n * vocab));
      t->reset();
      return t->forward(tokens.data(), n, 0, logits->data());
    });
  }
  return evaluate_windows(base, fns, sequences, options, results);
}

Status evaluate_windows(Transformer* base, const std::vector<WindowLogitsFn>& candidates,
                        const std::vector<std::vector<int32_t>>& sequences, const EvalOptions& options,
                        std::vector<EvalAccumulator>* results) {
  const ModelConfig& c = base->config();
  if (options.context < 2 || options.context > c.max_seq_len)
    return invalid_argument("--context: must be in [2, " + std::to_string(c.max_seq_len) + "], got " +
                            std::to_string(options.context));
  // Windows: [BOS] + up to context - 1 tokens of a sequence.
  struct Window {
    std::vector<int32_t> tokens;
  };
  std::vector<Window> windows;
  int64_t total = 0;
  for (const auto& seq : sequences) {
    size_t start = (!seq.empty() && seq[0] == c.bos_token) ? 1 : 0;
    while (start < seq.size()) {
      const size_t n = std::min(seq.size() - start, static_cast<size_t>(options.context - 1));
      Window w;
      w.tokens.push_back(c.bos_token);
      w.tokens.insert(w.tokens.end(), seq.begin() + static_cast<std::ptrdiff_t>(start),
                      seq.begin() + static_cast<std::ptrdiff_t>(start + n));
      total += static_cast<int64_t>(n);
      windows.push_back(std::move(w));
      start += n;
    }
  }
  if (options.max_tokens > 0) total = std::min(total, options.max_tokens);
  results->assign(candidates.size(), EvalAccumulator());
  const int64_t vocab = c.vocab_size;
  std::vector<float> base_logits, cand_logits;
  int64_t scored = 0;
  for (const Window& w : windows) {
    if (scored >= total) break;
    const int64_t n = static_cast<int64_t>(w.tokens.size());
    const int64_t score_n = std::min(n - 1, total - scored);  // positions 0 .. n-2 predict tokens 1 .. n-1
    base_logits.resize(static_cast<size_t>(n * vocab));
    base->reset();
    LLMQ_RETURN_IF_ERROR(base->forward(w.tokens.data(), n, 0, base_logits.data()));
    for (size_t m = 0; m < candidates.size(); ++m) {
      LLMQ_RETURN_IF_ERROR(candidates[m](w.tokens, &cand_logits));
      if (static_cast<int64_t>(cand_logits.size()) != n * vocab)
        return Status(StatusCode::kInternal, "candidate " + std::to_string(m) + ": " + std::to_string(cand_logits.size()) +
                                                 " logits for a window of " + std::to_string(n) + " tokens");
      for (int64_t p = 0; p < score_n; ++p)
        LLMQ_RETURN_IF_ERROR((*results)[m].add(base_logits.data() + p * vocab, cand_logits.data() + p * vocab, vocab,
                                               w.tokens[static_cast<size_t>(p + 1)]));
    }
    scored += score_n;
    if (options.progress) options.progress(scored, total);
  }
  // A perplexity of no tokens is exp(0) = 1 and a KL of nothing is 0: numbers that look like a
  // perfect result. Say so instead.
  if (scored == 0)
    return invalid_argument("evaluation scored no tokens: every sequence is at most one token long (after BOS), or "
                            "--max-tokens is 0; give sequences of two or more tokens");
  return {};
}

}  // namespace llmq
