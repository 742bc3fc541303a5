// Built when llmq is compiled without CUDA: the GPU runtime's entry points say so.
#include "llmq/gpu_runtime.hpp"
#include "llmq/tensor_parallel.hpp"

namespace llmq {

namespace {
Status no_cuda() { return unsupported("this llmq was built without CUDA: the GPU runtime is not available"); }
}  // namespace

struct GpuModel::Impl {
  ModelConfig config;
  std::string precision;
};
struct GpuRuntime::Impl {
  GpuRuntimeOptions options;
};

GpuModel::GpuModel() : impl_(std::make_unique<Impl>()) {}
GpuModel::~GpuModel() = default;
Status GpuModel::from_float(const ModelWeights&, DType, int, std::unique_ptr<GpuModel>*, TensorParallelRank) { return no_cuda(); }
Status GpuModel::from_quantized(const QuantizedModel&, int, std::unique_ptr<GpuModel>*, TensorParallelRank) { return no_cuda(); }
Status GpuModel::from_checkpoint(const std::string&, const GpuPrecision&, int, std::unique_ptr<GpuModel>*,
                                 const GpuProgressFn&, TensorParallelRank, const CalibrationStats*) {
  return no_cuda();
}
Status GpuModel::synthetic(const ModelConfig&, const GpuPrecision&, uint64_t, int, std::unique_ptr<GpuModel>*,
                           const GpuProgressFn&, TensorParallelRank) {
  return no_cuda();
}
const ModelConfig& GpuModel::config() const { return impl_->config; }
const ModelConfig& GpuModel::local_config() const { return impl_->config; }
TensorParallelRank GpuModel::tensor_parallel() const { return {}; }
const std::string& GpuModel::precision() const { return impl_->precision; }
int GpuModel::device() const { return 0; }
int64_t GpuModel::weight_bytes() const { return 0; }

GpuRuntime::GpuRuntime() : impl_(std::make_unique<Impl>()) {}
GpuRuntime::~GpuRuntime() = default;
Status GpuRuntime::create(const GpuModel&, const GpuRuntimeOptions&, std::unique_ptr<GpuRuntime>*) { return no_cuda(); }
Status GpuRuntime::prefill(const std::vector<std::vector<int32_t>>&, bool, std::vector<float>*) { return no_cuda(); }
Status GpuRuntime::decode(const std::vector<int32_t>&, std::vector<float>*) { return no_cuda(); }
Status GpuRuntime::generate(const std::vector<int32_t>&, int64_t, const SamplingOptions&,
                            std::vector<std::vector<int32_t>>*) {
  return no_cuda();
}
Status GpuRuntime::fill_context_for_benchmark(int64_t, int64_t, uint64_t) { return no_cuda(); }
Status GpuRuntime::time_decode(int64_t, int64_t, int64_t, std::vector<double>*) { return no_cuda(); }
Status GpuRuntime::time_prefill(int64_t, uint64_t, double*) { return no_cuda(); }
Status GpuRuntime::step(const std::vector<PagedChunk>&, std::vector<int32_t>*, std::vector<float>*, std::vector<RowLogprobs>*) {
  return no_cuda();
}
Status GpuRuntime::kv_blocks_that_fit(const GpuModel&, const GpuRuntimeOptions&, double, int64_t*) { return no_cuda(); }
Status GpuRuntime::set_kv_scales(const std::vector<float>&, const std::vector<float>&) { return no_cuda(); }
Status GpuRuntime::begin_calibration() { return no_cuda(); }
Status GpuRuntime::end_calibration(CalibrationStats*) { return no_cuda(); }
void GpuRuntime::reset() {}
int64_t GpuRuntime::length(int64_t) const { return 0; }
int64_t GpuRuntime::device_bytes() const { return 0; }
int64_t GpuRuntime::kv_cache_bytes() const { return 0; }
const GpuRuntimeOptions& GpuRuntime::options() const { return impl_->options; }
std::vector<std::string> GpuRuntime::describe_linears(int64_t) const { return {}; }

struct TensorParallelGroup::Impl {};
const parallel::P2pAllReduce* one_shot_all_reduce(const TensorParallelGroup&) { return nullptr; }
TensorParallelGroup::TensorParallelGroup() : impl_(std::make_unique<Impl>()) {}
TensorParallelGroup::~TensorParallelGroup() = default;
Status TensorParallelGroup::create(const std::vector<int>&, std::unique_ptr<TensorParallelGroup>*, const TensorParallelGroupOptions&) {
  return no_cuda();
}
int TensorParallelGroup::size() const { return 0; }
int TensorParallelGroup::device(int) const { return -1; }
std::string TensorParallelGroup::describe() const { return "no CUDA"; }
bool TensorParallelGroup::one_shot() const { return false; }
Status TensorParallelGroup::all_reduce_bf16(int, void*, int64_t, CudaStream) const { return no_cuda(); }
Status TensorParallelGroup::all_gather_f32(int, const void*, void*, int64_t, CudaStream) const { return no_cuda(); }

TensorParallelRuntime::TensorParallelRuntime() = default;
TensorParallelRuntime::~TensorParallelRuntime() = default;
Status TensorParallelRuntime::load(std::shared_ptr<TensorParallelGroup>, const std::vector<int>&, const ShardLoader&,
                                   std::unique_ptr<TensorParallelRuntime>*) {
  return no_cuda();
}
Status TensorParallelRuntime::load(int, int, const ShardLoader&, std::unique_ptr<TensorParallelRuntime>*, const TensorParallelGroupOptions&) {
  return no_cuda();
}
Status TensorParallelRuntime::start(const GpuRuntimeOptions&) { return no_cuda(); }
int TensorParallelRuntime::size() const { return 0; }
const GpuModel& TensorParallelRuntime::model(int rank) const { return *models_.at(static_cast<size_t>(rank)); }
GpuRuntime& TensorParallelRuntime::runtime(int rank) { return *runtimes_.at(static_cast<size_t>(rank)); }
const ModelConfig& TensorParallelRuntime::config() const { return models_.at(0)->config(); }
Status TensorParallelRuntime::prefill(const std::vector<std::vector<int32_t>>&, bool, std::vector<float>*) { return no_cuda(); }
Status TensorParallelRuntime::decode(const std::vector<int32_t>&, std::vector<float>*) { return no_cuda(); }
Status TensorParallelRuntime::step(const std::vector<PagedChunk>&, std::vector<int32_t>*, std::vector<float>*,
                                   std::vector<RowLogprobs>*) {
  return no_cuda();
}
Status TensorParallelRuntime::generate(const std::vector<int32_t>&, int64_t, const SamplingOptions&,
                                       std::vector<std::vector<int32_t>>*) {
  return no_cuda();
}
Status TensorParallelRuntime::begin_calibration() { return no_cuda(); }
Status TensorParallelRuntime::end_calibration(CalibrationStats*) { return no_cuda(); }
Status TensorParallelRuntime::fill_context_for_benchmark(int64_t, int64_t, uint64_t) { return no_cuda(); }
Status TensorParallelRuntime::time_decode(int64_t, int64_t, int64_t, std::vector<double>*) { return no_cuda(); }
Status TensorParallelRuntime::time_prefill(int64_t, uint64_t, double*) { return no_cuda(); }
void TensorParallelRuntime::reset() {}
Status TensorParallelRuntime::on_every_rank(const std::function<Status(int)>&) { return no_cuda(); }
Status TensorParallelRuntime::each_runtime(const std::function<Status(int, GpuRuntime&)>&) { return no_cuda(); }

Status gpu_memory_in_use(int, int64_t*, int64_t*) { return no_cuda(); }
Status measure_copy_bandwidth(int, int64_t, double*) { return no_cuda(); }

}  // namespace llmq
