// llmq serve: the serving engine behind the OpenAI-compatible HTTP server (include/llmq/server.hpp),
// on the CPU reference or the GPU runtime. SIGTERM or SIGINT stops accepting, lets the requests in
// flight finish, and exits 0.
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "commands.hpp"
#include "engine_setup.hpp"
#include "llmq/engine_loop.hpp"
#include "llmq/server.hpp"

namespace llmq::cli {
namespace {

struct ServeCmdArgs {
  ServingFlags engine;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string served_model_name;
  int64_t http_threads = 0;
  double shutdown_timeout = 30;
};

int run_serve_cmd(const ServeCmdArgs& a) {
  // Signals are taken by one watcher thread (sigwait): blocked here, before any thread exists, so
  // every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  ServingEngine e;
  if (Status st = build_serving_engine(a.engine, &e); !st.ok()) return fail(st);
  std::unique_ptr<engine::EngineLoop> loop;
  if (Status st = engine::EngineLoop::start(e.engine.get(), &loop); !st.ok()) return fail(st);

  server::ServerOptions o;
  o.host = a.host;
  o.port = a.port;
  o.api_key = a.api_key;
  o.served_model_name = a.served_model_name.empty() ? a.engine.model : a.served_model_name;
  o.max_model_len = e.max_model_len;
  o.http_threads = a.http_threads > 0 ? a.http_threads : std::min<int64_t>(4096, a.engine.max_num_seqs + 16);
  o.end_ids = e.end_ids;
  o.chat_template = e.chat.source;
  o.bos_token = e.chat.bos_token;
  o.eos_token = e.chat.eos_token;
  std::unique_ptr<server::Server> srv;
  if (Status st = server::Server::create(loop.get(), e.tokenizer.get(), o, &srv); !st.ok()) return fail(st);
  if (!e.chat_status.ok()) fmt::print(stderr, "llmq serve: /v1/chat/completions is off: {}\n", e.chat_status.message());
  // One line a script can wait for and read the port from.
  fmt::print("llmq serve: {} as \"{}\", listening on http://{}:{}\n", e.description, o.served_model_name, a.host, srv->port());
  std::fflush(stdout);

  // SIGTERM / SIGINT: new generating requests get 503 while those in flight finish, for at most
  // --shutdown-timeout seconds or until a second signal; then whatever is left is cancelled (each
  // client gets an error event), and the listener closes.
  server::Server* s = srv.get();
  engine::EngineLoop* l = loop.get();
  const double timeout_s = a.shutdown_timeout;
  std::thread watcher([&stop_signals, s, l, timeout_s] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    s->begin_drain();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    const timespec tick{0, 100 * 1000 * 1000};
    bool hard = false;
    while (s->in_flight() > 0 && !hard) {
      if (sigtimedwait(&stop_signals, nullptr, &tick) > 0 || std::chrono::steady_clock::now() > deadline) hard = true;
    }
    if (hard) {
      l->stop(/*drain=*/false);  // every live request ends with an error event
      for (int i = 0; i < 50 && s->in_flight() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    s->stop();
  });
  const Status ran = srv->run();
  if (!ran.ok()) kill(getpid(), SIGTERM);  // wake the watcher
  watcher.join();
  loop->stop(/*drain=*/true);
  if (!ran.ok()) return fail(ran);
  fmt::print(stderr, "llmq serve: stopped\n");
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app, std::vector<Command>* commands) {
  auto args = std::make_shared<ServeCmdArgs>();
  CLI::App* s = app.add_subcommand("serve", "an OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/models, /health)");
  add_serving_engine_options(s, &args->engine);
  s->add_option("--host", args->host, "address to listen on");
  s->add_option("--port", args->port, "port (0: any free one, printed)")->check(CLI::Range(0, 65535));
  s->add_option("--api-key", args->api_key, "require 'Authorization: Bearer KEY' on every endpoint but /health");
  s->add_option("--served-model-name", args->served_model_name, "the model name clients send (default: --model)");
  s->add_option("--max-waiting", args->engine.max_waiting, "queued requests before 503")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  s->add_option("--http-threads", args->http_threads, "connections served at once (0: --max-num-seqs + 16)")
      ->check(CLI::Range(int64_t{0}, int64_t{4096}));
  s->add_option("--shutdown-timeout", args->shutdown_timeout, "seconds SIGTERM waits for the requests in flight")
      ->check(CLI::Range(0.0, 86400.0));
  commands->push_back({s, [args] { return run_serve_cmd(*args); }});
}

}  // namespace llmq::cli
