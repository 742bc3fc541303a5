// The OpenAI-compatible request bodies `llmq serve` takes, read and checked before anything else
// happens: POST /v1/completions and POST /v1/chat/completions. Every field is checked for its type
// and range, and a bad one is answered as OpenAI answers it: HTTP 400 with an error object naming
// the field (`param`). Fields llmq does not implement are refused by name, never ignored into a
// different answer (n > 1, best_of, logit_bias, penalties other than 0, tools); fields that change
// nothing (user, metadata) are accepted. Internal header of the server (src/server/).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace llmq::server {

// An OpenAI error response: {"error": {"message", "type", "param", "code"}} with its HTTP status.
struct ApiError {
  int http_status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // the field at fault, or empty
  std::string code;   // OpenAI's machine-readable code where it has one, or empty
  std::string to_json() const;
};

// Bounds a server puts on what one request may ask.
struct RequestLimits {
  int64_t max_prompt_tokens = 1 << 20;  // token-id prompts
  int64_t max_prompt_bytes = 8 << 20;   // text prompts and chat messages, together
  int64_t max_messages = 4096;
  int64_t max_tokens = 1 << 20;         // max_tokens / max_completion_tokens
  int64_t max_stop = 16;                // stop strings
  int64_t max_logprobs = 20;            // chat's top_logprobs (OpenAI's limit)
  int64_t max_completion_logprobs = 5;  // completions' logprobs (OpenAI's legacy limit)
};

struct ChatMessage {
  std::string role;     // system, user, assistant, developer, tool
  std::string content;  // text; an array of {"type": "text", "text"} parts is joined
};

// What a request asks for, whichever endpoint it came through.
struct GenerateRequest {
  bool chat = false;
  std::string model;
  // Completions: the prompt as text or as token ids (exactly one is set). Chat: the messages.
  std::optional<std::string> prompt_text;
  std::optional<std::vector<int32_t>> prompt_ids;
  std::vector<ChatMessage> messages;
  bool add_generation_prompt = true;  // chat: the template's assistant header (vLLM's extension)
  int64_t max_tokens = -1;            // -1: until the context is full (chat's default); completions default 16
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;                  // vLLM's extension; 0: all
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;  // vLLM's extension
  bool ignore_eos = false;              // vLLM's extension
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions: the prompt's text before the completion
  // Completions: logprobs N; chat: top_logprobs N (0 when absent) when logprobs is true; -1: none.
  int64_t logprobs = -1;
};

// Parses and checks a body of POST /v1/completions (chat false) or /v1/chat/completions (chat
// true). False with *error set (HTTP 400, the field named) when the body is not valid JSON, not an
// object, nests deeper than JSON files llmq reads, or a field is missing, of the wrong type, out of
// range, or not implemented.
bool parse_generate_request(const std::string& body, bool chat, const RequestLimits& limits, GenerateRequest* out,
                            ApiError* error);

}  // namespace llmq::server
