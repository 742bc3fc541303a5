// start_gpu_engine (engine_setup.hpp).
#include "engine_setup.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

#include "llmq/safetensors.hpp"

namespace llmq::cli {

Status model_shape(const std::string& model, uint64_t seed, GpuModelSource* source, ModelWeights* host, ModelConfig* config) {
  LLMQ_RETURN_IF_ERROR(gpu_model_source(model, seed, source, host));
  if (source->kind == GpuModelSource::Kind::kSynthetic) {
    *config = source->config;
  } else if (source->kind == GpuModelSource::Kind::kCheckpoint) {
    std::unique_ptr<Checkpoint> ckpt;
    LLMQ_RETURN_IF_ERROR(open_hf_checkpoint(source->dir, &ckpt, config));
  } else {
    *config = host->config;
  }
  return {};
}

Status start_gpu_engine(const GpuEngineFlags& f, const GpuModelSource& source, int64_t max_model_len, GpuEngine* g) {
  // The runtime's own limits, named by the command's options.
  if (f.max_running > 1024)
    return invalid_argument(f.max_running_flag + ": " + std::to_string(f.max_running) +
                            " > 1024 (the GPU runtime's most sequences per step)");
  if ((f.block_size & (f.block_size - 1)) != 0)
    return invalid_argument("--block-size: " + std::to_string(f.block_size) +
                            " is not a power of two (the GPU kernels split positions with shifts)");
  if (f.kv_cache != "bf16" && f.kv_cache != "e4m3") return invalid_argument("--kv-cache: bf16 or e4m3, got " + f.kv_cache);
  GpuPrecision p;
  LLMQ_RETURN_IF_ERROR(parse_gpu_precision(f.precision, &p));
  Progress progress((source.kind == GpuModelSource::Kind::kSynthetic ? "generating " : "loading ") + f.model + " " + f.precision);
  TensorParallelLoadOptions lo;
  lo.group = apply_gpu_launch_flags(f.launch);
  lo.progress = [&](int64_t done, int64_t total, const std::string&) { progress.update(done, total); };
  LLMQ_RETURN_IF_ERROR(TensorParallelRuntime::load(f.tp, f.gpu, source, p, &g->tpr, lo));
  progress.finish();
  GpuRuntimeOptions o;
  o.max_batch = f.max_running;
  o.max_context = max_model_len;
  o.max_step_tokens = f.max_batched_tokens;
  o.cuda_graphs = !f.no_graphs;
  o.kv_block_size = f.block_size;
  o.kv_cache_dtype = f.kv_cache == "e4m3" ? DType::kE4M3 : DType::kBF16;
  o.kv_blocks = f.kv_blocks > 0 ? f.kv_blocks + 1 : 0;
  if (o.kv_blocks == 0) {
    // Every rank holds the same blocks (of its own heads): the smallest fit of the ranks.
    int64_t fit = INT64_MAX;
    for (int r = 0; r < g->tpr->size(); ++r) {
      int64_t b = 0;
      LLMQ_RETURN_IF_ERROR(GpuRuntime::kv_blocks_that_fit(g->tpr->model(r), o, f.gpu_memory_utilization, &b));
      fit = std::min(fit, b);
    }
    o.kv_blocks = fit;
  }
  LLMQ_RETURN_IF_ERROR(g->tpr->start(o));
  LLMQ_RETURN_IF_ERROR(engine::GpuBackend::create(g->tpr.get(), &g->backend));
  g->description = f.model + " " + f.precision + (f.kv_cache == "e4m3" ? " (e4m3 KV)" : "") +
                   (f.tp > 1 ? fmt::format(" over {} GPUs", f.tp) : std::string());
  return {};
}

}  // namespace llmq::cli
