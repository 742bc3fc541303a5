// The server's /metrics text (src/server/server_metrics.hpp), parsed back as a Prometheus scraper
// reads it (text exposition format 0.0.4): every sample belongs to a family declared once by its
// HELP and TYPE lines, counters end in _total, histogram buckets are cumulative and end in +Inf equal
// to _count; and the values are the ones fed in (engine gauges, request timings at set instants,
// HTTP statuses, a model name that needs escaping).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server/server_metrics.hpp"

namespace llmq::server {
namespace {

using std::chrono::milliseconds;

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};
struct Exposition {
  std::map<std::string, std::string> type;  // family -> counter / gauge / histogram
  std::map<std::string, std::string> help;
  std::vector<Sample> samples;
};

// The family a sample belongs to: a histogram's _bucket / _sum / _count go to the histogram.
std::string family_of(const std::string& name, const Exposition& e) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string s(suffix);
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      const std::string base = name.substr(0, name.size() - s.size());
      auto it = e.type.find(base);
      if (it != e.type.end() && it->second == "histogram") return base;
    }
  }
  return name;
}

// Reads `text` as a scraper does; ADD_FAILURE for each rule broken.
Exposition parse(const std::string& text) {
  Exposition e;
  const std::regex name_re("[a-zA-Z_:][a-zA-Z0-9_:]*");
  EXPECT_TRUE(!text.empty() && text.back() == '\n') << "the text ends with a line feed";
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
      const std::string rest = line.substr(7);
      const size_t sp = rest.find(' ');
      EXPECT_NE(sp, std::string::npos) << line;
      const std::string name = rest.substr(0, sp), what = rest.substr(sp + 1);
      EXPECT_TRUE(std::regex_match(name, name_re)) << line;
      auto& table = line[2] == 'H' ? e.help : e.type;
      EXPECT_EQ(table.count(name), 0u) << "declared twice: " << line;
      if (line[2] == 'T') {
        EXPECT_TRUE(what == "counter" || what == "gauge" || what == "histogram") << line;
        EXPECT_EQ(e.help.count(name), 1u) << "HELP before TYPE: " << line;
      }
      table[name] = what;
      continue;
    }
    EXPECT_NE(line[0], '#') << line;
    Sample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') s.name += line[i++];
    EXPECT_TRUE(std::regex_match(s.name, name_re)) << line;
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        std::string key, value;
        while (i < line.size() && line[i] != '=') key += line[i++];
        EXPECT_TRUE(i + 1 < line.size() && line[i + 1] == '"') << line;
        i += 2;
        while (i < line.size() && line[i] != '"') {
          if (line[i] == '\\' && i + 1 < line.size()) {
            ++i;
            value += line[i] == 'n' ? '\n' : line[i];
          } else {
            value += line[i];
          }
          ++i;
        }
        ++i;  // the closing quote
        EXPECT_EQ(s.labels.count(key), 0u) << line;
        s.labels[key] = value;
        if (i < line.size() && line[i] == ',') ++i;
      }
      ++i;  // '}'
    }
    EXPECT_TRUE(i < line.size() && line[i] == ' ') << line;
    const std::string v = line.substr(i + 1);
    s.value = v == "+Inf" ? INFINITY : std::stod(v);
    const std::string family = family_of(s.name, e);
    EXPECT_EQ(e.type.count(family), 1u) << "a sample before its TYPE line: " << line;
    if (e.type[family] == "counter") {
      EXPECT_TRUE(family.size() > 6 && family.substr(family.size() - 6) == "_total") << line;
    }
    e.samples.push_back(s);
  }
  return e;
}

// The value of the one sample named `name` whose labels include `labels`.
double value(const Exposition& e, const std::string& name, const std::map<std::string, std::string>& labels = {}) {
  const Sample* found = nullptr;
  for (const Sample& s : e.samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) match = match && s.labels.count(k) && s.labels.at(k) == v;
    if (!match) continue;
    EXPECT_EQ(found, nullptr) << "two samples match " << name;
    found = &s;
  }
  EXPECT_NE(found, nullptr) << "no sample " << name;
  return found ? found->value : -1;
}
double bucket(const Exposition& e, const std::string& histogram, const std::string& le) {
  return value(e, "llmq:" + histogram + "_bucket", {{"le", le}});
}

