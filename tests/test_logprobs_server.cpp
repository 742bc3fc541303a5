// The server's side of logprobs: the request fields (completions' `logprobs` 0..5, chat's
// `logprobs` true with `top_logprobs` 0..20; wrong types and ranges refused naming the field) and
// the response's shapes (src/server/response_logprobs.hpp): chat's content entries with token,
// logprob, bytes and top_logprobs; completions' tokens, token_logprobs, top_logprobs (top N plus
// the sampled token) and text_offset in characters; a token that is part of a UTF-8 character
// named "bytes:\xNN"; -Inf sent as -9999.0; the chunks a stream takes joined equal to the whole.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmq/tokenizer.hpp"
#include "server/openai_request.hpp"
#include "server/response_logprobs.hpp"

namespace llmq::server {
namespace {

using json = nlohmann::json;

// ---- Requests.

GenerateRequest parsed(const std::string& body, bool chat) {
  GenerateRequest r;
  ApiError e;
  EXPECT_TRUE(parse_generate_request(body, chat, {}, &r, &e)) << body << " -> " << e.message;
  return r;
}

void refused(const std::string& body, bool chat, const std::string& param, const std::string& text) {
  GenerateRequest r;
  ApiError e;
  ASSERT_FALSE(parse_generate_request(body, chat, {}, &r, &e)) << body;
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, param) << body << " -> " << e.message;
  EXPECT_NE(e.message.find(text), std::string::npos) << body << " -> " << e.message;
}

const std::string kChat = R"("model": "m", "messages": [{"role": "user", "content": "x"}])";
const std::string kCompletion = R"("model": "m", "prompt": "x")";

TEST(LogprobsRequest, CompletionsTakeACountFromZeroToFive) {
  EXPECT_EQ(parsed("{" + kCompletion + "}", false).logprobs, -1);
  EXPECT_EQ(parsed("{" + kCompletion + R"(, "logprobs": null})", false).logprobs, -1);
  EXPECT_EQ(parsed("{" + kCompletion + R"(, "logprobs": 0})", false).logprobs, 0);
  EXPECT_EQ(parsed("{" + kCompletion + R"(, "logprobs": 5})", false).logprobs, 5);
  refused("{" + kCompletion + R"(, "logprobs": 6})", false, "logprobs", "outside [0, 5]");
  refused("{" + kCompletion + R"(, "logprobs": -1})", false, "logprobs", "outside [0, 5]");
  refused("{" + kCompletion + R"(, "logprobs": true})", false, "logprobs", "expected an integer, got a boolean");
  refused("{" + kCompletion + R"(, "logprobs": 2.5})", false, "logprobs", "expected an integer");
  refused("{" + kCompletion + R"(, "logprobs": "3"})", false, "logprobs", "expected an integer, got a string");
}

TEST(LogprobsRequest, ChatTakesABooleanAndTopLogprobsFromZeroToTwenty) {
  EXPECT_EQ(parsed("{" + kChat + "}", true).logprobs, -1);
  EXPECT_EQ(parsed("{" + kChat + R"(, "logprobs": false})", true).logprobs, -1);
  EXPECT_EQ(parsed("{" + kChat + R"(, "logprobs": true})", true).logprobs, 0);  // the sampled token's only
  EXPECT_EQ(parsed("{" + kChat + R"(, "logprobs": true, "top_logprobs": 20})", true).logprobs, 20);
  EXPECT_EQ(parsed("{" + kChat + R"(, "logprobs": true, "top_logprobs": null})", true).logprobs, 0);
  refused("{" + kChat + R"(, "logprobs": true, "top_logprobs": 21})", true, "top_logprobs", "outside [0, 20]");
  refused("{" + kChat + R"(, "logprobs": true, "top_logprobs": -1})", true, "top_logprobs", "outside [0, 20]");
  refused("{" + kChat + R"(, "logprobs": 3})", true, "logprobs", "expected a boolean, got an integer");
  refused("{" + kChat + R"(, "top_logprobs": 3})", true, "top_logprobs", "needs logprobs true");
  refused("{" + kChat + R"(, "logprobs": false, "top_logprobs": 3})", true, "top_logprobs", "needs logprobs true");
  refused("{" + kChat + R"(, "logprobs": true, "top_logprobs": "2"})", true, "top_logprobs", "expected an integer");
}

// ---- Responses.

// Pieces by id: 0 EOS (""), 1 "Hi", 2 " there", 3 and 4 the halves of "é" (0xC3 0xA9), 5 "!", 6 "\"q\"".
class PieceTokenizer : public Tokenizer {
 public:
  PieceTokenizer() {
    vocab_size_ = 7;
    eos_ = 0;
  }
  Status encode(const std::string&, bool, std::vector<int32_t>*) const override { return unsupported("encode"); }
  Status decode_token(int32_t, int32_t token, std::string* piece) const override {
    static const char* kPieces[] = {"", "Hi", " there", "\xC3", "\xA9", "!", "\"q\""};
    if (token < 0 || token >= 7) return invalid_argument("token outside the vocabulary");
    *piece = kPieces[token];
    return {};
  }
};

std::shared_ptr<const engine::TokenLogprobs> lp(float token, std::vector<int32_t> ids, std::vector<float> top) {
  auto out = std::make_shared<engine::TokenLogprobs>();
  out->token = token;
  out->top_ids = std::move(ids);
  out->top = std::move(top);
  return out;
}

engine::TokenEvent event(int32_t token, std::shared_ptr<const engine::TokenLogprobs> logprobs) {
  engine::TokenEvent e;
  e.token = token;
  e.logprobs = std::move(logprobs);
  return e;
}

// Hi, the two halves of é, " there", -Inf among the alternatives, then EOS.
std::vector<engine::TokenEvent> sequence() {
  const float inf = std::numeric_limits<float>::infinity();
  return {event(1, lp(-0.25f, {1, 2}, {-0.25f, -1.5f})), event(3, lp(-2.0f, {5, 3}, {-1.0f, -2.0f})),
          event(4, lp(-0.125f, {4, 6}, {-0.125f, -inf})), event(2, lp(-0.5f, {2}, {-0.5f})),
          event(0, lp(-3.0f, {5, 6}, {-0.5f, -1.0f}))};
}

TEST(LogprobsResponse, ChatContentCarriesTokenLogprobBytesAndTheTopList) {
  PieceTokenizer tok;
  ResponseLogprobs r(&tok, true, 1);
  EXPECT_TRUE(r.take().is_null());  // nothing yet
  for (const engine::TokenEvent& e : sequence()) r.add(e);
  r.add(event(-1, nullptr));  // a cancellation's final event carries nothing
  const json j = r.take();
  const json& c = j.at("content");
  ASSERT_EQ(c.size(), 5u);
  EXPECT_EQ(c[0]["token"], "Hi");
  EXPECT_EQ(c[0]["logprob"], -0.25);
  EXPECT_EQ(c[0]["bytes"], json::array({72, 105}));
  ASSERT_EQ(c[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(c[0]["top_logprobs"][1], json::object({{"token", " there"}, {"logprob", -1.5}, {"bytes", json::array({32, 116, 104, 101, 114, 101})}}));
  EXPECT_EQ(c[1]["token"], "bytes:\\xc3");  // half a character: named by its byte, as OpenAI does
  EXPECT_EQ(c[1]["bytes"], json::array({0xC3}));
  EXPECT_EQ(c[1]["top_logprobs"][0]["token"], "!");
  EXPECT_EQ(c[2]["token"], "bytes:\\xa9");
  EXPECT_EQ(c[2]["top_logprobs"][1]["logprob"], -9999.0);  // -Inf
  EXPECT_EQ(c[4]["token"], "");                           // EOS adds no text
  EXPECT_EQ(c[4]["bytes"], json::array());
  EXPECT_NO_THROW((void)j.dump());
  EXPECT_TRUE(r.take().is_null());  // taken
}

TEST(LogprobsResponse, CompletionsListsAndTextOffsetsInCharacters) {
  PieceTokenizer tok;
  ResponseLogprobs r(&tok, false, 1);
  for (const engine::TokenEvent& e : sequence()) r.add(e);
  const json j = r.take();
  EXPECT_EQ(j["tokens"], json::array({"Hi", "bytes:\\xc3", "bytes:\\xa9", " there", ""}));
  EXPECT_EQ(j["token_logprobs"], json::array({-0.25, -2.0, -0.125, -0.5, -3.0}));
  // "Hi" at 0, both halves of é at 2 (where the character begins), " there" at 3, EOS at 9.
  EXPECT_EQ(j["text_offset"], json::array({0, 2, 2, 3, 9}));
  // The top N, plus the sampled token where it is not among them (EOS after "!" and "\"q\"").
  EXPECT_EQ(j["top_logprobs"][0], json::object({{"Hi", -0.25}, {" there", -1.5}}));
  EXPECT_EQ(j["top_logprobs"][2], json::object({{"bytes:\\xa9", -0.125}, {"\"q\"", -9999.0}}));
  EXPECT_EQ(j["top_logprobs"][4], json::object({{"!", -0.5}, {"\"q\"", -1.0}, {"", -3.0}}));
  EXPECT_NO_THROW((void)j.dump());
}

TEST(LogprobsResponse, TheChunksAStreamTakesJoinedAreTheWhole) {
  PieceTokenizer tok;
  for (bool chat : {true, false}) {
    ResponseLogprobs whole(&tok, chat, 1), streamed(&tok, chat, 1);
    json joined = chat ? json{{"content", json::array()}} : json{{"tokens", json::array()}, {"token_logprobs", json::array()},
                                                                 {"top_logprobs", json::array()}, {"text_offset", json::array()}};
    const std::vector<engine::TokenEvent> seq = sequence();
    for (size_t i = 0; i < seq.size(); ++i) {
      whole.add(seq[i]);
      streamed.add(seq[i]);
      if (i == 1) continue;  // a chunk held back (half a character): its logprobs go with the next
      const json chunk = streamed.take();
      for (auto& [key, list] : joined.items())
        for (const json& x : chunk.at(key)) list.push_back(x);
    }
    EXPECT_EQ(joined, whole.take()) << (chat ? "chat" : "completions");
  }
}

TEST(LogprobsResponse, WithoutATokenizerTokensAreNamedByTheirIds) {
  ResponseLogprobs chat(nullptr, true, 4), text(nullptr, false, 4);
  const engine::TokenEvent e = event(17, lp(-1.0f, {17, 3}, {-1.0f, -2.0f}));
  chat.add(e);
  text.add(e);
  const json c = chat.take();
  EXPECT_EQ(c["content"][0]["token"], "token_id:17");
  EXPECT_TRUE(c["content"][0]["bytes"].is_null());
  EXPECT_EQ(c["content"][0]["top_logprobs"][1]["token"], "token_id:3");
  const json t = text.take();
  EXPECT_EQ(t["tokens"], json::array({"token_id:17"}));
  EXPECT_EQ(t["text_offset"], json::array({0}));  // the text is empty
}

}  // namespace
}  // namespace llmq::server
