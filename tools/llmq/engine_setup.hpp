// The serving engine as the commands start it. GPU side (`llmq bench serve`, `llmq serve`, `llmq
// chat`): the model split over --tp GPUs and its runtime in the paged mode, its KV blocks sized from
// --gpu-memory-utilization unless given. The whole engine (`llmq serve`, `llmq chat`): the model on
// the CPU reference or the GPU, its tokenizer and chat template, the block pool and the scheduler.
// One place for the choices these commands make.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "commands.hpp"
#include "llmq/chat_template.hpp"
#include "llmq/engine.hpp"
#include "llmq/engine_cpu.hpp"
#include "llmq/engine_gpu.hpp"
#include "llmq/kv_block_pool.hpp"
#include "llmq/tokenizer.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/tensor_parallel.hpp"

namespace llmq::cli {

struct GpuEngineFlags {
  std::string model;  // for the description
  std::string precision = "bf16";
  std::string kv_cache = "bf16";
  int tp = 1;
  int gpu = 0;
  double gpu_memory_utilization = 0.9;
  int64_t max_running = 64;          // sequences per step (the command's own option name in errors)
  int64_t max_batched_tokens = 512;  // positions per step
  int64_t block_size = 16;
  int64_t kv_blocks = 0;             // usable blocks; 0: what fits
  bool no_graphs = false;
  int gemm_autotune = 1;             // cuBLASLt candidates timed per GEMM shape class
  bool fp8_fast_accum = false;       // CudaGemmOptions::fp8_fast_accumulation
  GpuLaunchFlags launch;
  std::string max_running_flag = "--max-running";
};

struct GpuEngine {
  std::unique_ptr<TensorParallelRuntime> tpr;
  std::unique_ptr<engine::GpuBackend> backend;
  std::string description;
};

// Where --model's weights come from (gpu_model_source) and the model's shape, read before any
// weights are: a synthetic model's config, a checkpoint's config.json, or the host model loaded.
Status model_shape(const std::string& model, uint64_t seed, GpuModelSource* source, ModelWeights* host, ModelConfig* config);

// TensorParallelRuntime::load with a progress line on stderr, "generating WHAT" for a synthetic
// model and "loading WHAT" otherwise (options.progress is set here): how every command puts a model
// on its GPUs.
Status load_on_gpus(int tp, int gpu, const GpuModelSource& source, const GpuPrecision& precision, const std::string& what,
                    TensorParallelLoadOptions options, std::unique_ptr<TensorParallelRuntime>* out);

Status start_gpu_engine(const GpuEngineFlags& f, const GpuModelSource& source, int64_t max_model_len, GpuEngine* g);

// The options `llmq serve` and `llmq chat` share (add_serving_engine_options names them).
struct ServingFlags {
  std::string model = "default";
  std::string device = "cpu";
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 0;  // 0: the model's context
  int64_t max_waiting = 1024;
  bool no_preemption = false;  // SchedulerOptions::no_preemption
  std::string chat_template;  // a file; empty: the model directory's
  GpuEngineFlags gpu;
};
// one_sequence: a command that runs one sequence at a time (chat) has no --max-num-seqs.
void add_serving_engine_options(CLI::App* app, ServingFlags* flags, bool one_sequence = false);

// Everything behind one engine, in the order it must be torn down (members last to first).
struct ServingEngine {
  // The engine points into the members (pool, backend, weights): built in place, never moved.
  ServingEngine() = default;
  ServingEngine(const ServingEngine&) = delete;
  ServingEngine& operator=(const ServingEngine&) = delete;
  ModelWeights weights;  // the host model (CPU backend)
  GpuModelSource source;
  std::unique_ptr<Tokenizer> tokenizer;  // null: the model has none (token-id prompts only)
  std::vector<int32_t> end_ids;          // generation_end_ids: what ends a reply unless ignore_eos
  ModelChatTemplate chat;                // source empty: no chat template
  Status chat_status;                    // why there is none (ok when there is one)
  int64_t max_model_len = 0;
  std::string description;
  std::unique_ptr<engine::CpuBackend> cpu;
  GpuEngine gpu;
  engine::EngineBackend* backend = nullptr;
  engine::KvBlockPool pool;
  std::unique_ptr<engine::Engine> engine;
};
Status build_serving_engine(ServingFlags flags, ServingEngine* out);

}  // namespace llmq::cli
