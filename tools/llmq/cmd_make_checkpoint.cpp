// llmq make-checkpoint: a synthetic Hugging Face checkpoint of a real model's shapes (or fewer
// or more layers), generated while it is written; for scale and interruption tests.
#include <cstdio>
#include <vector>

#include "commands.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/synthetic_checkpoint.hpp"

namespace llmq::cli {
namespace {

struct MakeCheckpointArgs {
  std::string shape = "tiny";
  int64_t layers = 0;
  std::string out;
  std::string dtype = "bf16";
  int64_t shard_mb = 4096;
  uint64_t seed = 1;
  bool force = false;
};

int run(const MakeCheckpointArgs& a) {
  SyntheticCheckpointOptions o;
  if (Status st = synthetic_model_config(a.shape, &o.config); !st.ok()) return fail(st);
  if (a.layers > 0) {
    // The preset's per-layer window pattern (gpt-oss alternates), repeated over the new count.
    const std::vector<bool> pattern = o.config.window_layers;
    o.config.n_layers = a.layers;
    if (!pattern.empty()) {
      o.config.window_layers.resize(static_cast<size_t>(a.layers));
      for (size_t i = 0; i < o.config.window_layers.size(); ++i) o.config.window_layers[i] = pattern[i % pattern.size()];
    }
  }
  if (a.dtype == "bf16") o.dtype = DType::kBF16;
  else if (a.dtype == "f16") o.dtype = DType::kF16;
  else o.dtype = DType::kF32;
  o.max_shard_bytes = a.shard_mb << 20;
  o.seed = a.seed;
  o.overwrite = a.force;
  int64_t bytes = 0;
  if (Status st = write_synthetic_checkpoint(a.out, o, &bytes); !st.ok()) return fail(st);
  std::printf("wrote %s: %s shapes, %lld layers, %.3f GB of %s weights\n", a.out.c_str(), a.shape.c_str(),
              static_cast<long long>(o.config.n_layers), static_cast<double>(bytes) / 1e9, a.dtype.c_str());
  return 0;
}

}  // namespace

void add_make_checkpoint_command(CLI::App& app, std::vector<Command>* commands) {
  auto args = std::make_shared<MakeCheckpointArgs>();
  CLI::App* cmd = app.add_subcommand("make-checkpoint", "write a synthetic Hugging Face checkpoint (seeded, with outliers)");
  cmd->add_option("--shape", args->shape, "model shapes: llama3-8b, llama3-70b, mistral-7b, qwen2-7b, mixtral-8x7b, tiny, ...");
  cmd->add_option("--layers", args->layers, "number of layers (default: the model's own)")->check(CLI::Range(1, 100000));
  cmd->add_option("-o,--out", args->out,
                  "output directory: staged in <out>.llmq-partial and swapped into place; an existing path is\n"
                  "refused unless it is an earlier llmq output and --force is given")
      ->required();
  cmd->add_option("--dtype", args->dtype, "bf16, f16 or f32")->check(CLI::IsMember({"bf16", "f16", "f32"}));
  cmd->add_option("--shard-mb", args->shard_mb, "largest shard in MiB")->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--seed", args->seed, "seed of the weights");
  cmd->add_flag("--force", args->force, "replace a previous llmq output at --out (never anything else)");
  commands->push_back({cmd, [args] { return run(*args); }});
}

}  // namespace llmq::cli
