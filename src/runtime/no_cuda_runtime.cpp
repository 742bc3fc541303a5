// Built when llmq is compiled without CUDA: the GPU runtime's entry points say so.
#include "llmq/gpu_runtime.hpp"

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
Status GpuModel::from_float(const ModelWeights&, DType, int, std::unique_ptr<GpuModel>*) { return no_cuda(); }
Status GpuModel::from_quantized(const QuantizedModel&, int, std::unique_ptr<GpuModel>*) { return no_cuda(); }
Status GpuModel::from_checkpoint(const std::string&, const std::string&, int, std::unique_ptr<GpuModel>*,
                                 const GpuProgressFn&) {
  return no_cuda();
}
Status GpuModel::synthetic(const ModelConfig&, const std::string&, uint64_t, int, std::unique_ptr<GpuModel>*,
                           const GpuProgressFn&) {
  return no_cuda();
}
const ModelConfig& GpuModel::config() const { return impl_->config; }
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
Status GpuRuntime::set_kv_scales(const std::vector<float>&, const std::vector<float>&) { return no_cuda(); }
void GpuRuntime::reset() {}
int64_t GpuRuntime::length(int64_t) const { return 0; }
int64_t GpuRuntime::device_bytes() const { return 0; }
int64_t GpuRuntime::kv_cache_bytes() const { return 0; }
const GpuRuntimeOptions& GpuRuntime::options() const { return impl_->options; }
std::vector<std::string> GpuRuntime::describe_linears(int64_t) const { return {}; }

Status gpu_memory_in_use(int, int64_t*, int64_t*) { return no_cuda(); }
Status measure_copy_bandwidth(int, int64_t, double*) { return no_cuda(); }

}  // namespace llmq
