// config.json semantics: both formats transformers writes (<= 4: top-level rope_theta /
// rope_scaling; >= 5: rope_parameters) read as transformers reads them, checked against
// transformers' own logits; every key implemented, known harmless or refused by name; sane ranges;
// sliding windows refused past their end (Transformer and `llmq logits`), and written back.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "llmq/export.hpp"
#include "llmq/model.hpp"
#include "llmq/safetensors.hpp"
#include "llmq/transformer.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using json = nlohmann::json;
using llmq::testing::TempDir;
namespace fs = std::filesystem;

const std::string kData = std::string(LLMQ_REPO_TESTDATA) + "/hf5";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_text(const std::string& path, const std::string& text) {
  EXPECT_TRUE((std::ofstream(path, std::ios::binary) << text).good()) << path;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void expect_refused(const Status& st, StatusCode code, const std::vector<std::string>& mentions) {
  ASSERT_FALSE(st.ok()) << "accepted; expected an error naming " << (mentions.empty() ? "" : mentions[0]);
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "config.json")) << st.to_string();
  for (const std::string& m : mentions) EXPECT_TRUE(contains(st.message(), m)) << "'" << m << "' not in " << st.to_string();
}

Status parse(const json& j, ModelConfig* c) { return parse_hf_config(j.dump(), c); }

ModelConfig parsed(const json& j) {
  ModelConfig c;
  const Status st = parse(j, &c);
  EXPECT_TRUE(st.ok()) << st.to_string() << "\n" << j.dump();
  return c;
}

// ---------------------------------------------------------------------------------------------
// Against transformers: tiny models saved by transformers 5.17 (tests/data/hf5/make_models.py)

struct Reference {
  std::vector<int32_t> ids;
  std::vector<float> logits;  // [ids, vocab]
};

Reference read_reference(const std::string& dir) {
  Reference r;
  std::istringstream in(read_text(dir + "/ids.txt"));
  for (int v; in >> v;) r.ids.push_back(v);
  const std::string bytes = read_text(dir + "/logits.f32");
  r.logits.resize(bytes.size() / sizeof(float));
  std::memcpy(r.logits.data(), bytes.data(), r.logits.size() * sizeof(float));
  return r;
}

struct Agreement {
  double rel_error = 0;  // max |llmq - transformers| / max |transformers|
  int64_t top1_same = 0;
  int64_t positions = 0;
};

// llmq's CPU forward pass over the reference ids of the model in `dir`, compared with
// transformers' logits from `ref_dir`.
Agreement run_against(const std::string& dir, const std::string& ref_dir) {
  Agreement a;
  const Reference ref = read_reference(ref_dir);
  ModelWeights w;
  const Status st = load_hf_model(dir, &w);
  EXPECT_TRUE(st.ok()) << st.to_string();
  if (!st.ok()) return a;
  const int64_t n = static_cast<int64_t>(ref.ids.size()), vocab = w.config.vocab_size;
  EXPECT_EQ(static_cast<int64_t>(ref.logits.size()), n * vocab);
  if (static_cast<int64_t>(ref.logits.size()) != n * vocab) return a;
  std::vector<float> logits(static_cast<size_t>(n * vocab));
  Transformer t(w);
  const Status fst = t.forward(ref.ids.data(), n, 0, logits.data());
  EXPECT_TRUE(fst.ok()) << fst.to_string();
  double max_ref = 0, max_err = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref.logits[i])));
    max_err = std::max(max_err, std::fabs(static_cast<double>(logits[i]) - ref.logits[i]));
  }
  a.rel_error = max_err / max_ref;
  a.positions = n;
  for (int64_t p = 0; p < n; ++p) {
    const float* x = logits.data() + p * vocab;
    const float* y = ref.logits.data() + p * vocab;
    a.top1_same += std::max_element(x, x + vocab) - x == std::max_element(y, y + vocab) - y;
  }
  return a;
}

void expect_matches_transformers(const Agreement& a) {
  EXPECT_EQ(a.positions, 40);
  EXPECT_LT(a.rel_error, 1e-4);
  EXPECT_EQ(a.top1_same, a.positions);
}

// The same checkpoint with config.json rewritten by `edit`, in a temporary directory.
std::string rewritten(const TempDir& tmp, const std::string& name, const std::function<void(json&)>& edit) {
  const std::string dir = tmp.file(name);
  fs::create_directories(dir);
  fs::copy_file(kData + "/" + name + "/model.safetensors", dir + "/model.safetensors");
  json j = json::parse(read_text(kData + "/" + name + "/config.json"));
  edit(j);
  write_text(dir + "/config.json", j.dump(2));
  return dir;
}

