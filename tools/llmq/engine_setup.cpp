// start_gpu_engine, build_serving_engine (engine_setup.hpp).
#include "engine_setup.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

#include "llmq/model_io.hpp"
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

Status load_on_gpus(int tp, int gpu, const GpuModelSource& source, const GpuPrecision& precision, const std::string& what,
                    TensorParallelLoadOptions options, std::unique_ptr<TensorParallelRuntime>* out) {
  Progress progress((source.kind == GpuModelSource::Kind::kSynthetic ? "generating " : "loading ") + what);
  options.progress = [&progress](int64_t done, int64_t total, const std::string&) { progress.update(done, total); };
  LLMQ_RETURN_IF_ERROR(TensorParallelRuntime::load(tp, gpu, source, precision, out, options));
  progress.finish();
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
  TensorParallelLoadOptions lo;
  lo.group = apply_gpu_launch_flags(f.launch);
  LLMQ_RETURN_IF_ERROR(load_on_gpus(f.tp, f.gpu, source, p, f.model + " " + f.precision, lo, &g->tpr));
  GpuRuntimeOptions o;
  o.max_batch = f.max_running;
  o.max_context = max_model_len;
  o.max_step_tokens = f.max_batched_tokens;
  o.cuda_graphs = !f.no_graphs;
  o.gemm_autotune = f.gemm_autotune;
  o.gemm_tile_search_max_m = f.launch.gemm_tile_search;
  o.fp8_fast_accumulation = f.fp8_fast_accum;
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

void add_serving_engine_options(CLI::App* s, ServingFlags* f, bool one_sequence) {
  s->add_option("--model", f->model, "llama2.c .bin, Hugging Face directory, 'default', or synthetic:NAME (cuda)");
  s->add_option("--device", f->device, "cpu (the CPU reference) or cuda");
  if (one_sequence) {
    f->max_num_seqs = 1;
  } else {
    s->add_option("--max-num-seqs", f->max_num_seqs, "sequences per step")->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  }
  s->add_option("--max-num-batched-tokens", f->max_num_batched_tokens, "positions per step")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  s->add_option("--max-model-len", f->max_model_len, "positions per request (0: the model's context)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  if (!one_sequence)  // one sequence at a time always fits (add() refuses what could not)
    s->add_flag("--no-preemption", f->no_preemption,
                "admit a request only while the cache holds every running request's longest output too (no step preempts)");
  s->add_option("--chat-template", f->chat_template, "a Jinja chat template file (default: the model directory's)");
  s->add_option("--block-size", f->gpu.block_size, "KV block size in tokens")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  s->add_option("--kv-blocks", f->gpu.kv_blocks, "KV blocks (0: what fits)")->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  s->add_option("--precision", f->gpu.precision, "cuda: bf16, f32, a scheme name, or checkpoint");
  s->add_option("--kv-cache", f->gpu.kv_cache, "cuda: KV elements, bf16 or e4m3");
  s->add_option("--tp", f->gpu.tp, "cuda: tensor-parallel GPUs")->check(CLI::Range(1, 8));
  s->add_option("--gpu", f->gpu.gpu, "cuda: first CUDA device ordinal")->check(CLI::Range(0, 63));
  s->add_option("--gpu-memory-utilization", f->gpu.gpu_memory_utilization, "cuda: share of GPU memory to use")
      ->check(CLI::Range(0.01, 1.0));
  s->add_flag("--no-graphs", f->gpu.no_graphs, "cuda: decode steps without CUDA graphs");
  s->add_option("--gemm-autotune", f->gpu.gemm_autotune,
                "cuda: time cuBLASLt's first N algorithms per GEMM shape class and keep the fastest (1: its first)")
      ->check(CLI::Range(1, 32));
  add_fp8_fast_accum_flag(s, &f->gpu.fp8_fast_accum);
  add_gpu_launch_flags(s, &f->gpu.launch);
}

Status build_serving_engine(ServingFlags a, ServingEngine* e) {
  if (a.device != "cpu" && a.device != "cuda") return invalid_argument("--device: cpu or cuda, got " + a.device);
  LLMQ_RETURN_IF_ERROR(check_fp8_fast_accum(a.gpu.fp8_fast_accum, a.device));
  ModelConfig config;
  LLMQ_RETURN_IF_ERROR(model_shape(a.model, /*seed=*/1, &e->source, &e->weights, &config));
  const bool checkpoint = e->source.kind == GpuModelSource::Kind::kCheckpoint;
  if (a.device == "cpu" && checkpoint) LLMQ_RETURN_IF_ERROR(load_model(a.model, &e->weights, &e->description));
  if (a.device == "cpu" && e->source.kind == GpuModelSource::Kind::kSynthetic)
    return invalid_argument("--model synthetic:*: weights generated on the GPU; use --device cuda");
  if (a.max_model_len > config.max_seq_len)
    return invalid_argument("--max-model-len: " + std::to_string(a.max_model_len) + " positions, the model's context is " +
                            std::to_string(config.max_seq_len));
  e->max_model_len = a.max_model_len > 0 ? a.max_model_len : config.max_seq_len;
  if (!Tokenizer::find(a.model).empty()) LLMQ_RETURN_IF_ERROR(Tokenizer::load(a.model, &e->tokenizer));
  e->end_ids = generation_end_ids(config, e->tokenizer.get());
  // The chat template: --chat-template, else the model directory's (none: chat is refused, and
  // chat_status says why). BOS / EOS text comes from the directory's tokenizer_config.json either
  // way (read_model_chat_template fills them before it looks for the template).
  if (checkpoint) {
    e->chat_status = read_model_chat_template(e->source.dir, &e->chat);
  } else {
    e->chat_status = invalid_argument(a.model + ": a llama2.c or built-in model carries no chat template");
  }
  if (!a.chat_template.empty()) {
    LLMQ_RETURN_IF_ERROR(read_chat_file("--chat-template", a.chat_template, &e->chat.source));
    e->chat.origin = a.chat_template;
    e->chat_status = {};
  } else if (!e->chat_status.ok()) {
    e->chat.source.clear();
  }

  const int64_t block_size = a.gpu.block_size;
  if (a.device == "cuda") {
    a.gpu.model = a.model;
    a.gpu.max_running = a.max_num_seqs;
    a.gpu.max_batched_tokens = a.max_num_batched_tokens;
    a.gpu.max_running_flag = "--max-num-seqs";
    LLMQ_RETURN_IF_ERROR(start_gpu_engine(a.gpu, e->source, e->max_model_len, &e->gpu));
    e->backend = e->gpu.backend.get();
    e->description = e->gpu.description;
  } else {
    // The CPU cache: every running sequence at its full context, unless --kv-blocks says.
    const int64_t blocks = a.gpu.kv_blocks > 0 ? a.gpu.kv_blocks
                                               : a.max_num_seqs * ((e->max_model_len + block_size - 1) / block_size);
    LLMQ_RETURN_IF_ERROR(engine::CpuBackend::create(e->weights, blocks + 1, block_size, &e->cpu));
    e->backend = e->cpu.get();
    e->description = a.model + " on the CPU reference";
  }
  // A request may fill the whole context (chat's default max_tokens): the cache must hold one.
  if ((e->backend->blocks() - 1) * block_size < e->max_model_len)
    return invalid_argument("the KV cache holds " + std::to_string((e->backend->blocks() - 1) * block_size) +
                            " positions, less than one request of --max-model-len " + std::to_string(e->max_model_len) +
                            ": raise --gpu-memory-utilization or --kv-blocks, or lower --max-model-len");
  LLMQ_RETURN_IF_ERROR(engine::KvBlockPool::create(e->backend->blocks(), block_size, &e->pool));
  engine::SchedulerOptions so;
  so.max_batched_tokens = a.max_num_batched_tokens;
  so.max_running = a.max_num_seqs;
  so.max_waiting = a.max_waiting;
  so.max_model_len = e->max_model_len;
  so.no_preemption = a.no_preemption;
  return engine::Engine::create(e->backend, &e->pool, so, &e->engine);
}

}  // namespace llmq::cli
