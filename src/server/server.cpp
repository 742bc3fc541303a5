// Server (server.hpp): cpp-httplib routes over the EngineLoop. A request's tokens reach its HTTP
// handler through a Channel (the loop's callback pushes, the handler waits); the text is built by
// a TextStream (UTF-8 completion, stop strings). A handler that stops reading (the client went
// away, or a stop string completed) cancels its request in the engine.
#include "llmq/server.hpp"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include <sys/socket.h>

#include <nlohmann/json.hpp>

#include "llmq/chat_template.hpp"
#include "llmq/text_stream.hpp"
#include "server/openai_request.hpp"
#include "server/response_logprobs.hpp"
#include "server/server_metrics.hpp"

namespace llmq::server {
namespace {

using json = nlohmann::json;
using engine::FinishReason;
using engine::TokenEvent;

// One request's events, from the engine's thread to the HTTP handler's.
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<TokenEvent> events;
  bool ended = false;
  void push(const TokenEvent& e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(e);
      if (e.finish != FinishReason::kNone) ended = true;
    }
    cv.notify_one();
  }
  // Waits up to `timeout` for events; moves them to *out. False when none came.
  bool take(std::deque<TokenEvent>* out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, timeout, [&] { return !events.empty(); });
    if (events.empty()) return false;
    out->swap(events);
    events.clear();
    return true;
  }
};

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(e.to_json(), "application/json");
}

ApiError error_of(int status, const std::string& type, const std::string& message, const std::string& code = "") {
  ApiError e;
  e.http_status = status;
  e.type = type;
  e.message = message;
  e.code = code;
  return e;
}

const char* finish_name(FinishReason r, bool stop_string) {
  if (stop_string) return "stop";
  return r == FinishReason::kLength ? "length" : "stop";
}

// A client that went away is only noticed by a write that fails (a closed socket still selects
// as writable): a response that has written nothing for a second writes something the client
// ignores (JSON's leading whitespace, an SSE comment). False: the client is gone.
bool keep_alive(httplib::DataSink& sink, SteadyTime* last_write, const char* filler) {
  const SteadyTime now = std::chrono::steady_clock::now();
  if (now - *last_write < std::chrono::seconds(1)) return sink.is_writable();
  *last_write = now;
  return sink.write(filler, std::strlen(filler));
}

// The metrics' name of a request's end (a stop string is a stop; kCancelled here is a failure).
RequestEnd end_of(FinishReason r, bool stop_string) {
  if (stop_string || r == FinishReason::kStop) return RequestEnd::kStop;
  return r == FinishReason::kLength ? RequestEnd::kLength : RequestEnd::kError;
}

std::string sse(const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; }

}  // namespace

struct Server::Impl {
  engine::EngineLoop* loop = nullptr;
  const Tokenizer* tokenizer = nullptr;
  ServerOptions options;
  httplib::Server http;
  int port = 0;
  std::atomic<int64_t> next_id{0};
  std::atomic<int64_t> in_flight{0};  // generating requests (each holds an HTTP thread)
  int64_t max_in_flight = 1;
  std::atomic<bool> draining{false};
  std::mt19937_64 seeds{std::random_device{}()};
  std::mutex seeds_mu;
  std::shared_ptr<ServerMetrics> metrics;  // GET /metrics; request timers hold it too
  int listen_socket = -1;                  // the listener, as httplib's socket-options hook saw it

  bool authorized(const httplib::Request& req) const {
    if (options.api_key.empty()) return true;
    return req.get_header_value("Authorization") == "Bearer " + options.api_key;
  }
  // POST /v1/completions (chat false) and /v1/chat/completions (chat true).
  void generate(const httplib::Request& req, httplib::Response& res, bool chat);
  // The prompt's tokens: token ids as sent, a text prompt encoded with BOS, or the messages
  // rendered by the model's chat template and encoded as they are (the template writes BOS).
  bool prompt_tokens(const GenerateRequest& r, std::vector<int32_t>* out, ApiError* e) const;
};

