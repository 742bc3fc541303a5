// ResponseLogprobs (response_logprobs.hpp).
#include "server/response_logprobs.hpp"

#include <cmath>
#include <cstdio>

#include "llmq/text_stream.hpp"

namespace llmq::server {
namespace {

using json = nlohmann::json;

constexpr double kLowest = -9999.0;  // what OpenAI and vLLM send for a logprob below it (-Inf)

// A logprob as sent: NaN stays NaN (nlohmann writes it as null: the row had no distribution).
json logprob_value(float v) {
  if (std::isnan(v)) return json(nullptr);
  return static_cast<double>(v) < kLowest ? kLowest : static_cast<double>(v);
}

json byte_list(const std::string& bytes) {
  json out = json::array();
  for (char c : bytes) out.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return out;
}

// Characters (code points) in valid UTF-8: the bytes that do not continue one.
int64_t code_points(const std::string& utf8) {
  int64_t n = 0;
  for (char c : utf8) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

}  // namespace

ResponseLogprobs::TokenText ResponseLogprobs::token_text(const Tokenizer* tokenizer, int32_t prev, int32_t token) {
  TokenText t;
  std::string piece;
  if (tokenizer == nullptr || !tokenizer->decode_token(prev, token, &piece).ok()) {
    t.text = "token_id:" + std::to_string(token);
    return t;
  }
  t.has_bytes = true;
  t.bytes = piece;
  std::string valid;
  (void)engine::utf8_replace_invalid(piece, true, &valid);
  if (valid == piece) {
    t.text = piece;
    return t;
  }
  t.text = "bytes:";
  for (char c : piece) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned>(static_cast<unsigned char>(c)));
    t.text += hex;
  }
  return t;
}

json ResponseLogprobs::entry(const TokenText& t, float logprob) const {
  return json{{"token", t.text}, {"logprob", logprob_value(logprob)}, {"bytes", t.has_bytes ? byte_list(t.bytes) : json(nullptr)}};
}

void ResponseLogprobs::add(const engine::TokenEvent& event) {
  if (event.token < 0 || event.logprobs == nullptr) return;
  const engine::TokenLogprobs& lp = *event.logprobs;
  const TokenText text = token_text(tokenizer_, prev_, event.token);
  if (chat_) {
    json e = entry(text, lp.token);
    json top = json::array();
    for (size_t i = 0; i < lp.top_ids.size() && i < lp.top.size(); ++i)
      top.push_back(entry(token_text(tokenizer_, prev_, lp.top_ids[i]), lp.top[i]));
    e["top_logprobs"] = std::move(top);
    content_.push_back(std::move(e));
  } else {
    // Where the token's text begins: the characters completed before it (a token that continues a
    // character split over tokens starts where that character does).
    text_offset_.push_back(chars_);
    if (text.has_bytes) {
      pending_ += text.bytes;
      std::string done;
      pending_.erase(0, static_cast<size_t>(engine::utf8_replace_invalid(pending_, false, &done)));
      chars_ += code_points(done);
    }
    tokens_.push_back(text.text);
    token_logprobs_.push_back(logprob_value(lp.token));
    json top = json::object();
    for (size_t i = 0; i < lp.top_ids.size() && i < lp.top.size(); ++i) {
      const std::string key = token_text(tokenizer_, prev_, lp.top_ids[i]).text;
      if (!top.contains(key)) top[key] = logprob_value(lp.top[i]);  // two ids of one text: the likelier
    }
    if (!top.contains(text.text)) top[text.text] = logprob_value(lp.token);
    top_logprobs_.push_back(std::move(top));
  }
  prev_ = event.token;
  ++count_;
}

json ResponseLogprobs::take() {
  if (count_ == 0) return json(nullptr);
  count_ = 0;
  if (chat_) {
    json out = {{"content", std::move(content_)}};
    content_ = json::array();
    return out;
  }
  json out = {{"tokens", std::move(tokens_)}, {"token_logprobs", std::move(token_logprobs_)},
              {"top_logprobs", std::move(top_logprobs_)}, {"text_offset", std::move(text_offset_)}};
  tokens_ = json::array();
  token_logprobs_ = json::array();
  top_logprobs_ = json::array();
  text_offset_ = json::array();
  return out;
}

}  // namespace llmq::server
