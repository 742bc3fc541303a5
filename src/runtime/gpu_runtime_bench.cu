// GpuRuntime's benchmark helpers (gpu_runtime.hpp): a KV cache filled with seeded values, timed
// decode steps (graph replays between CUDA events) and timed prefills.
#include <cuda_runtime.h>

#include <random>

#include "runtime/gpu_runtime_impl.hpp"

namespace llmq {

Status GpuRuntime::fill_context_for_benchmark(int64_t batch, int64_t length, uint64_t seed) {
  Impl& g = *impl_;
  LLMQ_RETURN_IF_ERROR(g.fixed_slots("fill_context_for_benchmark"));
  if (batch < 1 || batch > g.options.max_batch || length < 0 || length >= g.options.max_context)
    return invalid_argument("fill_context_for_benchmark: batch " + std::to_string(batch) + " x length " +
                            std::to_string(length) + " does not fit the runtime");
  if (g.kv_fp8) LLMQ_RETURN_IF_ERROR(runtime::fill_random_e4m3(g.kv_cache.as<uint8_t>(), g.kv_cache.bytes(), 1.0f, seed, g.stream));
  else LLMQ_RETURN_IF_ERROR(runtime::fill_random_bf16(g.kv_cache.as<uint16_t>(), g.kv_cache.bytes() / 2, 1.0f, seed, g.stream));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g.stream));
  for (int64_t b = 0; b < batch; ++b) g.lengths[static_cast<size_t>(b)] = length;
  return {};
}

Status GpuRuntime::time_decode(int64_t batch, int64_t warmup, int64_t steps, std::vector<double>* step_ms) {
  Impl& g = *impl_;
  LLMQ_RETURN_IF_ERROR(g.fixed_slots("time_decode"));
  for (int64_t b = 0; b < batch; ++b)
    if (g.lengths[static_cast<size_t>(b)] + warmup + steps > g.options.max_context)
      return invalid_argument("time_decode: the KV cache cannot hold " + std::to_string(warmup + steps) + " more positions");
  std::vector<int32_t> first(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) first[static_cast<size_t>(b)] = static_cast<int32_t>((b * 7919 + 1) % g.c.vocab_size);
  std::vector<std::vector<int32_t>> out;
  LLMQ_RETURN_IF_ERROR(generate(first, warmup, {}, &out));
  for (int64_t b = 0; b < batch; ++b) first[static_cast<size_t>(b)] = out.empty() || out[0].empty() ? 1 : out[static_cast<size_t>(b)].back();
  LLMQ_RETURN_IF_ERROR(g.start_decode_state(first));
  cudaGraphExec_t exec = nullptr;
  if (g.options.cuda_graphs) LLMQ_RETURN_IF_ERROR(g.decode_graph(batch, {}, &exec));
  std::vector<cudaEvent_t> ev(static_cast<size_t>(steps + 1), nullptr);
  auto timed = [&]() -> Status {
    for (auto& e : ev) LLMQ_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[0], g.stream));
    for (int64_t s = 0; s < steps; ++s) {
      if (exec != nullptr) LLMQ_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, g.stream));
      else LLMQ_RETURN_IF_ERROR(g.decode_body(batch, {}));
      LLMQ_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[static_cast<size_t>(s + 1)], g.stream));
    }
    LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g.stream));
    step_ms->clear();
    for (int64_t s = 0; s < steps; ++s) {
      float ms = 0.0f;
      LLMQ_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, ev[static_cast<size_t>(s)], ev[static_cast<size_t>(s + 1)]));
      step_ms->push_back(ms);
    }
    return {};
  };
  const Status st = timed();
  for (auto& e : ev)
    if (e != nullptr) (void)cudaEventDestroy(e);
  for (int64_t b = 0; b < batch; ++b) g.lengths[static_cast<size_t>(b)] += steps;
  return st;
}

Status GpuRuntime::time_prefill(int64_t tokens, uint64_t seed, double* ms) {
  Impl& g = *impl_;
  LLMQ_RETURN_IF_ERROR(g.fixed_slots("time_prefill"));
  if (tokens < 1 || tokens > g.options.max_context)
    return invalid_argument("time_prefill: " + std::to_string(tokens) + " tokens, the KV cache holds " +
                            std::to_string(g.options.max_context));
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> ids(1);
  for (int64_t i = 0; i < tokens; ++i) ids[0].push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(g.c.vocab_size)));
  g.lengths[0] = 0;
  cudaEvent_t start = nullptr, stop = nullptr;
  float t = 0.0f;
  auto timed = [&]() -> Status {
    LLMQ_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g.stream));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, g.stream));
    std::vector<float> logits;
    LLMQ_RETURN_IF_ERROR(prefill(ids, false, &logits));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, g.stream));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&t, start, stop));
    return {};
  };
  const Status st = timed();
  if (start != nullptr) (void)cudaEventDestroy(start);
  if (stop != nullptr) (void)cudaEventDestroy(stop);
  *ms = t;
  g.lengths[0] = 0;
  return st;
}

}  // namespace llmq
