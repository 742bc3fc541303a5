// Windowed evaluation of candidates against a base model (see llmq/evaluate.hpp).
#include "llmq/evaluate.hpp"

#include <algorithm>
#include <exception>
#include <functional>
#include <new>
#include <system_error>
#include <thread>

namespace llmq {
namespace {

// Runs task(0 .. n-1), task 0 on this thread and each other on a thread of its own; an exception
// in a task becomes its status (a worker's exception would otherwise end the process), and a task
// whose thread cannot start runs here after the others.
void run_in_parallel(size_t n, const std::function<void(size_t)>& task, std::vector<Status>* status) {
  auto guarded = [&task, status](size_t i) {
    try {
      task(i);
    } catch (const std::bad_alloc&) {
      (*status)[i] = Status(StatusCode::kInternal, "evaluate: out of memory");
    } catch (const std::exception& e) {
      (*status)[i] = Status(StatusCode::kInternal, std::string("evaluate: ") + e.what());
    }
  };
  std::vector<std::thread> pool;
  std::vector<size_t> here = {0};
  for (size_t i = 1; i < n; ++i) {
    try {
      pool.emplace_back(guarded, i);
    } catch (const std::system_error&) {
      here.push_back(i);
    }
  }
  for (size_t i : here)
    if (i < n) guarded(i);
  for (std::thread& t : pool) t.join();
}

}  // namespace

WindowLogitsFn transformer_window_logits(Transformer* t) {
  return [t, vocab = t->config().vocab_size](const std::vector<int32_t>& tokens, std::vector<float>* logits) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    logits->resize(static_cast<size_t>(n * vocab));
    t->reset();
    return t->forward(tokens.data(), n, 0, logits->data());
  };
}

Status evaluate(Transformer* base, const std::vector<Transformer*>& candidates,
                const std::vector<std::vector<int32_t>>& sequences, const EvalOptions& options,
                std::vector<EvalAccumulator>* results) {
  const ModelConfig& c = base->config();
  std::vector<WindowLogitsFn> fns;
  for (Transformer* t : candidates) {
    if (t->config().vocab_size != c.vocab_size)
      return invalid_argument("candidate model: vocabulary " + std::to_string(t->config().vocab_size) +
                              " differs from the base model's " + std::to_string(c.vocab_size));
    fns.push_back(transformer_window_logits(t));
  }
  return evaluate_windows(base, fns, sequences, options, results);
}

Status evaluate_windows(Transformer* base, const std::vector<WindowLogitsFn>& candidates,
                        const std::vector<std::vector<int32_t>>& sequences, const EvalOptions& options,
                        std::vector<EvalAccumulator>* results) {
  return evaluate_windows(base->config(), transformer_window_logits(base), candidates, sequences, options, results);
}

