// The serving engine's GPU side as `llmq bench serve` and `llmq serve` start it: the model split over
// --tp GPUs and its runtime in the paged mode, its KV blocks sized from --gpu-memory-utilization
// unless given. One place for the choices both commands make.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "commands.hpp"
#include "llmq/engine_gpu.hpp"
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

Status start_gpu_engine(const GpuEngineFlags& f, const GpuModelSource& source, int64_t max_model_len, GpuEngine* g);

}  // namespace llmq::cli
