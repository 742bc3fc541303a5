// The load generator against servers that misbehave (include/llmq/load_generator.hpp): an
// in-process cpp-httplib server whose URL prefix picks its behaviour. A good stream (token ids in
// pieces, "\r\n", comments) and a text-only one are measured; an HTTP error, a connection dropped
// mid-stream, malformed JSON, a stream without [DONE], a silent server and a trickling one past
// --timeout, and a port where nothing listens each fail their requests with the reason, never the
// run. The body sent is the benchmark's (token ids, max_tokens, ignore_eos, temperature 0, usage).
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "llmq/load_generator.hpp"
#include "llmq/serve_metrics.hpp"
#include "llmq/serve_workload.hpp"

namespace llmq::loadgen {
namespace {

using json = nlohmann::json;

// Waits up to `seconds` for the stop flag, in small steps (a handler that must not hold the test).
void wait_or_stop(const std::atomic<bool>& stop, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!stop && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

class FakeServer {
 public:
  FakeServer() {
    http_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"m","max_model_len":100},{"id":"other"}]})", "application/json");
    });
    http_.Post("/good/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        bodies_.push_back(req.body);
      }
      const int64_t n = json::parse(req.body).value("max_tokens", int64_t{0});
      res.set_chunked_content_provider("text/event-stream", [n](size_t, httplib::DataSink& sink) {
        std::string all = ": ping\n\n";
        for (int64_t i = 0; i < n; ++i)
          all += "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"token_ids\":[" + std::to_string(i + 3) + "]}]}\r\n\r\n";
        all += "data: {\"choices\":[],\"usage\":{\"completion_tokens\":" + std::to_string(n) + "}}\n\ndata: [DONE]\n\n";
        for (size_t at = 0; at < all.size(); at += 7) {  // 7-byte writes: lines and "\r\n" cut everywhere
          const std::string piece = all.substr(at, 7);
          if (!sink.write(piece.data(), piece.size())) return false;
        }
        sink.done();
        return true;
      });
    });
    http_.Post("/text/v1/completions", [](const httplib::Request& req, httplib::Response& res) {
      const int64_t n = json::parse(req.body).value("max_tokens", int64_t{0});
      std::string all;
      for (int64_t i = 0; i < (n + 1) / 2; ++i) all += "data: {\"choices\":[{\"index\":0,\"text\":\"ab\"}]}\n\n";
      all += "data: {\"choices\":[],\"usage\":{\"completion_tokens\":" + std::to_string(n) + "}}\n\ndata: [DONE]\n\n";
      res.set_content(all, "text/event-stream");
    });
    http_.Post("/status500/v1/completions", [](const httplib::Request&, httplib::Response& res) {
      res.status = 500;
      res.set_content(R"({"error":{"message":"the engine failed: boom","type":"server_error"}})", "application/json");
    });
    http_.Post("/disconnect/v1/completions", [](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("text/event-stream", [](size_t, httplib::DataSink& sink) {
        const std::string s = "data: {\"choices\":[{\"token_ids\":[3]}]}\n\n";
        sink.write(s.data(), s.size());
        return false;  // the server drops the connection mid-stream
      });
    });
    http_.Post("/malformed/v1/completions", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("data: {\"choices\": [oops\n\ndata: [DONE]\n\n", "text/event-stream");
    });
    http_.Post("/noend/v1/completions", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("data: {\"choices\":[{\"token_ids\":[3,4,5,6]}]}\n\n", "text/event-stream");
    });
    http_.Post("/silent/v1/completions", [this](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("text/event-stream", [this](size_t, httplib::DataSink& sink) {
        wait_or_stop(stop_, 5);  // nothing at all for longer than the client's timeout
        sink.done();
        return true;
      });
    });
    http_.Post("/trickle/v1/completions", [this](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("text/event-stream", [this](size_t, httplib::DataSink& sink) {
        wait_or_stop(stop_, 0.02);  // a comment every 20 ms: never silent, never done
        return !stop_ && sink.write(":\n\n", 3);
      });
    });
    port_ = http_.bind_to_any_port("127.0.0.1");
    listener_ = std::thread([this] { http_.listen_after_bind(); });
    for (int i = 0; i < 500 && !http_.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ~FakeServer() {
    stop_ = true;
    http_.stop();
    listener_.join();
  }
  std::string url(const std::string& prefix = "") const { return "http://127.0.0.1:" + std::to_string(port_) + prefix; }
  std::vector<std::string> bodies() {
    std::lock_guard<std::mutex> lock(mu_);
    return bodies_;
  }

 private:
  httplib::Server http_;
  int port_ = 0;
  std::thread listener_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::string> bodies_;
};