// transformers 4's spelling of the same config: rope_parameters' theta at the top level, its
// scaling (unless plain RoPE) as rope_scaling; torch_dtype; no layer_types.
void to_transformers4(json& j) {
  json rp = j["rope_parameters"];
  j.erase("rope_parameters");
  j["rope_theta"] = rp["rope_theta"];
  rp.erase("rope_theta");
  if (rp["rope_type"] != "default") j["rope_scaling"] = rp;
  j["torch_dtype"] = j["dtype"];
  j.erase("dtype");
  j.erase("layer_types");
  j["transformers_version"] = "4.46.0";
}

class AgainstTransformers : public ::testing::TestWithParam<const char*> {};

TEST_P(AgainstTransformers, Transformers5ConfigGivesTransformersLogits) {
  const std::string dir = kData + "/" + GetParam();
  ASSERT_TRUE(fs::exists(dir + "/config.json")) << dir;
  ASSERT_TRUE(contains(read_text(dir + "/config.json"), "rope_parameters")) << "not a transformers 5 config";
  expect_matches_transformers(run_against(dir, dir));
}

TEST_P(AgainstTransformers, Transformers4SpellingGivesTheSameLogits) {
  TempDir tmp("llmq_hf4");
  const std::string dir = rewritten(tmp, GetParam(), to_transformers4);
  const std::string text = read_text(dir + "/config.json");
  ASSERT_TRUE(!contains(text, "rope_parameters") && contains(text, "\"rope_theta\"")) << text;
  expect_matches_transformers(run_against(dir, kData + "/" + GetParam()));
}

// Without rope_parameters the same weights compute another model (theta 10000, no scaling): the
// comparison above can fail, and reading rope_parameters is what makes it pass.
TEST_P(AgainstTransformers, IgnoringRopeParametersWouldBeAnotherModel) {
  TempDir tmp("llmq_hf5_norope");
  const std::string dir = rewritten(tmp, GetParam(), [](json& j) { j.erase("rope_parameters"); });
  const Agreement a = run_against(dir, kData + "/" + GetParam());
  EXPECT_GT(a.rel_error, 100 * 1e-4) << "the model does not depend on its RoPE parameters: the test shows nothing";
  EXPECT_LT(a.top1_same, a.positions);
}

INSTANTIATE_TEST_SUITE_P(Hf5, AgainstTransformers, ::testing::Values("llama3-rope", "qwen2-theta"));

TEST(HfConfigFormats, BothSpellingsReadTheSameRope) {
  const json v5 = json::parse(read_text(kData + "/llama3-rope/config.json"));
  json v4 = v5;
  to_transformers4(v4);
  for (const json& j : {v5, v4}) {
    const ModelConfig c = parsed(j);
    EXPECT_EQ(c.rope_theta, 500000.0);
    const RopeScaling& r = c.rope_scaling;
    EXPECT_TRUE(r.enabled);
    EXPECT_TRUE(r.factor == 8.0 && r.low_freq_factor == 1.0 && r.high_freq_factor == 4.0 && r.original_max_position == 16);
  }
  // Both spellings at once, agreeing, as a config converted by hand might be: accepted.
  json both = v5;
  both["rope_theta"] = 500000.0;
  both["rope_scaling"] = v4["rope_scaling"];
  EXPECT_EQ(parsed(both).rope_theta, 500000.0);
  // The old "type" key and a theta repeated inside rope_parameters.
  json old_key = v4;
  old_key["rope_scaling"].erase("rope_type");
  old_key["rope_scaling"]["type"] = "llama3";
  EXPECT_TRUE(parsed(old_key).rope_scaling.enabled);
  const ModelConfig qwen = parsed(json::parse(read_text(kData + "/qwen2-theta/config.json")));
  EXPECT_EQ(qwen.rope_theta, 1e6);
  EXPECT_FALSE(qwen.rope_scaling.enabled);
}

// ---------------------------------------------------------------------------------------------
// Acceptance: transformers 5 defaults and configs as published on the Hub

