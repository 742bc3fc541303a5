// `llmq attention-accuracy`: the INT-FlashAttention paper's accuracy tables, reproduced with llmq's
// CPU specification of 8-bit attention (quant_attention.hpp) and extended: Q, K, V drawn from N(0,1)
// or U(-0.5, 0.5) (or with 0.1% N(0, 100) outliers, or a K channel offset), every variant against
// the float result, MRE over the whole output plus relative L1, cosine and RMSE.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "commands.hpp"
#include "llmq/model.hpp"
#include "llmq/model_io.hpp"
#include "llmq/output_dir.hpp"
#include "llmq/quant_attention.hpp"
#include "llmq/transformer.hpp"

namespace llmq::cli {
namespace {

struct AttentionArgs {
  std::vector<int64_t> lengths = {1024, 2048, 4096};
  std::vector<std::string> dists = {"normal", "uniform"};
  int64_t heads = 1;
  int64_t head_dim = 128;
  bool causal = false;
  int threads = 0;
  uint64_t seed = 1;
  std::string json_path;
  bool model_given = false;   // --model was passed (even as ""), as opposed to left out
  std::string model;          // real activations: Q, K, V of every layer of this model
  int64_t prompt_tokens = 256;
};

// One input set: the paper's distributions and two harder ones.
void fill(const std::string& dist, std::mt19937_64& rng, std::vector<float>* x, bool is_k, int64_t d) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unif(-0.5f, 0.5f), coin(0.0f, 1.0f);
  for (size_t i = 0; i < x->size(); ++i) {
    float v = dist == "uniform" ? unif(rng) : normal(rng);
    if (dist == "outliers" && coin(rng) < 1e-3f) v *= 10.0f;  // FA3's test: 0.1% of entries N(0, 100), std 10
    if (dist == "k-offset" && is_k && static_cast<int64_t>(i) % d == 3) v += 20.0f;
    (*x)[i] = v;
  }
  if (dist == "sink") {
    // An attention sink: every query leans along channel 0 and key 0 is large there, so key 0
    // takes about 4/5 of each row's weight and the other keys' probabilities sit below 1/254 of
    // the row maximum (where the paper's INT8 P flushes them to 0, though together they carry ~1/5).
    if (is_k) {
      (*x)[0] = 20.0f;  // key 0 (of the first kv head's row: keys are the outer index)
    } else {
      for (size_t i = 0; i < x->size(); i += static_cast<size_t>(d)) (*x)[i] += 5.0f;
    }
  }
}

struct Row {
  const char* name;
  AttentionVariant variant;
  QkScaling qk;
  VScaling vs;
  int p_max;
  bool smooth_k;
  bool p_tile_max = false;
  int64_t block_kv = 64;  // the KV tile and V block (the Hopper kernels: 128)
};

const Row kRows[] = {
      {"fp8 (FA3: per-tensor)", AttentionVariant::kFp8, QkScaling::kPerTensor, VScaling::kPerTensor, 127, false},
      {"fp8 per-token Q/K", AttentionVariant::kFp8, QkScaling::kPerToken, VScaling::kPerTensor, 127, false},
      {"half-int8 (bf16 V, P)", AttentionVariant::kHalfInt8, QkScaling::kPerToken, VScaling::kPerTensor, 127, false},
      {"int8 (paper: V per tensor)", AttentionVariant::kFullInt8, QkScaling::kPerToken, VScaling::kPerTensor, 127, false},
      {"int8 V per channel", AttentionVariant::kFullInt8, QkScaling::kPerToken, VScaling::kPerChannel, 127, false},
      {"int8 V per block", AttentionVariant::kFullInt8, QkScaling::kPerToken, VScaling::kPerBlock, 127, false},
      {"int8 V per block, P<=255", AttentionVariant::kFullInt8, QkScaling::kPerToken, VScaling::kPerBlock, 255, false},
      {"int8 block, P<=255, smooth K", AttentionVariant::kFullInt8, QkScaling::kPerToken, VScaling::kPerBlock, 255, true},
      {"int8 block, P<=255 tile max", AttentionVariant::kFullInt8, QkScaling::kPerToken, VScaling::kPerBlock, 255, false, true},
      {"int8 llmq (+ smooth K)", AttentionVariant::kFullInt8, QkScaling::kPerToken, VScaling::kPerBlock, 255, true, true},
      {"int8 llmq, 128-key tiles (H)", AttentionVariant::kFullInt8, QkScaling::kPerToken, VScaling::kPerBlock, 255, false, true, 128},
      {"fp8 llmq (V per block)", AttentionVariant::kFp8, QkScaling::kPerToken, VScaling::kPerBlock, 127, false},
      {"fp8 llmq, 128-key tiles (H)", AttentionVariant::kFp8, QkScaling::kPerToken, VScaling::kPerBlock, 127, false, false, 128},
      {"fp8 llmq, V per channel (H)", AttentionVariant::kFp8, QkScaling::kPerToken, VScaling::kPerChannel, 127, false, false, 128},
      {"bf16", AttentionVariant::kBf16, QkScaling::kPerToken, VScaling::kPerTensor, 127, false},
};

// Every variant on one problem against the float result: a table row and a JSON line each.
Status compare_variants(const AttentionProblem& p, const std::vector<float>& q, const std::vector<float>& k,
                        const std::vector<float>& v, int threads, const std::string& label, int64_t tokens,
                        nlohmann::json base, std::ofstream* json) {
  std::vector<float> want(q.size()), got(q.size());
  QuantAttentionOptions fo;
  fo.variant = AttentionVariant::kFloat;
  LLMQ_RETURN_IF_ERROR(quant_attention_reference(p, fo, q.data(), k.data(), v.data(), want.data(), threads));
  for (const Row& r : kRows) {
    QuantAttentionOptions o;
    o.variant = r.variant;
    o.qk_scaling = r.qk;
    o.v_scaling = r.vs;
    o.p_max = r.p_max;
    o.smooth_k = r.smooth_k;
    o.p_tile_max = r.p_tile_max;
    o.block_kv = r.block_kv;
    LLMQ_RETURN_IF_ERROR(quant_attention_reference(p, o, q.data(), k.data(), v.data(), got.data(), threads));
    const AttentionError e = attention_error(got.data(), want.data(), static_cast<int64_t>(got.size()));
    fmt::print("{:<9} {:>6} | {:<32} | {:7.3f}% {:7.3f}% {:10.6f} {:9.2e}\n", label, tokens, r.name, 100 * e.mre,
               100 * e.rel_l1, e.cosine, e.rmse);
    if (json->is_open()) {
      nlohmann::json j = base;
      j.update({{"bench", "attention_accuracy"}, {"tokens", tokens}, {"heads", p.heads}, {"kv_heads", p.kv_heads},
                {"head_dim", p.head_dim}, {"causal", p.causal}, {"variant", r.name}, {"block_kv", r.block_kv}, {"mre", e.mre},
                {"mre_excluded", e.mre_excluded}, {"rel_l1", e.rel_l1}, {"cosine", e.cosine}, {"rmse", e.rmse},
                {"max_abs", e.max_abs}});
      *json << j.dump() << "\n";
    }
  }
  return {};
}

// Real activations: a seeded prompt through the float CPU model, each layer's Q, K, V captured.
int run_on_model(const AttentionArgs& a, std::ofstream* json) {
  ModelWeights w;
  std::string description;
  if (Status st = load_model(a.model, &w, &description); !st.ok()) return fail(st);
  const ModelConfig& c = w.config;
  const int64_t n = std::min(a.prompt_tokens, c.max_seq_len);
  std::mt19937_64 rng(a.seed);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.vocab_size));
  std::vector<std::vector<float>> qs(static_cast<size_t>(c.n_layers)), ks(qs.size()), vs(qs.size());
  Transformer model(w);
  model.set_attention_observer([&](int64_t l, const float* q, int64_t rows, const float* k, const float* v, int64_t kv_len) {
    qs[l].assign(q, q + rows * c.n_heads * c.head_dim);
    ks[l].assign(k, k + kv_len * c.n_kv_heads * c.head_dim);
    vs[l].assign(v, v + kv_len * c.n_kv_heads * c.head_dim);
  });
  std::vector<float> logits(static_cast<size_t>(n * c.vocab_size));
  if (Status st = model.forward(tokens.data(), n, 0, logits.data()); !st.ok()) return fail(st);
  fmt::print("8-bit attention vs float on {}'s Q/K/V ({} tokens, {} layers, heads {}/{}, head_dim {}, causal)\n",
             description, n, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim);
  fmt::print("{:<9} {:>6} | {:<32} | {:>8} {:>8} {:>10} {:>9}\n", "layer", "tokens", "variant", "MRE", "rel L1", "cosine",
             "RMSE");
  AttentionProblem p;
  p.q_len = n;
  p.kv_len = n;
  p.heads = c.n_heads;
  p.kv_heads = c.n_kv_heads;
  p.head_dim = c.head_dim;
  p.causal = true;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (Status st = compare_variants(p, qs[l], ks[l], vs[l], a.threads, "layer " + std::to_string(l), n,
                                     {{"inputs", "model"}, {"model", description}, {"layer", l}}, json);
        !st.ok())
      return fail(st);
  }
  return 0;
}

