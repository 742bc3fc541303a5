// parse_generate_request (src/server/openai_request.hpp): the OpenAI request bodies, each field's
// type and range checked and a bad one refused naming it (param), unimplemented options refused
// by name, hostile bodies (deep nesting, huge numbers, invalid UTF-8, wrong types everywhere)
// answered with an error, never a crash.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "server/openai_request.hpp"

namespace llmq::server {
namespace {

using json = nlohmann::json;

GenerateRequest ok(const std::string& body, bool chat = false) {
  GenerateRequest r;
  ApiError e;
  EXPECT_TRUE(parse_generate_request(body, chat, {}, &r, &e)) << body << " -> " << e.message;
  return r;
}

// The error for `body`: its param and message must hold the given text.
void refused(const std::string& body, const std::string& param, const std::string& text, bool chat = false,
             const RequestLimits& limits = {}) {
  GenerateRequest r;
  ApiError e;
  ASSERT_FALSE(parse_generate_request(body, chat, limits, &r, &e)) << body;
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, param) << body << " -> " << e.message;
  EXPECT_NE(e.message.find(text), std::string::npos) << body << " -> " << e.message;
  const json j = json::parse(e.to_json());  // an OpenAI error object
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["message"], e.message);
}

TEST(OpenAiRequest, CompletionsDefaultsAndEveryPromptForm) {
  GenerateRequest r = ok(R"({"model": "m", "prompt": "Hello"})");
  EXPECT_EQ(r.model, "m");
  ASSERT_TRUE(r.prompt_text.has_value());
  EXPECT_EQ(*r.prompt_text, "Hello");
  EXPECT_EQ(r.max_tokens, 16);  // OpenAI's completions default
  EXPECT_FLOAT_EQ(r.temperature, 1.0f);
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.logprobs, -1);
  r = ok(R"({"model": "m", "prompt": [1, 2, 3]})");
  ASSERT_TRUE(r.prompt_ids.has_value());
  EXPECT_EQ(*r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(*ok(R"({"model": "m", "prompt": ["x"]})").prompt_text, "x");
  EXPECT_EQ(*ok(R"({"model": "m", "prompt": [[7, 8]]})").prompt_ids, (std::vector<int32_t>{7, 8}));
  r = ok(R"({"model": "m", "prompt": "a", "max_tokens": 5, "temperature": 0, "top_p": 0.5, "top_k": -1, "seed": -3,
            "stop": "\n", "stream": true, "stream_options": {"include_usage": true}, "logprobs": 2, "echo": true,
            "n": 1, "presence_penalty": 0.0, "user": "someone", "ignore_eos": true, "stop_token_ids": [2]})");
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_FLOAT_EQ(r.temperature, 0.0f);
  EXPECT_FLOAT_EQ(r.top_p, 0.5f);
  EXPECT_EQ(r.top_k, 0);
  ASSERT_TRUE(r.seed.has_value());
  EXPECT_EQ(*r.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n"}));
  EXPECT_TRUE(r.stream && r.include_usage && r.echo && r.ignore_eos);
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_EQ(r.stop_token_ids, (std::vector<int32_t>{2}));
}

TEST(OpenAiRequest, ChatMessagesPartsAndOptions) {
  GenerateRequest r = ok(R"({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null}], "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 3})",
                         true);
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1].content, "Hi there");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(r.logprobs, 3);
  EXPECT_EQ(ok(R"({"model": "m", "messages": [{"role": "user", "content": "x"}]})", true).max_tokens, -1);
}