TEST(HfConfigAccepts, Transformers5Defaults) {
  struct Want {
    const char* file;
    double theta;
    int64_t max_seq_len, sliding_window, experts, vocab;
  };
  for (const Want& w : {Want{"llama", 10000.0, 2048, 0, 0, 32000}, Want{"mistral", 10000.0, 131072, 4096, 0, 32000},
                        Want{"mixtral", 1e6, 131072, 0, 8, 32000}, Want{"qwen2", 10000.0, 32768, 0, 0, 151936}}) {
    SCOPED_TRACE(w.file);
    const ModelConfig c = parsed(json::parse(read_text(kData + "/defaults/" + w.file + ".json")));
    EXPECT_EQ(c.model_type, w.file);
    EXPECT_EQ(c.rope_theta, w.theta);
    EXPECT_FALSE(c.rope_scaling.enabled);
    EXPECT_EQ(c.max_seq_len, w.max_seq_len);
    EXPECT_EQ(c.sliding_window, w.sliding_window);
    EXPECT_EQ(c.n_experts, w.experts);
    EXPECT_EQ(c.vocab_size, w.vocab);
    EXPECT_EQ(c.attention_bias, std::string(w.file) == "qwen2");
  }
}

// Key sets (and values) of config.json files as published on the Hugging Face Hub.
const char* kHubConfigs[] = {
    // meta-llama/Meta-Llama-3-8B
    R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 500000.0,
        "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0",
        "use_cache": true, "vocab_size": 128256})",
    // meta-llama/Llama-2-7b-hf
    R"({"_name_or_path": "meta-llama/Llama-2-7b-hf", "architectures": ["LlamaForCausalLM"], "bos_token_id": 1,
        "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "pretraining_tp": 1,
        "rms_norm_eps": 1e-05, "rope_scaling": null, "tie_word_embeddings": false, "torch_dtype": "float16",
        "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})",
    // meta-llama/Llama-3.2-1B
    R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
        "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})",
    // huggyllama/llama-7b (a LLaMA 1 conversion)
    R"({"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 2048,
        "max_sequence_length": 2048, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
        "pad_token_id": 0, "rms_norm_eps": 1e-06, "tie_word_embeddings": false, "torch_dtype": "float16",
        "transformers_version": "4.28.0.dev0", "use_cache": true, "vocab_size": 32000})",
    // mistralai/Mistral-7B-v0.1
    R"({"architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
        "sliding_window": 4096, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
        "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000})",
    // mistralai/Mistral-7B-Instruct-v0.3
    R"({"architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
        "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
        "transformers_version": "4.42.0.dev0", "use_cache": true, "vocab_size": 32768})",
    // Qwen/Qwen2-7B
    R"({"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
        "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
        "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
        "torch_dtype": "bfloat16", "transformers_version": "4.37.2", "use_cache": true, "use_sliding_window": false,
        "vocab_size": 152064})",
    // Qwen/Qwen2.5-0.5B-Instruct
    R"({"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
        "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2",
        "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
        "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})",
    // mistralai/Mixtral-8x7B-v0.1
    R"({"architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
        "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
        "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
        "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
        "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000})",
};

TEST(HfConfigAccepts, HubConfigs) {
  for (const char* text : kHubConfigs) {
    const json j = json::parse(text);
    SCOPED_TRACE(j.value("_name_or_path", j["model_type"].get<std::string>()));
    const ModelConfig c = parsed(j);
    EXPECT_EQ(c.dim, j["hidden_size"].get<int64_t>());
    EXPECT_EQ(c.max_seq_len, j["max_position_embeddings"].get<int64_t>());
    EXPECT_EQ(c.rope_theta, j.value("rope_theta", 10000.0));
  }
  // Mistral 7B v0.1's window: recorded, and not a context cap.
  const ModelConfig mistral = parsed(json::parse(kHubConfigs[4]));
  EXPECT_EQ(mistral.sliding_window, 4096);
  EXPECT_EQ(mistral.max_seq_len, 32768);
  EXPECT_EQ(parsed(json::parse(kHubConfigs[5])).sliding_window, 0);  // "sliding_window": null
  EXPECT_EQ(parsed(json::parse(kHubConfigs[6])).sliding_window, 0);  // use_sliding_window false
  EXPECT_TRUE(parsed(json::parse(kHubConfigs[2])).rope_scaling.enabled);
  EXPECT_EQ(parsed(json::parse(kHubConfigs[2])).rope_scaling.factor, 32.0);
}