Status evaluate_windows(const ModelConfig& c, const WindowLogitsFn& base, const std::vector<WindowLogitsFn>& candidates,
                        const std::vector<std::vector<int32_t>>& sequences, const EvalOptions& options,
                        std::vector<EvalAccumulator>* results) {
  if (options.context < 2 || options.context > c.max_seq_len)
    return invalid_argument("--context: must be in [2, " + std::to_string(c.max_seq_len) + "], got " +
                            std::to_string(options.context));
  // Windows: [BOS] + up to context - 1 tokens of a sequence, every one of them scored. A model
  // without BOS (bos_token -1): up to context tokens, the first of each window context only.
  struct Window {
    std::vector<int32_t> tokens;
  };
  std::vector<Window> windows;
  int64_t total = 0;
  const bool bos = c.bos_token >= 0;
  const size_t per_window = static_cast<size_t>(bos ? options.context - 1 : options.context);
  for (const auto& seq : sequences) {
    size_t start = (bos && !seq.empty() && seq[0] == c.bos_token) ? 1 : 0;
    while (start < seq.size()) {
      const size_t n = std::min(seq.size() - start, per_window);
      Window w;
      if (bos) w.tokens.push_back(c.bos_token);
      w.tokens.insert(w.tokens.end(), seq.begin() + static_cast<std::ptrdiff_t>(start),
                      seq.begin() + static_cast<std::ptrdiff_t>(start + n));
      total += static_cast<int64_t>(bos ? n : n - 1);
      windows.push_back(std::move(w));
      start += n;
    }
  }
  if (options.max_tokens > 0) total = std::min(total, options.max_tokens);
  results->assign(candidates.size(), EvalAccumulator());
  const int64_t vocab = c.vocab_size;
  const size_t threads = static_cast<size_t>(std::max(1, options.threads));
  const size_t scoring_threads = options.scoring_threads > 0 ? static_cast<size_t>(options.scoring_threads) : threads;
  // Task 0 is the base model, task 1 + m candidate m. A window runs in rounds of `threads` tasks
  // (the base in the first): their logits are computed at the same time, then each candidate's
  // positions are scored in order, so every accumulator sees what the one-thread loop gives it.
  std::vector<float> base_logits;
  std::vector<std::vector<float>> cand_logits(std::min(threads, candidates.size()));
  std::vector<Status> task_status(threads);
  int64_t scored = 0;
  for (const Window& w : windows) {
    if (scored >= total) break;
    const int64_t n = static_cast<int64_t>(w.tokens.size());
    const int64_t score_n = std::min(n - 1, total - scored);  // positions 0 .. n-2 predict tokens 1 .. n-1
    auto run_base = [&]() -> Status {
      LLMQ_RETURN_IF_ERROR(base(w.tokens, &base_logits));
      if (static_cast<int64_t>(base_logits.size()) != n * vocab)
        return Status(StatusCode::kInternal, "the base model: " + std::to_string(base_logits.size()) +
                                                 " logits for a window of " + std::to_string(n) + " tokens");
      return {};
    };
    auto run_candidate = [&](size_t m, std::vector<float>* logits) -> Status {
      LLMQ_RETURN_IF_ERROR(candidates[m](w.tokens, logits));
      if (static_cast<int64_t>(logits->size()) != n * vocab)
        return Status(StatusCode::kInternal, "candidate " + std::to_string(m) + ": " + std::to_string(logits->size()) +
                                                 " logits for a window of " + std::to_string(n) + " tokens");
      return {};
    };
    // A candidate's positions in `pieces` contiguous runs, one thread each, appended in order (the
    // accumulator then holds what scoring them one by one gives).
    auto score = [&](size_t m, const std::vector<float>& logits, size_t pieces) -> Status {
      pieces = std::max<size_t>(1, std::min(pieces, static_cast<size_t>(score_n)));
      std::vector<EvalAccumulator> part(pieces);
      std::vector<Status> part_status(pieces);
      run_in_parallel(pieces, [&](size_t k) {
        const int64_t begin = score_n * static_cast<int64_t>(k) / static_cast<int64_t>(pieces);
        const int64_t end = score_n * static_cast<int64_t>(k + 1) / static_cast<int64_t>(pieces);
        for (int64_t p = begin; p < end && part_status[k].ok(); ++p)
          part_status[k] = part[k].add(base_logits.data() + p * vocab, logits.data() + p * vocab, vocab,
                                       w.tokens[static_cast<size_t>(p + 1)]);
      }, &part_status);
      for (size_t k = 0; k < pieces; ++k) {
        LLMQ_RETURN_IF_ERROR(part_status[k]);
        (*results)[m].append(part[k]);
      }
      return {};
    };
    size_t next = 0;  // the next candidate to run
    bool base_done = false;
    while (!base_done || next < candidates.size()) {
      // This round: the base (first round only) and up to `threads` candidates, slot s of the round
      // on thread s.
      const size_t first = next;
      const size_t slots = std::min(threads - (base_done ? 0 : 1), candidates.size() - next);
      next += slots;
      auto work = [&](size_t slot) -> Status {
        if (!base_done && slot == slots) return run_base();
        return run_candidate(first + slot, &cand_logits[slot]);
      };
      const size_t tasks = slots + (base_done ? 0 : 1);
      run_in_parallel(tasks, [&](size_t t) { task_status[t] = work(t); }, &task_status);
      for (size_t t = 0; t < tasks; ++t) LLMQ_RETURN_IF_ERROR(task_status[t]);
      base_done = true;
      // Scoring: one candidate per thread as well (each has its own accumulator).
      const size_t per_candidate = std::max<size_t>(1, scoring_threads / std::max<size_t>(1, slots));
      run_in_parallel(slots, [&](size_t s) { task_status[s] = score(first + s, cand_logits[s], per_candidate); },
                      &task_status);
      for (size_t s = 0; s < slots; ++s) LLMQ_RETURN_IF_ERROR(task_status[s]);
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
