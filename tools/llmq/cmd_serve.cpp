// llmq serve: the serving engine behind the OpenAI-compatible HTTP server (include/llmq/server.hpp),
// on the CPU reference or the GPU runtime. SIGTERM or SIGINT stops accepting, lets the requests in
// flight finish, and exits 0.
#include <fmt/format.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "commands.hpp"
#include "engine_setup.hpp"
#include "llmq/chat_template.hpp"
#include "llmq/engine.hpp"
#include "llmq/engine_cpu.hpp"
#include "llmq/engine_loop.hpp"
#include "llmq/model_io.hpp"
#include "llmq/safetensors.hpp"
#include "llmq/server.hpp"
#include "llmq/tokenizer.hpp"

namespace llmq::cli {
namespace {

struct ServeCmdArgs {
  std::string model = "default";
  std::string device = "cpu";
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string served_model_name;
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 0;
  int64_t max_waiting = 1024;
  int64_t http_threads = 0;
  double shutdown_timeout = 30;
  std::string chat_template;  // a file; empty: the model directory's
  GpuEngineFlags gpu;
};

int run_serve_cmd(ServeCmdArgs a) {
  if (a.device != "cpu" && a.device != "cuda") return fail(invalid_argument("--device: cpu or cuda, got " + a.device));
  // Signals are taken by one watcher thread (sigwait): blocked here, before any thread exists, so
  // every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  ModelWeights w;
  ModelConfig config;
  GpuModelSource source;
  std::string description;
  if (Status st = model_shape(a.model, /*seed=*/1, &source, &w, &config); !st.ok()) return fail(st);
  if (a.device == "cpu" && source.kind == GpuModelSource::Kind::kCheckpoint)
    if (Status st = load_model(a.model, &w, &description); !st.ok()) return fail(st);
  if (a.device == "cpu" && source.kind == GpuModelSource::Kind::kSynthetic)
    return fail(invalid_argument("--model synthetic:*: weights generated on the GPU; use --device cuda"));
  if (a.max_model_len > config.max_seq_len)
    return fail(invalid_argument("--max-model-len: " + std::to_string(a.max_model_len) + " positions, the model's context is " +
                                 std::to_string(config.max_seq_len)));
  const int64_t max_model_len = a.max_model_len > 0 ? a.max_model_len : config.max_seq_len;
  std::unique_ptr<Tokenizer> tokenizer;
  if (!Tokenizer::find(a.model).empty())
    if (Status st = Tokenizer::load(a.model, &tokenizer); !st.ok()) return fail(st);

  std::unique_ptr<engine::CpuBackend> cpu;
  GpuEngine g;
  engine::EngineBackend* backend = nullptr;
  const int64_t block_size = a.gpu.block_size;
  if (a.device == "cuda") {
    a.gpu.model = a.model;
    a.gpu.max_running = a.max_num_seqs;
    a.gpu.max_batched_tokens = a.max_num_batched_tokens;
    a.gpu.max_running_flag = "--max-num-seqs";
    if (Status st = start_gpu_engine(a.gpu, source, max_model_len, &g); !st.ok()) return fail(st);
    backend = g.backend.get();
    description = g.description;
  } else {
    // The CPU cache: every running sequence at its full context, unless --kv-blocks says.
    const int64_t blocks = a.gpu.kv_blocks > 0 ? a.gpu.kv_blocks : a.max_num_seqs * ((max_model_len + block_size - 1) / block_size);
    if (Status st = engine::CpuBackend::create(w, blocks + 1, block_size, &cpu); !st.ok()) return fail(st);
    backend = cpu.get();
    description = a.model + " on the CPU reference";
  }
  // A request may fill the whole context (chat's default max_tokens): the cache must hold one.
  if ((backend->blocks() - 1) * block_size < max_model_len)
    return fail(invalid_argument("the KV cache holds " + std::to_string((backend->blocks() - 1) * block_size) +
                                 " positions, less than one request of --max-model-len " + std::to_string(max_model_len) +
                                 ": raise --gpu-memory-utilization or --kv-blocks, or lower --max-model-len"));
  engine::KvBlockPool pool;
  if (Status st = engine::KvBlockPool::create(backend->blocks(), block_size, &pool); !st.ok()) return fail(st);
  engine::SchedulerOptions so;
  so.max_batched_tokens = a.max_num_batched_tokens;
  so.max_running = a.max_num_seqs;
  so.max_waiting = a.max_waiting;
  so.max_model_len = max_model_len;
  std::unique_ptr<engine::Engine> eng;
  if (Status st = engine::Engine::create(backend, &pool, so, &eng); !st.ok()) return fail(st);
  std::unique_ptr<engine::EngineLoop> loop;
  if (Status st = engine::EngineLoop::start(eng.get(), &loop); !st.ok()) return fail(st);

  server::ServerOptions o;
  o.host = a.host;
  o.port = a.port;
  o.api_key = a.api_key;
  o.served_model_name = a.served_model_name.empty() ? a.model : a.served_model_name;
  o.max_model_len = max_model_len;
  o.http_threads = a.http_threads > 0 ? a.http_threads : std::min<int64_t>(4096, a.max_num_seqs + 16);
  o.eos = tokenizer ? tokenizer->eos() : -1;
  // The chat template: --chat-template, else the model directory's (none: chat is refused).
  ModelChatTemplate mt;
  if (!a.chat_template.empty()) {
    if (Status st = read_chat_file("--chat-template", a.chat_template, &mt.source); !st.ok()) return fail(st);
  } else if (source.kind == GpuModelSource::Kind::kCheckpoint && !read_model_chat_template(source.dir, &mt).ok()) {
    mt = {};
  }
  o.chat_template = mt.source;
  o.bos_token = mt.bos_token;
  o.eos_token = mt.eos_token;
  std::unique_ptr<server::Server> srv;
  if (Status st = server::Server::create(loop.get(), tokenizer.get(), o, &srv); !st.ok()) return fail(st);
  // One line a script can wait for and read the port from.
  fmt::print("llmq serve: {} as \"{}\", listening on http://{}:{}\n", description, o.served_model_name, a.host, srv->port());
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
  s->add_option("--model", args->model, "llama2.c .bin, Hugging Face directory, 'default', or synthetic:NAME (cuda)");
  s->add_option("--device", args->device, "cpu (the CPU reference) or cuda");
  s->add_option("--host", args->host, "address to listen on");
  s->add_option("--port", args->port, "port (0: any free one, printed)")->check(CLI::Range(0, 65535));
  s->add_option("--api-key", args->api_key, "require 'Authorization: Bearer KEY' on every endpoint but /health");
  s->add_option("--served-model-name", args->served_model_name, "the model name clients send (default: --model)");
  s->add_option("--max-num-seqs", args->max_num_seqs, "sequences per step")->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  s->add_option("--max-num-batched-tokens", args->max_num_batched_tokens, "positions per step")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  s->add_option("--max-model-len", args->max_model_len, "positions per request (0: the model's context)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  s->add_option("--max-waiting", args->max_waiting, "queued requests before 503")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  s->add_option("--http-threads", args->http_threads, "connections served at once (0: --max-num-seqs + 16)")
      ->check(CLI::Range(int64_t{0}, int64_t{4096}));
  s->add_option("--shutdown-timeout", args->shutdown_timeout, "seconds SIGTERM waits for the requests in flight")
      ->check(CLI::Range(0.0, 86400.0));
  s->add_option("--chat-template", args->chat_template, "a Jinja chat template file (default: the model directory's)");
  s->add_option("--block-size", args->gpu.block_size, "KV block size in tokens")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  s->add_option("--kv-blocks", args->gpu.kv_blocks, "KV blocks (0: what fits)")->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  s->add_option("--precision", args->gpu.precision, "cuda: bf16, f32, a scheme name, or checkpoint");
  s->add_option("--kv-cache", args->gpu.kv_cache, "cuda: KV elements, bf16 or e4m3");
  s->add_option("--tp", args->gpu.tp, "cuda: tensor-parallel GPUs")->check(CLI::Range(1, 8));
  s->add_option("--gpu", args->gpu.gpu, "cuda: first CUDA device ordinal")->check(CLI::Range(0, 63));
  s->add_option("--gpu-memory-utilization", args->gpu.gpu_memory_utilization, "cuda: share of GPU memory to use")
      ->check(CLI::Range(0.01, 1.0));
  s->add_flag("--no-graphs", args->gpu.no_graphs, "cuda: decode steps without CUDA graphs");
  add_gpu_launch_flags(s, &args->gpu.launch);
  commands->push_back({s, [args] { return run_serve_cmd(*args); }});
}

}  // namespace llmq::cli
