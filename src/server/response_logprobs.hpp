// A response's log-probabilities in OpenAI's shapes, built token by token as a request's events
// arrive (streamed: each chunk takes what came since the one before, so the chunks' lists joined
// are the whole response's). Internal header of the server (src/server/).
//   /v1/completions (`logprobs: N`): {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
//     top_logprobs[i] maps each of the N most likely tokens' text to its logprob, plus the sampled
//     token when it is not among them (OpenAI: "up to logprobs+1 elements").
//   /v1/chat/completions (`logprobs: true`, `top_logprobs: N`): {"content": [{"token", "logprob",
//     "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}, the N most likely in order.
// A token's text is what it adds to the completion's text (Tokenizer::decode_token after the token
// before it, so a control token such as EOS is ""); bytes that are not valid UTF-8 on their own (a
// piece of a character split over tokens) are named as OpenAI names them, "bytes:\xe4\xbd", and
// `bytes` holds the byte values. A model without a tokenizer names tokens "token_id:N" (vLLM's
// return_tokens_as_token_ids), with bytes null. A logprob below -9999 (-Inf) is sent as -9999.0, as
// OpenAI and vLLM send it. text_offset is where each token's text begins in the completion's text,
// in characters (Unicode code points: Python's str indices); a token that continues a character
// begun by the token before has that character's offset.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmq/scheduler.hpp"
#include "llmq/tokenizer.hpp"

namespace llmq::server {

class ResponseLogprobs {
 public:
  // `tokenizer` (may be null) must outlive it; `prev` is the prompt's last token.
  ResponseLogprobs(const Tokenizer* tokenizer, bool chat, int32_t prev) : tokenizer_(tokenizer), chat_(chat), prev_(prev) {}

  // Records an event's token and logprobs; events without logprobs (a cancellation's) are skipped.
  void add(const engine::TokenEvent& event);
  // What was recorded since the last take(), as a choice's "logprobs" value; null when nothing was.
  nlohmann::json take();

  // A token's text and bytes after `prev` (exposed for tests).
  struct TokenText {
    std::string text;
    std::string bytes;
    bool has_bytes = false;  // false without a tokenizer
  };
  static TokenText token_text(const Tokenizer* tokenizer, int32_t prev, int32_t token);

 private:
  nlohmann::json entry(const TokenText& t, float logprob) const;  // chat's {"token", "logprob", "bytes"}

  const Tokenizer* tokenizer_;
  bool chat_;
  int32_t prev_;
  std::string pending_;  // the text's bytes not yet a whole character
  int64_t chars_ = 0;    // characters of the text before pending_
  nlohmann::json content_ = nlohmann::json::array();  // chat
  nlohmann::json tokens_ = nlohmann::json::array(), token_logprobs_ = nlohmann::json::array(),
                 top_logprobs_ = nlohmann::json::array(), text_offset_ = nlohmann::json::array();  // completions
  int64_t count_ = 0;  // tokens recorded since the last take()
};

}  // namespace llmq::server
