// Shared CLI helpers: error printing, the progress bar and the GPU launch flags.
#include <sys/resource.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <system_error>
#include <thread>

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
  app->add_option("--gemm-tile-search", flags->gemm_tile_search,
                  "cuda: FP8 GEMMs (per-token x per-channel scales) of up to M rows time up to nine tiles of cuBLASLt's "
                  "first algorithm per M class and keep the fastest (0: the heuristic's tile; E4M3 W8A8 leaves the "
                  "decode GEMM past 8 rows either way)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
}

void add_fp8_fast_accum_flag(CLI::App* app, bool* flag) {
  app->add_flag("--fp8-fast-accum", *flag,
                "cuda: FP8 GEMMs accumulate in the tensor core's own accumulator (cuBLASLt FAST_ACCUM, as vLLM's and "
                "TensorRT-LLM's do; per-channel FP8 MoE experts too): faster, further from the CPU reference");
}

Status check_fp8_fast_accum(bool flag, const std::string& device) {
  if (flag && device != "cuda") return invalid_argument("--fp8-fast-accum: a GPU GEMM option (--device cuda)");
  return {};
}

void add_gpu_ordinal_option(CLI::App* app, int* gpu, bool* given) {
  app->add_option("--gpu", *gpu, "with --device cuda: CUDA device ordinal")
      ->check(CLI::Range(0, 1023))
      ->each([given](const std::string&) { *given = true; });
}

Status check_gpu_option(bool given, const std::string& device) {
  if (given && device != "cuda") return invalid_argument("--gpu: only with --device cuda");
  return {};
}

TensorParallelGroupOptions apply_gpu_launch_flags(const GpuLaunchFlags& flags) {
  set_programmatic_dependent_launch(flags.pdl == "on");
  TensorParallelGroupOptions o;
  o.nccl_library = flags.nccl_library;
  o.one_shot_all_reduce = flags.allreduce == "auto";
  return o;
}

Status gpu_decode_ms(const GpuModelSource& source, const GpuPrecision& precision, int device, double* ms) {
  std::unique_ptr<GpuModel> model;
  LLMQ_RETURN_IF_ERROR(GpuModel::load(source, precision, device, &model));
  GpuRuntimeOptions o;
  o.max_context = 256;
  o.max_step_tokens = 256;
  std::unique_ptr<GpuRuntime> rt;
  LLMQ_RETURN_IF_ERROR(GpuRuntime::create(*model, o, &rt));
  LLMQ_RETURN_IF_ERROR(rt->fill_context_for_benchmark(1, 128, 1));
  std::vector<double> steps;
  LLMQ_RETURN_IF_ERROR(rt->time_decode(1, 16, 64, &steps));
  if (steps.empty()) return Status(StatusCode::kInternal, "time_decode returned no steps");
  std::sort(steps.begin(), steps.end());
  *ms = steps[steps.size() / 2];
  return {};
}

