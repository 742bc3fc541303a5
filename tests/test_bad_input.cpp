// Bad input as a new user meets it: truncated shards, index files pointing elsewhere, shapes
// whose byte count overflows, checkpoints that disagree with their config.json, unknown model
// types, NaN/Inf weights and calibration statistics of another model. Each is an error naming the
// file, tensor or field, never a crash or a quietly wrong checkpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "llmq/calibration.hpp"
#include "llmq/quantize_tensor.hpp"
#include "llmq/export.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/model_io.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/safetensors.hpp"
#include "llmq/synthetic_checkpoint.hpp"
#include "support.hpp"

namespace llmq {
namespace {

namespace fs = std::filesystem;
using llmq::testing::TempDir;

void expect_error_mentions(const Status& st, const std::vector<std::string>& words) {
  ASSERT_FALSE(st.ok()) << "expected an error mentioning " << (words.empty() ? "" : words[0]);
  for (const std::string& w : words) EXPECT_NE(st.message().find(w), std::string::npos) << st.to_string() << "\n  lacks: " << w;
}

ModelConfig tiny_config(int64_t layers = 2) {
  ModelConfig c;
  EXPECT_TRUE(synthetic_model_config("tiny", &c).ok());
  c.n_layers = layers;
  return c;
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A checkpoint of `config`'s tensors in F32 with random values and outliers; `edit` may change an
// entry's dtype or shape, or poison its values, before it is written.
struct Edit {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;           // empty: the spec's
  std::vector<int64_t> nan_at, inf_at;  // flat indices
};

void write_checkpoint(const std::string& dir, const ModelConfig& config, const std::vector<Edit>& edits = {},
                      int64_t max_shard_bytes = int64_t{1} << 30) {
  fs::create_directories(dir);
  std::vector<SafetensorsWriteEntry> entries;
  uint64_t seed = 7;
  for (const HfTensorSpec& spec : hf_tensor_specs(config)) {
    SafetensorsWriteEntry e{spec.name, DType::kF32, spec.shape, nullptr, nullptr};
    Edit edit;
    for (const Edit& x : edits)
      if (x.name == spec.name) edit = x;
    if (!edit.name.empty()) {
      e.dtype = edit.dtype;
      if (!edit.shape.empty()) e.shape = edit.shape;
    }
    ++seed;
    e.fill = [shape = e.shape, dtype = e.dtype, edit, seed](uint8_t* dst) -> Status {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      const int64_t cols = shape.back();
      const std::vector<float> v = llmq::testing::outlier_matrix(n / cols, cols, seed);
      for (int64_t i = 0; i < n; ++i) {
        float x = v[static_cast<size_t>(i)];
        for (int64_t at : edit.nan_at) x = at == i ? std::nanf("") : x;
        for (int64_t at : edit.inf_at) x = at == i ? -INFINITY : x;
        if (dtype == DType::kF32) std::memcpy(dst + 4 * i, &x, 4);
        else if (dtype == DType::kI32) {
          const int32_t k = static_cast<int32_t>(x * 100);
          std::memcpy(dst + 4 * i, &k, 4);
        }
      }
      return {};
    };
    entries.push_back(std::move(e));
  }
  const auto shards = split_into_shards(std::move(entries), max_shard_bytes);
  nlohmann::json weight_map;
  for (size_t i = 0; i < shards.size(); ++i) {
    for (const auto& e : shards[i]) weight_map[e.name] = shard_file_name(i, shards.size());
    ASSERT_TRUE(write_safetensors(dir + "/" + shard_file_name(i, shards.size()), shards[i]).ok());
  }
  if (shards.size() > 1) write_text(dir + "/model.safetensors.index.json", nlohmann::json{{"weight_map", weight_map}}.dump());
  write_text(dir + "/config.json", hf_config_json(config));
}

// The shard files an index lists, in order.
std::vector<std::string> shard_files(const std::string& dir) {
  const nlohmann::json j = nlohmann::json::parse(read_text(dir + "/model.safetensors.index.json"));
  std::set<std::string> files;
  for (const auto& item : j["weight_map"].items()) files.insert(item.value().get<std::string>());
  return {files.begin(), files.end()};
}

Status open_source(const std::string& dir) {
  std::unique_ptr<WeightSource> src;
  return checkpoint_weight_source(dir, &src);
}

Status quantize_dir(const std::string& in, const std::string& out, const ExportOptions& options = {},
                    const CalibrationStats* stats = nullptr, ExportSummary* summary = nullptr) {
  std::unique_ptr<WeightSource> src;
  LLMQ_RETURN_IF_ERROR(checkpoint_weight_source(in, &src));
  Scheme scheme;
  LLMQ_RETURN_IF_ERROR(find_scheme(stats != nullptr ? "fp8-tensor-static" : "fp8-dynamic", &scheme));
  ExportSummary ignored;
  return export_quantized(*src, scheme, stats, out, options, summary != nullptr ? summary : &ignored);
}

TEST(BadUserInput, TruncatedShardIsNamedBeforeAnythingIsWritten) {
  TempDir dir;
  write_checkpoint(dir.file("in"), tiny_config(), {}, int64_t{1} << 20);
  const std::vector<std::string> shards = shard_files(dir.file("in"));
  ASSERT_GE(shards.size(), 3u);
  const std::string shard = dir.file("in") + "/" + shards[1];
  ASSERT_TRUE(open_source(dir.file("in")).ok());
  fs::resize_file(shard, fs::file_size(shard) - 100);
  expect_error_mentions(quantize_dir(dir.file("in"), dir.file("out")), {shard, "past the data section"});
  EXPECT_FALSE(fs::exists(dir.file("out")));
  EXPECT_FALSE(fs::exists(dir.file("out") + ".llmq-partial"));
}

TEST(BadUserInput, IndexFilesMayNotPointOutsideTheModelDirectory) {
  TempDir dir;
  write_checkpoint(dir.file("in"), tiny_config(), {}, int64_t{1} << 20);
  const std::string index = dir.file("in") + "/model.safetensors.index.json";
  nlohmann::json j = nlohmann::json::parse(read_text(index));
  const std::string first = j["weight_map"].begin().key();
  // A copy of a real shard outside the directory: only the path rule can refuse it.
  fs::copy_file(dir.file("in") + "/" + j["weight_map"][first].get<std::string>(), dir.file("outside.safetensors"));
  for (const std::string& target : {std::string("../outside.safetensors"), dir.file("outside.safetensors"),
                                    std::string("sub/../../outside.safetensors")}) {
    SCOPED_TRACE(target);
    nlohmann::json bad = j;
    bad["weight_map"][first] = target;
    write_text(index, bad.dump());
    expect_error_mentions(open_source(dir.file("in")), {index, target, "not a plain file name"});
  }
  write_text(index, j.dump());
  EXPECT_TRUE(open_source(dir.file("in")).ok());
}

// A header whose shape has an element count that fits int64 but a byte count that does not, or
// an element count that does not: refused, naming the tensor, not wrapped into a small size.
TEST(BadUserInput, ShapesWhoseSizeOverflowsAreRefused) {
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[2305843009213693952]", "F32"},          // 2^61 elements: 2^63 bytes
      {"[4294967296, 4294967296]", "BF16"},      // 2^64 elements
      {"[3037000500, 3037000500, 2]", "I8"},     // product past 2^63
  };
  for (const auto& [shape, dtype] : cases) {
    SCOPED_TRACE(shape);
    const std::string header = R"({"big.weight":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":[0,8]}})";
    std::ofstream out(dir.file("big.safetensors"), std::ios::binary);
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header << std::string(8, '\x11');
    out.close();
    std::unique_ptr<SafetensorsFile> file;
    expect_error_mentions(SafetensorsFile::open(dir.file("big.safetensors"), &file), {"'big.weight'", shape.substr(1, 5)});
  }
}