bool Server::Impl::prompt_tokens(const GenerateRequest& r, std::vector<int32_t>* out, ApiError* e) const {
  if (r.prompt_ids) {
    *out = *r.prompt_ids;
    return true;
  }
  if (tokenizer == nullptr) {
    *e = error_of(400, "invalid_request_error", r.chat ? "messages: this model has no tokenizer" : "prompt: this model has no tokenizer; send token ids");
    return false;
  }
  std::string text;
  if (r.chat) {
    if (options.chat_template.empty()) {
      *e = error_of(400, "invalid_request_error", "messages: this model has no chat template (use /v1/completions)");
      return false;
    }
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // role, then content, as clients send them
    for (const ChatMessage& m : r.messages) messages.push_back({{"role", m.role}, {"content", m.content}});
    ChatTemplateOptions co;
    co.add_generation_prompt = r.add_generation_prompt;
    co.bos_token = options.bos_token;
    co.eos_token = options.eos_token;
    co.date = options.date;
    if (Status st = render_chat_template(options.chat_template, messages, co, &text); !st.ok()) {
      *e = error_of(400, "invalid_request_error", "messages: " + st.message());
      return false;
    }
  } else {
    text = *r.prompt_text;
  }
  if (Status st = tokenizer->encode(text, /*add_bos=*/!r.chat, out); !st.ok()) {
    *e = error_of(400, "invalid_request_error", std::string(r.chat ? "messages" : "prompt") + ": " + st.message());
    return false;
  }
  if (out->empty()) {
    *e = error_of(400, "invalid_request_error", "prompt: no tokens");
    return false;
  }
  return true;
}

