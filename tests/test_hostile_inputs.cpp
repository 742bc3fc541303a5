// The hostile-input suite (issue 21), part 1: config misreads and token ids. Every case runs the
// real `llmq` binary on a copy of a small checkpoint llmq made itself, edited into something a
// user (or a newer transformers) could hand it, and requires one of: the same model read right,
// or a refusal that names the file and the field, with no crash, no hang, bounded memory, the
// inputs' bytes unchanged and nothing partial left behind (hostile_support.hpp). Parts 2 and 3:
// hostile_resources.cpp (crashes, hangs, unbounded reads) and hostile_outputs.cpp (nothing lost).
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "hostile_support.hpp"

namespace llmq::hostile {
namespace {

// ---- mutations

std::function<void(Case&, const std::string&)> config(std::function<void(json&)> edit) {
  return [edit](Case&, const std::string& model) { edit_config(model, edit); };
}

// A field set to raw JSON text (numbers a JSON library would not print, such as 1e400).
std::function<void(Case&, const std::string&)> config_raw(const std::string& key, const std::string& raw) {
  return [key, raw](Case&, const std::string& model) {
    json j = read_json_file(model + "/config.json");
    j[key] = "@@RAW@@";
    std::string text = j.dump(2);
    text.replace(text.find("\"@@RAW@@\""), 9, raw);
    write_bytes(model + "/config.json", text);
  };
}

std::function<void(Case&, const std::string&)> tensors(std::function<void(StFile&)> edit) {
  return [edit](Case&, const std::string& model) {
    StFile f = read_safetensors(model + "/model.safetensors");
    edit(f);
    write_safetensors(model + "/model.safetensors", f);
  };
}

const std::vector<Cmd> kAll = {Cmd::kRun, Cmd::kEval, Cmd::kCalibrate, Cmd::kLogits, Cmd::kQuantize};
const std::vector<Cmd> kForward = {Cmd::kLogits, Cmd::kRun};  // commands that compute with the config

const std::string kQ0 = "model.layers.0.self_attn.q_proj.weight";

// Config.json and tensor mismatches: what `quantize` checks must hold for every command.
const std::vector<ModelCase>& config_cases() {
  static const std::vector<ModelCase> table = {
      // ---- config vs tensors
      {"FewerLayersThanCheckpoint", Base::kHf, config([](json& j) { j["num_hidden_layers"] = 1; }),
       {"layers.1|layer 1"}, kAll},
      {"MoreLayersThanCheckpoint", Base::kHf, config([](json& j) { j["num_hidden_layers"] = 3; }),
       {"layers.2|layer 2"}, {Cmd::kLogits, Cmd::kRun, Cmd::kQuantize}},
      {"UntiedConfigWithoutLmHead", Base::kHf, tensors([](StFile& f) { f.erase("lm_head.weight"); }), {"lm_head"}, kAll},
      // transformers' LlamaConfig defaults tie_word_embeddings to false: absent is untied.
      {"TieFieldAbsentWithoutLmHead", Base::kHf,
       [](Case& c, const std::string& m) {
         edit_config(m, [](json& j) { j.erase("tie_word_embeddings"); });
         tensors([](StFile& f) { f.erase("lm_head.weight"); })(c, m);
       },
       {"lm_head"}, {Cmd::kLogits, Cmd::kQuantize}},
      {"ExtraUnknownTensor", Base::kHf,
       tensors([](StFile& f) {
         f.tensors.push_back({"model.layers.0.mlp.extra_proj.weight", "BF16", {16, 256}, random_bf16(16 * 256, 31)});
       }),
       {"extra_proj"}, kAll},
      {"WrongDtypeI16", Base::kHf, tensors([](StFile& f) { f.find(kQ0)->dtype = "I16"; }), {"q_proj", "I16|dtype"},
       {Cmd::kLogits, Cmd::kRun, Cmd::kQuantize}},
      {"WrongDtypeF8InUnquantizedCheckpoint", Base::kHf,
       tensors([](StFile& f) {
         StTensor* t = f.find(kQ0);
         t->dtype = "F8_E4M3";
         t->shape = {256, 512};  // the same bytes, read as 8-bit
       }),
       {"q_proj"}, {Cmd::kLogits, Cmd::kQuantize}},
      {"ShapeOffByOne", Base::kHf,
       tensors([](StFile& f) {
         StTensor* t = f.find(kQ0);
         t->shape = {256, 257};
         t->data += random_bf16(256, 32);
       }),
       {"q_proj"}, kAll},
      {"EmbeddingRowsOffByOne", Base::kHf,
       tensors([](StFile& f) {
         StTensor* t = f.find("model.embed_tokens.weight");
         t->shape = {511, 256};
         t->data.resize(511 * 256 * 2);
       }),
       {"embed_tokens"}, {Cmd::kLogits, Cmd::kEval, Cmd::kQuantize}},
      {"NormLengthOffByOne", Base::kHf,
       tensors([](StFile& f) {
         StTensor* t = f.find("model.norm.weight");
         t->shape = {255};
         t->data.resize(255 * 2);
       }),
       {"model.norm"}, {Cmd::kLogits, Cmd::kQuantize}},
      {"MissingDownProj", Base::kHf, tensors([](StFile& f) { f.erase(layer_tensor(1, "mlp.down_proj")); }),
       {"model.layers.1.mlp.down_proj"}, {Cmd::kLogits, Cmd::kCalibrate, Cmd::kQuantize}},
      {"HeadDimDoubled", Base::kHf, config([](json& j) { j["head_dim"] = 64; }), {"q_proj|head_dim"},
       {Cmd::kLogits, Cmd::kQuantize}},
      {"AttentionBiasWithoutBiasTensors", Base::kHf, config([](json& j) { j["attention_bias"] = true; }),
       {"bias"}, {Cmd::kLogits, Cmd::kQuantize}},
      // ---- values out of range
      {"RopeThetaZero", Base::kHf, config([](json& j) { j["rope_theta"] = 0; }), {"config.json", "rope_theta"},
       {Cmd::kLogits, Cmd::kRun, Cmd::kQuantize}},
      {"RopeThetaNegative", Base::kHf, config([](json& j) { j["rope_theta"] = -10000.0; }),
       {"config.json", "rope_theta"}, kForward},
      {"RopeTheta1e300", Base::kHf, config([](json& j) { j["rope_theta"] = 1e300; }), {"config.json", "rope_theta"},
       kForward},
      {"RopeThetaOverflowsToInfinity", Base::kHf, config_raw("rope_theta", "1e400"),
       {"config.json", "rope_theta|1e400|overflow"}, kForward},
      {"RopeThetaNaNString", Base::kHf, config([](json& j) { j["rope_theta"] = "NaN"; }),
       {"config.json", "rope_theta"}, kForward},
      {"RopeThetaInfinityString", Base::kHf, config([](json& j) { j["rope_theta"] = "Infinity"; }),
       {"config.json", "rope_theta"}, {Cmd::kLogits}},
      {"RopeParametersThetaZero", Base::kHf,
       config([](json& j) {
         j.erase("rope_theta");
         j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 0.0}};
       }),
       {"config.json", "rope_theta"}, kForward},
      {"RmsNormEpsZero", Base::kHf, config([](json& j) { j["rms_norm_eps"] = 0.0; }), {"config.json", "rms_norm_eps"},
       {Cmd::kLogits, Cmd::kRun, Cmd::kQuantize}},
      {"RmsNormEpsFive", Base::kHf, config([](json& j) { j["rms_norm_eps"] = 5.0; }), {"config.json", "rms_norm_eps"},
       kForward},
      {"RmsNormEpsNegative", Base::kHf, config([](json& j) { j["rms_norm_eps"] = -1e-6; }),
       {"config.json", "rms_norm_eps"}, kForward},
      {"HiddenSizeNegative", Base::kHf, config([](json& j) { j["hidden_size"] = -256; }), {"config.json", "hidden_size|dim"},
       {Cmd::kLogits, Cmd::kQuantize}},
      {"VocabSizeZero", Base::kHf, config([](json& j) { j["vocab_size"] = 0; }), {"config.json", "vocab_size"},
       {Cmd::kLogits, Cmd::kQuantize}},
      {"AttentionHeadsZero", Base::kHf, config([](json& j) { j["num_attention_heads"] = 0; }),
       {"config.json", "num_attention_heads|n_heads"}, {Cmd::kLogits}},
      {"IntermediateSizeNegative", Base::kHf, config([](json& j) { j["intermediate_size"] = -768; }),
       {"config.json", "intermediate_size|hidden_dim"}, {Cmd::kLogits}},
      {"KvHeadsNotADivisor", Base::kHf, config([](json& j) { j["num_key_value_heads"] = 3; }),
       {"config.json", "num_key_value_heads|n_kv_heads"}, {Cmd::kLogits, Cmd::kQuantize}},
      {"MaxPositionZero", Base::kHf, config([](json& j) { j["max_position_embeddings"] = 0; }),
       {"config.json", "max_position_embeddings|max_seq_len"}, kForward},
      {"HeadDimOdd", Base::kHf, config([](json& j) { j["head_dim"] = 31; }), {"head_dim"}, {Cmd::kLogits}},
      // The first token every command feeds is BOS: an id past the vocabulary reads past the embedding.
      {"BosTokenIdEqualsVocab", Base::kHf, config([](json& j) { j["bos_token_id"] = 512; }),
       {"bos_token_id"}, {Cmd::kRun, Cmd::kEval, Cmd::kCalibrate}},
      {"BosTokenIdHuge", Base::kHf, config([](json& j) { j["bos_token_id"] = 2000000000; }),
       {"bos_token_id"}, {Cmd::kRun, Cmd::kCalibrate}},
      // ---- fields that change the computation and are not implemented: refused by name
      {"PartialRotaryFactor", Base::kHf, config([](json& j) { j["partial_rotary_factor"] = 0.5; }),
       {"partial_rotary_factor"}, {Cmd::kLogits, Cmd::kRun, Cmd::kEval}},
      {"RopeScalingLinear", Base::kHf,
       config([](json& j) { j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}}; }), {"rope_scaling", "linear"},
       kForward},
      {"RopeScalingYarnMscale", Base::kHf,
       config([](json& j) {
         j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 1024},
                              {"mscale_all_dim", 1.0}};
       }),
       {"mscale_all_dim"}, kForward},
      {"RopeParametersDynamic", Base::kHf,
       config([](json& j) {
         j.erase("rope_theta");
         j["rope_parameters"] = {{"rope_type", "dynamic"}, {"rope_theta", 10000.0}, {"factor", 2.0}};
       }),
       {"dynamic"}, {Cmd::kLogits}},
      {"HiddenActGelu", Base::kHf, config([](json& j) { j["hidden_act"] = "gelu"; }), {"hidden_act"},
       {Cmd::kLogits, Cmd::kQuantize}},
      {"MlpBias", Base::kHf, config([](json& j) { j["mlp_bias"] = true; }), {"mlp_bias"}, {Cmd::kLogits, Cmd::kQuantize}},
      {"QuantizationConfigAwqOnBf16Tensors", Base::kHf,
       config([](json& j) { j["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}}; }),
       {"quantization_config|awq"}, {Cmd::kLogits, Cmd::kRun, Cmd::kEval, Cmd::kQuantize}},
      {"ModelTypeGemma", Base::kHf, config([](json& j) { j["model_type"] = "gemma"; }), {"model_type"},
       {Cmd::kLogits, Cmd::kQuantize}},
      {"ModelTypeMissing", Base::kHf, config([](json& j) { j.erase("model_type"); }), {"model_type"},
       {Cmd::kLogits, Cmd::kQuantize}},
      // ---- config.json that is not a config
      {"ConfigIsAnArray", Base::kHf, [](Case&, const std::string& m) { write_bytes(m + "/config.json", "[1, 2]"); },
       {"config.json"}, {Cmd::kLogits, Cmd::kQuantize}},
      {"ConfigEmpty", Base::kHf, [](Case&, const std::string& m) { write_bytes(m + "/config.json", ""); }, {"config.json"},
       {Cmd::kLogits, Cmd::kQuantize}},
      {"ConfigTruncated", Base::kHf,
       [](Case&, const std::string& m) {
         const std::string text = read_bytes(m + "/config.json");
         write_bytes(m + "/config.json", text.substr(0, text.size() / 2));
       },
       {"config.json"}, {Cmd::kLogits, Cmd::kQuantize, Cmd::kRun}},
      {"ConfigMissing", Base::kHf, [](Case&, const std::string& m) { std::remove((m + "/config.json").c_str()); },
       {"config.json"}, {Cmd::kLogits, Cmd::kQuantize}},
      // ---- sliding windows: attention, whatever the prompt's length (not a cap on the context)
      {"MistralSlidingWindowWiderThanPrompt", Base::kHf,
       config([](json& j) {
         j["model_type"] = "mistral";
         j["sliding_window"] = 64;
       }),
       {}, {Cmd::kLogits, Cmd::kRun}, Want::kSucceeds},
      {"MistralSlidingWindowShorterThanPrompt", Base::kHf,
       config([](json& j) {
         j["model_type"] = "mistral";
         j["sliding_window"] = 2;
       }),
       {}, {Cmd::kLogits, Cmd::kRun}, Want::kSucceeds},
  };
  return table;
}

class ConfigMisread : public ::testing::TestWithParam<ModelCaseParam> {};
TEST_P(ConfigMisread, RefusedNamingTheField) { run_model_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Hostile, ConfigMisread, ::testing::ValuesIn(expand(config_cases())),
                         [](const auto& info) { return model_case_name(info.param); });

// Seeded token ids after BOS, long enough that RoPE's position matters.
std::string random_ids(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> id(3, 511);
  std::string s = "1";
  for (int i = 0; i < n; ++i) s += " " + std::to_string(id(rng));
  return s;
}

// transformers 5 writes rope_parameters (rope_theta and the scaling together) and no top-level
// rope_theta / rope_scaling. Read right, it is the same model as the transformers-4 config: the
// same logits to the byte; read as the defaults (theta 10000, no scaling) it is another model.
TEST(Hostile, Transformers5RopeParametersGiveTheLogitsOfTheTransformers4Config) {
  Case c;
  const json scaling = {{"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                        {"original_max_position_embeddings", 8192}};
  auto make = [&](const std::string& dir, const std::function<void(json&)>& edit) {
    c.add(Base::kHf, dir);
    edit_config(c.path(dir), [&](json& j) {
      j.erase("rope_theta");
      j.erase("rope_scaling");
      edit(j);
    });
  };
  make("t4", [&](json& j) {
    j["rope_theta"] = 500000.0;
    j["rope_scaling"] = scaling;
    j["rope_scaling"]["rope_type"] = "llama3";
  });
  make("t5", [&](json& j) {
    j["rope_parameters"] = scaling;
    j["rope_parameters"]["rope_type"] = "llama3";
    j["rope_parameters"]["rope_theta"] = 500000.0;
  });
  make("theta-only", [&](json& j) { j["rope_theta"] = 500000.0; });
  make("dropped", [](json&) {});
  const std::string ids = random_ids(15, 77);
  std::map<std::string, std::string> logits;
  std::string repro;
  for (const std::string m : {"t4", "t5", "theta-only", "dropped"}) {
    const RunResult r = c.succeeds({"logits", "--model", m, "--ids", ids, "-o", m + ".bin"});
    logits[m] = read_bytes(c.path(m + ".bin"));
    repro += r.repro() + "\n";
  }
  ASSERT_EQ(logits["t4"].size(), 16u * 512 * 4);
  EXPECT_TRUE(logits["t5"] == logits["t4"]) << "HOSTILE misread: rope_parameters (transformers 5) is not read as the "
                                                "same rope_theta + llama3 scaling of transformers 4\n" << repro;
  EXPECT_TRUE(logits["t5"] != logits["dropped"]) << "HOSTILE misread: rope_parameters changed nothing (read as "
                                                    "defaults)\n" << repro;
  EXPECT_TRUE(logits["t5"] != logits["theta-only"]) << "HOSTILE misread: the llama3 scaling inside rope_parameters "
                                                       "is ignored\n" << repro;
}

// rope_parameters of plain RoPE ("default"): rope_theta alone, as the transformers-4 field.
TEST(Hostile, Transformers5DefaultRopeParametersGiveTheLogitsOfTopLevelRopeTheta) {
  Case c;
  c.add(Base::kHf, "t4");
  c.add(Base::kHf, "t5");
  edit_config(c.path("t4"), [](json& j) { j["rope_theta"] = 250000.0; });
  edit_config(c.path("t5"), [](json& j) {
    j.erase("rope_theta");
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 250000.0}};
  });
  const std::string ids = random_ids(11, 78);
  c.succeeds({"logits", "--model", "t4", "--ids", ids, "-o", "t4.bin"});
  const RunResult r = c.succeeds({"logits", "--model", "t5", "--ids", ids, "-o", "t5.bin"});
  const std::string t4 = read_bytes(c.path("t4.bin")), t5 = read_bytes(c.path("t5.bin"));
  ASSERT_EQ(t4.size(), 12u * 512 * 4);
  EXPECT_TRUE(t4 == t5) << "HOSTILE misread: rope_parameters {rope_type: default, rope_theta} is not read as "
                           "rope_theta\n" << r.repro();
}

// `--model ""` is an empty path, not a request for the built-in model.
class EmptyModelPath : public ::testing::TestWithParam<Cmd> {};
TEST_P(EmptyModelPath, IsRefused) {
  Case c;
  c.refused(model_args(GetParam(), ""), {"--model"});
}
INSTANTIATE_TEST_SUITE_P(Hostile, EmptyModelPath, ::testing::ValuesIn(all_cmds()),
                         [](const auto& info) { return std::string(cmd_name(info.param)); });

// ---- token ids: parsed without wrapping, dropping or guessing

struct BadIds {
  const char* name;
  const char* text;
  const char* word;  // what the error must quote
};
const std::vector<BadIds>& bad_ids() {
  static const std::vector<BadIds> ids = {
      {"WrapsTo1", "1 4294967297", "4294967297"},
      {"WrapsTo0", "1 4294967296", "4294967296"},
      {"Int32Overflow", "1 2147483648", "2147483648"},
      {"Negative", "1 -4", "-4"},
      {"EqualsVocab", "1 512", "512"},
      {"Huge", "1 99999999999999999999", "99999999999999999999"},
      {"TrailingLetters", "1 7x", "7x"},
      {"PlusSign", "1 +7", "+7"},
      {"Comma", "1,7", "1,7"},
      {"Hex", "1 0x10", "0x10"},
      {"Fraction", "1 2.5", "2.5"},
      {"Word", "1 2 three", "three"},
  };
  return ids;
}

void PrintTo(const BadIds& b, std::ostream* os) { *os << b.name << " '" << b.text << "'"; }
class LogitsIds : public ::testing::TestWithParam<BadIds> {};
TEST_P(LogitsIds, AreRefusedNamingTheToken) {
  Case c;
  const std::string m = c.add(Base::kHf, "m");
  c.refused({"logits", "--model", m, "--ids", GetParam().text, "-o", "out.bin"}, {"--ids", GetParam().word});
}
INSTANTIATE_TEST_SUITE_P(Hostile, LogitsIds, ::testing::ValuesIn(bad_ids()),
                         [](const auto& info) { return std::string(info.param.name); });

class RunPromptIds : public ::testing::TestWithParam<BadIds> {};
TEST_P(RunPromptIds, AreRefusedNamingTheToken) {
  Case c;
  const std::string m = c.add(Base::kHf, "m");
  c.refused({"run", "--model", m, "--prompt-ids", GetParam().text, "-n", "16", "-t", "0", "--ids"},
            {"--prompt-ids", GetParam().word});
}
INSTANTIATE_TEST_SUITE_P(Hostile, RunPromptIds, ::testing::ValuesIn(bad_ids()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Hostile, LogitsEmptyIdsAreRefused) {
  Case c;
  const std::string m = c.add(Base::kHf, "m");
  c.refused({"logits", "--model", m, "--ids", " ", "-o", "out.bin"}, {"--ids"});
}

// A token-id data file with such an id, for eval and calibrate (no tokenizer beside the model, so
// the file cannot be taken for text either).
struct BadData {
  const char* name;
  const char* token;
  const char* words;  // alternatives
};
const std::vector<BadData>& bad_data() {
  static const std::vector<BadData> d = {
      {"WrapsTo1", "4294967297", "4294967297"},
      {"Int32Overflow", "2147483648", "2147483648"},
      {"Negative", "-3", "-3"},
      {"EqualsVocab", "512", "512"},
      {"Huge", "99999999999999999999", "99999999999999999999"},
      {"TrailingLetters", "7x", "7x|tokenizer"},
  };
  return d;
}
void PrintTo(const BadData& b, std::ostream* os) { *os << b.name << " '" << b.token << "'"; }
class DataFileIds : public ::testing::TestWithParam<std::tuple<BadData, Cmd>> {};
TEST_P(DataFileIds, AreRefusedNamingTheFileAndToken) {
  const auto& [bad, cmd] = GetParam();
  Case c;
  const std::string m = c.add(Base::kHf, "m");
  std::mt19937_64 rng(91);
  std::uniform_int_distribution<int> id(3, 511);
  std::string text;
  for (int i = 0; i < 9; ++i) text += std::to_string(id(rng)) + " ";
  write_bytes(c.path("d.txt"), text + bad.token + " " + std::to_string(id(rng)) + "\n");
  std::vector<std::string> args = {cmd_name(cmd), "--model", m, "--data", "d.txt"};
  if (cmd == Cmd::kCalibrate) args.insert(args.end(), {"-o", "calib-out.json"});
  c.refused(args, {"d.txt", bad.words});
}
INSTANTIATE_TEST_SUITE_P(Hostile, DataFileIds,
                         ::testing::Combine(::testing::ValuesIn(bad_data()), ::testing::Values(Cmd::kEval, Cmd::kCalibrate)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_" + cmd_name(std::get<1>(info.param));
                         });

// No sequence, so no token scored: a perplexity of nothing is an error, not a number.
TEST(Hostile, EvalOfAnEmptyDataFileIsRefused) {
  Case c;
  const std::string m = c.add(Base::kHf, "m");
  write_bytes(c.path("d.txt"), "\n  \n");
  c.refused({"eval", "--model", m, "--data", "d.txt"}, {"d.txt|no tokens|no sequence|zero"});
}

}  // namespace
}  // namespace llmq::hostile