// A config saved in full (use_diff=False) by transformers 4 carries every PretrainedConfig key.
TEST(HfConfigAccepts, EveryGenericPretrainedConfigKeyOfTransformers4) {
  json j = json::parse(kHubConfigs[0]);
  const json generic = json::parse(R"({
    "return_dict": true, "output_hidden_states": false, "output_attentions": false, "torchscript": false,
    "use_bfloat16": false, "tf_legacy_loss": false, "pruned_heads": {}, "chunk_size_feed_forward": 0,
    "is_encoder_decoder": false, "is_decoder": false, "cross_attention_hidden_size": null,
    "add_cross_attention": false, "tie_encoder_decoder": false, "max_length": 20, "min_length": 0,
    "do_sample": false, "early_stopping": false, "num_beams": 1, "num_beam_groups": 1, "diversity_penalty": 0.0,
    "temperature": 1.0, "top_k": 50, "top_p": 1.0, "typical_p": 1.0, "repetition_penalty": 1.0,
    "length_penalty": 1.0, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "bad_words_ids": null,
    "num_return_sequences": 1, "output_scores": false, "return_dict_in_generate": false,
    "forced_bos_token_id": null, "forced_eos_token_id": null, "remove_invalid_values": false,
    "exponential_decay_length_penalty": null, "suppress_tokens": null, "begin_suppress_tokens": null,
    "finetuning_task": null, "id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "label2id": {"LABEL_0": 0, "LABEL_1": 1},
    "tokenizer_class": null, "prefix": null, "pad_token_id": null, "sep_token_id": null,
    "decoder_start_token_id": null, "task_specific_params": null, "problem_type": null,
    "_name_or_path": "x", "_attn_implementation_autoset": true})");
  j.update(generic);
  const ModelConfig c = parsed(j);
  EXPECT_EQ(c.rope_theta, 500000.0);
  // Those that would change the model, with values that do.
  for (const char* bad : {R"({"pruned_heads": {"0": [1]}})", R"({"is_encoder_decoder": true})",
                          R"({"add_cross_attention": true})", R"({"cross_attention_hidden_size": 64})"}) {
    json k = j;
    k.update(json::parse(bad));
    ModelConfig out;
    expect_refused(parse(k, &out), StatusCode::kUnsupported, {json::parse(bad).begin().key()});
  }
}

// ---------------------------------------------------------------------------------------------
// Refusals, each naming the field

const json& llama3() {
  static const json j = json::parse(read_text(kData + "/llama3-rope/config.json"));
  return j;
}

struct Case {
  const char* what;
  std::function<void(json&)> edit;
  StatusCode code;
  std::vector<std::string> mentions;
};

void expect_cases(const json& base, const std::vector<Case>& cases) {
  ModelConfig untouched;
  ASSERT_TRUE(parse(base, &untouched).ok()) << "the base config must parse";
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    json j = base;
    k.edit(j);
    ModelConfig c;
    expect_refused(parse(j, &c), k.code, k.mentions);
  }
}

