// llmq logits: the logits of a model (float, a scheme, or a quantized checkpoint) for given token
// ids, written as raw float32 [n, vocab]: what scripts/hf_load_check.py compares with transformers.
#include <cstdio>
#include <sstream>

#include "commands.hpp"
#include "llmq/atomic_io.hpp"
#include "llmq/export.hpp"
#include "llmq/model_io.hpp"
#include "llmq/quantized_model.hpp"

namespace llmq::cli {
namespace {

struct LogitsArgs {
  std::string model;
  std::string quantized;
  std::string scheme;
  std::string stats;
  std::string ids;
  std::string out;
};

int run(const LogitsArgs& a) {
  std::vector<int32_t> tokens;
  std::istringstream in(a.ids);
  long long v;
  while (in >> v) tokens.push_back(static_cast<int32_t>(v));
  if (tokens.empty()) return fail(invalid_argument("--ids: no token ids"));
  ModelWeights model;
  QuantizedModel qm;
  std::unique_ptr<LinearBackend> backend;
  const ModelWeights* weights = &model;
  if (!a.quantized.empty()) {
    if (Status st = load_quantized_checkpoint(a.quantized, &qm); !st.ok()) return fail(st);
    backend = std::make_unique<QuantizedLinearBackend>(qm);
    weights = &qm.weights;
  } else {
    if (Status st = load_model(a.model, &model); !st.ok()) return fail(st);
    if (!a.scheme.empty()) {
      Scheme scheme;
      if (Status st = find_scheme(a.scheme, &scheme); !st.ok()) return fail(st);
      CalibrationStats stats;
      if (!a.stats.empty())
        if (Status st = CalibrationStats::load(a.stats, &stats); !st.ok()) return fail(st);
      if (Status st = quantize_model(model, scheme, a.stats.empty() ? nullptr : &stats, {}, &qm); !st.ok())
        return fail(st);
      backend = std::make_unique<QuantizedLinearBackend>(qm);
      weights = &qm.weights;
    }
  }
  for (int32_t t : tokens)
    if (t < 0 || t >= weights->config.vocab_size) return fail(invalid_argument("--ids: token " + std::to_string(t) + " out of range"));
  Transformer transformer(*weights, backend.get());
  const int64_t n = static_cast<int64_t>(tokens.size()), vocab = weights->config.vocab_size;
  std::vector<float> logits(static_cast<size_t>(n * vocab));
  if (Status st = transformer.forward(tokens.data(), n, 0, logits.data()); !st.ok()) return fail(st);
  // Durable and all-or-nothing, as every llmq output (atomic_io.hpp).
  const std::string bytes(reinterpret_cast<const char*>(logits.data()), logits.size() * sizeof(float));
  if (Status st = write_file_atomic(a.out, bytes); !st.ok()) return fail({st.code(), "--out: " + st.message()});
  std::printf("wrote %lld x %lld float32 logits to %s\n", static_cast<long long>(n), static_cast<long long>(vocab), a.out.c_str());
  return 0;
}

}  // namespace

void add_logits_command(CLI::App& app, std::vector<Command>* commands) {
  auto args = std::make_shared<LogitsArgs>();
  CLI::App* cmd = app.add_subcommand("logits", "write a model's logits for token ids (float32 [n, vocab])");
  cmd->add_option("--model", args->model, "llama2.c .bin, Hugging Face directory, or 'default'");
  cmd->add_option("--quantized", args->quantized, "a quantized checkpoint directory instead of --model");
  cmd->add_option("--scheme", args->scheme, "quantize --model under this scheme first");
  cmd->add_option("--stats", args->stats, "calibration statistics for static schemes");
  cmd->add_option("--ids", args->ids, "space-separated token ids (include BOS yourself)")->required();
  cmd->add_option("-o,--out", args->out, "output file")->required();
  commands->push_back({cmd, [args] { return run(*args); }});
}

}  // namespace llmq::cli
