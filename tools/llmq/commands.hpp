// The CLI's subcommands, one file each; each registers its options and a function to run.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "llmq/calibration.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/status.hpp"
#include "llmq/tensor_parallel.hpp"

namespace llmq::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

void add_demo_command(CLI::App& app, std::vector<Command>* commands);
void add_run_command(CLI::App& app, std::vector<Command>* commands);
void add_calibrate_command(CLI::App& app, std::vector<Command>* commands);
void add_quantize_command(CLI::App& app, std::vector<Command>* commands);
void add_eval_command(CLI::App& app, std::vector<Command>* commands);
void add_recipe_command(CLI::App& app, std::vector<Command>* commands);  // `llmq recipe`
void add_schemes_command(CLI::App& app, std::vector<Command>* commands);
void add_logits_command(CLI::App& app, std::vector<Command>* commands);
extern const char* const kBuildCommit;  // the commit the binary was built from (build_info.cpp)
std::string today();  // "YYYY-MM-DD" (UTC), for the date of benchmark results

void add_bench_command(CLI::App& app, std::vector<Command>* commands);
void add_bench_serve_command(CLI::App* bench, std::vector<Command>* commands);  // `bench serve`
void add_serve_command(CLI::App& app, std::vector<Command>* commands);          // `llmq serve`
void add_chat_command(CLI::App& app, std::vector<Command>* commands);           // `llmq chat`
void add_attention_command(CLI::App& app, std::vector<Command>* commands);
void add_make_checkpoint_command(CLI::App& app, std::vector<Command>* commands);
void add_template_command(CLI::App& app, std::vector<Command>* commands);  // `llmq template`

// How GPU work is launched and how tensor-parallel ranks talk, shared by `run` and `bench e2e`.
struct GpuLaunchFlags {
  std::string nccl_library;      // --nccl-library
  std::string allreduce = "auto";  // --allreduce auto|nccl
  std::string pdl = "on";          // --pdl on|off
  int64_t gemm_tile_search = GpuRuntimeOptions{}.gemm_tile_search_max_m;  // --gemm-tile-search M
};
void add_gpu_launch_flags(CLI::App* app, GpuLaunchFlags* flags);
// Applies --pdl (process-wide) and returns the group options --tp > 1 uses.
TensorParallelGroupOptions apply_gpu_launch_flags(const GpuLaunchFlags& flags);

// --fp8-fast-accum (CudaGemmOptions::fp8_fast_accumulation), the one flag of every command that runs
// a model on the GPU, and its refusal by name off the GPU (device: the command's --device).
void add_fp8_fast_accum_flag(CLI::App* app, bool* flag);
Status check_fp8_fast_accum(bool flag, const std::string& device);

// --gpu ORDINAL of a command whose --device is cpu by default (calibrate, recipe): *given says
// whether it was given, and check_gpu_option refuses it by name off the GPU.
void add_gpu_ordinal_option(CLI::App* app, int* gpu, bool* given);
Status check_gpu_option(bool given, const std::string& device);

// Where --model's weights come from: "synthetic:NAME" (seeded, generated on the device), a Hugging
// Face directory (streamed from its memory map), else a model loaded on the host into *host.
Status gpu_model_source(const std::string& model, uint64_t seed, GpuModelSource* out, ModelWeights* host);

// Print "llmq: <status>" to stderr; exit code 2 for bad arguments, 1 otherwise.
int fail(const Status& st);

// Progress of a counted step on stderr, shown only once the step has run for 2 s: on a terminal
// a bar redrawn in place with the time left; in a log a line at most every 10 s. finish() prints
// how long the step took when anything was shown.
class Progress {
 public:
  explicit Progress(std::string what);
  ~Progress();  // a bar left unfinished (an error) gets its line ended, so the message starts clean
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void update(int64_t done, int64_t total);
  void finish();

 private:
  std::string what_;
  bool tty_;
  double start_;
  double last_print_ = 0;
  int last_percent_ = -1;
  bool shown_ = false;
};

// A step that cannot count its progress (loading a model): "llmq: <what> ..." on stderr once it has
// run for 2 s, then "done in N s" when done() is called. Nothing for a quick step, and nothing
// more for a failed one (its error follows).
class SlowStep {
 public:
  explicit SlowStep(std::string what);
  ~SlowStep();
  void done();
  SlowStep(const SlowStep&) = delete;
  SlowStep& operator=(const SlowStep&) = delete;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// "a,b,,c" -> {"a", "b", "c"}: the comma lists of --scheme, --schemes, --attention.
std::vector<std::string> split_commas(const std::string& s);

// Calibration statistics from `count` sequences the model samples itself (seeds 1000.., other
// samples than an evaluation's, as the FP8 paper advises), after the token they were sampled from
// (BOS, else EOS), in windows of `context`;
// with a progress line.
Status calibrate_on_samples(const ModelWeights& model, int64_t count, int64_t length, int64_t context,
                            CalibrationStats* stats);

// The median batch-1 decode step of a model on GPU `device`, at 128 positions of context (64 steps
// after 16 untimed, CUDA graphs on), in milliseconds: what `llmq demo` and `llmq recipe --device
// cuda` put beside each scheme.
Status gpu_decode_ms(const GpuModelSource& source, const GpuPrecision& precision, int device, double* ms);

// Peak resident set of this process so far, in bytes (-1 when the system does not say).
int64_t peak_rss_bytes();

// What a command held, for its closing line: "peak host memory X GiB" and, for each of the `gpus`
// devices from `first_gpu` (none: 0), ", GPU n used of total GiB" as in use now.
std::string memory_text(int first_gpu, int gpus);

// Threads a CPU command uses: `requested`, or every core when 0.
int cpu_threads(int requested);

}  // namespace llmq::cli