std::vector<engine::WorkloadRequest> workload(int64_t requests, double rate = 0) {
  engine::WorkloadOptions wo;
  wo.dataset = "fixed:5/4";
  wo.requests = requests;
  wo.rate = rate;
  wo.vocab_size = 100;
  std::vector<engine::WorkloadRequest> w;
  EXPECT_TRUE(engine::make_workload(wo, &w).ok());
  return w;
}

LoadResult run(const std::string& url, const std::vector<engine::WorkloadRequest>& work, double timeout_s = 10,
               int64_t max_concurrency = 2) {
  LoadOptions o;
  EXPECT_TRUE(parse_server_url(url, &o.client.url).ok()) << url;
  o.client.timeout_s = timeout_s;
  o.model = "m";
  o.max_concurrency = max_concurrency;
  LoadResult r;
  const Status st = run_load(o, work, &r);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return r;
}

// Every request failed, each with a reason that holds `why`.
void expect_all_failed(const LoadResult& r, size_t n, const std::string& why) {
  ASSERT_EQ(r.requests.size(), n);
  EXPECT_EQ(r.failed, static_cast<int64_t>(n));
  for (const RequestOutcome& q : r.requests) {
    EXPECT_FALSE(q.ok);
    EXPECT_NE(q.error.find(why), std::string::npos) << "expected '" << why << "' in: " << q.error;
  }
}

TEST(LoadGenerator, AGoodStreamIsTimedTokenByToken) {
  FakeServer server;
  const auto work = workload(6, /*rate=*/200);
  const LoadResult r = run(server.url("/good/"), work);
  ASSERT_EQ(r.requests.size(), 6u);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.concurrency, 2);
  std::vector<engine::RequestTimeline> t;
  for (size_t i = 0; i < r.requests.size(); ++i) {
    const RequestOutcome& q = r.requests[i];
    ASSERT_TRUE(q.ok) << q.error;
    EXPECT_TRUE(q.per_token_times);
    EXPECT_EQ(q.timeline.token_s.size(), 4u);
    EXPECT_EQ(q.timeline.prompt_tokens, 5);
    EXPECT_GE(q.timeline.arrival_s, work[i].arrival_s) << "request " << i << " went before its arrival time";
    EXPECT_GE(q.timeline.token_s.front(), q.timeline.arrival_s);
    t.push_back(q.timeline);
  }
  engine::ServeMetrics m;
  ASSERT_TRUE(engine::serve_metrics(t, &m).ok());
  EXPECT_EQ(m.output_tokens, 24);
  // The body is the benchmark's: the workload's token ids, its length forced, greedy, streamed with usage.
  const std::vector<std::string> bodies = server.bodies();
  ASSERT_EQ(bodies.size(), 6u);
  for (const std::string& b : bodies) {
    const json j = json::parse(b);
    EXPECT_EQ(j["model"], "m");
    EXPECT_EQ(j["max_tokens"], 4);
    EXPECT_EQ(j["ignore_eos"], true);
    EXPECT_EQ(j["temperature"], 0);
    EXPECT_EQ(j["stream"], true);
    EXPECT_EQ(j["stream_options"]["include_usage"], true);
    bool found = false;
    for (const auto& w : work) found = found || j["prompt"] == json(w.prompt);
    EXPECT_TRUE(found) << "a prompt not in the workload: " << j["prompt"].dump();
  }
}

