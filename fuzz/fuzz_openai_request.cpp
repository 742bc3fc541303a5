// The OpenAI request bodies of `llmq serve` (src/server/openai_request.cpp): the whole input is a
// body, parsed as /v1/completions and as /v1/chat/completions, each under the limits the server
// uses and under tight ones (a handful of tokens, messages, stop strings and bytes) so that every
// limit's refusal is reachable with a small input.
// Invariants: either a request whose every field is within the range openai_request.hpp documents,
// or an ApiError with a 4xx status, a non-empty message and an OpenAI error object that is valid
// JSON (the server sends it as is).
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz_support.hpp"
#include "server/openai_request.hpp"

namespace {

using llmq::fuzz::require;
using llmq::server::ApiError;
using llmq::server::GenerateRequest;
using llmq::server::RequestLimits;

RequestLimits tight_limits() {
  RequestLimits l;
  l.max_prompt_tokens = 4;
  l.max_prompt_bytes = 32;
  l.max_messages = 3;
  l.max_tokens = 64;  // not below completions' default of 16
  l.max_stop = 2;
  l.max_logprobs = 3;
  l.max_completion_logprobs = 2;
  return l;
}

void check_request(const GenerateRequest& r, bool chat, const RequestLimits& l) {
  require(r.chat == chat, "chat flag differs from the endpoint");
  if (chat) {
    require(!r.prompt_text && !r.prompt_ids, "chat request with a prompt");
    require(!r.messages.empty() && static_cast<int64_t>(r.messages.size()) <= l.max_messages, "message count out of range");
    int64_t bytes = 0;
    for (const auto& m : r.messages) {
      require(m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "developer" || m.role == "tool",
              "unknown role accepted:", m.role);
      bytes += static_cast<int64_t>(m.content.size());
    }
    require(bytes <= l.max_prompt_bytes, "messages past max_prompt_bytes");
    require(r.max_tokens == -1 || (r.max_tokens >= 1 && r.max_tokens <= l.max_tokens), "max_tokens out of range");
    require(r.logprobs >= -1 && r.logprobs <= l.max_logprobs, "top_logprobs out of range");
    require(!r.echo, "echo on a chat request");
  } else {
    require(r.messages.empty(), "completions request with messages");
    require(r.prompt_text.has_value() != r.prompt_ids.has_value(), "not exactly one prompt form");
    if (r.prompt_text)
      require(!r.prompt_text->empty() && static_cast<int64_t>(r.prompt_text->size()) <= l.max_prompt_bytes,
              "text prompt empty or too long");
    if (r.prompt_ids) {
      require(!r.prompt_ids->empty() && static_cast<int64_t>(r.prompt_ids->size()) <= l.max_prompt_tokens,
              "token prompt empty or too long");
      for (int32_t id : *r.prompt_ids) require(id >= 0, "negative token id accepted");
    }
    require(r.max_tokens >= 1 && r.max_tokens <= l.max_tokens, "max_tokens out of range");
    require(r.logprobs >= -1 && r.logprobs <= l.max_completion_logprobs, "logprobs out of range");
    require(r.add_generation_prompt, "add_generation_prompt changed on a completions request");
  }
  require(std::isfinite(r.temperature) && r.temperature >= 0.0f && r.temperature <= 2.0f, "temperature out of [0, 2]",
          std::to_string(r.temperature));
  require(std::isfinite(r.top_p) && r.top_p > 0.0f && r.top_p <= 1.0f, "top_p out of (0, 1]", std::to_string(r.top_p));
  require(r.top_k >= 0, "negative top_k");
  require(static_cast<int64_t>(r.stop.size()) <= l.max_stop, "too many stop strings");
  for (const auto& s : r.stop) require(!s.empty(), "empty stop string accepted");
  require(static_cast<int64_t>(r.stop_token_ids.size()) <= l.max_prompt_tokens, "too many stop token ids");
  for (int32_t id : r.stop_token_ids) require(id >= 0, "negative stop token id accepted");
  require(!r.include_usage || r.stream, "include_usage without stream");
}

void check_error(const ApiError& e) {
  require(e.http_status >= 400 && e.http_status < 500, "error status not 4xx", std::to_string(e.http_status));
  require(!e.message.empty(), "error without a message");
  const nlohmann::json j = nlohmann::json::parse(e.to_json(), nullptr, /*allow_exceptions=*/false);
  require(!j.is_discarded() && j.contains("error") && j["error"]["message"].is_string(),
          "error object is not valid JSON:", e.to_json().substr(0, 200));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body = llmq::fuzz::as_string(data, size);
  for (const bool chat : {false, true})
    for (const RequestLimits& limits : {RequestLimits{}, tight_limits()}) {
      GenerateRequest r;
      ApiError e;
      if (llmq::server::parse_generate_request(body, chat, limits, &r, &e)) check_request(r, chat, limits);
      else check_error(e);
    }
  return 0;
}
