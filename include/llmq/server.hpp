// `llmq serve`'s HTTP side: an OpenAI-compatible server in front of an EngineLoop (engine_loop.hpp).
// Endpoints so far: GET /health, GET /v1/models, GET /metrics (Prometheus' text format), POST
// /v1/completions and POST /v1/chat/completions (the model's chat template; streamed as server-sent
// events or not). Every request is checked before it reaches the engine (src/server/
// openai_request.hpp) and answered with OpenAI's error object and status where it cannot be served:
// 400 a malformed body or a field out of range, 401 a missing or wrong API key, 404 an unknown model,
// 413 a body over the limit, 400 a prompt longer than the context (both numbers said), 503 the
// engine's waiting queue full. A client that disconnects cancels its request, which frees its KV
// blocks. Binds 127.0.0.1 unless told otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llmq/engine_loop.hpp"
#include "llmq/status.hpp"
#include "llmq/tokenizer.hpp"

namespace llmq::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                   // 0: any free port (port() says which)
  std::string api_key;               // empty: no key asked
  std::string served_model_name = "llmq";
  int64_t max_model_len = 0;         // positions per request, prompt and completion (required)
  int64_t max_body_bytes = 16 << 20;
  int64_t http_threads = 64;         // connections served at once (a streaming request holds one)
  // The tokens that end a completion unless ignore_eos (generation_end_ids: config.json's EOS, the
  // tokenizer's end ids); empty: none.
  std::vector<int32_t> end_ids;
  // POST /v1/chat/completions: the model's chat template (chat_template.hpp; empty: chat refused)
  // with its BOS / EOS text, and the day strftime_now gives (YYYY-MM-DD; empty: today).
  std::string chat_template, bos_token, eos_token, date;
};

class Server {
 public:
  // `loop` (the engine behind its queue) and `tokenizer` (null: token-id prompts only) must outlive
  // the server. Binds the socket; refused with the reason when it cannot.
  static Status create(engine::EngineLoop* loop, const Tokenizer* tokenizer, const ServerOptions& options,
                       std::unique_ptr<Server>* out);
  ~Server();
  int port() const;   // the bound port
  // Serves until stop(); returns when the listener has closed.
  Status run();
  // Shutdown, from any thread (a signal watcher's): begin_drain() answers new generating requests
  // 503 while the ones in flight go on; in_flight() counts those; stop() closes the listener and
  // ends every connection (streams included), and run() returns.
  void begin_drain();
  int64_t in_flight() const;
  void stop();

  struct Impl;

 private:
  Server() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace llmq::server