// The cumulative counts of `histogram` at the given bounds (le).
void expect_buckets(const Exposition& e, const std::string& histogram, const std::vector<std::pair<std::string, double>>& want) {
  for (const auto& [le, count] : want) EXPECT_EQ(bucket(e, histogram, le), count) << histogram << " le=" << le;
}

// Every histogram: buckets in ascending le, counts never decreasing, +Inf last and equal to _count.
void expect_histograms_consistent(const Exposition& e) {
  for (const auto& [family, type] : e.type) {
    if (type != "histogram") continue;
    double last_le = -INFINITY, last_count = 0;
    int buckets = 0;
    for (const Sample& s : e.samples) {
      if (s.name != family + "_bucket") continue;
      ++buckets;
      const double le = s.labels.at("le") == "+Inf" ? INFINITY : std::stod(s.labels.at("le"));
      EXPECT_GT(le, last_le) << family;
      EXPECT_GE(s.value, last_count) << family << " le=" << s.labels.at("le");
      last_le = le;
      last_count = s.value;
    }
    EXPECT_GT(buckets, 1) << family;
    EXPECT_EQ(last_le, INFINITY) << family << ": the last bucket is +Inf";
    EXPECT_EQ(last_count, value(e, family + "_count")) << family;
  }
}

TEST(ServerMetrics, EngineGaugesAndCountersAsTheEngineSaysThem) {
  ServerMetrics m("tiny", 1024);
  engine::EngineLoop::Snapshot snap;
  snap.running = 3;
  snap.waiting = 2;
  snap.kv_blocks_used = 5;
  snap.kv_blocks_total = 20;
  snap.stats.preemptions = 7;
  snap.stats.prompt_tokens = 100;
  snap.stats.prefix_hit_tokens = 32;
  snap.stats.computed_tokens = 150;
  const Exposition e = parse(m.render(snap));
  const std::map<std::string, std::string> model = {{"model_name", "tiny"}};
  EXPECT_EQ(value(e, "llmq:num_requests_running", model), 3);
  EXPECT_EQ(value(e, "llmq:num_requests_waiting", model), 2);
  EXPECT_EQ(value(e, "llmq:kv_cache_blocks_used", model), 5);
  EXPECT_EQ(value(e, "llmq:kv_cache_blocks_total", model), 20);
  EXPECT_DOUBLE_EQ(value(e, "llmq:kv_cache_usage_perc", model), 0.25);
  EXPECT_EQ(value(e, "llmq:num_preemptions_total", model), 7);
  EXPECT_EQ(value(e, "llmq:prefix_cache_queries_total", model), 100);
  EXPECT_EQ(value(e, "llmq:prefix_cache_hits_total", model), 32);
  EXPECT_EQ(value(e, "llmq:computed_tokens_total", model), 150);
  for (const char* reason : {"stop", "length", "abort", "error"})
    EXPECT_EQ(value(e, "llmq:request_success_total", {{"finished_reason", reason}}), 0) << reason;
  for (const Sample& s : e.samples) EXPECT_EQ(s.labels.at("model_name"), "tiny") << s.name;
  expect_histograms_consistent(e);
  // An empty cache (no blocks at all) reads as 0 used, not NaN.
  EXPECT_EQ(value(parse(m.render({})), "llmq:kv_cache_usage_perc"), 0);
}

TEST(ServerMetrics, HistogramBucketsAreCumulativeAndABoundHoldsItsValue) {
  ServerMetrics m("m", 1024);
  for (double s : {0.001, 0.003, 0.2, 2000.0}) m.observe_ttft(s);  // 0.001 is a bound; 2000 s is past all
  const Exposition e = parse(m.render({}));
  expect_buckets(e, "time_to_first_token_seconds",
                 {{"0.001", 1}, {"0.0025", 1}, {"0.005", 2}, {"0.1", 2}, {"0.25", 3}, {"1000", 3}, {"+Inf", 4}});
  EXPECT_EQ(value(e, "llmq:time_to_first_token_seconds_count"), 4);
  EXPECT_DOUBLE_EQ(value(e, "llmq:time_to_first_token_seconds_sum"), 0.001 + 0.003 + 0.2 + 2000.0);
  expect_histograms_consistent(e);
}