TEST(HfConfigRefuses, UnknownKeysByName) {
  const std::string msg = "is not understood by llmq; refusing rather than computing a different model";
  expect_cases(llama3(), {
      {"unknown key", [](json& j) { j["attn_logit_softcapping"] = 50.0; }, StatusCode::kUnsupported,
       {"field 'attn_logit_softcapping' " + msg}},
      {"remote code", [](json& j) { j["auto_map"] = {{"AutoModelForCausalLM", "x.Y"}}; }, StatusCode::kUnsupported,
       {"'auto_map'"}},
      {"per-layer overrides (5.x)", [](json& j) { j["per_layer_config"] = {{"0", {{"hidden_act", "gelu"}}}}; },
       StatusCode::kUnsupported, {"'per_layer_config'"}},
      {"unknown key inside rope_parameters", [](json& j) { j["rope_parameters"]["mrope_section"] = {16, 24, 24}; },
       StatusCode::kUnsupported, {"'rope_parameters.mrope_section'"}},
      {"experts on a dense model type", [](json& j) { j["num_local_experts"] = 8; }, StatusCode::kUnsupported,
       {"'num_local_experts'", "model_type 'llama'"}},
      {"Qwen2's max_window_layers on Llama", [](json& j) { j["max_window_layers"] = 4; }, StatusCode::kUnsupported,
       {"'max_window_layers'"}},
      {"a window on Llama", [](json& j) { j["sliding_window"] = 8; }, StatusCode::kUnsupported,
       {"'sliding_window'", "llama"}},
      {"a quantization llmq does not read",
       [](json& j) { j["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}}; },
       StatusCode::kUnsupported, {"quantization_config.quant_method", "awq"}},
      {"classification head", [](json& j) { j["architectures"] = {"LlamaForSequenceClassification"}; },
       StatusCode::kUnsupported, {"architectures", "LlamaForSequenceClassification"}},
  });
  // null counts as absent, known key or not.
  json j = llama3();
  j["attn_logit_softcapping"] = nullptr;
  EXPECT_TRUE(parsed(j).rope_scaling.enabled);
}

TEST(HfConfigRefuses, ConflictingSpellingsNameBoth) {
  expect_cases(llama3(), {
      {"theta in both places, different", [](json& j) { j["rope_theta"] = 10000.0; }, StatusCode::kInvalidArgument,
       {"rope_theta", "rope_parameters.rope_theta", "disagree"}},
      {"scaling in both places, different",
       [](json& j) {
         j["rope_scaling"] = j["rope_parameters"];
         j["rope_scaling"]["factor"] = 4.0;
       },
       StatusCode::kInvalidArgument, {"rope_scaling", "rope_parameters", "disagree"}},
      {"plain rope_scaling beside llama3 rope_parameters",
       [](json& j) { j["rope_scaling"] = {{"rope_type", "default"}}; }, StatusCode::kInvalidArgument,
       {"rope_scaling", "rope_parameters"}},
      {"rope_type and type differ", [](json& j) { j["rope_parameters"]["type"] = "default"; },
       StatusCode::kInvalidArgument, {"rope_parameters.rope_type", "rope_parameters.type"}},
      {"max_sequence_length beside max_position_embeddings", [](json& j) { j["max_sequence_length"] = 64; },
       StatusCode::kUnsupported, {"max_sequence_length", "max_position_embeddings"}},
  });
  // A theta only inside rope_scaling: transformers 4 ignores it, 5 uses it.
  json v4 = llama3();
  to_transformers4(v4);
  v4["rope_scaling"]["rope_theta"] = v4["rope_theta"];
  v4.erase("rope_theta");
  ModelConfig c;
  expect_refused(parse(v4, &c), StatusCode::kUnsupported, {"rope_scaling.rope_theta"});
}

TEST(HfConfigRefuses, RopeTypesAndPartialRotary) {
  std::vector<Case> cases;
  for (const char* type : {"linear", "dynamic", "longrope", "su", "mrope"}) {
    cases.push_back({type, [type](json& j) { j["rope_parameters"]["rope_type"] = type; }, StatusCode::kUnsupported,
                     {"rope_parameters.rope_type", std::string("'") + type + "'"}});
    cases.push_back({type, [type](json& j) {
                       to_transformers4(j);
                       j["rope_scaling"] = {{"type", type}, {"factor", 2.0}};
                     },
                     StatusCode::kUnsupported, {"rope_scaling.type", std::string("'") + type + "'"}});
  }
  cases.push_back({"partial rotary in rope_parameters", [](json& j) { j["rope_parameters"]["partial_rotary_factor"] = 0.5; },
                   StatusCode::kUnsupported, {"rope_parameters.partial_rotary_factor"}});
  cases.push_back({"partial rotary at the top", [](json& j) { j["partial_rotary_factor"] = 0.25; },
                   StatusCode::kUnsupported, {"partial_rotary_factor"}});
  cases.push_back({"rope_scaling without a type", [](json& j) {
                     to_transformers4(j);
                     j["rope_scaling"].erase("rope_type");
                   },
                   StatusCode::kInvalidArgument, {"rope_scaling", "rope_type"}});
  cases.push_back({"llama3 without original_max_position_embeddings",
                   [](json& j) { j["rope_parameters"].erase("original_max_position_embeddings"); },
                   StatusCode::kInvalidArgument, {"rope_parameters.original_max_position_embeddings"}});
  expect_cases(llama3(), cases);
  // The values that leave RoPE whole are accepted.
  json j = llama3();
  j["partial_rotary_factor"] = 1.0;
  j["rope_parameters"]["partial_rotary_factor"] = 1;
  EXPECT_TRUE(parsed(j).rope_scaling.enabled);
  // rope_parameters without a rope_type is plain RoPE in transformers 5.
  j = llama3();
  j["rope_parameters"] = {{"rope_theta", 123.0}};
  EXPECT_FALSE(parsed(j).rope_scaling.enabled);
  EXPECT_EQ(parsed(j).rope_theta, 123.0);
}

TEST(HfConfigRefuses, ValuesThatChangeTheModel) {
  expect_cases(llama3(), {
      {"gelu", [](json& j) { j["hidden_act"] = "gelu"; }, StatusCode::kUnsupported, {"hidden_act", "gelu"}},
      {"mlp bias", [](json& j) { j["mlp_bias"] = true; }, StatusCode::kUnsupported, {"mlp_bias"}},
      {"layer_types sliding on Llama", [](json& j) { j["layer_types"] = {"full_attention", "sliding_attention"}; },
       StatusCode::kUnsupported, {"layer_types"}},
      {"layer_types of another length", [](json& j) { j["layer_types"] = {"full_attention"}; },
       StatusCode::kInvalidArgument, {"layer_types", "num_hidden_layers"}},
      {"chunked attention", [](json& j) { j["layer_types"] = {"full_attention", "chunked_attention"}; },
       StatusCode::kUnsupported, {"layer_types[1]", "chunked_attention"}},
      {"Qwen2 without its biases",
       [](json& j) {
         j["model_type"] = "qwen2";
         j.erase("mlp_bias");
         j.erase("pretraining_tp");
         j["attention_bias"] = false;
       },
       StatusCode::kUnsupported, {"attention_bias", "qwen2"}},
      {"Mistral with biases",
       [](json& j) {
         j["model_type"] = "mistral";
         j["attention_bias"] = true;
       },
       StatusCode::kUnsupported, {"attention_bias", "mistral"}},
      {"Mistral's window switched off by a key Mistral does not read",
       [](json& j) {
         j["model_type"] = "mistral";
         j["sliding_window"] = 16;
         j["use_sliding_window"] = false;
       },
       StatusCode::kUnsupported, {"use_sliding_window", "sliding_window = 16"}},
  });
  json j = llama3();
  j["hidden_act"] = "swish";  // transformers' name for the same SiLU
  j["layer_types"] = {"full_attention", "full_attention"};
  EXPECT_TRUE(parsed(j).rope_scaling.enabled);
}

TEST(HfConfigRefuses, OutOfRangeValuesNameTheField) {
  auto set = [](const char* key, json v) { return [key, v](json& j) { j[key] = v; }; };
  auto rope = [](const char* key, json v) { return [key, v](json& j) { j["rope_parameters"][key] = v; }; };
  const StatusCode bad = StatusCode::kInvalidArgument;
  expect_cases(llama3(), {
      {"theta 0", rope("rope_theta", 0.0), bad, {"rope_theta"}},
      {"theta negative", rope("rope_theta", -5.0), bad, {"rope_theta"}},
      {"theta huge", rope("rope_theta", 2e12), bad, {"rope_theta"}},
      {"eps 0", set("rms_norm_eps", 0.0), bad, {"rms_norm_eps"}},
      {"eps 0.5", set("rms_norm_eps", 0.5), bad, {"rms_norm_eps"}},
      {"hidden_size", set("hidden_size", (1 << 17) + 8), bad, {"hidden_size"}},
      {"intermediate_size", set("intermediate_size", (1 << 20) + 1), bad, {"intermediate_size"}},
      {"layers", set("num_hidden_layers", 5000), bad, {"num_hidden_layers"}},
      {"heads", set("num_attention_heads", 8192), bad, {"num_attention_heads"}},
      {"kv heads do not divide heads", set("num_key_value_heads", 3), bad, {"n_kv_heads"}},
      {"head_dim", set("head_dim", 8192), bad, {"head_dim"}},
      {"vocab", set("vocab_size", (1 << 24) + 1), bad, {"vocab_size"}},
      {"positions", set("max_position_embeddings", (int64_t{1} << 26) + 1), bad, {"max_position_embeddings"}},
      {"negative positions", set("max_position_embeddings", -1), bad, {"max_position_embeddings"}},
      {"factor 0", rope("factor", 0.0), bad, {"factor"}},
      {"factor negative", rope("factor", -8.0), bad, {"factor"}},
      {"low_freq_factor 0", rope("low_freq_factor", 0.0), bad, {"low_freq_factor"}},
      {"high below low", rope("high_freq_factor", 0.5), bad, {"high_freq_factor"}},
      {"original positions 0", rope("original_max_position_embeddings", 0), bad, {"original_max_position_embeddings"}},
      {"pretraining_tp 0", set("pretraining_tp", 0), bad, {"pretraining_tp"}},
      {"BOS past the vocabulary", set("bos_token_id", 64), bad, {"bos_token_id"}},
      {"EOS past the vocabulary", set("eos_token_id", json::array({2000000000, 2})), bad, {"eos_token_id"}},
  });
  json moe = llama3();
  moe["model_type"] = "mixtral";
  moe.erase("mlp_bias");
  moe.erase("attention_bias");
  moe["num_local_experts"] = 4;
  moe["num_experts_per_tok"] = 2;
  expect_cases(moe, {
      {"experts", set("num_local_experts", 5000), bad, {"num_local_experts"}},
      {"top-k above experts", set("num_experts_per_tok", 5), bad, {"n_experts_per_token"}},
      {"window 0", set("sliding_window", 0), bad, {"sliding_window"}},
  });
  // A number past double's range is refused (by the JSON parser), not read as "huge".
  std::string text = llama3().dump();
  const size_t at = text.find("500000.0");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 8, "1e999");
  ModelConfig inf;
  expect_refused(parse_hf_config(text, &inf), bad, {"1e999"});
  // The caps leave room: the largest real sizes pass.
  json big = llama3();
  big.update(json{{"hidden_size", 16384}, {"intermediate_size", 53248}, {"num_hidden_layers", 126},
                  {"num_attention_heads", 128}, {"head_dim", 128}, {"num_key_value_heads", 8}, {"vocab_size", 256000},
                  {"max_position_embeddings", 10485760}});
  big["rope_parameters"]["rope_theta"] = 1e9;
  EXPECT_EQ(parsed(big).max_seq_len, 10485760);
}

// ModelConfig::validate holds for every loader, not only config.json.
TEST(HfConfigRefuses, ValidateChecksRangesForEveryLoader) {
  ModelWeights w = make_default_model();
  ASSERT_TRUE(w.config.validate().ok());
  auto refused = [&](const std::function<void(ModelConfig&)>& edit, const std::string& field) {
    ModelConfig c = w.config;
    edit(c);
    const Status st = c.validate();
    EXPECT_FALSE(st.ok()) << field;
    EXPECT_TRUE(contains(st.message(), field)) << st.to_string();
  };
  refused([](ModelConfig& c) { c.rope_theta = std::nan(""); }, "rope_theta");
  refused([](ModelConfig& c) { c.rope_theta = INFINITY; }, "rope_theta");
  refused([](ModelConfig& c) { c.norm_eps = std::nan(""); }, "norm_eps");
  refused([](ModelConfig& c) { c.n_layers = 1 << 20; }, "n_layers");
  refused([](ModelConfig& c) { c.sliding_window = -1; }, "sliding_window");
  refused([](ModelConfig& c) { c.rope_scaling.enabled = true; c.rope_scaling.factor = INFINITY; }, "scaling.factor");
}

// ---------------------------------------------------------------------------------------------
// Sliding windows

TEST(HfConfigSlidingWindow, Qwen2FollowsUseSlidingWindowAndItsLayers) {
  json j = json::parse(kHubConfigs[6]);  // Qwen2-7B: 28 layers, max_window_layers 28
  EXPECT_EQ(parsed(j).sliding_window, 0);  // use_sliding_window false
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  EXPECT_FALSE(parsed(j).has_window());  // no layer at or above max_window_layers 28
  j["max_window_layers"] = 20;
  EXPECT_EQ(parsed(j).sliding_window, 4096);
  EXPECT_EQ(parsed(j).layer_window(19), 0);
  EXPECT_EQ(parsed(j).layer_window(20), 4096);
  EXPECT_EQ(parsed(j).layer_window(27), 4096);
  EXPECT_EQ(parsed(j).max_seq_len, 131072);
  // layer_types (transformers 5) decide over max_window_layers.
  j["layer_types"] = std::vector<std::string>(28, "full_attention");
  EXPECT_FALSE(parsed(j).has_window());
  j["layer_types"][27] = "sliding_attention";
  j["max_window_layers"] = 28;
  EXPECT_EQ(parsed(j).layer_window(27), 4096);
  EXPECT_EQ(parsed(j).layer_window(26), 0);
  j["use_sliding_window"] = false;  // transformers 5 drops the window then, and its mask code raises
  ModelConfig c;
  const Status st = parse_hf_config(j.dump(), &c);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  EXPECT_NE(st.message().find("layer_types"), std::string::npos) << st.to_string();
}

// A config without bos_token_id / eos_token_id, or with null, says the model has none: -1, never
// llama2.c's 1 / 2 (token 1 of a byte-level vocabulary is '"': a prompt would start with it and
// generation would stop on it). The writer writes null back.
TEST(HfConfigAccepts, MissingOrNullTokenIdsMeanNone) {
  json j = json::parse(kHubConfigs[4]);  // Mistral 7B v0.1: bos 1, eos 2
  EXPECT_EQ(parsed(j).bos_token, 1);
  EXPECT_EQ(parsed(j).eos_token, 2);
  j.erase("bos_token_id");
  j["eos_token_id"] = nullptr;
  const ModelConfig c = parsed(j);
  EXPECT_EQ(c.bos_token, -1);
  EXPECT_EQ(c.eos_token, -1);
  EXPECT_EQ(c.text_start_token(), -1);
  const json written = json::parse(hf_config_json(c));
  EXPECT_TRUE(written.at("bos_token_id").is_null());
  EXPECT_TRUE(written.at("eos_token_id").is_null());
  ModelConfig back;
  ASSERT_TRUE(parse_hf_config(hf_config_json(c), &back).ok());
  EXPECT_EQ(back.bos_token, -1);
  EXPECT_EQ(back.eos_token, -1);
  j["eos_token_id"] = json::array({7, 9});
  EXPECT_EQ(parsed(j).eos_token, 7);
  EXPECT_EQ(parsed(j).text_start_token(), 7);  // sampled text starts after the EOS between documents
  ModelConfig bad = c;
  bad.bos_token = -2;
  EXPECT_NE(bad.validate().message().find("bos_token"), std::string::npos);
}

TEST(HfConfigSlidingWindow, WriterKeepsTheWindow) {
  for (const char* type : {"mistral", "llama", "qwen2", "mixtral"}) {
    SCOPED_TRACE(type);
    ModelConfig c = parsed(json::parse(kHubConfigs[4]));  // Mistral 7B v0.1
    c.model_type = type;
    c.attention_bias = std::string(type) == "qwen2";
    if (std::string(type) == "mixtral") c.n_experts = 8, c.n_experts_per_token = 2;
    c.sliding_window = 1000;
    ModelConfig back;
    const Status st = parse_hf_config(hf_config_json(c), &back);
    ASSERT_TRUE(st.ok()) << st.to_string() << "\n" << hf_config_json(c);
    EXPECT_EQ(back.sliding_window, 1000);
    EXPECT_EQ(back.max_seq_len, c.max_seq_len);
    EXPECT_EQ(back.attention_bias, c.attention_bias);
    c.sliding_window = 0;
    ASSERT_TRUE(parse_hf_config(hf_config_json(c), &back).ok());
    EXPECT_EQ(back.sliding_window, 0);
  }
}


// `llmq logits`, with exit status and the message on the terminal.
int run_cli(const std::string& args, std::string* output) {
  TempDir tmp("llmq_cli_out");
  const std::string cmd = std::string("'") + LLMQ_CLI_PATH + "' " + args + " > '" + tmp.file("out") + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  *output = read_text(tmp.file("out"));
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(HfConfigSlidingWindow, LogitsCommandRunsPastTheWindow) {
  TempDir tmp("llmq_window");
  // The tiny transformers model as a Mistral with an 8-position window.
  const std::string dir = rewritten(tmp, "llama3-rope", [](json& j) {
    j["model_type"] = "mistral";
    j["architectures"] = {"MistralForCausalLM"};
    j.erase("attention_bias");
    j["sliding_window"] = 8;
  });
  auto ids = [](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += std::to_string((7 * i + 3) % 64) + " ";
    return s;
  };
  std::string out;
  EXPECT_EQ(run_cli("logits --model '" + dir + "' --ids '" + ids(48) + "' -o '" + tmp.file("l48.bin") + "'", &out), 0) << out;
  EXPECT_EQ(fs::file_size(tmp.file("l48.bin")), 48u * 64u * sizeof(float));
  // A config key llmq does not understand stops the command too, naming it.
  const std::string odd = rewritten(tmp, "qwen2-theta", [](json& j) { j["use_mrope"] = true; });
  EXPECT_NE(run_cli("logits --model '" + odd + "' --ids '1 2 3' -o '" + tmp.file("odd.bin") + "'", &out), 0);
  EXPECT_TRUE(contains(out, "field 'use_mrope' is not understood by llmq")) << out;
}

}  // namespace
}  // namespace llmq