void Server::Impl::generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  const SteadyTime arrival = std::chrono::steady_clock::now();
  if (!authorized(req)) return send_error(res, error_of(401, "authentication_error", "Incorrect API key provided", "invalid_api_key"));
  if (draining) return send_error(res, error_of(503, "server_error", "the server is shutting down"));
  if (!loop->error().ok()) return send_error(res, error_of(500, "server_error", "the engine failed: " + loop->error().message()));
  // Each generating request holds an HTTP thread until it ends: past the threads kept for
  // everything else, answer "busy" at once rather than queue connections nobody serves.
  if (in_flight.fetch_add(1) >= max_in_flight) {
    --in_flight;
    return send_error(res, error_of(503, "server_error", "the server is busy: " + std::to_string(max_in_flight) + " requests in flight"));
  }
  std::atomic<int64_t>* counter = &in_flight;
  const std::shared_ptr<void> slot(nullptr, [counter](void*) { --*counter; });
  GenerateRequest r;
  ApiError e;
  if (!parse_generate_request(req.body, chat, RequestLimits{}, &r, &e)) return send_error(res, e);
  if (r.model != options.served_model_name)
    return send_error(res, error_of(404, "invalid_request_error", "The model `" + r.model + "` does not exist (this server serves `" +
                                                                      options.served_model_name + "`)", "model_not_found"));
  if (r.echo) return send_error(res, error_of(400, "invalid_request_error", "echo: not supported yet"));
  if (tokenizer == nullptr && !r.stop.empty())
    return send_error(res, error_of(400, "invalid_request_error", "stop: this model has no tokenizer; use stop_token_ids"));
  std::vector<int32_t> prompt;
  if (!prompt_tokens(r, &prompt, &e)) return send_error(res, e);
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n >= options.max_model_len || (r.max_tokens > 0 && n + r.max_tokens > options.max_model_len))
    return send_error(res, error_of(400, "invalid_request_error",
                                    "This model's maximum context length is " + std::to_string(options.max_model_len) +
                                        " tokens. However, you requested " + std::to_string(n + std::max<int64_t>(r.max_tokens, 1)) +
                                        " tokens (" + std::to_string(n) + " in the prompt, " +
                                        std::to_string(std::max<int64_t>(r.max_tokens, 1)) + " for the completion).",
                                    "context_length_exceeded"));
  engine::RequestSpec spec;
  spec.prompt = prompt;
  spec.max_new_tokens = r.max_tokens > 0 ? r.max_tokens : options.max_model_len - n;
  spec.stop_ids = r.stop_token_ids;
  if (!r.ignore_eos) spec.stop_ids.insert(spec.stop_ids.end(), options.end_ids.begin(), options.end_ids.end());
  engine::SamplingParams sp;
  sp.temperature = r.temperature;
  sp.top_p = r.top_p;
  sp.top_k = r.top_k;
  sp.logprobs = static_cast<int32_t>(r.logprobs);  // parse_generate_request held it to [-1, 20]
  if (r.seed) {
    sp.seed = *r.seed;
  } else {
    std::lock_guard<std::mutex> lock(seeds_mu);
    sp.seed = seeds();
  }
  if (sp.seed == 0) sp.seed = 1;  // xorshift's one dead state
  engine::TextStreamOptions to;
  to.stop = r.stop;
  to.prev = prompt.back();
  auto text = std::make_shared<engine::TextStream>();
  if (Status st = engine::TextStream::create(tokenizer, to, text.get()); tokenizer != nullptr && !st.ok())
    return send_error(res, error_of(400, "invalid_request_error", st.message()));
  auto channel = std::make_shared<Channel>();
  // The response's logprobs (null when not asked), built as the events arrive.
  const auto lp = r.logprobs >= 0 ? std::make_shared<ResponseLogprobs>(tokenizer, chat, prompt.back()) : nullptr;
  int64_t id = 0;
  auto timer = std::make_shared<RequestTimer>(metrics, n, arrival);
  const Status submitted = loop->submit(
      spec, sp,
      [channel, timer](const TokenEvent& ev) {
        if (ev.token >= 0) timer->on_token(std::chrono::steady_clock::now());
        channel->push(ev);
      },
      &id);
  if (!submitted.ok()) {
    if (!loop->error().ok()) return send_error(res, error_of(500, "server_error", "the engine failed: " + submitted.message()));
    const bool busy = submitted.code() == StatusCode::kResourceExhausted;
    return send_error(res, error_of(busy ? 503 : 400, busy ? "server_error" : "invalid_request_error", submitted.message()));
  }
  const std::string rid = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
  const char* object = chat ? "chat.completion" : "text_completion";
  const char* chunk_object = chat ? "chat.completion.chunk" : "text_completion";
  const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string model = options.served_model_name;
  const bool has_text = tokenizer != nullptr;
  // Pushes one event's token into the text: the delta, and whether the request has ended (its
  // final event, or a stop string).
  // A stop token (an end id such as <|eot_id|>, or one of stop_token_ids) ends the text without
  // being part of it, as OpenAI's API and vLLM answer (special tokens are not text).
  auto feed = [text, has_text](const TokenEvent& ev, std::string* delta, bool* stop_string) {
    *stop_string = false;
    if (ev.token >= 0 && has_text && ev.finish != FinishReason::kStop) (void)text->push(ev.token, delta, stop_string);
    if (ev.finish != FinishReason::kNone && !*stop_string && has_text) text->finish(delta);
  };

  // A final event the request did not reach on its own (kCancelled: the engine failed, or a hard
  // stop): an error, not a finished answer.
  engine::EngineLoop* loop_ptr = loop;
  const auto failure = [loop_ptr] {
    const Status st = loop_ptr->error();
    return st.ok() ? error_of(503, "server_error", "the request was cancelled: the server is shutting down")
                   : error_of(500, "server_error", "the engine failed: " + st.message());
  };
  auto ended = std::make_shared<bool>(false);
  auto last_write = std::make_shared<SteadyTime>(std::chrono::steady_clock::now());
  // The response is over: a request that did not end (the client went away) is cancelled, which
  // frees its blocks before the engine's next step; one that ended is not cancelled. The slot (an
  // HTTP thread's share of the in-flight count) is held until then.
  const auto release = [=](bool) {
    if (!*ended) (void)loop_ptr->cancel(id);
    timer->finish(RequestEnd::kAbort, -1, std::chrono::steady_clock::now());  // no-op once the request ended
    (void)slot;
  };

  if (!r.stream) {
    // Answered through a content provider too, so that a client that goes away is noticed while
    // it waits (sink.is_writable) and its request cancelled: its blocks are freed before the next step.
    auto out = std::make_shared<std::string>();
    auto ids = std::make_shared<std::vector<int32_t>>();
    res.set_chunked_content_provider(
        "application/json",
        [=](size_t, httplib::DataSink& sink) {
          std::deque<TokenEvent> evs;
          if (!keep_alive(sink, last_write.get(), " ")) return false;  // tokens keep coming, nothing is written until the end
          if (!channel->take(&evs, std::chrono::milliseconds(100))) return true;
          for (const TokenEvent& ev : evs) {
            if (ev.token >= 0) ids->push_back(ev.token);
            if (lp) lp->add(ev);
            bool stop_string = false;
            feed(ev, out.get(), &stop_string);
            if (!stop_string && ev.finish == FinishReason::kNone) continue;
            timer->finish(end_of(ev.finish, stop_string), static_cast<int64_t>(ids->size()), std::chrono::steady_clock::now());
            if (stop_string) (void)loop_ptr->cancel(id);  // the engine would go on to its length
            std::string body;
            if (!stop_string && ev.finish == FinishReason::kCancelled) {
              body = failure().to_json();
            } else {
              const int64_t completion = static_cast<int64_t>(ids->size());
              json choice = {{"index", 0}, {"logprobs", lp ? lp->take() : json(nullptr)},
                             {"finish_reason", finish_name(ev.finish, stop_string)}};
              if (chat) choice["message"] = {{"role", "assistant"}, {"content", *out}};
              else choice["text"] = *out;
              if (!has_text) choice["token_ids"] = *ids;
              body = json{{"id", rid}, {"object", object}, {"created", created}, {"model", model},
                          {"choices", json::array({choice})},
                          {"usage", {{"prompt_tokens", n}, {"completion_tokens", completion}, {"total_tokens", n + completion}}}}
                         .dump(-1, ' ', false, json::error_handler_t::replace);
            }
            *ended = true;
            if (!sink.write(body.data(), body.size())) return false;
            sink.done();
            return true;
          }
          return true;
        },
        release);
    return;
  }

  const bool usage = r.include_usage;
  auto completion = std::make_shared<int64_t>(0);
  auto started = std::make_shared<bool>(false);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [=](size_t, httplib::DataSink& sink) {
        std::deque<TokenEvent> evs;
        if (!channel->take(&evs, std::chrono::milliseconds(100))) return keep_alive(sink, last_write.get(), ":\n\n");
        for (const TokenEvent& ev : evs) {
          std::string delta;
          bool stop_string = false;
          if (ev.token >= 0) ++*completion;
          if (lp) lp->add(ev);
          feed(ev, &delta, &stop_string);
          const bool last = stop_string || ev.finish != FinishReason::kNone;
          if (last) timer->finish(end_of(ev.finish, stop_string), *completion, std::chrono::steady_clock::now());
          if (last && !stop_string && ev.finish == FinishReason::kCancelled) {
            // The engine failed or a hard stop: an error event (as vLLM sends one), then the end.
            const std::string s = "data: " + failure().to_json() + "\n\ndata: [DONE]\n\n";
            *ended = true;
            if (!sink.write(s.data(), s.size())) return false;
            sink.done();
            return true;
          }
          json choice = {{"index", 0}, {"logprobs", nullptr},
                         {"finish_reason", last ? json(finish_name(ev.finish, stop_string)) : json(nullptr)}};
          if (chat) {
            // OpenAI's deltas: the role once, first; then content; the last chunk's delta may be empty.
            choice["delta"] = json::object();
            if (!*started) choice["delta"]["role"] = "assistant";
            if (!delta.empty() || !*started) choice["delta"]["content"] = delta;
          } else {
            choice["text"] = delta;
          }
          if (!has_text && ev.token >= 0) choice["token_ids"] = json::array({ev.token});
          // A chunk carries the logprobs of every token since the last chunk sent (a token whose text
          // is held back, part of a character or of a possible stop string, sends no chunk).
          const bool send = !delta.empty() || last || !has_text || (chat && !*started);
          if (send && lp) choice["logprobs"] = lp->take();
          const json chunk = {{"id", rid}, {"object", chunk_object}, {"created", created}, {"model", model},
                              {"choices", json::array({choice})}};
          if (send) {
            const std::string s = sse(chunk);
            *last_write = std::chrono::steady_clock::now();
            if (!sink.write(s.data(), s.size())) return false;
            *started = true;
          }
          if (last) {
            if (stop_string) (void)loop_ptr->cancel(id);
            if (usage) {
              const json u = {{"id", rid}, {"object", chunk_object}, {"created", created}, {"model", model},
                              {"choices", json::array()},
                              {"usage", {{"prompt_tokens", n}, {"completion_tokens", *completion}, {"total_tokens", n + *completion}}}};
              const std::string s = sse(u);
              if (!sink.write(s.data(), s.size())) return false;
            }
            static const std::string kDone = "data: [DONE]\n\n";
            if (!sink.write(kDone.data(), kDone.size())) return false;
            *ended = true;
            sink.done();
            return true;
          }
        }
        return true;
      },
      release);
}

