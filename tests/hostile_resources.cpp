// The hostile-input suite (issue 21), part 2: inputs that crash, hang or exhaust memory or disk.
// Deep JSON wherever llmq reads JSON, counts that would allocate before a tensor is checked,
// FIFOs / devices / directories / symbolic-link loops in place of every input, quadratic or
// endless header walks, malformed safetensors framing, and weights whose forward pass is NaN.
// Each must end in a refusal naming the file (and field or tensor) within the time limit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "hostile_support.hpp"

namespace llmq::hostile {
namespace {

namespace fs = std::filesystem;

const char* const kNested = "nested|deep|depth";
const std::vector<Cmd> kAll = {Cmd::kRun, Cmd::kEval, Cmd::kCalibrate, Cmd::kLogits, Cmd::kQuantize};
// 100,000 levels: far past any recursion a parser could survive on an 8 MiB stack.
constexpr int64_t kDeep = 100000;

std::function<void(Case&, const std::string&)> config(std::function<void(json&)> edit) {
  return [edit](Case&, const std::string& model) { edit_config(model, edit); };
}

std::function<void(Case&, const std::string&)> tensors(std::function<void(StFile&)> edit) {
  return [edit](Case&, const std::string& model) {
    StFile f = read_safetensors(model + "/model.safetensors");
    edit(f);
    write_safetensors(model + "/model.safetensors", f);
  };
}

// Rewrite model.safetensors with `header_of(tensors' header)` as its header bytes.
std::function<void(Case&, const std::string&)> raw_header(std::function<std::string(const std::string&)> header_of) {
  return [header_of](Case&, const std::string& model) {
    const StFile f = read_safetensors(model + "/model.safetensors");
    write_safetensors_raw(model + "/model.safetensors", header_of(safetensors_header(f)), concat_data(f));
  };
}

std::function<void(Case&, const std::string&)> file_bytes(const std::string& rel, std::string bytes) {
  return [rel, bytes](Case&, const std::string& model) { write_bytes(model + "/" + rel, bytes); };
}

void add_tokenizer(const std::string& model) {
  const std::string& t = base_path(Base::kTokenizer);
  fs::copy_file(t + "/tokenizer.json", model + "/tokenizer.json", fs::copy_options::overwrite_existing);
  fs::copy_file(t + "/tokenizer_config.json", model + "/tokenizer_config.json", fs::copy_options::overwrite_existing);
}

// Commands that load the tokenizer beside the model: run printing text (no --ids), and eval /
// calibrate on a data file (d.txt, written by the case); quantize copies the tokenizer files into
// its output.
std::vector<std::string> tokenizer_args(Cmd c, const std::string& model) {
  switch (c) {
    case Cmd::kRun: return {"run", "--model", model, "--prompt-ids", "5 9 17", "-n", "8", "-t", "0"};
    case Cmd::kEval: return {"eval", "--model", model, "--data", "d.txt"};
    case Cmd::kCalibrate: return {"calibrate", "--model", model, "--data", "d.txt", "-o", "calib-out.json"};
    default: return model_args(c, model);
  }
}

void write_data(Case& c) {
  std::mt19937_64 rng(515);
  std::uniform_int_distribution<int> id(3, 509);
  std::string text;
  for (int line = 0; line < 2; ++line) {
    for (int i = 0; i < 10; ++i) text += std::to_string(id(rng)) + " ";
    text += "\n";
  }
  write_bytes(c.path("d.txt"), text);
}

// Commands reading calibration statistics (--stats) under a static scheme.
std::vector<std::string> stats_args(Cmd c, const std::string& model) {
  const std::string s = "fp8-tensor-static";
  switch (c) {
    case Cmd::kQuantize: return {"quantize", "--model", model, "--scheme", s, "--stats", "s.json", "-o", "quant-out"};
    case Cmd::kEval: return {"eval", "--model", model, "--scheme", s, "--stats", "s.json", "--samples", "1", "--length", "8"};
    case Cmd::kLogits: return {"logits", "--model", model, "--scheme", s, "--stats", "s.json", "--ids", "1 5 9", "-o", "l.bin"};
    case Cmd::kRun:
      return {"run", "--model", model, "--scheme", s, "--stats", "s.json", "--prompt-ids", "5 9", "-n", "8", "-t", "0", "--ids"};
    default: return model_args(c, model);
  }
}

// Commands reading a data file (--data).
std::vector<std::string> data_args(Cmd c, const std::string& model) {
  if (c == Cmd::kCalibrate) return {"calibrate", "--model", model, "--data", "d.txt", "-o", "calib-out.json"};
  return {"eval", "--model", model, "--data", "d.txt"};
}

// Commands reading a quantized checkpoint: logits --quantized, and eval of it against the
// unquantized model it came from (copied to b/).
std::vector<std::string> quantized_args(Cmd c, const std::string& model) {
  if (c == Cmd::kEval) return {"eval", "--model", "b", "--quantized", model, "--samples", "1", "--length", "8"};
  return {"logits", "--quantized", model, "--ids", "1 5 9 17", "-o", "l.bin"};
}

// The first / second shard of the sharded base.
std::string shard_path(const std::string& model, int index) {
  std::vector<std::string> shards;
  for (const auto& e : fs::directory_iterator(model)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("model-", 0) == 0 && n.size() > 12 && n.substr(n.size() - 12) == ".safetensors") shards.push_back(n);
  }
  std::sort(shards.begin(), shards.end());
  if (static_cast<int>(shards.size()) <= index) {
    ADD_FAILURE() << "HOSTILE setup: the sharded base has " << shards.size() << " shards";
    return model + "/missing-shard";
  }
  return model + "/" + shards[static_cast<size_t>(index)];
}

// ---- JSON nesting, and counts that would be allocated before any tensor is checked

const std::vector<ModelCase>& nesting_cases() {
  static const std::vector<ModelCase> table = {
      {"NestedConfigJson", Base::kHf, file_bytes("config.json", nested_json(kDeep)), {"config.json", kNested}, kAll},
      {"NestedConfigJsonInAField", Base::kHf,
       [](Case&, const std::string& m) {
         const std::string text = read_bytes(m + "/config.json");
         write_bytes(m + "/config.json", "{\"architectures\": " + nested_json(kDeep) + ", " + text.substr(text.find('{') + 1));
       },
       {"config.json", kNested}, {Cmd::kLogits, Cmd::kQuantize}},
      {"NestedConfigJsonObjects", Base::kHf, file_bytes("config.json", nested_json(kDeep, '{')), {"config.json", kNested},
       {Cmd::kLogits}},
      {"NestedIndexJson", Base::kSharded, file_bytes("model.safetensors.index.json", nested_json(kDeep)),
       {"index.json", kNested}, {Cmd::kLogits, Cmd::kQuantize, Cmd::kRun}},
      {"NestedIndexWeightMap", Base::kSharded,
       file_bytes("model.safetensors.index.json", "{\"metadata\": {}, \"weight_map\": " + nested_json(kDeep, '{') + "}"),
       {"index.json", kNested}, {Cmd::kLogits, Cmd::kQuantize}},
      {"NestedTokenizerJson", Base::kHf,
       [](Case& c, const std::string& m) {
         add_tokenizer(m);
         write_data(c);
         write_bytes(m + "/tokenizer.json", nested_json(kDeep));
       },
       {"tokenizer.json", kNested}, {Cmd::kRun, Cmd::kEval, Cmd::kCalibrate}, Want::kRefused, kTimeoutSeconds,
       tokenizer_args},
      {"NestedTokenizerConfigJson", Base::kHf,
       [](Case& c, const std::string& m) {
         add_tokenizer(m);
         write_data(c);
         write_bytes(m + "/tokenizer_config.json", nested_json(kDeep));
       },
       {"tokenizer_config.json", kNested}, {Cmd::kRun, Cmd::kEval}, Want::kRefused, kTimeoutSeconds, tokenizer_args},
      // quantize copies tokenizer files without reading them: refusing or copying are both fine.
      {"NestedTokenizerJsonCopied", Base::kHf,
       [](Case&, const std::string& m) {
         add_tokenizer(m);
         write_bytes(m + "/tokenizer.json", nested_json(kDeep));
       },
       {"tokenizer.json"}, {Cmd::kQuantize}, Want::kNoCrash},
      {"NestedStats", Base::kHf, [](Case& c, const std::string&) { write_bytes(c.path("s.json"), nested_json(kDeep)); },
       {"s.json", kNested}, {Cmd::kQuantize, Cmd::kEval, Cmd::kLogits, Cmd::kRun}, Want::kRefused, kTimeoutSeconds,
       stats_args},
      {"NestedStatsLinears", Base::kHf,
       [](Case& c, const std::string&) {
         write_bytes(c.path("s.json"),
                     "{\"format\": \"llmq-calibration-v1\", \"linears\": " + nested_json(kDeep, '{') + "}");
       },
       {"s.json", kNested}, {Cmd::kQuantize}, Want::kRefused, kTimeoutSeconds, stats_args},
      // A 3 MB safetensors header of nested arrays.
      {"NestedSafetensorsHeader", Base::kHf,
       raw_header([](const std::string&) { return "{\"x\": " + nested_json(1500000) + "}"; }),
       {"model.safetensors", kNested}, kAll},
      {"NestedSafetensorsMetadata", Base::kHf,
       raw_header([](const std::string& h) { return "{\"__metadata__\": {\"a\": " + nested_json(kDeep) + "}, " + h.substr(1); }),
       {"model.safetensors"}, {Cmd::kLogits, Cmd::kQuantize}},
      // ---- counts
      {"NumHiddenLayersBillion", Base::kHf, config([](json& j) { j["num_hidden_layers"] = 1000000000; }),
       {"num_hidden_layers|layers"}, kAll},
      {"VocabSize2Pow40", Base::kHf, config([](json& j) { j["vocab_size"] = int64_t{1} << 40; }),
       {"vocab_size|embed_tokens"}, {Cmd::kLogits, Cmd::kRun, Cmd::kEval, Cmd::kQuantize}},
      {"HiddenSize2Pow40", Base::kHf, config([](json& j) { j["hidden_size"] = int64_t{1} << 40; }),
       {"hidden_size|embed_tokens|dim"}, {Cmd::kLogits, Cmd::kQuantize}},
      {"IntermediateSize2Pow40", Base::kHf, config([](json& j) { j["intermediate_size"] = int64_t{1} << 40; }),
       {"intermediate_size|gate_proj|hidden_dim"}, {Cmd::kLogits, Cmd::kQuantize, Cmd::kCalibrate}},
      {"AttentionHeads2Pow30", Base::kHf,
       config([](json& j) {
         j["num_attention_heads"] = int64_t{1} << 30;
         j["num_key_value_heads"] = int64_t{1} << 30;
       }),
       {"heads|q_proj"}, {Cmd::kLogits, Cmd::kQuantize}},
      // A long context needs no allocation up front: running or refusing are both fine, in bounds.
      {"MaxPositionEmbeddings2Pow40", Base::kHf, config([](json& j) { j["max_position_embeddings"] = int64_t{1} << 40; }),
       {"max_position_embeddings|max_seq_len"}, {Cmd::kRun, Cmd::kLogits, Cmd::kEval, Cmd::kCalibrate}, Want::kNoCrash},
      {"NumLocalExpertsBillion", Base::kMoe, config([](json& j) { j["num_local_experts"] = 1000000000; }),
       {"num_local_experts|experts"}, {Cmd::kLogits, Cmd::kRun, Cmd::kQuantize}},
      {"NumExpertsPerTokBillion", Base::kMoe, config([](json& j) { j["num_experts_per_tok"] = 1000000000; }),
       {"num_experts_per_tok|experts_per_token"}, {Cmd::kLogits, Cmd::kRun}},
      {"NumLocalExpertsOneMoreThanTensors", Base::kMoe, config([](json& j) { j["num_local_experts"] = 9; }),
       {"block_sparse_moe|experts.8"}, {Cmd::kLogits, Cmd::kQuantize}},
  };
  return table;
}

class DepthAndCounts : public ::testing::TestWithParam<ModelCaseParam> {};
TEST_P(DepthAndCounts, RefusedWithoutOverflowingOrAllocating) { run_model_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Hostile, DepthAndCounts, ::testing::ValuesIn(expand(nesting_cases())),
                         [](const auto& info) { return model_case_name(info.param); });

// ---- calibration statistics that do not fit the model or hold impossible values

std::function<void(Case&, const std::string&)> stats(std::function<void(json&)> edit) {
  return [edit](Case& c, const std::string&) {
    c.add(Base::kStats, "s.json");
    json j = read_json_file(c.path("s.json"));
    edit(j);
    write_json_file(c.path("s.json"), j);
  };
}

// SmoothQuant reads the per-channel input absmax too.
std::vector<std::string> smoothquant_args(Cmd c, const std::string& model) {
  if (c == Cmd::kLogits)
    return {"logits", "--model", model, "--scheme", "fp8-smoothquant", "--stats", "s.json", "--ids", "1 5 9", "-o", "l.bin"};
  return {"quantize", "--model", model, "--scheme", "fp8-smoothquant", "--stats", "s.json", "-o", "quant-out"};
}

const std::string kQ0Stats = "model.layers.0.self_attn.q_proj";

const std::vector<ModelCase>& stats_cases() {
  static const std::vector<ModelCase> table = {
      {"StatsNegativeInputAbsmax", Base::kHf, stats([](json& j) { j["linears"][kQ0Stats]["input_absmax"] = -5.0; }),
       {"s.json", "input_absmax"}, {Cmd::kQuantize, Cmd::kLogits, Cmd::kEval, Cmd::kRun}, Want::kRefused,
       kTimeoutSeconds, stats_args},
      // All-zero inputs are possible (absmax 0); a zero scale must not turn into NaN output.
      {"StatsZeroInputAbsmax", Base::kHf, stats([](json& j) { j["linears"][kQ0Stats]["input_absmax"] = 0.0; }),
       {"s.json", "input_absmax"}, {Cmd::kLogits, Cmd::kQuantize}, Want::kNoCrash, kTimeoutSeconds, stats_args},
      {"StatsMissingLinear", Base::kHf, stats([](json& j) { j["linears"].erase("model.layers.1.mlp.down_proj"); }),
       {"s.json|--stats", "model.layers.1.mlp.down_proj"}, {Cmd::kQuantize, Cmd::kLogits}, Want::kRefused, kTimeoutSeconds,
       stats_args},
      {"StatsInFeaturesOfAnotherModel", Base::kHf, stats([](json& j) { j["linears"][kQ0Stats]["in_features"] = 128; }),
       {"s.json", "q_proj|in_features"}, {Cmd::kQuantize, Cmd::kLogits}, Want::kRefused, kTimeoutSeconds, stats_args},
      {"StatsChannelAbsmaxOneShort", Base::kHf,
       stats([](json& j) {
         json& v = j["linears"][kQ0Stats]["input_channel_absmax"];
         v.erase(v.size() - 1);
       }),
       {"s.json", "q_proj|input_channel_absmax"}, {Cmd::kQuantize, Cmd::kLogits}, Want::kRefused, kTimeoutSeconds,
       smoothquant_args},
      {"StatsWrongFormat", Base::kHf, stats([](json& j) { j["format"] = "someone-elses-stats-v9"; }), {"s.json", "format"},
       {Cmd::kQuantize, Cmd::kEval}, Want::kRefused, kTimeoutSeconds, stats_args},
  };
  return table;
}

class Stats : public ::testing::TestWithParam<ModelCaseParam> {};
TEST_P(Stats, RefusedNamingTheFileAndLinear) { run_model_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Hostile, Stats, ::testing::ValuesIn(expand(stats_cases())),
                         [](const auto& info) { return model_case_name(info.param); });

// ---- special files in place of every input

struct Role {
  const char* name;
  Base base;
  const char* word;  // the file the error must name
  std::vector<Cmd> cmds;
  std::function<std::string(Case&, const std::string& model)> target;  // where the special file goes
  std::function<std::vector<std::string>(Cmd, const std::string&)> args;
};

const std::vector<Role>& roles() {
  static const std::vector<Role> r = {
      {"ModelFile", Base::kLlama2c, "model.bin", kAll, [](Case&, const std::string& m) { return m; }, nullptr},
      {"ConfigJson", Base::kHf, "config.json", {Cmd::kLogits, Cmd::kQuantize, Cmd::kRun},
       [](Case&, const std::string& m) { return m + "/config.json"; }, nullptr},
      {"Weights", Base::kHf, "model.safetensors", {Cmd::kLogits, Cmd::kQuantize, Cmd::kEval},
       [](Case&, const std::string& m) { return m + "/model.safetensors"; }, nullptr},
      {"Shard", Base::kSharded, "model-00002-of-", {Cmd::kLogits, Cmd::kQuantize},
       [](Case&, const std::string& m) { return shard_path(m, 1); }, nullptr},
      {"Index", Base::kSharded, "model.safetensors.index.json", {Cmd::kLogits, Cmd::kQuantize},
       [](Case&, const std::string& m) { return m + "/model.safetensors.index.json"; }, nullptr},
      {"Tokenizer", Base::kHf, "tokenizer.json", {Cmd::kRun, Cmd::kEval, Cmd::kQuantize},
       [](Case& c, const std::string& m) {
         add_tokenizer(m);
         write_data(c);
         return m + "/tokenizer.json";
       },
       tokenizer_args},
      {"TokenizerConfig", Base::kHf, "tokenizer_config.json", {Cmd::kRun, Cmd::kQuantize},
       [](Case&, const std::string& m) {
         add_tokenizer(m);
         return m + "/tokenizer_config.json";
       },
       tokenizer_args},
      {"SpecialTokensMap", Base::kHf, "special_tokens_map.json", {Cmd::kQuantize},
       [](Case&, const std::string& m) { return m + "/special_tokens_map.json"; }, nullptr},
      {"Stats", Base::kHf, "s.json", {Cmd::kQuantize, Cmd::kEval},
       [](Case& c, const std::string&) { return c.path("s.json"); }, stats_args},
      {"Data", Base::kHf, "d.txt", {Cmd::kEval, Cmd::kCalibrate},
       [](Case& c, const std::string&) { return c.path("d.txt"); }, data_args},
  };
  return r;
}

struct SpecialParam {
  const Role* role;
  Special kind;
  Cmd cmd;
};
std::vector<SpecialParam> special_params() {
  std::vector<SpecialParam> out;
  for (const Role& r : roles())
    for (Special k : {Special::kFifo, Special::kDevZero, Special::kDirectory, Special::kSymlinkLoop}) {
      // A directory given as --model is a Hugging Face checkpoint: another case entirely.
      if (k == Special::kDirectory && r.base == Base::kLlama2c) continue;
      for (Cmd c : r.cmds) out.push_back({&r, k, c});
    }
  return out;
}

void PrintTo(const SpecialParam& p, std::ostream* os) {
  *os << p.role->name << "_" << special_name(p.kind) << "_" << cmd_name(p.cmd);
}

class SpecialFile : public ::testing::TestWithParam<SpecialParam> {};
TEST_P(SpecialFile, IsRefusedByKindWithoutBlockingOrReading) {
  const SpecialParam& p = GetParam();
  Case c;
  const std::string rel = c.add(p.role->base, model_rel(p.role->base));
  make_special(p.role->target(c, c.path(rel)), p.kind);
  const auto args = p.role->args ? p.role->args(p.cmd, rel) : model_args(p.cmd, rel);
  c.refused(args, {p.role->word, special_words(p.kind)}, kShortTimeoutSeconds);
}
INSTANTIATE_TEST_SUITE_P(Hostile, SpecialFile, ::testing::ValuesIn(special_params()), [](const auto& info) {
  return std::string(info.param.role->name) + "_" + special_name(info.param.kind) + "_" + cmd_name(info.param.cmd);
});

// ---- safetensors framing and weights

constexpr uint16_t kBf16NaN = 0x7FC0, kBf16Inf = 0x7F80, kBf16Huge = 0x7F7F;  // 0x7F7F ~ 3.39e38

// One value at a seeded position.
std::function<void(StFile&)> poison(const std::string& tensor, uint16_t bits, uint64_t seed) {
  return [tensor, bits, seed](StFile& f) {
    StTensor* t = f.find(tensor);
    if (t == nullptr) return;
    std::mt19937_64 rng(seed);
    set_bf16(t, static_cast<int64_t>(rng() % (t->data.size() / 2)), bits);
  };
}

std::string le64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

const std::vector<ModelCase>& safetensors_cases() {
  static const std::vector<ModelCase> table = {
      // Header parsing must be linear: 200,000 one-float tensors (a 14 MB header) in seconds.
      {"TwoHundredThousandTensors", Base::kHf,
       tensors([](StFile& f) {
         const float one = 1.5f;
         for (int i = 0; i < 200000; ++i)
           f.tensors.push_back({"extra." + std::to_string(i), "F32", {1}, std::string(reinterpret_cast<const char*>(&one), 4)});
       }),
       {"extra."}, {Cmd::kLogits, Cmd::kQuantize}, Want::kRefused, kShortTimeoutSeconds},
      // Zero bytes, 2^40 rows: anything that walks rows (or row blocks) never ends.
      {"ZeroByteTensorWithHugeFirstDimension", Base::kHf,
       tensors([](StFile& f) { f.tensors.push_back({"model.layers.0.mlp.zero_huge.weight", "BF16", {int64_t{1} << 40, 0}, ""}); }),
       {"zero_huge"}, {Cmd::kLogits, Cmd::kQuantize, Cmd::kRun}, Want::kNoCrash, kShortTimeoutSeconds},
      {"ZeroByteTensorInPlaceOfQProj", Base::kHf,
       tensors([](StFile& f) {
         StTensor* t = f.find("model.layers.0.self_attn.q_proj.weight");
         t->shape = {int64_t{1} << 40, 0};
         t->data.clear();
       }),
       {"q_proj"}, {Cmd::kLogits, Cmd::kQuantize}, Want::kRefused, kShortTimeoutSeconds},
      {"InvalidUtf8TensorName", Base::kHf,
       raw_header([](const std::string& h) {
         const std::string bad = "{\"model.layers.0.\xff\xfe.weight\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},";
         return bad + h.substr(1);
       }),
       {"model.safetensors", "UTF-8|utf8"}, {Cmd::kLogits, Cmd::kQuantize}},
      // The reference (huggingface/safetensors, read_metadata -> serde_json::from_str) accepts only
      // JSON whitespace around the header object; anything else inside the declared length is an error.
      {"TrailingLetterInHeader", Base::kHf, raw_header([](const std::string& h) { return h + "x"; }),
       {"model.safetensors"}, {Cmd::kLogits, Cmd::kQuantize}},
      {"TrailingNulPaddingInHeader", Base::kHf, raw_header([](const std::string& h) { return h + std::string(5, '\0'); }),
       {"model.safetensors"}, {Cmd::kLogits, Cmd::kQuantize}},
      {"TrailingSecondObjectInHeader", Base::kHf, raw_header([](const std::string& h) { return h + " {}"; }),
       {"model.safetensors"}, {Cmd::kLogits}},
      {"HeaderLengthPastEndOfFile", Base::kHf,
       [](Case&, const std::string& m) {
         std::string bytes = read_bytes(m + "/model.safetensors");
         const std::string len = le64(bytes.size());
         bytes.replace(0, 8, len);
         write_bytes(m + "/model.safetensors", bytes);
       },
       {"model.safetensors"}, {Cmd::kLogits, Cmd::kQuantize, Cmd::kRun}},
      {"HeaderLength2Pow62", Base::kHf,
       [](Case&, const std::string& m) {
         std::string bytes = read_bytes(m + "/model.safetensors");
         bytes.replace(0, 8, le64(uint64_t{1} << 62));
         write_bytes(m + "/model.safetensors", bytes);
       },
       {"model.safetensors"}, {Cmd::kLogits, Cmd::kQuantize}},
      {"HeaderLengthZero", Base::kHf,
       [](Case&, const std::string& m) {
         std::string bytes = read_bytes(m + "/model.safetensors");
         bytes.replace(0, 8, le64(0));
         write_bytes(m + "/model.safetensors", bytes);
       },
       {"model.safetensors"}, {Cmd::kLogits}},
      {"TruncatedWeights", Base::kHf,
       [](Case&, const std::string& m) {
         const std::string bytes = read_bytes(m + "/model.safetensors");
         write_bytes(m + "/model.safetensors", bytes.substr(0, bytes.size() - 1000));
       },
       {"model.safetensors"}, {Cmd::kLogits, Cmd::kQuantize, Cmd::kRun}},
      {"WeightsFileOfFourBytes", Base::kHf, file_bytes("model.safetensors", std::string("\x10\x00\x00\x00", 4)),
       {"model.safetensors"}, {Cmd::kLogits, Cmd::kQuantize}},
      {"WeightsFileEmpty", Base::kHf, file_bytes("model.safetensors", ""), {"model.safetensors"},
       {Cmd::kLogits, Cmd::kQuantize}},
      {"PaddedWeights", Base::kHf,
       [](Case&, const std::string& m) {
         write_bytes(m + "/model.safetensors", read_bytes(m + "/model.safetensors") + std::string(64, '\x5a'));
       },
       {"model.safetensors"}, {Cmd::kLogits}},
      // Shard names in the index are plain file names: "../x" would read outside the checkpoint.
      {"IndexShardOutsideTheCheckpoint", Base::kSharded,
       [](Case& c, const std::string& m) {
         const std::string shard = shard_path(m, 1);
         fs::copy_file(shard, c.path("outside.safetensors"));
         const std::string name = fs::path(shard).filename().string();
         json index = read_json_file(m + "/model.safetensors.index.json");
         for (auto& [tensor, file] : index["weight_map"].items())
           if (file == name) file = "../outside.safetensors";
         write_json_file(m + "/model.safetensors.index.json", index);
         fs::remove(shard);
       },
       {"outside.safetensors"}, {Cmd::kLogits, Cmd::kQuantize}},
      {"ShardMissing", Base::kSharded, [](Case&, const std::string& m) { fs::remove(shard_path(m, 1)); },
       {"model-00002-of-"}, {Cmd::kLogits, Cmd::kQuantize}},
      // ---- weights
      {"NaNInQProj", Base::kHf, tensors(poison(layer_tensor(1, "self_attn.q_proj"), kBf16NaN, 5)),
       {"model.layers.1.self_attn.q_proj.weight", "NaN|finite"}, kAll},
      {"InfInFinalNorm", Base::kHf, tensors(poison("model.norm.weight", kBf16Inf, 6)),
       {"model.norm.weight", "Inf|finite"}, {Cmd::kLogits, Cmd::kRun, Cmd::kQuantize}},
      {"NaNInEmbedding", Base::kHf, tensors(poison("model.embed_tokens.weight", kBf16NaN, 7)),
       {"embed_tokens", "NaN|finite"}, {Cmd::kLogits, Cmd::kEval, Cmd::kQuantize}},
      // Finite weights whose forward pass overflows: every norm gain near the BF16 maximum.
      {"NormGainsOverflowTheForwardPass", Base::kHf,
       tensors([](StFile& f) {
         for (auto& t : f.tensors)
           if (t.name.find("norm") != std::string::npos)
             for (int64_t i = 0; i < static_cast<int64_t>(t.data.size() / 2); ++i) set_bf16(&t, i, kBf16Huge);
       }),
       {"NaN|Inf|finite|overflow"}, {Cmd::kLogits, Cmd::kRun, Cmd::kEval, Cmd::kCalibrate}},
      // An all-zero lm_head: every logit 0, a uniform distribution that is no model's output.
      {"ZeroLmHeadGivesConstantLogits", Base::kHf,
       tensors([](StFile& f) {
         StTensor* t = f.find("lm_head.weight");
         if (t != nullptr) std::fill(t->data.begin(), t->data.end(), '\0');
       }),
       {"constant|degenerate|lm_head"}, {Cmd::kLogits, Cmd::kRun, Cmd::kEval}},
      // ---- llama2.c files
      {"Llama2cTruncated", Base::kLlama2c,
       [](Case&, const std::string& m) {
         const std::string bytes = read_bytes(m);
         write_bytes(m, bytes.substr(0, bytes.size() - 100));
       },
       {"model.bin"}, {Cmd::kLogits, Cmd::kRun, Cmd::kQuantize}},
      {"Llama2cNaNWeight", Base::kLlama2c,
       [](Case&, const std::string& m) {
         std::string bytes = read_bytes(m);
         const float nan = std::nanf("");
         std::memcpy(&bytes[28 + 4 * (128 * 64 + 2 * 64 + 1000)], &nan, 4);  // inside layer 0's wq
         write_bytes(m, bytes);
       },
       {"model.bin", "NaN|finite"}, kAll},
      {"Llama2cLayerCount2Pow30", Base::kLlama2c,
       [](Case&, const std::string& m) {
         std::string bytes = read_bytes(m);
         const int32_t layers = 1 << 30;
         std::memcpy(&bytes[8], &layers, 4);
         write_bytes(m, bytes);
       },
       {"model.bin", "n_layers"}, {Cmd::kLogits, Cmd::kQuantize}},
      {"Llama2cVocab2Pow30", Base::kLlama2c,
       [](Case&, const std::string& m) {
         std::string bytes = read_bytes(m);
         const int32_t vocab = 1 << 30;
         std::memcpy(&bytes[20], &vocab, 4);
         write_bytes(m, bytes);
       },
       {"model.bin"}, {Cmd::kLogits, Cmd::kRun}},
  };
  return table;
}

class Safetensors : public ::testing::TestWithParam<ModelCaseParam> {};
TEST_P(Safetensors, RefusedNamingTheFileOrTensor) { run_model_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Hostile, Safetensors, ::testing::ValuesIn(expand(safetensors_cases())),
                         [](const auto& info) { return model_case_name(info.param); });

// ---- quantized checkpoints (logits --quantized; eval against the model they came from)

std::function<void(Case&, const std::string&)> with_base(std::function<void(Case&, const std::string&)> edit) {
  return [edit](Case& c, const std::string& m) {
    c.add(Base::kHf, "b");
    edit(c, m);
  };
}

const std::string kScale = "model.layers.0.self_attn.q_proj.weight_scale";

const std::vector<ModelCase>& quantized_cases() {
  const std::vector<Cmd> both = {Cmd::kLogits, Cmd::kEval};
  static const std::vector<ModelCase> table = {
      {"QuantizedNaNWeightScale", Base::kQuantized,
       with_base(tensors([](StFile& f) {
         StTensor* t = f.find(kScale);
         const float nan = std::nanf("");
         if (t != nullptr) std::memcpy(&t->data[40], &nan, 4);
       })),
       {"weight_scale", "NaN|finite"}, both, Want::kRefused, kTimeoutSeconds, quantized_args},
      {"QuantizedMissingWeightScale", Base::kQuantized, with_base(tensors([](StFile& f) { f.erase(kScale); })),
       {"weight_scale"}, both, Want::kRefused, kTimeoutSeconds, quantized_args},
      {"QuantizedWeightScaleShapeOffByOne", Base::kQuantized,
       with_base(tensors([](StFile& f) {
         StTensor* t = f.find(kScale);
         if (t == nullptr) return;
         t->shape = {255, 1};
         t->data.resize(255 * 4);
       })),
       {"weight_scale"}, {Cmd::kLogits}, Want::kRefused, kTimeoutSeconds, quantized_args},
      {"QuantizedFewerLayersThanCheckpoint", Base::kQuantized,
       with_base(config([](json& j) { j["num_hidden_layers"] = 1; })), {"layers.1|layer 1"}, both, Want::kRefused,
       kTimeoutSeconds, quantized_args},
      {"QuantizedNestedConfig", Base::kQuantized, with_base(file_bytes("config.json", nested_json(kDeep))),
       {"config.json", kNested}, both, Want::kRefused, kTimeoutSeconds, quantized_args},
      {"QuantizedNestedQuantizationConfig", Base::kQuantized,
       with_base(config([](json& j) { j["quantization_config"]["config_groups"] = json::array(); })),
       {"config_groups|quantization_config"}, {Cmd::kLogits}, Want::kRefused, kTimeoutSeconds, quantized_args},
      {"QuantizedFifoWeights", Base::kQuantized,
       with_base([](Case&, const std::string& m) { make_special(m + "/model.safetensors", Special::kFifo); }),
       {"model.safetensors", "FIFO|named pipe"}, both, Want::kRefused, kShortTimeoutSeconds, quantized_args},
      {"QuantizedNestedHeader", Base::kQuantized,
       with_base(raw_header([](const std::string&) { return "{\"x\": " + nested_json(kDeep) + "}"; })),
       {"model.safetensors", kNested}, {Cmd::kLogits}, Want::kRefused, kTimeoutSeconds, quantized_args},
  };
  return table;
}

class Quantized : public ::testing::TestWithParam<ModelCaseParam> {};
TEST_P(Quantized, CheckpointRefusedNamingTheFileOrTensor) { run_model_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Hostile, Quantized, ::testing::ValuesIn(expand(quantized_cases())),
                         [](const auto& info) { return model_case_name(info.param); });

// ---- what the reference accepts must be read, and as the same model. huggingface/safetensors
// parses the header with serde_json::from_str, which skips JSON whitespace (space, tab, LF, CR)
// around the object: trailing whitespace is accepted by every release (its test
// test_whitespace_padded_header pads with "\r \t\n"), leading whitespace since 0.4.0 (the '{'
// check was commented out) and by explicit design since #686 (test_whitespace_leading_padded_header).
// Only other bytes inside the declared length (a letter, NUL padding) are errors (cases above).
struct Padding {
  const char* name;
  const char* before;
  const char* after;
};
void PrintTo(const Padding& p, std::ostream* os) { *os << p.name; }
class HeaderWhitespace : public ::testing::TestWithParam<Padding> {};
TEST_P(HeaderWhitespace, IsAcceptedAsTheSameModel) {
  const Padding& pad = GetParam();
  Case c;
  c.add(Base::kHf, "ref");
  c.add(Base::kHf, "m");
  const StFile f = read_safetensors(c.path("m/model.safetensors"));
  write_safetensors_raw(c.path("m/model.safetensors"), pad.before + safetensors_header(f) + pad.after, concat_data(f));
  const std::string ids = "1 300 17 42 511 3";
  c.succeeds({"logits", "--model", "ref", "--ids", ids, "-o", "ref.bin"});
  const RunResult r = c.succeeds({"logits", "--model", "m", "--ids", ids, "-o", "m.bin"});
  if (r.exited && r.code == 0)
    EXPECT_TRUE(read_bytes(c.path("m.bin")) == read_bytes(c.path("ref.bin"))) << "HOSTILE misread\n" << r.repro();
}
INSTANTIATE_TEST_SUITE_P(Hostile, HeaderWhitespace,
                         ::testing::Values(Padding{"TrailingSpaces", "", "        "}, Padding{"TrailingNewline", "", "\n"},
                                           Padding{"TrailingTab", "", "\t"}, Padding{"TrailingCrLf", "", "\r\n"},
                                           Padding{"LeadingTabNewline", "\t\n", ""}),
                         [](const auto& info) { return std::string(info.param.name); });

// Paths the filesystem library throws on (a name longer than NAME_MAX): an error, not an abort.
class OverlongPath : public ::testing::TestWithParam<Cmd> {};
TEST_P(OverlongPath, IsAnErrorNotAnAbort) {
  Case c;
  // One component past NAME_MAX (255): stat() fails with ENAMETOOLONG, not ENOENT.
  const std::string path(300, 'm');
  c.refused(model_args(GetParam(), path), {"too long|exist"});
}
INSTANTIATE_TEST_SUITE_P(Hostile, OverlongPath, ::testing::ValuesIn(std::vector<Cmd>{Cmd::kRun, Cmd::kLogits, Cmd::kQuantize, Cmd::kEval, Cmd::kCalibrate}),
                         [](const auto& info) { return std::string(cmd_name(info.param)); });

// bench reads a checkpoint only on the GPU; a CPU build refuses before reading it. Either way: a
// plain refusal, never a hang on a FIFO or a run of the truncated model.
TEST(Hostile, BenchOnAFifoConfig) {
  Case c;
  c.add(Base::kHf, "m");
  make_special(c.path("m/config.json"), Special::kFifo);
  c.refused({"bench", "e2e", "--model", "m", "--precision", "bf16", "--batch", "1", "--context", "16", "--prefill", "16"},
            {"CUDA|FIFO|named pipe"}, kShortTimeoutSeconds);
}

TEST(Hostile, BenchOnAConfigWithFewerLayersThanTheCheckpoint) {
  Case c;
  c.add(Base::kHf, "m");
  edit_config(c.path("m"), [](json& j) { j["num_hidden_layers"] = 1; });
  c.refused({"bench", "e2e", "--model", "m", "--precision", "bf16", "--batch", "1", "--context", "16", "--prefill", "16"},
            {"CUDA|layers.1|layer 1"});
}

}  // namespace
}  // namespace llmq::hostile
