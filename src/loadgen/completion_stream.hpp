// One streamed completion (POST /v1/completions with stream true) turned into when its tokens
// arrived: the data of each server-sent event (sse_reader.hpp) with the time it was read. Chunks
// that carry `token_ids` (llmq serve for a model without a tokenizer; vLLM with return_token_ids)
// give every token its own time; chunks of text alone give one time per chunk with text, and the
// token count comes from the final usage chunk (stream_options.include_usage), as vLLM's
// benchmark_serving counts them. What makes the request a failure: an error event, malformed
// JSON, a token count that disagrees with usage or with the max_tokens asked (the benchmark
// forces lengths with ignore_eos), more tokens than asked, no [DONE] before the stream ends.
// Internal header of the load generator (src/loadgen/).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llmq/status.hpp"

namespace llmq::loadgen {

struct StreamedCompletion {
  std::vector<double> token_s;  // one time per token (token ids) or per chunk with text, ascending
  int64_t tokens = 0;           // completion tokens: the token ids counted, or usage's count for text
  bool per_token = true;        // token_s has one time per token (false: per chunk of text)
};

class CompletionStream {
 public:
  explicit CompletionStream(int64_t asked_tokens) : asked_(asked_tokens) {}

  // The data of one event, read at t_s; an error ends the request (the caller stops reading).
  Status on_event(const std::string& data, double t_s);

  // After the response ended: the tokens and their times, or why the stream does not count.
  Status finish(StreamedCompletion* out) const;

 private:
  int64_t asked_;
  std::vector<double> times_;
  int64_t id_tokens_ = 0;     // tokens counted from token_ids
  int64_t text_chunks_ = 0;   // chunks with text and no token_ids
  int64_t usage_tokens_ = -1;  // usage.completion_tokens, -1 until a usage chunk comes
  bool done_ = false;          // data: [DONE] seen
};

}  // namespace llmq::loadgen
