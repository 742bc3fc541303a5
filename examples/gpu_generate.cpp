// An example built against an installed llmq with CUDA: load a model onto the GPU in BF16 and
// generate greedy tokens with the GPU runtime, through the public API only (no CUDA headers).
//
// Usage: gpu_generate MODEL [STEPS]
//   MODEL  a llama2.c .bin file, a Hugging Face directory, or "default"
// Prints the generated token ids on one line. Exit status 0 when done, 1 on an error (no GPU
// included: the message says so), 2 on a wrong argument.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "llmq/runtime.hpp"

namespace {

int fail(const llmq::Status& st) {
  std::fprintf(stderr, "gpu_generate: %s\n", st.message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: gpu_generate MODEL [STEPS]\n");
    return 2;
  }
  const long steps = argc == 3 ? std::strtol(argv[2], nullptr, 10) : 16;
  if (steps < 1 || steps > 4096) {
    std::fprintf(stderr, "gpu_generate: STEPS must be in 1 .. 4096\n");
    return 2;
  }
  llmq::ModelWeights weights;
  if (llmq::Status st = llmq::load_model(argv[1], &weights); !st.ok()) return fail(st);
  std::unique_ptr<llmq::GpuModel> model;
  if (llmq::Status st = llmq::GpuModel::from_float(weights, llmq::DType::kBF16, 0, &model); !st.ok()) return fail(st);
  llmq::GpuRuntimeOptions options;
  options.max_context = steps + 1;
  std::unique_ptr<llmq::GpuRuntime> runtime;
  if (llmq::Status st = llmq::GpuRuntime::create(*model, options, &runtime); !st.ok()) return fail(st);
  std::vector<std::vector<int32_t>> out;
  llmq::SamplingOptions greedy;  // temperature 0
  const int32_t bos = 1;
  if (llmq::Status st = runtime->generate({bos}, steps, greedy, &out); !st.ok()) return fail(st);
  for (size_t i = 0; i < out[0].size(); ++i) std::printf(i == 0 ? "%d" : " %d", out[0][i]);
  std::printf("\n");
  return 0;
}
