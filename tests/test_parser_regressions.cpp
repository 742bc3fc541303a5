// Regression tests for what fuzzing the file parsers found (fuzz/, docs/fuzzing.md), and for
// what writing the fuzz targets turned up by reading. Each test feeds the input that broke a
// parser (the fuzzer's input where it found it) and asserts a clear error that names the file and
// the field, where before there was a crash, an out-of-memory abort, undefined behaviour or a
// silently wrong value.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "llmq/calibration.hpp"
#include "llmq/model.hpp"
#include "llmq/model_io.hpp"
#include "llmq/safetensors.hpp"
#include "llmq/tokenizer.hpp"
#include "model/tokenizer/tokenizer_bpe.hpp"
#include "fuzz_regression_inputs.hpp"

namespace llmq {
namespace {

void expect_error_naming(const Status& st, const std::vector<std::string>& mentions) {
  ASSERT_FALSE(st.ok()) << "expected an error naming " << mentions.front();
  for (const std::string& m : mentions)
    EXPECT_NE(st.message().find(m), std::string::npos) << "'" << m << "' not in: " << st.message();
}

// ---- llama2.c checkpoints

// fuzz_llama2c, out-of-memory: the legacy header of a 2,940-byte file claimed n_layers 16777216
// (0x01000000), and the loader built its list of per-layer arrays (11 per layer) before comparing
// the size the header implies with the file's: 3 GiB of bookkeeping for a 3 KB file. These are
// the fuzzer's 28 header bytes; the floats after them do not matter.
TEST(FuzzRegression, Llama2cHugeLayerCountIsRefusedBeforeAllocating) {
  const uint8_t header[28] = {0x08, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x00,
                              0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x0c, 0x00, 0x01, 0x00, 0x08, 0x00, 0x00, 0x00};
  std::string file(reinterpret_cast<const char*>(header), sizeof header);
  file.resize(2940, '\0');
  std::istringstream in(file);
  ModelWeights w;
  expect_error_naming(load_llama2c("fuzz-oom.bin", in, &w), {"fuzz-oom.bin", "n_layers 16777216", "implies"});
  // n_layers INT32_MAX: the old loader needed ~500 GB for its list, which no machine gives it.
  const int32_t max_layers = 0x7fffffff;
  std::memcpy(&file[8], &max_layers, sizeof max_layers);
  std::istringstream in_max(file);
  expect_error_naming(load_llama2c("fuzz-oom.bin", in_max, &w), {"fuzz-oom.bin", "n_layers 2147483647"});
}

// fuzz_llama2c, found after ModelConfig::validate gained the BOS/EOS range check (issue 21): a
// llama2.c file of vocabulary 1 cannot hold run.c's BOS (1), and the refusal must name the file.
// The fuzzer's 28 bytes, as it wrote them.
TEST(FuzzRegression, Llama2cVocabularyWithoutBosIsRefusedNamingTheFile) {
  const uint8_t bytes[28] = {0x08, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x6e, 0x00, 0x00, 0x00, 0x02, 0x00,
                             0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00, 0x00, 0x00};
  std::istringstream in(std::string(reinterpret_cast<const char*>(bytes), sizeof bytes));
  ModelWeights w;
  const Status st = load_llama2c("fuzz-bos.bin", in, &w);
  expect_error_naming(st, {"fuzz-bos.bin"});
}

// ---- config.json

// fuzz_hf_config: errors from ModelConfig::validate() (here 31 heads, 8 KV heads) named the
// field but not the file, unlike every other config.json error.
TEST(FuzzRegression, HfConfigValidationErrorsNameConfigJson) {
  const std::string config = R"({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 31, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 128256})";
  ModelConfig c;
  expect_error_naming(parse_hf_config(config, &c), {"config.json", "n_kv_heads", "31"});
}

// Found writing fuzz_hf_config.cpp (whose check that accepted sizes fit int64 this answers; 1M
// runs did not reach such numbers): validate() checked each size alone, so 2^40 heads of head_dim
// 2^40 passed, and load_hf_model's n_heads * head_dim overflowed int64.
TEST(FuzzRegression, HfConfigSizesWhoseProductsOverflowAreRefused) {
  const std::string config = R"({"model_type": "llama", "hidden_size": 1099511627776,
    "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 1099511627776,
    "head_dim": 1099511627776, "vocab_size": 1})";
  ModelConfig c;
  expect_error_naming(parse_hf_config(config, &c), {"config.json", "n_heads x head_dim x dim", "overflows"});
  // Real sizes still pass: Llama 3.1 405B with its 128k context.
  const std::string big = R"({"model_type": "llama", "hidden_size": 16384, "intermediate_size": 53248,
    "num_hidden_layers": 126, "num_attention_heads": 128, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072})";
  EXPECT_TRUE(parse_hf_config(big, &c).ok());
}

// ---- tokenizer.json

