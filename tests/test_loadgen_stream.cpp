// The load generator's reading of a streamed completion (src/loadgen/): server-sent events split
// anywhere (lines across pieces, "\r\n" split between pieces, "\r" alone, comments, several events
// in one piece, multi-line data, the bound on an event), OpenAI chunks counted into token times
// (token_ids, text with usage, [DONE], error events, malformed JSON, counts that disagree), and
// the --url parser.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "llmq/load_generator.hpp"
#include "loadgen/completion_stream.hpp"
#include "loadgen/sse_reader.hpp"

namespace llmq::loadgen {
namespace {

// Every event's data, feeding `stream` in pieces cut at `cuts` (byte offsets).
std::vector<std::string> events_of(const std::string& stream, const std::vector<size_t>& cuts, bool* cut_mid_event = nullptr) {
  SseReader r;
  std::vector<std::string> out;
  size_t at = 0;
  std::vector<size_t> ends = cuts;
  ends.push_back(stream.size());
  for (size_t end : ends) {
    const Status st = r.feed(std::string_view(stream).substr(at, end - at), [&out](const std::string& d) {
      out.push_back(d);
      return Status{};
    });
    EXPECT_TRUE(st.ok()) << st.to_string();
    at = end;
  }
  if (cut_mid_event != nullptr) *cut_mid_event = r.in_event();
  return out;
}

TEST(SseReader, EventsWholeAndCutAtEveryByte) {
  // "\n", "\r\n" and "\r" line ends; a comment; fields other than data; a space after the colon
  // dropped once; an event without data dispatches nothing; two data lines join with '\n'.
  const std::string s =
      ": keep-alive\n\n"
      "data: {\"a\":1}\n\n"
      "event: x\r\nid: 7\r\ndata:  two spaces\r\n\r\n"
      "data: first\rdata:second\r\r"
      "retry: 10\n\n"
      "data\n\n"
      "data: [DONE]\n\n";
  const std::vector<std::string> want = {"{\"a\":1}", " two spaces", "first\nsecond", "", "[DONE]"};
  EXPECT_EQ(events_of(s, {}), want);
  for (size_t cut = 1; cut < s.size(); ++cut) EXPECT_EQ(events_of(s, {cut}), want) << "cut at byte " << cut;
  std::vector<size_t> every;
  for (size_t i = 1; i < s.size(); ++i) every.push_back(i);
  EXPECT_EQ(events_of(s, every), want);
}

TEST(SseReader, CrLfSplitBetweenPiecesIsOneLineEnd) {
  // "\r" ends a piece and "\n" starts the next: one line end, not an empty line (which would end
  // the event early and drop the second data line into an event of its own).
  const std::string s = "data: a\r\ndata: b\r\n\r\n";
  EXPECT_EQ(events_of(s, {8}), std::vector<std::string>({"a\nb"}));
  // A "\r" then "\r" is two line ends: the event ends there.
  EXPECT_EQ(events_of("data: a\r\rdata: b\n\n", {8}), std::vector<std::string>({"a", "b"}));
}

TEST(SseReader, SeveralEventsInOnePieceInOrder) {
  EXPECT_EQ(events_of("data: 1\n\ndata: 2\n\ndata: 3\n\n", {}), std::vector<std::string>({"1", "2", "3"}));
}

TEST(SseReader, AStreamCutMidEventIsSeen) {
  bool cut = false;
  EXPECT_TRUE(events_of("data: 1\n\ndata: 2\n", {}, &cut) == std::vector<std::string>({"1"}));
  EXPECT_TRUE(cut);
  events_of("data: 1\n\n", {}, &cut);
  EXPECT_FALSE(cut);
}

TEST(SseReader, AnEventPastTheBoundIsAnError) {
  SseReader r(64);
  const auto none = [](const std::string&) { return Status{}; };
  EXPECT_TRUE(r.feed("data: short\n\n", none).ok());
  const Status st = r.feed("data: " + std::string(100, 'x'), none);  // a line that never ends
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("longer than 64 bytes"), std::string::npos) << st.message();
  SseReader lines(64);
  Status many;
  for (int i = 0; i < 20 && many.ok(); ++i) many = lines.feed("data: 0123456789\n", none);  // data lines, no blank line
  EXPECT_FALSE(many.ok());
}

TEST(SseReader, AHandlerErrorStopsTheFeed) {
  SseReader r;
  int calls = 0;
  const Status st = r.feed("data: 1\n\ndata: 2\n\n", [&calls](const std::string&) {
    ++calls;
    return invalid_argument("stop here");
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(st.message(), "stop here");
}

std::string ids_chunk(const std::vector<int>& ids) {
  std::string s = R"({"object":"text_completion","choices":[{"index":0,"text":"","token_ids":[)";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]}]}";
}
std::string usage_chunk(int n) {
  return R"({"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":)" + std::to_string(n) + "}}";
}
std::string text_chunk(const std::string& text) {
  return R"({"choices":[{"index":0,"text":")" + text + R"(","finish_reason":null}]})";
}

TEST(CompletionStream, TokenIdsGiveOneTimePerToken) {
  CompletionStream c(4);
  ASSERT_TRUE(c.on_event(ids_chunk({5}), 1.0).ok());
  ASSERT_TRUE(c.on_event(ids_chunk({6, 7}), 2.0).ok());  // two tokens in one chunk: both arrived then
  ASSERT_TRUE(c.on_event(ids_chunk({8}), 3.5).ok());
  ASSERT_TRUE(c.on_event(usage_chunk(4), 3.5).ok());
  ASSERT_TRUE(c.on_event("[DONE]", 3.5).ok());
  StreamedCompletion r;
  ASSERT_TRUE(c.finish(&r).ok());
  EXPECT_TRUE(r.per_token);
  EXPECT_EQ(r.tokens, 4);
  EXPECT_EQ(r.token_s, std::vector<double>({1.0, 2.0, 2.0, 3.5}));
}

