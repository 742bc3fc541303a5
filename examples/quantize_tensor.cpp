// An example built against an installed llmq: load a checkpoint, quantize one of its weight
// matrices to FP8 E4M3 with one scale per output channel through the public API, dequantize it and
// print how far the result is from the original.
//
// Usage: quantize_tensor MODEL [INDEX]
//   MODEL  a llama2.c .bin file, a Hugging Face directory, or "default" (llmq's seeded model)
//   INDEX  which linear layer, in forward order (default 0, the first layer's q_proj)
// Prints one line: name, shape, relative RMS error, max absolute error, scale count. Exit status 0
// when done, 1 when llmq refused the input (the message says why).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llmq/llmq.hpp"
#include "llmq/model_io.hpp"
#include "llmq/version.hpp"

namespace {

int fail(const llmq::Status& st) {
  std::fprintf(stderr, "quantize_tensor: %s\n", st.message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: quantize_tensor MODEL [INDEX]\n");
    return 2;
  }
  // Headers and library from different builds would disagree here.
  if (std::strcmp(llmq::library_version(), LLMQ_VERSION_STRING) != 0) {
    std::fprintf(stderr, "quantize_tensor: headers of llmq %s, library %s\n", LLMQ_VERSION_STRING,
                 llmq::library_version());
    return 1;
  }
  llmq::ModelWeights model;
  std::string description;
  if (llmq::Status st = llmq::load_model(argv[1], &model, &description); !st.ok()) return fail(st);
  const std::vector<const llmq::Linear*> linears = static_cast<const llmq::ModelWeights&>(model).linears();
  const long index = argc == 3 ? std::strtol(argv[2], nullptr, 10) : 0;
  if (index < 0 || index >= static_cast<long>(linears.size())) {
    std::fprintf(stderr, "quantize_tensor: INDEX %ld is outside the model's %zu linear layers\n", index, linears.size());
    return 2;
  }
  const llmq::Linear& linear = *linears[static_cast<size_t>(index)];
  const llmq::Tensor& w = linear.weight;
  const int64_t rows = w.shape()[0], cols = w.shape()[1];

  llmq::QuantSpec spec;
  spec.format = llmq::DType::kE4M3;
  spec.granularity = llmq::Granularity::kPerChannel;
  llmq::QuantizedTensor q;
  if (llmq::Status st = llmq::quantize(w.view(), spec, &q); !st.ok()) return fail(st);
  llmq::Tensor back(llmq::DType::kF32, {rows, cols});
  if (llmq::Status st = llmq::dequantize(q, back.view()); !st.ok()) return fail(st);

  const float* a = w.data_as<float>();
  const float* b = back.data_as<float>();
  double err2 = 0, ref2 = 0, max_abs = 0;
  for (int64_t i = 0; i < rows * cols; ++i) {
    const double d = static_cast<double>(b[i]) - a[i];
    err2 += d * d;
    ref2 += static_cast<double>(a[i]) * a[i];
    max_abs = std::fmax(max_abs, std::fabs(d));
  }
  std::printf("llmq %s, %s: %s [%lld, %lld] e4m3 per-channel: relative rms error %.6g, max abs error %.6g, %lld scales\n",
              llmq::library_version(), description.c_str(), linear.id.hf_name(model.config).c_str(),
              static_cast<long long>(rows), static_cast<long long>(cols), std::sqrt(err2 / ref2), max_abs,
              static_cast<long long>(q.scales.scale_rows() * q.scales.scale_cols()));
  return 0;
}