TEST(LoadGenerator, TextWithoutTokenIdsCountsFromUsage) {
  FakeServer server;
  const LoadResult r = run(server.url("/text"), workload(3));
  std::vector<engine::RequestTimeline> t;
  for (const RequestOutcome& q : r.requests) {
    ASSERT_TRUE(q.ok) << q.error;
    EXPECT_FALSE(q.per_token_times);
    EXPECT_EQ(q.timeline.token_s.size(), 2u);  // two chunks of two tokens' text each
    EXPECT_EQ(q.timeline.output_tokens, 4);
    t.push_back(q.timeline);
  }
  // The metrics count usage's tokens: TPOT spreads the first-to-last chunk time over 3 gaps.
  engine::ServeMetrics m;
  ASSERT_TRUE(engine::serve_metrics(t, &m).ok());
  EXPECT_EQ(m.output_tokens, 12);
  EXPECT_EQ(m.itl_s.count, 3);  // one gap between each request's two chunks
  double widest = 0;
  for (const auto& q : t) widest = std::max(widest, q.token_s[1] - q.token_s[0]);
  EXPECT_DOUBLE_EQ(m.tpot_s.max, widest / 3);
  t[0].output_tokens = 1;  // fewer tokens than the times it has: refused
  EXPECT_FALSE(engine::serve_metrics(t, &m).ok());
}

TEST(LoadGenerator, FailuresAreCountedWithTheirReason) {
  FakeServer server;
  expect_all_failed(run(server.url("/status500"), workload(3)), 3, "HTTP 500: the engine failed: boom");
  expect_all_failed(run(server.url("/nowhere"), workload(2)), 2, "HTTP 404");
  expect_all_failed(run(server.url("/disconnect"), workload(3)), 3, "closed before the response was whole");
  expect_all_failed(run(server.url("/malformed"), workload(3)), 3, "malformed JSON");
  expect_all_failed(run(server.url("/noend"), workload(3)), 3, "before data: [DONE]");
  expect_all_failed(run(server.url("/silent"), workload(2), /*timeout_s=*/0.3), 2, "timed out");
  expect_all_failed(run(server.url("/trickle"), workload(2), /*timeout_s=*/0.3), 2, "timed out");
  // After all that, the same client code still measures a good server.
  const LoadResult good = run(server.url("/good"), workload(2));
  EXPECT_EQ(good.failed, 0);
}

TEST(LoadGenerator, NothingListening) {
  std::string url;
  {
    FakeServer gone;
    url = gone.url();
  }
  expect_all_failed(run(url, workload(3)), 3, "cannot connect");
  ClientOptions c;
  ASSERT_TRUE(parse_server_url(url, &c.url).ok());
  ServedModel m;
  const Status st = query_served_model(c, &m);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(url), std::string::npos) << st.message();  // names the URL
}

TEST(LoadGenerator, TheModelList) {
  FakeServer server;
  ClientOptions c;
  ASSERT_TRUE(parse_server_url(server.url(), &c.url).ok());
  ServedModel m;
  ASSERT_TRUE(query_served_model(c, &m).ok());
  EXPECT_EQ(m.name, "m");
  EXPECT_EQ(m.max_model_len, 100);
  EXPECT_EQ(m.all, std::vector<std::string>({"m", "other"}));
  ASSERT_TRUE(parse_server_url(server.url("/nowhere"), &c.url).ok());
  int status = 0;
  const Status st = query_served_model(c, &m, &status);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(status, 404);
}

TEST(LoadGenerator, BadOptionsAreRefusedByName) {
  LoadOptions o;
  ASSERT_TRUE(parse_server_url("http://127.0.0.1:9", &o.client.url).ok());
  o.model = "m";
  LoadResult r;
  o.max_concurrency = kMaxInFlight + 1;
  EXPECT_NE(run_load(o, workload(1), &r).message().find("--max-concurrency"), std::string::npos);
  o.max_concurrency = 1;
  o.client.timeout_s = 0;
  EXPECT_NE(run_load(o, workload(1), &r).message().find("--timeout"), std::string::npos);
  o.client.timeout_s = 1;
  EXPECT_FALSE(run_load(o, {}, &r).ok());
}

}  // namespace
}  // namespace llmq::loadgen