int run_accuracy(const AttentionArgs& a) {
  std::ofstream json;
  if (!a.json_path.empty()) {
    // Appended to: never an input, never through a link, only a file of JSON lines (output_dir.hpp).
    OutputRules rules;
    rules.kind = OutputKind::kJsonLines;
    rules.option = "--json";
    rules.inputs = a.model_given ? std::vector<std::string>{a.model} : std::vector<std::string>{};
    if (Status st = check_output_path(a.json_path, rules); !st.ok()) return fail(st);
    json.open(a.json_path, std::ios::app);
    if (!json) return fail(Status(StatusCode::kIoError, "--json: cannot open " + a.json_path));
  }
  if (a.model_given) return run_on_model(a, &json);  // an explicit --model "" is refused by load_model
  fmt::print("8-bit attention vs float (CPU specification), heads {}, head_dim {}, {}\n", a.heads, a.head_dim,
             a.causal ? "causal" : "non-causal");
  fmt::print("{:<9} {:>6} | {:<32} | {:>8} {:>8} {:>10} {:>9}\n", "inputs", "tokens", "variant", "MRE", "rel L1",
             "cosine", "RMSE");
  for (const std::string& dist : a.dists) {
    for (int64_t n : a.lengths) {
      AttentionProblem p;
      p.q_len = n;
      p.kv_len = n;
      p.heads = a.heads;
      p.kv_heads = a.heads;
      p.head_dim = a.head_dim;
      p.causal = a.causal;
      std::mt19937_64 rng(a.seed);
      std::vector<float> q(static_cast<size_t>(n * a.heads * a.head_dim)), k(q.size()), v(q.size());
      fill(dist, rng, &q, false, a.head_dim);
      fill(dist, rng, &k, true, a.head_dim);
      fill(dist, rng, &v, false, a.head_dim);
      if (Status st = compare_variants(p, q, k, v, a.threads, dist, n, {{"inputs", dist}, {"seed", a.seed}}, &json);
          !st.ok())
        return fail(st);
    }
  }
  return 0;
}

}  // namespace

