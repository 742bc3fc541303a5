// The checked way in (issue 21), at the library level: bounded reading of every input (regular
// files only, JSON depth capped), safetensors headers read as strictly as the reference
// implementation and in linear time, one config-vs-tensor check shared by every loader, token
// ids parsed without wrapping, and outputs that are not a model's answer (NaN/Inf or constant
// logits, a perplexity of nothing) refused. The CLI-level cases are in test_hostile_inputs.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include <nlohmann/json.hpp>

#include "llmq/evaluate.hpp"
#include "llmq/export.hpp"
#include "llmq/model_io.hpp"
#include "llmq/nonfinite.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/safetensors.hpp"
#include "llmq/synthetic_checkpoint.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/transformer.hpp"
#include "model/checkpoint/input_file.hpp"
#include "support.hpp"

namespace llmq {
namespace {

namespace fs = std::filesystem;
using llmq::testing::TempDir;

void expect_error_mentions(const Status& st, const std::vector<std::string>& words) {
  ASSERT_FALSE(st.ok()) << "expected an error mentioning " << (words.empty() ? "" : words[0]);
  for (const std::string& w : words)
    EXPECT_NE(st.message().find(w), std::string::npos) << st.to_string() << "\n  lacks: " << w;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// A safetensors file whose header is exactly `header` (its declared length included every byte).
std::string safetensors_with_header(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

Status parse_bytes(const std::string& file, SafetensorsHeader* h) {
  return parse_safetensors_header("mem.safetensors", reinterpret_cast<const uint8_t*>(file.data()),
                                  static_cast<int64_t>(file.size()), h);
}

const std::string kOneTensor = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
const std::string kFourBytes("\x01\x02\x03\x04", 4);

// The reference implementation parses the header with serde_json, which skips JSON whitespace
// (space, tab, CR, LF) around the object; every other byte inside the declared length is an error.
TEST(SafetensorsStrict, OnlyJsonWhitespaceMaySurroundTheHeaderObject) {
  SafetensorsHeader h;
  for (const std::string& pad : {std::string("    "), std::string("\r \t\n")}) {
    ASSERT_TRUE(parse_bytes(safetensors_with_header(kOneTensor + pad, kFourBytes), &h).ok());
    ASSERT_TRUE(parse_bytes(safetensors_with_header(pad + kOneTensor, kFourBytes), &h).ok());
    EXPECT_EQ(h.tensors.size(), 1u);
  }
  for (const std::string& tail : {std::string(1, '\0'), std::string("x"), std::string("}"), std::string(" {}"),
                                  std::string("\f"), std::string("\v")}) {
    SCOPED_TRACE("tail bytes of length " + std::to_string(tail.size()));
    expect_error_mentions(parse_bytes(safetensors_with_header(kOneTensor + tail, kFourBytes), &h), {"mem.safetensors"});
  }
  expect_error_mentions(parse_bytes(safetensors_with_header(std::string(1, '\0') + kOneTensor, kFourBytes), &h),
                        {"'{'"});
}

TEST(SafetensorsStrict, InvalidUtf8InANameIsRefused) {
  SafetensorsHeader h;
  const std::string bad = "{\"w\xff\xfe\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
  expect_error_mentions(parse_bytes(safetensors_with_header(bad, kFourBytes), &h), {"mem.safetensors", "JSON"});
}

TEST(SafetensorsStrict, DeepNestingIsRefusedBeforeTheParserRecurses) {
  SafetensorsHeader h;
  const int64_t depth = 1000000;  // a 2 MB header that would overflow a recursive walk
  const std::string nested = "{\"w\":" + std::string(static_cast<size_t>(depth), '[') +
                             std::string(static_cast<size_t>(depth), ']') + "}";
  expect_error_mentions(parse_bytes(safetensors_with_header(nested), &h), {"mem.safetensors", "nested"});
}

// 200000 tensors: the header is parsed in n log n (an ordered_json object searches its keys
// linearly on each insert, which took minutes at this size). Correctness is asserted here; the
// time bound is the hostile-input suite's timeout.
TEST(SafetensorsStrict, HeadersWithManyTensorsParse) {
  const int64_t n = 200000;
  std::string header = "{";
  for (int64_t i = 0; i < n; ++i)
    header += (i ? "," : "") + std::string("\"t") + std::to_string(i) + "\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}";
  header += "}";
  SafetensorsHeader h;
  const Status st = parse_bytes(safetensors_with_header(header), &h);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(static_cast<int64_t>(h.tensors.size()), n);
}

TEST(SafetensorsStrict, AZeroByteTensorWithAHugeFirstDimensionIsWrittenAtOnce) {
  TempDir dir;
  SafetensorsWriteEntry e;
  e.name = "empty";
  e.dtype = DType::kF32;
  e.shape = {int64_t{1} << 40, 0};
  int64_t calls = 0;
  e.fill_rows = [&calls](int64_t, int64_t, uint8_t*) {
    ++calls;
    return Status();
  };
  const std::string path = dir.file("z.safetensors");
  ASSERT_TRUE(write_safetensors(path, {e}).ok());
  EXPECT_LE(calls, 1);
  std::unique_ptr<SafetensorsFile> f;
  ASSERT_TRUE(SafetensorsFile::open(path, &f).ok());
  ASSERT_NE(f->find("empty"), nullptr);
  EXPECT_EQ(f->find("empty")->shape, (std::vector<int64_t>{int64_t{1} << 40, 0}));
}

TEST(InputFiles, OnlyRegularFilesAreRead) {
  TempDir dir;
  const std::string fifo = dir.file("fifo"), loop = dir.file("loop"), sub = dir.file("sub");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(::symlink("loop", loop.c_str()), 0);  // a link to itself
  fs::create_directory(sub);
  std::string text;
  expect_error_mentions(read_input_file("--stats", fifo, 1 << 20, &text), {"--stats", fifo, "FIFO"});
  expect_error_mentions(read_input_file("--stats", "/dev/zero", 1 << 20, &text), {"/dev/zero", "character device"});
  expect_error_mentions(read_input_file("--stats", sub, 1 << 20, &text), {sub, "directory"});
  expect_error_mentions(read_input_file("--stats", loop, 1 << 20, &text), {loop});
  write_bytes(dir.file("big"), std::string(100, 'x'));
  expect_error_mentions(read_input_file("--data", dir.file("big"), 99, &text), {"--data", "100 bytes", "99"});
  ASSERT_TRUE(read_input_file("--data", dir.file("big"), 100, &text).ok());
  EXPECT_EQ(text, std::string(100, 'x'));
}

TEST(InputFiles, JsonDepthIsCountedOutsideStringsOnly) {
  const std::string at_limit = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  const std::string past = "[" + at_limit + "]";
  nlohmann::json j;
  EXPECT_TRUE(parse_json_text("x.json", at_limit, &j).ok());
  expect_error_mentions(parse_json_text("x.json", past, &j), {"x.json", "nested"});
  const std::string s = R"({"a": "[[[[{{{{\"[[[", "b": [1]})";
  EXPECT_EQ(json_nesting_depth(s.data(), s.data() + s.size()), 2);
}

// A synthetic checkpoint of `tiny` shapes with `layers` layers, written to `dir` (which must not
// exist yet: llmq replaces only its own outputs).
void make_checkpoint(const std::string& dir, int64_t layers, uint64_t seed = 3) {
  SyntheticCheckpointOptions o;
  ASSERT_TRUE(synthetic_model_config("tiny", &o.config).ok());
  o.config.n_layers = layers;
  o.dtype = DType::kF32;
  o.seed = seed;
  const Status st = write_synthetic_checkpoint(dir, o);
  ASSERT_TRUE(st.ok()) << st.to_string();
}

// A checkpoint in `tmp`/ck.
struct Ckpt {
  Ckpt(const TempDir& tmp, int64_t layers) : dir(tmp.file("ck")) { make_checkpoint(dir, layers); }
  const std::string& path() const { return dir; }
  std::string file(const std::string& name) const { return dir + "/" + name; }
  std::string dir;
};

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void write_json(const std::string& path, const nlohmann::json& j) { write_bytes(path, j.dump(2)); }

// Every loader refuses the same disagreement in the same words: the CPU model (run, eval,
// calibrate, logits), the quantized reader (logits/eval --quantized) and the streaming quantizer.
void expect_every_loader_refuses(const std::string& dir, const std::vector<std::string>& words) {
  ModelWeights w;
  expect_error_mentions(load_model(dir, &w), words);
  std::unique_ptr<WeightSource> source;
  expect_error_mentions(checkpoint_weight_source(dir, &source), words);
  std::unique_ptr<Checkpoint> ckpt;
  ModelConfig config;
  expect_error_mentions(open_hf_checkpoint(dir, &ckpt, &config), words);
}

// Rewrite dir/model.safetensors: every tensor copied from `source_of(name)` (itself by default),
// then `extra` appended.
Status rewrite_checkpoint(const std::string& dir, const std::function<std::string(const std::string&)>& source_of,
                          const std::vector<SafetensorsWriteEntry>& extra = {}) {
  std::unique_ptr<SafetensorsFile> f;
  LLMQ_RETURN_IF_ERROR(SafetensorsFile::open(dir + "/model.safetensors", &f));
  std::vector<SafetensorsWriteEntry> entries;
  for (const SafetensorsTensorInfo& info : f->tensors()) {
    SafetensorsWriteEntry e;
    e.name = info.name;
    e.dtype = info.dtype;
    e.shape = info.shape;
    const SafetensorsFile* file = f.get();
    e.fill = [file, source = source_of(info.name), bytes = info.nbytes](uint8_t* dst) {
      TensorView v;
      LLMQ_RETURN_IF_ERROR(file->view(source, &v));
      std::memcpy(dst, v.data, static_cast<size_t>(bytes));
      return Status();
    };
    entries.push_back(e);
  }
  entries.insert(entries.end(), extra.begin(), extra.end());
  LLMQ_RETURN_IF_ERROR(write_safetensors(dir + "/new.safetensors", entries));
  f.reset();
  std::error_code ec;
  fs::rename(dir + "/new.safetensors", dir + "/model.safetensors", ec);
  return ec ? Status(StatusCode::kIoError, ec.message()) : Status();
}

std::string same_name(const std::string& name) { return name; }

TEST(CheckedLoad, ALayerBeyondTheConfigIsRefusedByEveryLoader) {
  TempDir tmp;
  const Ckpt dir(tmp, 2);
  nlohmann::json c = read_json(dir.file("config.json"));
  c["num_hidden_layers"] = 1;
  write_json(dir.file("config.json"), c);
  expect_every_loader_refuses(dir.path(), {dir.path(), "model.layers.1.", "num_hidden_layers"});
}

TEST(CheckedLoad, AStrayTensorIsRefusedAndRotaryBuffersAreIgnored) {
  for (const std::string& extra : {std::string("model.extra_head.weight"), std::string("model.layers.0.self_attn.rotary_emb.inv_freq")}) {
    SCOPED_TRACE(extra);
    TempDir tmp;
    const Ckpt dir(tmp, 1);
    // Rewrite the checkpoint with one more tensor.
    SafetensorsWriteEntry x;
    x.name = extra;
    x.dtype = DType::kF32;
    x.shape = {4};
    x.fill = [](uint8_t* dst) {
      const float v[4] = {0.5f, -1.25f, 3.0f, 7.5f};
      std::memcpy(dst, v, sizeof v);
      return Status();
    };
    ASSERT_TRUE(rewrite_checkpoint(dir.path(), same_name, {x}).ok());
    if (extra.find("inv_freq") != std::string::npos) {
      ModelWeights w;
      const Status st = load_model(dir.path(), &w);
      EXPECT_TRUE(st.ok()) << st.to_string();
    } else {
      expect_every_loader_refuses(dir.path(), {extra, "not part of the model"});
    }
  }
}

TEST(CheckedLoad, TiedConfigWithItsOwnLmHeadIsRefused) {
  TempDir tmp;
  const Ckpt dir(tmp, 1);
  nlohmann::json c = read_json(dir.file("config.json"));
  ASSERT_FALSE(c.value("tie_word_embeddings", true));  // the synthetic checkpoint has lm_head
  c["tie_word_embeddings"] = true;
  write_json(dir.file("config.json"), c);
  expect_every_loader_refuses(dir.path(), {"lm_head.weight", "tie_word_embeddings"});
}

// A tied config with a stored lm_head that is the embedding byte for byte (merges and conversions
// write the duplicate) loads; one that differs is refused.
TEST(CheckedLoad, TiedConfigWithAnIdenticalLmHeadLoads) {
  TempDir tmp;
  const Ckpt dir(tmp, 1);
  nlohmann::json c = read_json(dir.file("config.json"));
  c["tie_word_embeddings"] = true;
  write_json(dir.file("config.json"), c);
  // Rewrite lm_head.weight as a copy of the embedding.
  ASSERT_TRUE(rewrite_checkpoint(dir.path(), [](const std::string& name) {
                return name == "lm_head.weight" ? std::string("model.embed_tokens.weight") : name;
              }).ok());
  ModelWeights w;
  const Status st = load_model(dir.path(), &w);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(w.config.tie_embeddings);
}

TEST(CheckedLoad, MalformedQuantizationConfigIsNamedBeforeAnyLoaderReadsIt) {
  for (const nlohmann::json& q : {nlohmann::json{{"quant_method", "fp8"}, {"weight_block_size", {128}}},
                                  nlohmann::json{{"quant_method", "fp8"}, {"llmq_scheme", 5}},
                                  nlohmann::json{{"quant_method", "compressed-tensors"}, {"config_groups", {1, 2}}}}) {
    SCOPED_TRACE(q.dump());
    TempDir tmp;
    const Ckpt dir(tmp, 1);
    nlohmann::json c = read_json(dir.file("config.json"));
    c["quantization_config"] = q;
    write_json(dir.file("config.json"), c);
    std::unique_ptr<Checkpoint> ckpt;
    ModelConfig config;
    expect_error_mentions(open_hf_checkpoint(dir.path(), &ckpt, &config), {dir.path(), "quantization_config"});
  }
}

// transformers' MistralConfig defaults sliding_window to 4096: a config without the key has a
// window; an explicit null has none.
TEST(CheckedLoad, MistralWithoutASlidingWindowKeyHasTransformersDefaultWindow) {
  const std::string base = R"({"model_type": "mistral", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
      "max_position_embeddings": 32768)";
  ModelConfig absent, null_window;
  ASSERT_TRUE(parse_hf_config(base + "}", &absent).ok());
  EXPECT_EQ(absent.sliding_window, 4096);
  ASSERT_TRUE(parse_hf_config(base + R"(, "sliding_window": null})", &null_window).ok());
  EXPECT_EQ(null_window.sliding_window, 0);
  // The writer says null explicitly, so the window-less model reads back window-less.
  ModelConfig back;
  ASSERT_TRUE(parse_hf_config(hf_config_json(null_window), &back).ok());
  EXPECT_EQ(back.sliding_window, 0);
}

// A config that claims thousands of layers fails at the first missing one, before anything of
// that count is allocated or enumerated.
TEST(CheckedLoad, AbsurdLayerCountsFailAtTheFirstMissingTensor) {
  TempDir tmp;
  const Ckpt dir(tmp, 2);
  nlohmann::json c = read_json(dir.file("config.json"));
  c["num_hidden_layers"] = 4000;
  write_json(dir.file("config.json"), c);
  expect_every_loader_refuses(dir.path(), {"model.layers.2.", "missing"});
}

TEST(CheckedLoad, AnEmptyModelPathIsNotTheBuiltInModel) {
  ModelWeights w;
  expect_error_mentions(load_model("", &w), {"--model", "empty"});
  EXPECT_TRUE(load_model("default", &w).ok());
}

TEST(CheckedLoad, FifoAndLinkLoopAsCheckpointFilesAreRefusedByName) {
  for (const std::string& victim : {std::string("config.json"), std::string("model.safetensors")}) {
    for (const bool fifo : {true, false}) {
      SCOPED_TRACE(victim + (fifo ? " as a FIFO" : " as a link loop"));
      TempDir tmp;
      const Ckpt dir(tmp, 1);
      const std::string path = dir.file(victim);
      fs::remove(path);
      if (fifo) ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
      else ASSERT_EQ(::symlink(victim.c_str(), path.c_str()), 0);
      ModelWeights w;
      expect_error_mentions(load_model(dir.path(), &w), {path});
    }
  }
}

TEST(TokenIds, ParsedWithoutWrappingOrSigns) {
  std::vector<int32_t> ids;
  ASSERT_TRUE(parse_token_ids("--ids", " 1 15\t007 ", 100, &ids).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 15, 7}));
  ASSERT_TRUE(parse_token_ids("--ids", "", 100, &ids).ok());
  EXPECT_TRUE(ids.empty());
  for (const std::string& bad : {"1 4294967297", "1 -1", "+1", "1x", "1.0", "100", "99999999999999999999999", "0x10"}) {
    SCOPED_TRACE(bad);
    expect_error_mentions(parse_token_ids("--ids", bad, 100, &ids), {"--ids"});
  }
  expect_error_mentions(parse_token_ids("--prompt-ids", "3 4294967297", 512, &ids), {"--prompt-ids", "4294967297"});
}

TEST(Logits, NonFiniteAndConstantRowsAreErrors) {
  std::vector<float> rows = {0.5f, -1.0f, 2.0f, 1.0f, 1.0f, 3.0f};
  EXPECT_TRUE(check_logits(rows.data(), 2, 3, "position ", 0).ok());
  rows[4] = std::nanf("");
  expect_error_mentions(check_logits(rows.data(), 2, 3, "position ", 10), {"position 11", "1 NaN"});
  rows[4] = std::numeric_limits<float>::infinity();
  expect_error_mentions(check_logits(rows.data(), 2, 3, "position ", 0), {"position 1", "1 Inf"});
  rows = {2.0f, 2.0f, 2.0f};
  expect_error_mentions(check_logits(rows.data(), 1, 3, "position ", 4), {"position 4", "all"});
}

TEST(Logits, AModelWhoseOutputIsNotAnAnswerIsRefusedByTheForwardPass) {
  ModelWeights w = make_default_model();
  const std::vector<int32_t> tokens = {1, 7, 42};
  std::vector<float> logits(tokens.size() * static_cast<size_t>(w.config.vocab_size));
  {
    Transformer t(w);
    EXPECT_TRUE(t.forward(tokens.data(), 3, 0, logits.data()).ok());
  }
  ModelWeights zero_head = w;
  std::fill(zero_head.lm_head.weight.data_as<float>(),
            zero_head.lm_head.weight.data_as<float>() + zero_head.lm_head.weight.numel(), 0.0f);
  Transformer constant(zero_head);
  expect_error_mentions(constant.forward(tokens.data(), 3, 0, logits.data()), {"position 0", "all"});
  ModelWeights huge = w;  // a classifier whose products overflow float32
  float* head = huge.lm_head.weight.data_as<float>();
  for (int64_t i = 0; i < huge.lm_head.weight.numel(); ++i) head[i] = (i % 2 ? 3e38f : -3e38f);
  Transformer overflow(huge);
  expect_error_mentions(overflow.forward(tokens.data(), 3, 0, logits.data()), {"position 0", "Inf"});
}

TEST(Evaluate, APerplexityOfNoTokensIsAnError) {
  const ModelWeights w = make_default_model();
  Transformer base(w), cand(w);
  std::vector<EvalAccumulator> results;
  EvalOptions o;
  o.context = 16;
  // BOS alone scores nothing: every window is [BOS] with no next token.
  expect_error_mentions(evaluate(&base, {&cand}, {{w.config.bos_token}, {}}, o, &results), {"no tokens"});
  EXPECT_TRUE(evaluate(&base, {&cand}, {{w.config.bos_token, 5, 9}}, o, &results).ok());
}

}  // namespace
}  // namespace llmq
