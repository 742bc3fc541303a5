// A load generator for OpenAI-compatible servers (`llmq bench serve --url`, as `vllm bench serve`
// measures a server): a serving workload (serve_workload.hpp) sent over HTTP to POST
// /v1/completions as token-id prompts (no tokenizer needed on this side), each forced to its length
// with max_tokens and ignore_eos at temperature 0, streamed, and timed token by token on arrival, so
// that serve_metrics (serve_metrics.hpp) gives TTFT, TPOT, ITL and E2E as the in-process benchmark
// does. Requests go at their arrival times (all at once, or the workload's Poisson process) with at
// most max_concurrency in flight; each in-flight request holds one thread and one HTTP connection
// (reused by the thread's next request), at most kMaxInFlight. A request that fails (an HTTP
// error, a refused or dropped connection, the timeout, a stream that is malformed or disagrees with
// its usage count) is counted with its reason and kept out of the latency figures; it never stops
// the run. Plain http only, for now (https is refused by name).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llmq/serve_metrics.hpp"
#include "llmq/serve_workload.hpp"
#include "llmq/status.hpp"

namespace llmq::loadgen {

// At most this many requests in flight (threads and connections held at once).
constexpr int64_t kMaxInFlight = 1024;

// http://HOST[:PORT][/PREFIX]: the server's root; requests go to PREFIX/v1/... (a proxy's prefix).
struct ServerUrl {
  std::string host;    // an IPv6 address without its brackets
  int port = 80;
  std::string prefix;  // "" or "/a/b", no trailing slash
  std::string text;    // as given, for messages
};
// Refused by name: another scheme (https included), no host, a port outside [1, 65535], user
// information, a query or a fragment.
Status parse_server_url(const std::string& url, ServerUrl* out);

struct ClientOptions {
  ServerUrl url;
  std::string api_key;     // sent as "Authorization: Bearer KEY" when not empty
  double timeout_s = 600;  // per request: connecting, and from sending it to its last byte
};

// What GET /v1/models says of the first model it lists.
struct ServedModel {
  std::string name;
  int64_t max_model_len = 0;  // 0 where the server does not say (OpenAI's API does not)
  std::vector<std::string> all;  // every model id listed
};
// Errors say the URL and what went wrong: no connection, an HTTP status with the server's message,
// a body that is not a model list. http_status is set to the HTTP status when one came (else 0).
Status query_served_model(const ClientOptions& client, ServedModel* out, int* http_status = nullptr);

struct LoadOptions {
  ClientOptions client;
  std::string model;            // the served model's name, sent in every request
  int64_t max_concurrency = 0;  // requests in flight at most; 0: as many as the workload (up to kMaxInFlight)
};

struct RequestOutcome {
  bool ok = false;
  std::string error;                 // why it failed
  engine::RequestTimeline timeline;  // ok only: arrival_s = when it was sent, seconds from the start
  bool per_token_times = true;       // ok only: token_s has one time per token (else per chunk of text)
};

struct LoadResult {
  std::vector<RequestOutcome> requests;  // in the workload's order
  int64_t concurrency = 0;               // the bound the run had
  int64_t failed = 0;
};

// Sends `work`, each request at work[i].arrival_s (seconds from the start) or, when every thread
// is busy, as soon as one is free, and timed from the moment it is sent (as vLLM's benchmark times
// a request that waited for its concurrency slot). Errors only for bad options; failed requests are
// in the result.
Status run_load(const LoadOptions& options, const std::vector<engine::WorkloadRequest>& work, LoadResult* out);

}  // namespace llmq::loadgen