// fuzz_tokenizer_json, out-of-memory: the table of pieces was sized by the largest id, and this
// 2,880-byte file (the fuzzer's input) lists the id 120000008: 3.8 GB of empty strings.
TEST(FuzzRegression, TokenizerJsonIdFarBeyondTheVocabularyIsRefused) {
  const std::string file(fuzz_inputs::kTokenizerJsonHugeId, fuzz_inputs::kTokenizerJsonHugeIdSize);
  std::unique_ptr<Tokenizer> tok;
  expect_error_naming(tokenizer_detail::parse_tokenizer_json("dir/tokenizer.json", file, &tok),
                      {"dir/tokenizer.json", "120000008"});
  // A few gaps (reserved ids) are still fine: ids 0, 1 and 40 in a three-token vocabulary.
  const std::string gappy = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 40}, "merges": [],
    "byte_fallback": true}})";
  ASSERT_TRUE(tokenizer_detail::parse_tokenizer_json("dir/tokenizer.json", gappy, &tok).ok());
  EXPECT_EQ(tok->vocab_size(), 41);
}

// ---- calibration statistics

std::string stats_with_linear(const std::string& linear_fields) {
  return R"({"format": "llmq-calibration-v1", "model": "m", "data": "d", "tokens": 8, "linears": {"lm_head": {)" +
         linear_fields + "}}}";
}

// Found writing fuzz_calibration.cpp: counts and absmax values were read with nlohmann's get<>(),
// which casts a float count to int64 (1e300: undefined behaviour; 4.5: silently 4) and accepts a
// negative absmax or one that overflows float32 to inf; a value of the wrong type gave nlohmann's
// message, which names no field.
TEST(FuzzRegression, CalibrationStatsRefuseNumbersThatDoNotFit) {
  const std::string channels = R"("input_channel_absmax": [1, 2], "weight_channel_absmax": [3, 4])";
  const std::string good_counts = R"("in_features": 2, "rows_seen": 5, )";
  const std::string good_absmax = R"("input_absmax": 2, "weight_absmax": 4, )";
  CalibrationStats s;
  ASSERT_TRUE(CalibrationStats::parse("ok.json", stats_with_linear(good_counts + good_absmax + channels), &s).ok());
  EXPECT_EQ(s.linears.at("lm_head").input_channel_absmax, (std::vector<float>{1, 2}));
  struct Case {
    std::string fields;
    std::vector<std::string> mentions;
  };
  const Case cases[] = {
      {R"("in_features": 1e300, "rows_seen": 5, )" + good_absmax + channels, {"lm_head", "in_features", "1e+300"}},
      {R"("in_features": 2, "rows_seen": 4.5, )" + good_absmax + channels, {"lm_head", "rows_seen", "4.5"}},
      {R"("in_features": 2, "rows_seen": -5, )" + good_absmax + channels, {"lm_head", "rows_seen"}},
      {good_counts + R"("input_absmax": -2, "weight_absmax": 4, )" + channels, {"lm_head", "input_absmax"}},
      {good_counts + good_absmax + R"("input_channel_absmax": [1, 1e39], "weight_channel_absmax": [3, 4])",
       {"lm_head", "input_channel_absmax[1]", "float32"}},
      {good_counts + good_absmax + R"("input_channel_absmax": [1, "2"], "weight_channel_absmax": [3, 4])",
       {"lm_head", "input_channel_absmax[1]"}},
      {good_counts + good_absmax + R"("input_channel_absmax": [1], "weight_channel_absmax": [3, 4])",
       {"lm_head", "input_channel_absmax", "in_features 2"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fields);
    expect_error_naming(CalibrationStats::parse("bad.json", stats_with_linear(c.fields), &s), c.mentions);
    expect_error_naming(CalibrationStats::parse("bad.json", stats_with_linear(c.fields), &s), {"bad.json"});
  }
  expect_error_naming(CalibrationStats::parse("bad.json", R"({"format": "llmq-calibration-v1", "model": 3,
    "linears": {}})", &s), {"bad.json", "model"});
  expect_error_naming(CalibrationStats::parse("bad.json", R"({"format": "llmq-calibration-v1", "tokens": 1e19,
    "linears": {}})", &s), {"bad.json", "tokens"});
}

// ---- token files

// Found writing fuzz_token_file.cpp: with the vocabulary unknown (vocab_size 0), an id beyond
// int32 was cast to int32: "4294967297" became token 1.
TEST(FuzzRegression, TokenIdsBeyondInt32AreRefusedWithoutAVocabulary) {
  std::vector<std::vector<int32_t>> seqs;
  ASSERT_TRUE(parse_token_sequences("ids.txt", "1 2147483647\n", 0, &seqs).ok());
  EXPECT_EQ(seqs, (std::vector<std::vector<int32_t>>{{1, 2147483647}}));
  expect_error_naming(parse_token_sequences("ids.txt", "1 2\n3 4294967297\n", 0, &seqs),
                      {"ids.txt:2", "4294967297"});
}

}  // namespace
}  // namespace llmq
