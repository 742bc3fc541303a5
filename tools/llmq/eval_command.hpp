// `llmq eval`'s options and its report, shared by its two routes: the model on the host
// (cmd_eval.cpp: the CPU reference or the GPU runtime beside it, candidates quantized on the host)
// and the model on the GPUs alone (cmd_eval_gpu.cpp: a checkpoint directory or synthetic:NAME with
// a GPU reference, every model loaded, quantized and run on the devices, over --tp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <memory>

#include "commands.hpp"
#include "eval_data.hpp"
#include "llmq/eval_metrics.hpp"
#include "llmq/evaluate.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/tensor_parallel.hpp"
#include "recipe_flags.hpp"

namespace llmq::cli {

struct EvalArgs {
  std::string model = "default";  // an explicit --model "" is refused by load_model
  std::vector<std::string> quantized;
  std::string schemes;
  RecipeFlags flags;  // --recipe (one more candidate), --smooth-alpha, --backoff
  EvalDataArgs data;  // --data, or --samples, --length, --seed
  std::string stats;
  int64_t context = 256;
  int64_t max_tokens = 0;
  bool json = false;
  std::string device = "cpu";
  std::string reference = "cpu";  // cpu: the float32 CPU reference; f32 / bf16: the GPU runtime
  int gpu = 0;
  int tp = 1;  // GPUs per model (the route with the model on the GPUs alone)
  GpuLaunchFlags launch;
  std::string attention;  // comma-separated attention variants; each candidate runs once per variant
  std::string kv_cache;   // comma-separated KV caches (float, e4m3, e4m3-static); each candidate once per cache
  bool fp8_fast_accum = false;  // --device cuda: CudaGemmOptions::fp8_fast_accumulation for the candidates
  int threads = 0;        // 0: every core
};

// The schemes --scheme names ("all": every one; none and no other candidate: the default), with
// --smooth-alpha and --backoff applied.
Status eval_schemes(const EvalArgs& a, bool have_other_candidates, std::vector<Scheme>* out);

// What one evaluation measured, for the report.
struct EvalReport {
  std::string model, data, reference;
  int64_t context = 0;
  bool moe = false;
  bool fp8_fast_accum = false;
  std::vector<std::string> labels;               // per candidate
  std::vector<std::string> kv_caches;            // per candidate
  std::vector<const WeightError*> weight_errors;  // per candidate; null: not measured
  std::vector<EvalAccumulator::Summary> sums;    // per candidate
  double seconds = 0;                            // the evaluation pass
  double total_seconds = 0;                      // the whole command
  std::string memory;                            // peak host memory, and the GPUs' in use
};
// Prints the table (or --json) and returns the command's exit code.
int print_eval_report(const EvalArgs& a, const EvalReport& r);

// The models an evaluation runs on GPUs, for both routes: each loaded over --tp GPUs from --gpu
// (load_on_gpus) with a runtime of its own sized by `options`, and read as a window-logits function
// (a window is one prefill from an empty cache).
struct GpuWindowModels {
  std::vector<std::unique_ptr<TensorParallelRuntime>> runtimes;  // in the order added
  // `what` names the model in the progress line and in an error.
  Status add(const EvalArgs& a, const GpuModelSource& source, const GpuPrecision& precision, const CalibrationStats* stats,
             const GpuRuntimeOptions& options, const std::string& what, WindowLogitsFn* out);
};

// The route with the model on the GPUs alone (see above); the caller chose it (eval_on_gpus_only).
bool eval_on_gpus_only(const EvalArgs& a);
int run_eval_on_gpus(const EvalArgs& a);

}  // namespace llmq::cli
