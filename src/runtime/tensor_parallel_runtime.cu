// TensorParallelRuntime (tensor_parallel.hpp): one GpuModel and GpuRuntime per rank, every call run
// on all ranks at once, one thread per rank. The ranks agree on everything the host decides (the
// same arguments reach every rank), so they enqueue the same steps and meet at each all-reduce.
//
// nvcc (13.0) reports `status = call();` as discarding a [[nodiscard]] value: the value it means is
// the reference operator= returns, not the call's Status, which is kept and checked.
#pragma nv_diag_suppress 2810

#include <cuda_runtime.h>

#include <new>
#include <stdexcept>
#include <thread>

#include "cuda/cuda_check.cuh"
#include "cuda/device_facts.cuh"
#include "llmq/tensor_parallel.hpp"

namespace llmq {

TensorParallelRuntime::TensorParallelRuntime() = default;
TensorParallelRuntime::~TensorParallelRuntime() {
  // Each rank's runtime and model free their memory on their own device.
  for (size_t r = 0; r < devices_.size(); ++r) {
    (void)cudaSetDevice(devices_[r]);
    if (r < runtimes_.size()) runtimes_[r].reset();
    if (r < models_.size()) models_[r].reset();
  }
}

Status TensorParallelRuntime::on_every_rank(const std::function<Status(int rank)>& fn) {
  const int n = size();
  // Ranks run on worker threads, where an exception would reach std::terminate: it becomes the
  // rank's Status instead (the CLI's boundary in main() sees only the calling thread).
  auto run_rank = [&](int r) -> Status {
    try {
      LLMQ_RETURN_IF_ERROR(cuda::select_device(devices_[static_cast<size_t>(r)]));
      return fn(r);
    } catch (const std::bad_alloc&) {
      return Status(StatusCode::kInternal, "out of host memory");
    } catch (const std::exception& e) {
      return Status(StatusCode::kInternal, std::string("unexpected exception: ") + e.what());
    }
  };
  if (n == 1) return run_rank(0);
  std::vector<Status> results(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { results[static_cast<size_t>(r)] = run_rank(r); });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    if (!results[static_cast<size_t>(r)].ok())
      return Status(results[static_cast<size_t>(r)].code(), "rank " + std::to_string(r) + ": " + results[static_cast<size_t>(r)].message());
  return {};
}

Status TensorParallelRuntime::load(std::shared_ptr<TensorParallelGroup> group, const std::vector<int>& devices,
                                   const ShardLoader& loader, std::unique_ptr<TensorParallelRuntime>* out) {
  if (devices.empty()) return invalid_argument("tensor parallel: no devices");
  if (devices.size() > 1 && (group == nullptr || group->size() != static_cast<int>(devices.size())))
    return invalid_argument("tensor parallel: " + std::to_string(devices.size()) + " devices need a group of as many");
  std::unique_ptr<TensorParallelRuntime> t(new TensorParallelRuntime());
  t->group_ = std::move(group);
  t->devices_ = devices;
  t->models_.resize(devices.size());
  const int n = static_cast<int>(devices.size());
  LLMQ_RETURN_IF_ERROR(t->on_every_rank([&](int r) {
    return loader({r, n}, devices[static_cast<size_t>(r)], &t->models_[static_cast<size_t>(r)]);
  }));
  *out = std::move(t);
  return {};
}

Status TensorParallelRuntime::load(int tp, int first_device, const ShardLoader& loader,
                                   std::unique_ptr<TensorParallelRuntime>* out, const TensorParallelGroupOptions& group_options) {
  if (tp < 1 || tp > 64) return invalid_argument("--tp: " + std::to_string(tp) + " outside [1, 64]");
  std::vector<int> devices;
  for (int r = 0; r < tp; ++r) devices.push_back(first_device + r);
  std::shared_ptr<TensorParallelGroup> group;
  if (tp > 1) {
    std::unique_ptr<TensorParallelGroup> g;
    LLMQ_RETURN_IF_ERROR(TensorParallelGroup::create(devices, &g, group_options));
    group = std::move(g);
  }
  return load(std::move(group), devices, loader, out);
}

Status TensorParallelRuntime::start(const GpuRuntimeOptions& options) {
  runtimes_.resize(devices_.size());
  return on_every_rank([&](int r) {
    runtimes_[static_cast<size_t>(r)].reset();
    GpuRuntimeOptions o = options;
    o.tp_group = size() > 1 ? group_.get() : nullptr;
    return GpuRuntime::create(*models_[static_cast<size_t>(r)], o, &runtimes_[static_cast<size_t>(r)]);
  });
}

int TensorParallelRuntime::size() const { return static_cast<int>(devices_.size()); }
const GpuModel& TensorParallelRuntime::model(int rank) const { return *models_.at(static_cast<size_t>(rank)); }
GpuRuntime& TensorParallelRuntime::runtime(int rank) { return *runtimes_.at(static_cast<size_t>(rank)); }
const ModelConfig& TensorParallelRuntime::config() const { return models_.front()->config(); }

Status TensorParallelRuntime::each_runtime(const std::function<Status(int rank, GpuRuntime& rt)>& fn) {
  if (runtimes_.empty() || runtimes_.front() == nullptr) return invalid_argument("tensor parallel runtime: start() first");
  return on_every_rank([&](int r) { return fn(r, *runtimes_[static_cast<size_t>(r)]); });
}

// Every rank computes the same logits and tokens; rank 0's come back, the others' are dropped.
Status TensorParallelRuntime::prefill(const std::vector<std::vector<int32_t>>& tokens, bool all_positions,
                                      std::vector<float>* logits) {
  // The other ranks' logits (the same) are computed, not copied back.
  return each_runtime([&](int r, GpuRuntime& rt) { return rt.prefill(tokens, all_positions, r == 0 ? logits : nullptr); });
}

Status TensorParallelRuntime::decode(const std::vector<int32_t>& tokens, std::vector<float>* logits) {
  std::vector<std::vector<float>> other(devices_.size());
  return each_runtime([&](int r, GpuRuntime& rt) { return rt.decode(tokens, r == 0 ? logits : &other[r]); });
}

Status TensorParallelRuntime::step(const std::vector<PagedChunk>& chunks, std::vector<int32_t>* sampled,
                                   std::vector<float>* logits, std::vector<RowLogprobs>* logprobs) {
  std::vector<std::vector<int32_t>> other(devices_.size());
  std::vector<std::vector<float>> other_logits(devices_.size());
  return each_runtime([&](int r, GpuRuntime& rt) {
    return rt.step(chunks, r == 0 ? sampled : &other[r], logits == nullptr ? nullptr : r == 0 ? logits : &other_logits[r],
                   r == 0 ? logprobs : nullptr);
  });
}

Status TensorParallelRuntime::generate(const std::vector<int32_t>& first, int64_t steps, const SamplingOptions& sampling,
                                       std::vector<std::vector<int32_t>>* out) {
  std::vector<std::vector<std::vector<int32_t>>> other(devices_.size());
  return each_runtime([&](int r, GpuRuntime& rt) { return rt.generate(first, steps, sampling, r == 0 ? out : &other[r]); });
}

Status TensorParallelRuntime::begin_calibration() {
  std::vector<char> began(devices_.size(), 0);  // by rank: began in this call
  const Status st = each_runtime([&](int r, GpuRuntime& rt) {
    LLMQ_RETURN_IF_ERROR(rt.begin_calibration());
    began[static_cast<size_t>(r)] = 1;
    return Status();
  });
  if (!st.ok())  // the ranks that began here detach again (one calibrating before stays so)
    (void)on_every_rank([&](int r) {
      return began[static_cast<size_t>(r)] ? runtimes_[static_cast<size_t>(r)]->end_calibration(nullptr) : Status();
    });
  return st;
}

Status TensorParallelRuntime::end_calibration(CalibrationStats* stats) {
  std::vector<CalibrationStats> ranks(devices_.size());
  // Every rank detaches, even when one fails.
  LLMQ_RETURN_IF_ERROR(each_runtime([&](int r, GpuRuntime& rt) {
    return rt.end_calibration(stats == nullptr ? nullptr : &ranks[static_cast<size_t>(r)]);
  }));
  if (stats == nullptr) return {};
  if (size() == 1) return stats->merge(ranks[0]);
  CalibrationStats whole;
  LLMQ_RETURN_IF_ERROR(merge_tensor_parallel_calibration(models_.front()->config(), ranks, &whole));
  return stats->merge(whole);
}

Status TensorParallelRuntime::fill_context_for_benchmark(int64_t batch, int64_t length, uint64_t seed) {
  return each_runtime([&](int, GpuRuntime& rt) { return rt.fill_context_for_benchmark(batch, length, seed); });
}

Status TensorParallelRuntime::time_decode(int64_t batch, int64_t warmup, int64_t steps, std::vector<double>* step_ms) {
  std::vector<std::vector<double>> other(devices_.size());
  return each_runtime([&](int r, GpuRuntime& rt) { return rt.time_decode(batch, warmup, steps, r == 0 ? step_ms : &other[r]); });
}

Status TensorParallelRuntime::time_prefill(int64_t tokens, uint64_t seed, double* ms) {
  std::vector<double> other(devices_.size());
  return each_runtime([&](int r, GpuRuntime& rt) { return rt.time_prefill(tokens, seed, r == 0 ? ms : &other[r]); });
}

void TensorParallelRuntime::reset() {
  for (auto& rt : runtimes_)
    if (rt != nullptr) rt->reset();
}

}  // namespace llmq
