// llmq run: generate from a model (llama2.c sampling, token for token).
#include <cstdio>
#include <sstream>

#include "commands.hpp"
#include "llmq/model_io.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/sampler.hpp"
#include "llmq/tokenizer.hpp"

namespace llmq::cli {
namespace {

struct RunArgs {
  std::string model;
  std::string prompt_ids;
  int64_t steps = 256;
  float temperature = 1.0f;
  float topp = 0.9f;
  uint64_t seed = 0;
  bool ids = false;
  std::string scheme;
  std::string stats;
};

int run(const RunArgs& a) {
  ModelWeights model;
  if (Status st = load_model(a.model, &model); !st.ok()) return fail(st);
  std::vector<int32_t> prompt = {model.config.bos_token};
  if (!a.prompt_ids.empty()) {
    std::istringstream in(a.prompt_ids);
    long long v;
    while (in >> v) {
      if (v < 0 || v >= model.config.vocab_size)
        return fail(invalid_argument("--prompt-ids: " + std::to_string(v) + " is outside the vocabulary"));
      prompt.push_back(static_cast<int32_t>(v));
    }
    if (!in.eof()) return fail(invalid_argument("--prompt-ids: expected space-separated token ids"));
  }
  if (a.temperature > 0.0f && a.seed == 0)
    return fail(invalid_argument("--seed: sampling (temperature > 0) needs an explicit non-zero seed"));
  QuantizedModel qm;
  std::unique_ptr<LinearBackend> backend;
  const ModelWeights* weights = &model;
  if (!a.scheme.empty()) {
    Scheme scheme;
    if (Status st = find_scheme(a.scheme, &scheme); !st.ok()) return fail(st);
    CalibrationStats stats;
    if (!a.stats.empty())
      if (Status st = CalibrationStats::load(a.stats, &stats); !st.ok()) return fail(st);
    if (Status st = quantize_model(model, scheme, a.stats.empty() ? nullptr : &stats, {}, &qm); !st.ok()) return fail(st);
    backend = std::make_unique<QuantizedLinearBackend>(qm);
    weights = &qm.weights;
  }
  Transformer transformer(*weights, backend.get());
  GenerateOptions g;
  g.steps = a.steps;
  g.temperature = a.temperature;
  g.topp = a.topp;
  g.seed = a.seed;
  std::vector<int32_t> out;
  if (Status st = generate(&transformer, prompt, g, &out); !st.ok()) return fail(st);
  std::unique_ptr<Tokenizer> tokenizer;
  if (!a.ids && !a.model.empty() && !Tokenizer::find(a.model).empty())
    if (Status st = Tokenizer::load(a.model, &tokenizer); !st.ok()) return fail(st);
  if (tokenizer == nullptr) {
    if (!a.ids) std::fprintf(stderr, "llmq: no tokenizer beside the model; printing token ids\n");
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? " " : "", out[i]);
    std::printf("\n");
    return 0;
  }
  int32_t prev = prompt.back();
  for (int32_t t : out) {
    std::string piece;
    if (Status st = tokenizer->decode_token(prev, t, &piece); !st.ok()) return fail(st);
    std::fputs(piece.c_str(), stdout);
    prev = t;
  }
  std::printf("\n");
  return 0;
}

}  // namespace

void add_run_command(CLI::App& app, std::vector<Command>* commands) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand("run", "generate tokens (reproduces llama2.c's run.c token for token)");
  cmd->add_option("--model", args->model, "llama2.c .bin, Hugging Face directory, or 'default'");
  cmd->add_option("--prompt-ids", args->prompt_ids, "prompt as space-separated token ids (BOS is added)");
  cmd->add_option("-n,--steps", args->steps, "positions to run, BOS included (run.c's -n)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("-t,--temperature", args->temperature, "0 = greedy")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("-p,--topp", args->topp, "nucleus sampling threshold")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("-s,--seed", args->seed, "sampler seed (required when temperature > 0)");
  cmd->add_flag("--ids", args->ids, "print generated token ids instead of text");
  cmd->add_option("--scheme", args->scheme, "run with every linear layer quantized under this scheme");
  cmd->add_option("--stats", args->stats, "calibration statistics for static schemes");
  commands->push_back({cmd, [args] { return run(*args); }});
}

}  // namespace llmq::cli
