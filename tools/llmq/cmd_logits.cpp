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
  std::string model = "default";  // an explicit --model "" is refused by load_model
  std::string quantized;
  std::string scheme;
  std::string stats;
  std::string ids;
  std::string out;
  bool force = false;
};

// Raw float32 has nothing that says llmq wrote it: an existing file is replaced only with --force,
// and only a regular file that is not an input (output_dir.hpp decides).
OutputRules logits_output_rules(const LogitsArgs& a) {
  OutputRules rules;
  rules.kind = OutputKind::kRawFile;
  rules.inputs = {a.model, a.quantized, a.stats};
  rules.overwrite = a.force;
  return rules;
}

int run(const LogitsArgs& a) {
  if (Status st = check_output_path(a.out, logits_output_rules(a)); !st.ok()) return fail(st);  // before any work
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
  std::vector<int32_t> tokens;
  if (Status st = parse_token_ids("--ids", a.ids, weights->config.vocab_size, &tokens); !st.ok()) return fail(st);
  if (tokens.empty()) return fail(invalid_argument("--ids: no token ids"));
  Transformer transformer(*weights, backend.get());
  const int64_t n = static_cast<int64_t>(tokens.size()), vocab = weights->config.vocab_size;
  std::vector<float> logits(static_cast<size_t>(n * vocab));
  if (Status st = transformer.forward(tokens.data(), n, 0, logits.data()); !st.ok()) return fail(st);
  // Durable and all-or-nothing, as every llmq output (atomic_io.hpp).
  const std::string bytes(reinterpret_cast<const char*>(logits.data()), logits.size() * sizeof(float));
  if (Status st = write_output_file(a.out, bytes, logits_output_rules(a)); !st.ok()) return fail(st);
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
  cmd->add_option("-o,--out", args->out,
                  "output file (raw float32). Never an input or a file inside one; an existing file is replaced\n"
                  "only with --force, and only a regular file (raw float32 cannot say that llmq wrote it)")
      ->required();
  cmd->add_flag("--force", args->force, "replace an existing --out file (a regular file that is not an input)");
  commands->push_back({cmd, [args] { return run(*args); }});
}

}  // namespace llmq::cli