TEST(CompletionStream, TextChunksCountFromUsage) {
  CompletionStream c(5);
  ASSERT_TRUE(c.on_event(text_chunk("Once"), 1.0).ok());
  ASSERT_TRUE(c.on_event(text_chunk(""), 1.5).ok());  // no text: no token arrived with it
  ASSERT_TRUE(c.on_event(text_chunk(" upon"), 2.0).ok());
  ASSERT_TRUE(c.on_event(R"({"choices":[{"index":0,"delta":{"content":" a"}}]})", 3.0).ok());  // a chat-style delta
  ASSERT_TRUE(c.on_event(usage_chunk(5), 3.0).ok());
  ASSERT_TRUE(c.on_event("[DONE]", 3.0).ok());
  StreamedCompletion r;
  ASSERT_TRUE(c.finish(&r).ok());
  EXPECT_FALSE(r.per_token);
  EXPECT_EQ(r.tokens, 5);
  EXPECT_EQ(r.token_s, std::vector<double>({1.0, 2.0, 3.0}));
}

Status finish_of(const std::vector<std::string>& events, int64_t asked) {
  CompletionStream c(asked);
  for (const std::string& e : events) LLMQ_RETURN_IF_ERROR(c.on_event(e, 1.0));
  StreamedCompletion r;
  return c.finish(&r);
}

void expect_error(const Status& st, const std::string& part) {
  EXPECT_FALSE(st.ok()) << "expected an error with: " << part;
  EXPECT_NE(st.message().find(part), std::string::npos) << st.message();
}

TEST(CompletionStream, WhatMakesARequestFail) {
  expect_error(finish_of({ids_chunk({1}), usage_chunk(1)}, 1), "before data: [DONE]");
  expect_error(finish_of({"{\"choices\": [", "[DONE]"}, 1), "malformed JSON");
  expect_error(finish_of({"[1,2]"}, 1), "not a JSON object");
  expect_error(finish_of({R"({"error":{"message":"the engine failed: boom","type":"server_error"}})"}, 1),
               "the engine failed: boom");
  expect_error(finish_of({ids_chunk({1}), usage_chunk(2), "[DONE]"}, 2), "usage says 2 completion tokens, the stream carried 1");
  expect_error(finish_of({ids_chunk({1}), usage_chunk(1), "[DONE]"}, 2), "1 completion tokens, 2 asked");
  expect_error(finish_of({ids_chunk({1, 2, 3})}, 2), "more tokens than the 2 asked");
  expect_error(finish_of({text_chunk("a"), "[DONE]"}, 1), "without a usage chunk");
  expect_error(finish_of({text_chunk("a"), text_chunk("b"), usage_chunk(1), "[DONE]"}, 1), "more tokens than the 1 asked");
  expect_error(finish_of({text_chunk("a"), text_chunk("b"), usage_chunk(1), "[DONE]"}, 3), "fewer than the 2 chunks");
  expect_error(finish_of({ids_chunk({1}), "[DONE]", ids_chunk({2})}, 2), "after data: [DONE]");
  expect_error(finish_of({R"({"choices":[{"token_ids":["x"]}]})"}, 1), "non-integer");
  expect_error(finish_of({R"({"choices":[{"text":7}]})"}, 1), "not a string");
  expect_error(finish_of({R"({"usage":{"completion_tokens":"many"}})"}, 1), "completion_tokens");
  expect_error(finish_of({R"({"id":"x"})"}, 1), "without choices");
  expect_error(finish_of({usage_chunk(0), "[DONE]"}, 1), "0 completion tokens, 1 asked");
  std::string deep(10000, '[');
  expect_error(finish_of({deep}, 1), "malformed JSON");  // refused before the parser recurses
  // Without a usage chunk, token ids alone count.
  EXPECT_TRUE(finish_of({ids_chunk({1}), ids_chunk({2}), "[DONE]"}, 2).ok());
}

TEST(ServerUrl, ParsedAndRefusedByName) {
  ServerUrl u;
  ASSERT_TRUE(parse_server_url("http://127.0.0.1:8000", &u).ok());
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, 8000);
  EXPECT_EQ(u.prefix, "");
  ASSERT_TRUE(parse_server_url("http://example.com/proxy/llm/", &u).ok());
  EXPECT_EQ(u.host, "example.com");
  EXPECT_EQ(u.port, 80);
  EXPECT_EQ(u.prefix, "/proxy/llm");
  ASSERT_TRUE(parse_server_url("http://[::1]:9000/", &u).ok());
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, 9000);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"127.0.0.1:8000", "expected http://"},
      {"https://h:443", "https is not supported"},
      {"ftp://h", "the scheme must be http"},
      {"http://:8000", "no host"},
      {"http://h:", "an empty port"},
      {"http://h:0", "outside [1, 65535]"},
      {"http://h:65536", "outside [1, 65535]"},
      {"http://h:80a", "not a number"},
      {"http://h:99999999", "not a number"},
      {"http://u:p@h:80", "user information"},
      {"http://h/v1?x=1", "query"},
      {"http://[::1:80", "closing ']'"},
  };
  for (const auto& [url, why] : bad) {
    const Status st = parse_server_url(url, &u);
    EXPECT_FALSE(st.ok()) << url;
    EXPECT_NE(st.message().find(why), std::string::npos) << url << ": " << st.message();
    EXPECT_NE(st.message().find("--url"), std::string::npos) << url << ": " << st.message();
  }
}

}  // namespace
}  // namespace llmq::loadgen
