// The server's Prometheus metrics (server_metrics.hpp).
#include "server/server_metrics.hpp"

#include <charconv>
#include <cmath>
#include <utility>

namespace llmq::server {
namespace {

// Request latencies (TTFT, end to end): 1 ms to 1000 s in steps of 1, 2.5, 5.
const std::vector<double> kLatencyBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                            2.5,   5,      10,    25,   50,    100,  250, 500,  1000};
// Gaps between tokens: denser below 50 ms, where decode steps are (a GPU step of a small batch is a
// few milliseconds), so that quantiles interpolated from the buckets say something there.
const std::vector<double> kTokenGapBounds = {0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05,
                                             0.075, 0.1,   0.15,  0.2,   0.3,   0.5,    0.75, 1,     2.5,  5,    10};

// Token counts: 1, 2, 5, 10, 20, 50, ... while at most max_model_len (a request holds no more).
std::vector<double> token_count_bounds(int64_t max_model_len) {
  std::vector<double> b;
  for (int64_t decade = 1; decade <= max_model_len && decade <= (int64_t{1} << 50); decade *= 10)
    for (int64_t m : {1, 2, 5})
      if (m * decade <= max_model_len) b.push_back(static_cast<double>(m * decade));
  if (b.empty()) b.push_back(1);
  return b;
}

// The shortest text that reads back as the same double (Prometheus parses Go's float syntax).
std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
std::string number(int64_t v) { return std::to_string(v); }

double seconds(SteadyTime::duration d) { return std::chrono::duration<double>(d).count(); }

const char* end_name(int end) {
  static const char* const kNames[kRequestEnds] = {"stop", "length", "abort", "error"};
  return kNames[end];
}

// Appends one metric family: its HELP and TYPE lines, then samples.
class Writer {
 public:
  Writer(std::string* out, const std::string& model_label) : out_(out), model_label_(model_label) {}
  void family(const char* name, const char* type, const char* help) {
    *out_ += std::string("# HELP llmq:") + name + " " + help + "\n# TYPE llmq:" + name + " " + type + "\n";
  }
  // name{model_name="...",extra} value; extra is `key="value"` or empty.
  template <typename T>
  void sample(const std::string& name, const std::string& extra, T value) {
    *out_ += "llmq:" + name + "{" + model_label_ + (extra.empty() ? "" : "," + extra) + "} " + number(value) + "\n";
  }
  template <typename T>
  void single(const char* name, const char* type, const char* help, T value) {
    family(name, type, help);
    sample(name, "", value);
  }
  void histogram(const char* name, const char* help, const Histogram& h) {
    family(name, "histogram", help);
    int64_t cumulative = 0;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      cumulative += h.counts[i];
      sample(std::string(name) + "_bucket", "le=\"" + number(h.bounds[i]) + "\"", cumulative);
    }
    sample(std::string(name) + "_bucket", "le=\"+Inf\"", h.count);
    sample(std::string(name) + "_sum", "", h.sum);
    sample(std::string(name) + "_count", "", h.count);
  }

 private:
  std::string* out_;
  const std::string& model_label_;
};

}  // namespace

std::string escape_label_value(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

Histogram::Histogram(std::vector<double> upper_bounds) : bounds(std::move(upper_bounds)), counts(bounds.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds.size() && value > bounds[i]) ++i;  // NaN lands past every bound, as +Inf
  ++counts[i];
  sum += value;
  ++count;
}

ServerMetrics::ServerMetrics(std::string model_name, int64_t max_model_len)
    : model_label_("model_name=\"" + escape_label_value(model_name) + "\""),
      ttft_(kLatencyBounds),
      itl_(kTokenGapBounds),
      tpot_(kTokenGapBounds),
      e2e_(kLatencyBounds),
      prompt_len_(token_count_bounds(max_model_len)),
      generation_len_(token_count_bounds(max_model_len)) {}

void ServerMetrics::count_http_response(int status) {
  if (status < 100 || status > 599) return;
  std::lock_guard<std::mutex> lock(mu_);
  ++http_[static_cast<size_t>(status / 100 - 1)];
}
void ServerMetrics::count_prefill_done(int64_t prompt_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt_tokens;
}
void ServerMetrics::count_generated_token() {
  std::lock_guard<std::mutex> lock(mu_);
  ++generation_tokens_;
}
void ServerMetrics::observe_ttft(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(s);
}
void ServerMetrics::observe_inter_token(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.observe(s);
}
void ServerMetrics::count_end(RequestEnd end, int64_t prompt_tokens, int64_t completion_tokens, double e2e_s, double tpot_s) {
  std::lock_guard<std::mutex> lock(mu_);
  ++ends_[static_cast<size_t>(end)];
  if (end != RequestEnd::kStop && end != RequestEnd::kLength) return;
  e2e_.observe(e2e_s);
  prompt_len_.observe(static_cast<double>(prompt_tokens));
  generation_len_.observe(static_cast<double>(completion_tokens));
  if (tpot_s >= 0) tpot_.observe(tpot_s);
}

