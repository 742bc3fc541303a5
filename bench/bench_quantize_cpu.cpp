// CPU throughput of the reference quantizer: a baseline for the CUDA kernels' speedup, not a
// target (the reference is written to be obviously right, not fast).
#include <benchmark/benchmark.h>

#include "llmq/quantize_tensor.hpp"
#include "llmq/synthetic.hpp"

namespace {

void quantize_per_token_e4m3(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const auto x = llmq::synthetic_activations(rows, cols, 1);
  llmq::QuantizedTensor q;
  for (auto _ : state) {
    if (!llmq::quantize(llmq::matrix_view(x.data(), rows, cols), llmq::QuantSpec::per_token(llmq::DType::kE4M3), &q).ok())
      state.SkipWithError("quantize failed");
    benchmark::DoNotOptimize(q.data.data());
  }
  state.SetBytesProcessed(state.iterations() * rows * cols * 5);  // 4 bytes in, 1 out
}
BENCHMARK(quantize_per_token_e4m3)->Args({16, 4096})->Args({256, 4096});

}  // namespace