TEST(ServerMetrics, TokenCountBucketsStopAtTheContext) {
  const Exposition e = parse(ServerMetrics("m", 1024).render({}));
  std::vector<std::string> les;
  for (const Sample& s : e.samples)
    if (s.name == "llmq:request_prompt_tokens_bucket") les.push_back(s.labels.at("le"));
  EXPECT_EQ(les, (std::vector<std::string>{"1", "2", "5", "10", "20", "50", "100", "200", "500", "1000", "+Inf"}));
}

TEST(ServerMetrics, RequestTimerTimesEachTokenFromArrival) {
  auto m = std::make_shared<ServerMetrics>("m", 1024);
  const SteadyTime t0{};
  RequestTimer timer(m, /*prompt_tokens=*/7, t0);
  timer.on_token(t0 + milliseconds(95));   // TTFT 95 ms
  timer.on_token(t0 + milliseconds(132));  // gap 37 ms
  timer.on_token(t0 + milliseconds(222));  // gap 90 ms
  timer.finish(RequestEnd::kLength, -1, t0 + milliseconds(300));
  timer.on_token(t0 + milliseconds(310));  // after the end: not counted
  timer.finish(RequestEnd::kAbort, -1, t0 + milliseconds(400));  // the connection's release: not counted
  const Exposition e = parse(m->render({}));
  EXPECT_EQ(value(e, "llmq:prompt_tokens_total"), 7);
  EXPECT_EQ(value(e, "llmq:generation_tokens_total"), 3);
  EXPECT_EQ(value(e, "llmq:request_success_total", {{"finished_reason", "length"}}), 1);
  EXPECT_EQ(value(e, "llmq:request_success_total", {{"finished_reason", "abort"}}), 0);
  expect_buckets(e, "time_to_first_token_seconds", {{"0.05", 0}, {"0.1", 1}});
  EXPECT_NEAR(value(e, "llmq:time_to_first_token_seconds_sum"), 0.095, 1e-12);
  EXPECT_EQ(value(e, "llmq:inter_token_latency_seconds_count"), 2);
  expect_buckets(e, "inter_token_latency_seconds", {{"0.03", 0}, {"0.04", 1}, {"0.075", 1}, {"0.1", 2}});
  EXPECT_NEAR(value(e, "llmq:inter_token_latency_seconds_sum"), 0.127, 1e-12);
  // TPOT: (222 - 95) / 2 = 63.5 ms; end to end 300 ms; 7 prompt and 3 generated tokens.
  EXPECT_NEAR(value(e, "llmq:request_time_per_output_token_seconds_sum"), 0.0635, 1e-12);
  expect_buckets(e, "request_time_per_output_token_seconds", {{"0.05", 0}, {"0.075", 1}});
  EXPECT_NEAR(value(e, "llmq:e2e_request_latency_seconds_sum"), 0.3, 1e-12);
  expect_buckets(e, "e2e_request_latency_seconds", {{"0.25", 0}, {"0.5", 1}});
  expect_buckets(e, "request_prompt_tokens", {{"5", 0}, {"10", 1}});
  expect_buckets(e, "request_generation_tokens", {{"2", 0}, {"5", 1}});
  expect_histograms_consistent(e);
}