std::string ServerMetrics::render(const engine::EngineLoop::Snapshot& engine) const {
  std::string out;
  Writer w(&out, model_label_);
  w.single("num_requests_running", "gauge", "Requests in the engine's running batch.", engine.running);
  w.single("num_requests_waiting", "gauge", "Requests queued for the engine (preempted ones included).", engine.waiting);
  w.single("kv_cache_blocks_used", "gauge", "KV cache blocks held by requests.", engine.kv_blocks_used);
  w.single("kv_cache_blocks_total", "gauge", "KV cache blocks the engine may hand out.", engine.kv_blocks_total);
  const double usage = engine.kv_blocks_total > 0 ? static_cast<double>(engine.kv_blocks_used) / static_cast<double>(engine.kv_blocks_total) : 0.0;
  w.single("kv_cache_usage_perc", "gauge", "Share of the KV cache blocks held by requests (0 to 1).", usage);
  w.single("num_preemptions_total", "counter", "Requests preempted (blocks released, recomputed later).", engine.stats.preemptions);
  w.single("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.", engine.stats.prompt_tokens);
  w.single("prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.", engine.stats.prefix_hit_tokens);
  w.single("computed_tokens_total", "counter", "Positions the engine computed (recomputation included).", engine.stats.computed_tokens);

  std::lock_guard<std::mutex> lock(mu_);
  w.single("prompt_tokens_total", "counter", "Prompt tokens of requests whose prefill finished.", prompt_tokens_);
  w.single("generation_tokens_total", "counter", "Tokens generated.", generation_tokens_);
  w.family("request_success_total", "counter",
           "Requests ended, by finished_reason: stop, length, abort (the client went away), error (the engine failed or a hard shutdown).");
  for (int i = 0; i < kRequestEnds; ++i)
    w.sample("request_success_total", std::string("finished_reason=\"") + end_name(i) + "\"", ends_[static_cast<size_t>(i)]);
  w.family("http_requests_total", "counter", "HTTP responses, by status class.");
  for (int i = 0; i < 5; ++i)
    w.sample("http_requests_total", "status=\"" + std::to_string(i + 1) + "xx\"", http_[static_cast<size_t>(i)]);
  w.histogram("time_to_first_token_seconds", "Time from a request's arrival to its first token.", ttft_);
  w.histogram("inter_token_latency_seconds", "Time between consecutive tokens of a request.", itl_);
  w.histogram("request_time_per_output_token_seconds",
              "Per completed request: (last token - first token) / (tokens - 1).", tpot_);
  w.histogram("e2e_request_latency_seconds", "Per completed request: arrival to last token.", e2e_);
  w.histogram("request_prompt_tokens", "Per completed request: prompt tokens.", prompt_len_);
  w.histogram("request_generation_tokens", "Per completed request: generated tokens.", generation_len_);
  return out;
}

RequestTimer::RequestTimer(std::shared_ptr<ServerMetrics> metrics, int64_t prompt_tokens, SteadyTime arrival)
    : metrics_(std::move(metrics)), prompt_tokens_(prompt_tokens), arrival_(arrival) {}

void RequestTimer::on_token(SteadyTime now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;  // the engine's last steps before a stop string's cancel took effect
  ++tokens_;
  metrics_->count_generated_token();
  if (tokens_ == 1) {
    first_ = now;
    metrics_->count_prefill_done(prompt_tokens_);
    metrics_->observe_ttft(seconds(now - arrival_));
  } else {
    metrics_->observe_inter_token(seconds(now - last_));
  }
  last_ = now;
}

void RequestTimer::finish(RequestEnd end, int64_t completion_tokens, SteadyTime now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  const double tpot = tokens_ >= 2 ? seconds(last_ - first_) / static_cast<double>(tokens_ - 1) : -1.0;
  metrics_->count_end(end, prompt_tokens_, completion_tokens >= 0 ? completion_tokens : tokens_, seconds(now - arrival_), tpot);
}

}  // namespace llmq::server