TEST(OpenAiRequest, BadFieldsAreRefusedNamingThem) {
  refused(R"({"prompt": "x"})", "model", "model: required");
  refused(R"({"model": 3, "prompt": "x"})", "model", "required, a string");
  refused(R"({"model": "m"})", "prompt", "prompt: required");
  refused(R"({"model": "m", "prompt": ""})", "prompt", "prompt: empty");
  refused(R"({"model": "m", "prompt": {"a": 1}})", "prompt", "got an object");
  refused(R"({"model": "m", "prompt": ["a", "b"]})", "prompt", "2 prompts in one request");
  refused(R"({"model": "m", "prompt": [1, -2]})", "prompt", "prompt[1]: -2 is not a token id");
  refused(R"({"model": "m", "prompt": [1, 4294967296]})", "prompt", "prompt[1]: 4294967296 is not a token id");
  refused(R"({"model": "m", "prompt": [1, 2.5]})", "prompt", "is not a token id");
  refused(R"({"model": "m", "prompt": "x", "max_tokens": 0})", "max_tokens", "0 is outside [1, 1048576]");
  refused(R"({"model": "m", "prompt": "x", "max_tokens": 18446744073709551615})", "max_tokens", "is outside");
  refused(R"({"model": "m", "prompt": "x", "max_tokens": "5"})", "max_tokens", "expected an integer, got a string");
  refused(R"({"model": "m", "prompt": "x", "max_tokens": 5.0})", "max_tokens", "expected an integer, got a number");
  refused(R"({"model": "m", "prompt": "x", "temperature": 2.5})", "temperature", "outside");
  refused(R"({"model": "m", "prompt": "x", "temperature": 1e400})", "", "request body");  // not JSON's number range: a parse error
  refused(R"({"model": "m", "prompt": "x", "top_p": 0})", "top_p", "outside (");
  // Found writing fuzz_openai_request (its top_p invariant): above 0 as a double, 0.0f as the
  // float the sampler gets (which refuses it later, past the point of a 400).
  refused(R"({"model": "m", "prompt": "x", "top_p": 1e-50})", "top_p", "outside (");
  EXPECT_GT(ok(R"({"model": "m", "prompt": "x", "top_p": 1e-30, "temperature": 1e-50})").top_p, 0.0f);
  refused(R"({"model": "m", "prompt": "x", "stop": ["a", ""]})", "stop", "stop[1]: expected a non-empty string");
  refused(R"({"model": "m", "prompt": "x", "stop": 5})", "stop", "expected a string or an array");
  refused(R"({"model": "m", "prompt": "x", "stream_options": {"include_usage": true}})", "stream_options", "only allowed when stream");
  refused(R"({"model": "m", "prompt": "x", "stream": true, "stream_options": {"include_usage": 1}})",
          "stream_options.include_usage", "expected a boolean");
  refused(R"({"model": "m", "prompt": "x", "n": 2})", "n", "n: not supported");
  refused(R"({"model": "m", "prompt": "x", "best_of": 3})", "best_of", "not supported");
  refused(R"({"model": "m", "prompt": "x", "logit_bias": {"5": 10}})", "logit_bias", "not supported");
  refused(R"({"model": "m", "prompt": "x", "frequency_penalty": 0.5})", "frequency_penalty", "not supported");
  refused(R"({"model": "m", "prompt": "x", "logprobs": 50})", "logprobs", "outside [0, 5]");
  refused(R"({"model": "m", "messages": []})", "messages", "non-empty array", true);
  refused(R"({"model": "m", "messages": [{"content": "x"}]})", "messages[0].role", "required", true);
  refused(R"({"model": "m", "messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role", "'wizard' is not", true);
  refused(R"({"model": "m", "messages": [{"role": "user"}]})", "messages[0].content", "required", true);
  refused(R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
          "messages[0].content[0]", "only {\"type\": \"text\"", true);
  refused(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", "tools",
          "tool calling", true);
  refused(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs",
          "needs logprobs true", true);
  RequestLimits tight;
  tight.max_prompt_bytes = 4;
  tight.max_stop = 1;
  refused(R"({"model": "m", "prompt": "hello"})", "prompt", "5 bytes, at most 4", false, tight);
  refused(R"({"model": "m", "prompt": "x", "stop": ["a", "b"]})", "stop", "2 strings, at most 1", false, tight);
}

TEST(OpenAiRequest, HostileBodiesAreAnsweredNotCrashedOn) {
  refused("", "", "request body");
  refused("not json", "", "request body");
  refused("[1, 2]", "", "expected a JSON object, got an array");
  refused(std::string(100000, '[') + std::string(100000, ']'), "", "request body");  // nesting past the cap, refused before parsing
  refused("{\"model\": \"m\", \"prompt\": \"\xff\xfe\"}", "", "request body");  // invalid UTF-8 in a string
  refused(R"({"model": "m", "prompt": "x", "max_tokens": 1e308})", "max_tokens", "expected an integer");
  std::string many = R"({"model": "m", "prompt": [)";
  for (int i = 0; i < 5000; ++i) many += (i ? "," : "") + std::to_string(i);
  many += "]}";
  RequestLimits tight;
  tight.max_prompt_tokens = 1000;
  refused(many, "prompt", "5000 token ids, at most 1000", false, tight);
}

}  // namespace
}  // namespace llmq::server