TEST(BadUserInput, CheckpointsThatDisagreeWithConfigJsonAreRefusedBeforeQuantizing) {
  const ModelConfig c = tiny_config();
  const std::string up = "model.layers.1.mlp.up_proj.weight";
  struct Case {
    const char* what;
    ModelConfig config;         // what config.json says
    std::vector<Edit> edits;    // how the tensors differ
    std::vector<std::string> mentions;
  };
  ModelConfig wider = c;
  wider.hidden_dim += 128;
  ModelConfig fewer = c;
  fewer.n_layers = 1;
  ModelConfig more = c;
  more.n_layers = 3;
  ModelConfig untied = c;
  untied.tie_embeddings = false;
  const std::vector<Case> cases = {
      {"intermediate_size differs", wider, {}, {"gate_proj.weight", "config.json implies", std::to_string(wider.hidden_dim)}},
      {"extra layer", fewer, {}, {"model.layers.1.", "num_hidden_layers is 1"}},
      {"missing layer", more, {}, {"model.layers.2.", "missing"}},
      {"integer weight", c, {{up, DType::kI32}}, {up, "int32"}},
      {"transposed weight", c, {{up, DType::kF32, {c.dim, c.hidden_dim}}}, {up, "has shape"}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    TempDir dir;
    write_checkpoint(dir.file("in"), c, k.edits);
    write_text(dir.file("in") + "/config.json", hf_config_json(k.config));
    expect_error_mentions(quantize_dir(dir.file("in"), dir.file("out")), k.mentions);
    EXPECT_FALSE(fs::exists(dir.file("out")));
  }
  // lm_head absent while config.json says the embeddings are not tied: a loader would start
  // lm_head from random weights.
  TempDir dir;
  ModelConfig tied = c;
  tied.tie_embeddings = true;
  write_checkpoint(dir.file("in"), tied);
  write_text(dir.file("in") + "/config.json", hf_config_json(untied));
  expect_error_mentions(quantize_dir(dir.file("in"), dir.file("out")), {"lm_head.weight", "tie_word_embeddings"});
  write_text(dir.file("in") + "/config.json", hf_config_json(tied));
  EXPECT_TRUE(quantize_dir(dir.file("in"), dir.file("out")).ok());
}

TEST(BadUserInput, UnknownModelTypeIsNamedWithTheSupportedOnes) {
  TempDir dir;
  write_checkpoint(dir.file("in"), tiny_config());
  nlohmann::json config = nlohmann::json::parse(read_text(dir.file("in") + "/config.json"));
  config["model_type"] = "gpt_neox";
  write_text(dir.file("in") + "/config.json", config.dump());
  expect_error_mentions(open_source(dir.file("in")), {"model_type", "gpt_neox", "llama"});
  ModelWeights w;
  expect_error_mentions(load_model(dir.file("in"), &w), {"model_type", "gpt_neox"});
}

TEST(BadUserInput, NonFiniteWeightsAreRefusedWithNameCountAndPosition) {
  const ModelConfig c = tiny_config();
  const std::string down = "model.layers.1.mlp.down_proj.weight";
  const int64_t cols = c.hidden_dim;
  const std::vector<int64_t> nans = {3 * cols + 5, 17, 9 * cols}, infs = {2 * cols + 1, 40 * cols + 7};
  TempDir dir;
  write_checkpoint(dir.file("in"), c, {{down, DType::kF32, {}, nans, infs}});
  const std::string first = "element 17 (row 0, col 17)";
  expect_error_mentions(quantize_dir(dir.file("in"), dir.file("out")), {down, "3 NaN", "2 Inf", first, "--nonfinite zero"});
  EXPECT_FALSE(fs::exists(dir.file("out")));
  ModelWeights w;
  expect_error_mentions(load_model(dir.file("in"), &w), {dir.file("in"), down, "3 NaN", "2 Inf"});

  // --nonfinite zero writes them as 0 and counts them; every other weight is quantized as usual.
  ExportOptions zero;
  zero.nonfinite = NonFinitePolicy::kZero;
  ExportSummary sum;
  const Status st = quantize_dir(dir.file("in"), dir.file("out"), zero, nullptr, &sum);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(sum.nonfinite_replaced, 5);
  std::unique_ptr<Checkpoint> out;
  ASSERT_TRUE(Checkpoint::open(dir.file("out"), &out).ok());
  TensorView codes;
  ASSERT_TRUE(out->view(down, &codes).ok());
  const auto* q = static_cast<const uint8_t*>(codes.data);
  for (int64_t i : nans) EXPECT_EQ(q[i] & 0x7F, 0) << i;
  for (int64_t i : infs) EXPECT_EQ(q[i] & 0x7F, 0) << i;
  EXPECT_NE(q[18] & 0x7F, 0);  // a neighbour keeps its value

  // In a tensor kept in high precision (the embedding), the same rule.
  TempDir dir2;
  write_checkpoint(dir2.file("in"), c, {{"model.embed_tokens.weight", DType::kF32, {}, {}, {c.dim * 5}}});
  expect_error_mentions(quantize_dir(dir2.file("in"), dir2.file("out")),
                        {"model.embed_tokens.weight", "0 NaN", "1 Inf", "row 5, col 0"});
}

TEST(BadUserInput, CalibrationStatisticsOfAnotherModelAreRefused) {
  DefaultModelOptions o;
  o.n_layers = 2;
  const ModelWeights model = make_default_model(o);
  std::vector<int32_t> tokens;
  std::mt19937 rng(5);
  for (int i = 0; i < 64; ++i) tokens.push_back(static_cast<int32_t>(rng() % model.config.vocab_size));
  CalibrationStats good;
  ASSERT_TRUE(calibrate(model, tokens, 32, &good).ok());
  ASSERT_TRUE(good.check_matches(model.config).ok());

  const std::string q = "model.layers.1.self_attn.q_proj";
  CalibrationStats extra_layer = good, narrow = good, negative = good, nan = good;
  extra_layer.linears["model.layers.7.self_attn.q_proj"] = good.linears.at(q);
  narrow.linears[q].in_features /= 2;
  narrow.linears[q].input_channel_absmax.resize(static_cast<size_t>(narrow.linears[q].in_features));
  narrow.linears[q].weight_channel_absmax.resize(static_cast<size_t>(narrow.linears[q].in_features));
  negative.linears[q].input_channel_absmax[3] = -1.0f;
  nan.linears[q].input_absmax = std::nan("");

  Scheme scheme;
  ASSERT_TRUE(find_scheme("fp8-tensor-static", &scheme).ok());
  const auto src = memory_weight_source(model);
  TempDir dir;
  const std::vector<std::pair<const CalibrationStats*, std::vector<std::string>>> cases = {
      {&extra_layer, {"model.layers.7.self_attn.q_proj", "2 layers"}},
      {&narrow, {q, std::to_string(narrow.linears[q].in_features) + " input channels", std::to_string(o.dim)}},
      {&negative, {q, "negative"}},
      {&nan, {q, "NaN"}},
  };
  for (const auto& [stats, mentions] : cases) {
    SCOPED_TRACE(mentions[0]);
    ExportSummary sum;
    expect_error_mentions(export_quantized(*src, scheme, stats, dir.file("out"), {}, &sum), mentions);
    QuantizedModel qm;
    expect_error_mentions(quantize_model(model, scheme, stats, {}, &qm), mentions);
    EXPECT_FALSE(fs::exists(dir.file("out")));
  }
  ExportSummary sum;
  EXPECT_TRUE(export_quantized(*src, scheme, &good, dir.file("out"), {}, &sum).ok());
}

TEST(BadUserInput, TokenIdsOutsideTheVocabularyNameFileAndLine) {
  TempDir dir;
  write_text(dir.file("ids.txt"), "1 2 3\n4 511 5\n");
  std::vector<std::vector<int32_t>> seqs;
  ASSERT_TRUE(read_token_sequences(dir.file("ids.txt"), 512, &seqs).ok());
  EXPECT_EQ(seqs.size(), 2u);
  for (const std::string& bad : {std::string("512"), std::string("-1"), std::string("99999999999999999999")}) {
    SCOPED_TRACE(bad);
    write_text(dir.file("ids.txt"), "1 2 3\n4 " + bad + " 5\n");
    expect_error_mentions(read_token_sequences(dir.file("ids.txt"), 512, &seqs), {dir.file("ids.txt") + ":2", bad});
  }
}

TEST(BadUserInput, ZeroAndNegativeGroupAndBlockSizesAreRefused) {
  const std::vector<float> x = llmq::testing::outlier_matrix(4, 256, 3);
  ScaleSet scales;
  for (int64_t g : {int64_t{0}, int64_t{-128}}) {
    SCOPED_TRACE(g);
    expect_error_mentions(compute_scale(matrix_view(x.data(), 4, 256), QuantSpec::per_group(DType::kE4M3, g), &scales),
                          {"group_size", std::to_string(g)});
    expect_error_mentions(compute_scale(matrix_view(x.data(), 4, 256), QuantSpec::per_block(DType::kE4M3, g, 128), &scales),
                          {"block"});
  }
  EXPECT_TRUE(compute_scale(matrix_view(x.data(), 4, 256), QuantSpec::per_group(DType::kE4M3, 128), &scales).ok());
}

}  // namespace
}  // namespace llmq
