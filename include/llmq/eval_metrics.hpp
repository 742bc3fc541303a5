// Accuracy of a quantized model against the unquantized one over a token stream, with the
// statistics of llama.cpp's `perplexity --kl-divergence`: KL divergence (mean with its standard
// error, median, p99, max), top-1 agreement, perplexity of both and their ratio, and Δp (the change
// in the probability of the correct next token), each with a ± error.
#pragma once

#include <cstdint>
#include <vector>

#include "llmq/status.hpp"

namespace llmq {

class EvalAccumulator {
 public:
  // One position: logits of the base and the quantized model ([vocab] each) and the true next
  // token. Computed in double with a max-shifted log-softmax.
  Status add(const float* base_logits, const float* quant_logits, int64_t vocab, int32_t target);
  int64_t count() const { return static_cast<int64_t>(kl_.size()); }
  // Appends another accumulator's positions after these: the same as add()ing them here in order
  // (so positions scored in pieces on several threads and appended in order give the same summary).
  void append(const EvalAccumulator& other);

  struct Stat {
    double mean = 0, stderr_ = 0;  // stderr_ is the standard error of the mean
  };
  struct Summary {
    int64_t tokens = 0;
    Stat kl;                     // KL(base || quant) in nats
    double kl_median = 0, kl_p99 = 0, kl_max = 0;
    Stat top1_agreement;         // fraction of positions where the argmaxes agree
    double ppl_base = 0, ppl_base_err = 0;
    double ppl_quant = 0, ppl_quant_err = 0;
    double ppl_ratio = 0, ppl_ratio_err = 0;  // quant / base, error from the paired log ratio
    Stat delta_p;                // p_quant(target) - p_base(target), mean
    double delta_p_rms = 0;
  };
  Summary summarize() const;

 private:
  std::vector<double> kl_;
  std::vector<double> nll_base_, nll_quant_;
  std::vector<double> delta_p_;
  int64_t top1_same_ = 0;
};

}  // namespace llmq
