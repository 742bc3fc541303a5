// Shared CLI helpers: error printing, the progress bar and the GPU launch flags.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <cstdio>

#include "commands.hpp"
#include "llmq/device.hpp"
#include "llmq/model_io.hpp"

namespace llmq::cli {

int fail(const Status& st) {
  std::fprintf(stderr, "llmq: %s\n", st.to_string().c_str());
  return st.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

void add_gpu_launch_flags(CLI::App* app, GpuLaunchFlags* flags) {
  app->add_option("--nccl-library", flags->nccl_library,
                  "--tp > 1: the libnccl.so.2 to open first (else the loader's path, then the CUDA toolkit's)");
  app->add_option("--allreduce", flags->allreduce,
                  "--tp > 1: auto (the one-shot peer exchange for decode-sized messages, NCCL above) or nccl (NCCL only)")
      ->check(CLI::IsMember({"auto", "nccl"}));
  app->add_option("--pdl", flags->pdl, "programmatic dependent launch on sm_90+ (on), or off to measure what it buys")
      ->check(CLI::IsMember({"on", "off"}));
}

TensorParallelGroupOptions apply_gpu_launch_flags(const GpuLaunchFlags& flags) {
  set_programmatic_dependent_launch(flags.pdl == "on");
  TensorParallelGroupOptions o;
  o.nccl_library = flags.nccl_library;
  o.one_shot_all_reduce = flags.allreduce == "auto";
  return o;
}

Status gpu_model_source(const std::string& model, uint64_t seed, GpuModelSource* out, ModelWeights* host) {
  const std::string prefix = "synthetic:";
  GpuModelSource s;
  std::error_code ec;  // the non-throwing overload: a link loop is an error of load_model below, not an exception
  if (model.rfind(prefix, 0) == 0) {
    s.kind = GpuModelSource::Kind::kSynthetic;
    LLMQ_RETURN_IF_ERROR(synthetic_model_config(model.substr(prefix.size()), &s.config));
    s.seed = seed;
  } else if (std::filesystem::is_directory(model, ec)) {
    s.kind = GpuModelSource::Kind::kCheckpoint;
    s.dir = model;
  } else {
    LLMQ_RETURN_IF_ERROR(load_model(model, host));
    s.kind = GpuModelSource::Kind::kHost;
    s.weights = host;
  }
  *out = std::move(s);
  return {};
}

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Progress::Progress(std::string what) : what_(std::move(what)), tty_(::isatty(2) != 0), start_(now_seconds()) {}

void Progress::update(int64_t done, int64_t total) {
  if (!tty_ || total <= 0) return;
  const int percent = static_cast<int>(100 * done / total);
  if (percent == last_percent_) return;
  last_percent_ = percent;
  constexpr int kWidth = 30;
  const int filled = kWidth * percent / 100;
  const double elapsed = now_seconds() - start_;
  const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0.0;
  std::fprintf(stderr, "\r%s [%.*s%*s] %3d%% %lld/%lld (%.0f/s)", what_.c_str(), filled,
               "==============================", kWidth - filled, "", percent, static_cast<long long>(done),
               static_cast<long long>(total), rate);
  std::fflush(stderr);
}

void Progress::finish() {
  if (tty_ && last_percent_ >= 0) std::fprintf(stderr, "\n");
}

}  // namespace llmq::cli