int64_t peak_rss_bytes() {
  struct rusage usage {};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return -1;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

std::string memory_text(int first_gpu, int gpus) {
  std::string out = fmt::format("peak host memory {:.2f} GiB", static_cast<double>(peak_rss_bytes()) / (1 << 30));
  for (int d = first_gpu; d < first_gpu + gpus; ++d) {
    int64_t used = 0, total = 0;
    if (gpu_memory_in_use(d, &used, &total).ok())
      out += fmt::format(", GPU {} {:.2f} of {:.2f} GiB", d, static_cast<double>(used) / (1 << 30),
                         static_cast<double>(total) / (1 << 30));
  }
  return out;
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

constexpr double kQuietSeconds = 2.0;     // a step shorter than this shows nothing
constexpr double kLogLineSeconds = 10.0;  // not a terminal: at most one line this often

std::string duration_text(double seconds) {
  if (seconds < 90) return fmt::format("{:.0f} s", std::max(1.0, seconds));
  return fmt::format("{:.0f} min {:02.0f} s", std::floor(seconds / 60), std::fmod(seconds, 60));
}

}  // namespace

Progress::Progress(std::string what) : what_(std::move(what)), tty_(::isatty(2) != 0), start_(now_seconds()) {}

void Progress::update(int64_t done, int64_t total) {
  if (total <= 0) return;
  const double now = now_seconds();
  const double elapsed = now - start_;
  if (elapsed < kQuietSeconds) return;
  const int percent = static_cast<int>(100 * std::min(done, total) / total);
  if (percent == last_percent_) return;
  if (!tty_ && now - last_print_ < kLogLineSeconds) return;
  last_percent_ = percent;
  last_print_ = now;
  shown_ = true;
  const double left = done > 0 ? elapsed * static_cast<double>(total - done) / static_cast<double>(done) : 0.0;
  const std::string eta = done > 0 && done < total ? ", about " + duration_text(left) + " left" : "";
  if (!tty_) {
    std::fprintf(stderr, "llmq: %s: %d%% (%lld/%lld)%s\n", what_.c_str(), percent, static_cast<long long>(done),
                 static_cast<long long>(total), eta.c_str());
    return;
  }
  constexpr int kWidth = 30;
  const int filled = kWidth * percent / 100;
  std::fprintf(stderr, "\r\033[Kllmq: %s [%.*s%*s] %3d%%%s", what_.c_str(), filled, "==============================",
               kWidth - filled, "", percent, eta.c_str());
  std::fflush(stderr);
}

Progress::~Progress() {
  if (shown_ && tty_) std::fprintf(stderr, "\n");
}

void Progress::finish() {
  if (!shown_) return;
  const std::string took = duration_text(now_seconds() - start_);
  if (tty_) std::fprintf(stderr, "\r\033[Kllmq: %s: done in %s\n", what_.c_str(), took.c_str());
  else std::fprintf(stderr, "llmq: %s: done in %s\n", what_.c_str(), took.c_str());
  shown_ = false;
}

struct SlowStep::State {
  std::string what;
  double start = now_seconds();
  std::mutex mutex;
  std::condition_variable ended_cv;
  bool ended = false;
  bool shown = false;
};

SlowStep::SlowStep(std::string what) : state_(std::make_shared<State>()) {
  state_->what = std::move(what);
  try {
    std::thread([s = state_] {
      std::unique_lock<std::mutex> lock(s->mutex);
      if (s->ended_cv.wait_for(lock, std::chrono::duration<double>(kQuietSeconds), [&s] { return s->ended; })) return;
      std::fprintf(stderr, "llmq: %s ...\n", s->what.c_str());
      s->shown = true;
    }).detach();
  } catch (const std::system_error&) {
    // No thread for a progress line: the step runs without one.
  }
}

void SlowStep::done() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->ended) return;
  state_->ended = true;
  state_->ended_cv.notify_all();
  if (state_->shown)
    std::fprintf(stderr, "llmq: %s: done in %s\n", state_->what.c_str(),
                 duration_text(now_seconds() - state_->start).c_str());
}

SlowStep::~SlowStep() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->ended = true;
  state_->ended_cv.notify_all();
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

Status calibrate_on_samples(const ModelWeights& model, int64_t count, int64_t length, int64_t context,
                            CalibrationStats* stats) {
  std::vector<std::vector<int32_t>> samples;
  LLMQ_RETURN_IF_ERROR(sample_token_sequences(model, count, length, 1000, &samples));
  Progress progress("calibrating");
  for (size_t i = 0; i < samples.size(); ++i) {
    std::vector<int32_t> tokens = {model.config.text_start_token()};  // what the sample continued
    tokens.insert(tokens.end(), samples[i].begin(), samples[i].end());
    LLMQ_RETURN_IF_ERROR(calibrate(model, tokens, context, stats));
    progress.update(static_cast<int64_t>(i + 1), static_cast<int64_t>(samples.size()));
  }
  progress.finish();
  return {};
}

int cpu_threads(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

}  // namespace llmq::cli
