// The load generator (load_generator.hpp): cpp-httplib's client, one thread and one kept-alive
// connection per request in flight, each response's body read as it arrives.
#include "llmq/load_generator.hpp"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>
#include <thread>

#include "loadgen/completion_stream.hpp"
#include "loadgen/sse_reader.hpp"
#include "model/checkpoint/input_file.hpp"

namespace llmq::loadgen {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxErrorBody = 4096;            // of a response that is not 200: enough for its message
constexpr size_t kMaxModelListBytes = size_t{1} << 20;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

std::unique_ptr<httplib::Client> make_client(const ClientOptions& c) {
  auto cli = std::make_unique<httplib::Client>(c.url.host, c.url.port);
  const auto t = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(c.timeout_s));
  cli->set_connection_timeout(t);
  cli->set_read_timeout(t);   // a server silent this long ends the request
  cli->set_write_timeout(t);
  cli->set_keep_alive(true);  // the thread's next request reuses the connection, as a benchmark client does
  cli->set_tcp_nodelay(true);  // the body is a second write after the headers: Nagle would hold it for the server's ACK
  return cli;
}

// One exchange: the body of a 200 goes to on_body piece by piece (a non-empty answer is a failure
// and ends it); any other status's body is kept, bounded, for its error message.
struct Exchange {
  int status = 0;
  std::string error_body;
  std::string failure;  // set by on_body or by the deadline
  httplib::Error error = httplib::Error::Success;
  bool sent = false;  // a whole response was read
};

Exchange exchange(httplib::Client& cli, httplib::Request req, const ClientOptions& c,
                  const std::function<std::string(std::string_view)>& on_body) {
  Exchange x;
  const Clock::time_point start = Clock::now();
  const auto limit = std::chrono::duration<double>(c.timeout_s);
  if (!c.api_key.empty()) req.set_header("Authorization", "Bearer " + c.api_key);
  req.response_handler = [&x](const httplib::Response& r) {
    x.status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (Clock::now() - start > limit) {
      x.failure = "timed out: no whole response within " + fmt_seconds(c.timeout_s) + " (--timeout)";
      return false;
    }
    if (x.status != 200) {
      x.error_body.append(data, std::min(n, kMaxErrorBody - x.error_body.size()));
      return x.error_body.size() < kMaxErrorBody;
    }
    x.failure = on_body(std::string_view(data, n));
    return x.failure.empty();
  };
  httplib::Response res;
  x.sent = cli.send(req, res, x.error);
  // The status is 0 until a response's headers came (httplib's own default is -1).
  if (x.sent && x.status == 0) x.status = res.status;
  if (x.sent && x.error_body.empty() && x.status != 200) x.error_body = res.body.substr(0, kMaxErrorBody);
  if (x.failure.empty() && !x.sent && x.error == httplib::Error::Read && Clock::now() - start >= limit)
    x.failure = "timed out: nothing read for " + fmt_seconds(c.timeout_s) + " (--timeout)";
  return x;
}

// The words for a transport error (the caller names the URL).
std::string transport_error(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection:
      return "cannot connect (nothing listening, or no route to the host)";
    case httplib::Error::ConnectionTimeout:
      return "no connection within --timeout";
    case httplib::Error::Read:
      return "the connection closed before the response was whole";
    case httplib::Error::Write:
      return "the connection closed while the request was sent";
    default:
      return "HTTP client error: " + httplib::to_string(e);
  }
}

// "HTTP 401: Incorrect API key provided": the status and the message of OpenAI's error object, or
// the start of the body when it holds none.
std::string http_error(const Exchange& x) {
  std::string message = x.error_body.substr(0, 200);
  json body;
  if (parse_json_text("an error response", x.error_body, &body).ok() && body.is_object()) {
    const auto e = body.find("error");
    if (e != body.end() && e->is_object() && e->contains("message") && (*e)["message"].is_string())
      message = (*e)["message"].get<std::string>().substr(0, 200);
  }
  return "HTTP " + std::to_string(x.status) + (message.empty() ? "" : ": " + message);
}

// Why an exchange failed, or "" when it gave a 200 whose body was read whole.
std::string exchange_failure(const Exchange& x) {
  if (!x.failure.empty()) return x.failure;
  if (x.status != 0 && x.status != 200) return http_error(x);
  if (!x.sent) return transport_error(x.error);
  return {};
}