void add_attention_command(CLI::App& app, std::vector<Command>* commands) {
  auto args = std::make_shared<AttentionArgs>();
  CLI::App* cmd = app.add_subcommand(
      "attention-accuracy",
      "8-bit attention (FP8, half-INT8, full-INT8 and llmq's variants) against float on the INT-FlashAttention "
      "paper's inputs, by the CPU specification");
  cmd->add_option("--lengths", args->lengths, "sequence lengths")->delimiter(',')->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--inputs", args->dists, "normal, uniform (the paper's), outliers (0.1% of entries N(0, 100)), k-offset (K channel 3 + 20), sink (key 0 takes ~4/5 of every row)")
      ->delimiter(',')
      ->check(CLI::IsMember({"normal", "uniform", "outliers", "k-offset", "sink"}));
  cmd->add_option("--heads", args->heads, "attention heads")->check(CLI::Range(1, 256));
  cmd->add_option("--head-dim", args->head_dim, "head dimension")->check(CLI::Range(2, 512));
  cmd->add_flag("--causal", args->causal, "causal mask (the paper's tables are non-causal)");
  cmd->add_option("--threads", args->threads, "CPU threads (0: all)")->check(CLI::Range(0, 4096));
  cmd->add_option("--seed", args->seed, "seed of the inputs");
  cmd->add_option("--json", args->json_path, "append JSON lines here");
  cmd->add_option_function<std::string>("--model", [args](const std::string& m) {
        args->model = m;
        args->model_given = true;
      },
                  "instead of random inputs: every layer's Q, K, V of this model (llama2.c .bin, HF directory or "
                  "'default') on a seeded random prompt");
  cmd->add_option("--prompt-tokens", args->prompt_tokens, "prompt length with --model")->check(CLI::Range(1, 1 << 16));
  commands->push_back({cmd, [args] { return run_accuracy(*args); }});
}

}  // namespace llmq::cli