TEST(ServerMetrics, AStopStringsCountIsTheResponsesAndAnAbortOnlyItsReason) {
  auto m = std::make_shared<ServerMetrics>("m", 1024);
  const SteadyTime t0{};
  RequestTimer cut(m, 4, t0);  // a stop string completed on the 2nd of 3 tokens the engine produced
  for (int i = 1; i <= 3; ++i) cut.on_token(t0 + milliseconds(10 * i));
  cut.finish(RequestEnd::kStop, /*completion_tokens=*/2, t0 + milliseconds(40));
  RequestTimer gone(m, 5, t0);  // the client left after one token
  gone.on_token(t0 + milliseconds(20));
  gone.finish(RequestEnd::kAbort, -1, t0 + milliseconds(50));
  RequestTimer failed(m, 6, t0);  // the engine failed before any token
  failed.finish(RequestEnd::kError, -1, t0 + milliseconds(5));
  const Exposition e = parse(m->render({}));
  EXPECT_EQ(value(e, "llmq:request_success_total", {{"finished_reason", "stop"}}), 1);
  EXPECT_EQ(value(e, "llmq:request_success_total", {{"finished_reason", "abort"}}), 1);
  EXPECT_EQ(value(e, "llmq:request_success_total", {{"finished_reason", "error"}}), 1);
  EXPECT_EQ(value(e, "llmq:request_generation_tokens_sum"), 2);  // completed requests only, as reported
  EXPECT_EQ(value(e, "llmq:e2e_request_latency_seconds_count"), 1);
  EXPECT_EQ(value(e, "llmq:request_prompt_tokens_sum"), 4);
  EXPECT_EQ(value(e, "llmq:generation_tokens_total"), 4);   // every token the engine handed over
  EXPECT_EQ(value(e, "llmq:prompt_tokens_total"), 4 + 5);   // prefills that finished
  EXPECT_EQ(value(e, "llmq:time_to_first_token_seconds_count"), 2);
}

TEST(ServerMetrics, HttpResponsesByStatusClass) {
  ServerMetrics m("m", 16);
  for (int status : {200, 200, 401, 404, 413, 503, 99, 600}) m.count_http_response(status);  // 99, 600: not HTTP
  const Exposition e = parse(m.render({}));
  EXPECT_EQ(value(e, "llmq:http_requests_total", {{"status", "2xx"}}), 2);
  EXPECT_EQ(value(e, "llmq:http_requests_total", {{"status", "4xx"}}), 3);
  EXPECT_EQ(value(e, "llmq:http_requests_total", {{"status", "5xx"}}), 1);
  EXPECT_EQ(value(e, "llmq:http_requests_total", {{"status", "1xx"}}) + value(e, "llmq:http_requests_total", {{"status", "3xx"}}), 0);
}

TEST(ServerMetrics, AModelNameIsEscapedAndReadsBackWhole) {
  const std::string name = "org/model \"v2\"\\final\nline";
  EXPECT_EQ(escape_label_value(name), "org/model \\\"v2\\\"\\\\final\\nline");
  const Exposition e = parse(ServerMetrics(name, 64).render({}));
  ASSERT_FALSE(e.samples.empty());
  for (const Sample& s : e.samples) EXPECT_EQ(s.labels.at("model_name"), name) << s.name;
}

// Timers fed from several threads at once (the engine's and the handlers'): nothing lost.
TEST(ServerMetrics, ConcurrentRequestsAreEachCountedOnce) {
  auto m = std::make_shared<ServerMetrics>("m", 1024);
  constexpr int kThreads = 4, kRequests = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([m] {
      const SteadyTime t0{};
      for (int r = 0; r < kRequests; ++r) {
        RequestTimer timer(m, 3, t0);
        timer.on_token(t0 + milliseconds(1));
        timer.on_token(t0 + milliseconds(2));
        std::thread other([&timer, t0] { timer.finish(RequestEnd::kAbort, -1, t0 + milliseconds(4)); });
        timer.finish(RequestEnd::kStop, 2, t0 + milliseconds(3));
        other.join();
        m->count_http_response(200);
      }
    });
  }
  for (auto& t : threads) t.join();
  const Exposition e = parse(m->render({}));
  const double total = kThreads * kRequests;
  EXPECT_EQ(value(e, "llmq:request_success_total", {{"finished_reason", "stop"}}) +
                value(e, "llmq:request_success_total", {{"finished_reason", "abort"}}),
            total);
  EXPECT_EQ(value(e, "llmq:generation_tokens_total"), 2 * total);
  EXPECT_EQ(value(e, "llmq:prompt_tokens_total"), 3 * total);
  EXPECT_EQ(value(e, "llmq:inter_token_latency_seconds_count"), total);
  EXPECT_EQ(value(e, "llmq:http_requests_total", {{"status", "2xx"}}), total);
}

}  // namespace
}  // namespace llmq::server