RequestOutcome send_request(httplib::Client& cli, const LoadOptions& o, const engine::WorkloadRequest& w,
                            Clock::time_point t0) {
  const json body = {{"model", o.model},     {"prompt", w.prompt},  {"max_tokens", w.output_tokens},
                     {"temperature", 0},     {"ignore_eos", true},  {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  httplib::Request req;
  req.method = "POST";
  req.path = o.client.url.prefix + "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  SseReader sse;
  CompletionStream stream(w.output_tokens);
  RequestOutcome out;
  const Clock::time_point sent = Clock::now();
  const Exchange x = exchange(cli, std::move(req), o.client, [&](std::string_view piece) {
    const double t = seconds(Clock::now() - t0);  // every event this piece completes arrived now
    const Status st = sse.feed(piece, [&](const std::string& data) { return stream.on_event(data, t); });
    return st.ok() ? std::string() : st.message();
  });
  out.error = exchange_failure(x);
  if (!out.error.empty()) return out;
  StreamedCompletion c;
  if (Status st = stream.finish(&c); !st.ok()) {
    out.error = st.message();
    return out;
  }
  out.ok = true;
  out.timeline.arrival_s = seconds(sent - t0);
  out.timeline.prompt_tokens = static_cast<int64_t>(w.prompt.size());
  out.timeline.token_s = std::move(c.token_s);
  out.timeline.output_tokens = c.per_token ? 0 : c.tokens;
  out.per_token_times = c.per_token;
  return out;
}

// One thread's share: the next request not yet taken, at its arrival time, until none is left.
void worker(const LoadOptions& o, const std::vector<engine::WorkloadRequest>& work, Clock::time_point t0,
            std::atomic<size_t>* next, std::vector<RequestOutcome>* out) {
  std::unique_ptr<httplib::Client> cli;
  for (size_t i = next->fetch_add(1); i < work.size(); i = next->fetch_add(1)) {
    // At most a year away: an arrival past it (a rate near 0) would overflow the clock's type.
    const double at = std::min(work[i].arrival_s, 365.0 * 86400);
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at)));
    RequestOutcome& r = (*out)[i];
    try {
      if (!cli) cli = make_client(o.client);
      r = send_request(*cli, o, work[i], t0);
    } catch (const std::exception& e) {
      r = RequestOutcome{};
      r.error = std::string("internal error: ") + e.what();
    } catch (...) {
      r = RequestOutcome{};
      r.error = "internal error: an unknown exception";
    }
    if (!r.ok) cli.reset();  // a fresh connection after any failure: the old one may be mid-response
  }
}

}  // namespace

Status query_served_model(const ClientOptions& client, ServedModel* out, int* http_status) {
  if (out == nullptr) return invalid_argument("out: null");
  if (http_status != nullptr) *http_status = 0;
  std::string body;
  Exchange x;
  try {
    const std::unique_ptr<httplib::Client> cli = make_client(client);
    httplib::Request req;
    req.method = "GET";
    req.path = client.url.prefix + "/v1/models";
    x = exchange(*cli, std::move(req), client, [&body](std::string_view piece) {
      if (body.size() + piece.size() > kMaxModelListBytes) return std::string("a model list over 1 MB");
      body.append(piece);
      return std::string();
    });
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("GET /v1/models: ") + e.what());
  }
  if (http_status != nullptr) *http_status = x.status;
  std::string root = client.url.text;
  while (!root.empty() && root.back() == '/') root.pop_back();
  const std::string where = "GET " + root + "/v1/models";
  if (const std::string f = exchange_failure(x); !f.empty()) return Status(StatusCode::kIoError, where + ": " + f);
  json j;
  if (Status st = parse_json_text(where, body, &j); !st.ok()) return Status(StatusCode::kIoError, st.message());
  const auto data = j.is_object() ? j.find("data") : j.end();
  if (data == j.end() || !data->is_array() || data->empty())
    return Status(StatusCode::kIoError, where + ": no model listed (expected {\"data\": [{\"id\": ...}]})");
  ServedModel m;
  for (const json& e : *data) {
    if (!e.is_object() || !e.contains("id") || !e["id"].is_string())
      return Status(StatusCode::kIoError, where + ": a model without a string id");
    m.all.push_back(e["id"].get<std::string>());
  }
  m.name = m.all.front();
  const json& first = data->front();
  if (const auto len = first.find("max_model_len"); len != first.end() && len->is_number_integer() && len->get<int64_t>() > 0)
    m.max_model_len = len->get<int64_t>();
  *out = std::move(m);
  return {};
}

Status run_load(const LoadOptions& o, const std::vector<engine::WorkloadRequest>& work, LoadResult* out) {
  if (out == nullptr) return invalid_argument("out: null");
  if (work.empty()) return invalid_argument("requests: none");
  if (o.model.empty()) return invalid_argument("--model: empty");
  if (o.max_concurrency < 0 || o.max_concurrency > kMaxInFlight)
    return invalid_argument("--max-concurrency: " + std::to_string(o.max_concurrency) + " outside [0, " +
                            std::to_string(kMaxInFlight) + "] (each request in flight holds a thread)");
  if (!(o.client.timeout_s > 0) || o.client.timeout_s > 1e6)
    return invalid_argument("--timeout: must be in (0, 10^6] seconds");
  const int64_t n = static_cast<int64_t>(work.size());
  const int64_t threads = std::min(n, o.max_concurrency > 0 ? o.max_concurrency : kMaxInFlight);
  LoadResult r;
  r.requests.resize(work.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  const Clock::time_point t0 = Clock::now();
  try {
    for (int64_t i = 0; i < threads; ++i) pool.emplace_back(worker, std::cref(o), std::cref(work), t0, &next, &r.requests);
  } catch (const std::exception&) {
    // Fewer threads than asked (the system's limit): those started take every request between them.
    if (pool.empty()) return Status(StatusCode::kResourceExhausted, "cannot start a thread to send requests");
  }
  for (std::thread& t : pool) t.join();
  r.concurrency = static_cast<int64_t>(pool.size());
  for (const RequestOutcome& q : r.requests) r.failed += q.ok ? 0 : 1;
  *out = std::move(r);
  return {};
}

}  // namespace llmq::loadgen
