// The CLI's subcommands, one file each; each registers its options and a function to run.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "llmq/status.hpp"
#include "llmq/tensor_parallel.hpp"

namespace llmq::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

void add_run_command(CLI::App& app, std::vector<Command>* commands);
void add_calibrate_command(CLI::App& app, std::vector<Command>* commands);
void add_quantize_command(CLI::App& app, std::vector<Command>* commands);
void add_eval_command(CLI::App& app, std::vector<Command>* commands);
void add_schemes_command(CLI::App& app, std::vector<Command>* commands);
void add_logits_command(CLI::App& app, std::vector<Command>* commands);
void add_bench_command(CLI::App& app, std::vector<Command>* commands);
void add_attention_command(CLI::App& app, std::vector<Command>* commands);
void add_make_checkpoint_command(CLI::App& app, std::vector<Command>* commands);

// How GPU work is launched and how tensor-parallel ranks talk, shared by `run` and `bench e2e`.
struct GpuLaunchFlags {
  std::string nccl_library;      // --nccl-library
  std::string allreduce = "auto";  // --allreduce auto|nccl
  std::string pdl = "on";          // --pdl on|off
};
void add_gpu_launch_flags(CLI::App* app, GpuLaunchFlags* flags);
// Applies --pdl (process-wide) and returns the group options --tp > 1 uses.
TensorParallelGroupOptions apply_gpu_launch_flags(const GpuLaunchFlags& flags);

// Where --model's weights come from: "synthetic:NAME" (seeded, generated on the device), a Hugging
// Face directory (streamed from its memory map), else a model loaded on the host into *host.
Status gpu_model_source(const std::string& model, uint64_t seed, GpuModelSource* out, ModelWeights* host);

// Print "llmq: <status>" to stderr; exit code 2 for bad arguments, 1 otherwise.
int fail(const Status& st);

// A progress bar on stderr, drawn only when stderr is a terminal.
class Progress {
 public:
  explicit Progress(std::string what);
  void update(int64_t done, int64_t total);
  void finish();

 private:
  std::string what_;
  bool tty_;
  double start_;
  int last_percent_ = -1;
};

}  // namespace llmq::cli