Status Server::create(engine::EngineLoop* loop, const Tokenizer* tokenizer, const ServerOptions& options,
                      std::unique_ptr<Server>* out) {
  if (loop == nullptr || out == nullptr) return invalid_argument("Server: loop and out must not be null");
  if (options.max_model_len < 2) return invalid_argument("Server: max_model_len must be at least 2");
  if (options.http_threads < 1 || options.http_threads > 4096)
    return invalid_argument("--http-threads: " + std::to_string(options.http_threads) + " outside [1, 4096]");
  std::unique_ptr<Server> s(new Server());
  s->impl_ = std::make_unique<Impl>();
  Impl& g = *s->impl_;
  g.loop = loop;
  g.tokenizer = tokenizer;
  g.options = options;
  g.metrics = std::make_shared<ServerMetrics>(options.served_model_name, options.max_model_len);
  const size_t threads = static_cast<size_t>(options.http_threads);
  g.http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  g.http.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
  g.http.set_read_timeout(std::chrono::seconds(30));
  g.http.set_write_timeout(std::chrono::seconds(30));
  // Each token leaves in its own small write: with Nagle's algorithm on, a write waits for the
  // client's (delayed) acknowledgement of the last one, about 40 ms (H100, 2026-11-27: 86 ms to the
  // first token at one client, for a 10 ms prefill).
  g.http.set_tcp_nodelay(true);
  Impl* impl = &g;
  // httplib listens with a backlog of 5: a burst of connections past it is answered with SYN cookies,
  // some of which fail (the client sees its connection reset). The hook that sets the listener's
  // options tells its descriptor, and a second listen() raises the backlog (see after the bind).
  g.http.set_socket_options([impl](socket_t sock) {
    httplib::default_socket_options(sock);
    impl->listen_socket = sock;
  });
  g.max_in_flight = std::max<int64_t>(1, options.http_threads - 4);  // 4 threads kept for /health, /v1/models, refusals
  // Before a body is read: one without a length (chunked, or up to the end of the connection) is
  // refused, since only a declared length can be held to the limit before it arrives.
  g.http.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "POST" && (!req.has_header("Content-Length") || req.has_header("Transfer-Encoding"))) {
      send_error(res, error_of(411, "invalid_request_error", "a request body needs a Content-Length (no chunked uploads)"));
      return httplib::Server::HandlerResponse::Handled;
    }
    // httplib reads a Content-Length with strtoull: "abc" would be 0 (the body then read as the next
    // request), "-5" or 30 digits past 2^64 (the body skipped until the read timeout). One plain
    // decimal count, or the request is refused before its body is read.
    if (req.has_header("Content-Length")) {
      const std::string length = req.get_header_value("Content-Length");
      if (req.get_header_value_count("Content-Length") != 1 || length.empty() || length.size() > 18 ||
          length.find_first_not_of("0123456789") != std::string::npos) {
        send_error(res, error_of(400, "invalid_request_error", "Content-Length: not one byte count"));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  g.http.Get("/health", [impl](const httplib::Request&, httplib::Response& res) {
    const Status st = impl->loop->error();
    if (!st.ok()) return send_error(res, error_of(503, "server_error", "the engine failed: " + st.message()));
    res.set_content("{}", "application/json");
  });
  g.http.Get("/v1/models", [impl](const httplib::Request& req, httplib::Response& res) {
    if (!impl->authorized(req))
      return send_error(res, error_of(401, "authentication_error", "Incorrect API key provided", "invalid_api_key"));
    const json m = {{"id", impl->options.served_model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "llmq"},
                    {"max_model_len", impl->options.max_model_len}};
    res.set_content(json{{"object", "list"}, {"data", json::array({m})}}.dump(), "application/json");
  });
  // GET /metrics (Prometheus' text format) asks for the key as /v1/models does: it tells the
  // model's name and load to whoever asks. Every response is counted by its status class.
  g.http.Get("/metrics", [impl](const httplib::Request& req, httplib::Response& res) {
    if (!impl->authorized(req))
      return send_error(res, error_of(401, "authentication_error", "Incorrect API key provided", "invalid_api_key"));
    res.set_content(impl->metrics->render(impl->loop->snapshot()), "text/plain; version=0.0.4; charset=utf-8");
  });
  g.http.set_logger([impl](const httplib::Request&, const httplib::Response& res) { impl->metrics->count_http_response(res.status); });
  g.http.Post("/v1/completions", [impl](const httplib::Request& req, httplib::Response& res) { impl->generate(req, res, false); });
  g.http.Post("/v1/chat/completions",
              [impl](const httplib::Request& req, httplib::Response& res) { impl->generate(req, res, true); });
  g.http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    send_error(res, error_of(500, "server_error", "internal error"));
  });
  // Errors httplib answers itself (a malformed request line or headers, a body that ended early,
  // an over-long URI) get OpenAI's error object too.
  g.http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (res.status == 413) send_error(res, error_of(413, "invalid_request_error", "request body too large"));
    else if (res.status == 404 && res.body.empty()) send_error(res, error_of(404, "invalid_request_error", "no such endpoint"));
    else if (res.status == 414) send_error(res, error_of(414, "invalid_request_error", "request URI too long"));
    else if (res.body.empty() && !res.content_provider_)
      send_error(res, error_of(res.status, res.status >= 500 ? "server_error" : "invalid_request_error",
                               "malformed HTTP request (HTTP " + std::to_string(res.status) + ")"));
  });
  const int port = options.port == 0 ? g.http.bind_to_any_port(options.host) : (g.http.bind_to_port(options.host, options.port) ? options.port : -1);
  if (port < 0) return Status(StatusCode::kIoError, "cannot listen on " + options.host + ":" + std::to_string(options.port));
  if (::listen(g.listen_socket, SOMAXCONN) != 0)
    return Status(StatusCode::kIoError, "cannot raise the listen backlog on " + options.host + ":" + std::to_string(port));
  g.port = port;
  *out = std::move(s);
  return {};
}

Server::~Server() {
  if (impl_) impl_->http.stop();
}
int Server::port() const { return impl_->port; }
Status Server::run() {
  if (!impl_->http.listen_after_bind()) return Status(StatusCode::kIoError, "the HTTP listener failed");
  return {};
}
void Server::begin_drain() { impl_->draining = true; }
int64_t Server::in_flight() const { return impl_->in_flight; }
void Server::stop() {
  // httplib's stop() is a no-op until the listener runs: wait for it (a signal may come early).
  for (int i = 0; i < 600 && !impl_->http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  impl_->http.stop();
}

}  // namespace llmq::server
