// config.json of each supported family as published (Llama 3.1, Qwen2, Mixtral, Mistral), the
// defaults transformers applies to absent fields, and bad configs named by field. The formats
// and refusals of issue 21 are in test_hf_config.cpp; models loaded from checkpoints in
// test_hf_model.cpp.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmq/safetensors.hpp"
#include "safetensors_test_support.hpp"
#include "support.hpp"


namespace llmq {
namespace {

using namespace safetensors_test;  // NOLINT: the suite's shared helpers
// ---------------------------------------------------------------------------------------------
// config.json

const char* kLlama31Config = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256
})";

const char* kQwen2Config = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
  "intermediate_size": 18944, "max_position_embeddings": 32768, "max_window_layers": 28,
  "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false, "vocab_size": 152064
})";

const char* kMixtralConfig = R"({
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
  "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
  "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.02, "sliding_window": null, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 32000
})";

ModelConfig parsed_config(const std::string& text) {
  ModelConfig c;
  const Status st = parse_hf_config(text, &c);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return c;
}

TEST(HfConfig, Llama31With8BShapesAndLlama3RopeScaling) {
  const ModelConfig c = parsed_config(kLlama31Config);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.dim, 4096);
  EXPECT_EQ(c.hidden_dim, 14336);
  EXPECT_EQ(c.n_layers, 32);
  EXPECT_EQ(c.n_heads, 32);
  EXPECT_EQ(c.n_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.max_seq_len, 131072);
  EXPECT_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_TRUE(c.rope_scaling.enabled);
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position, 8192);
  EXPECT_EQ(c.rope_style, RopeStyle::kHalf);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.is_moe());
  EXPECT_EQ(c.bos_token, 128000);
  EXPECT_EQ(c.eos_token, 128001);  // the first of the list
}

TEST(HfConfig, Qwen2HasAttentionBiasAndIgnoresADisabledSlidingWindow) {
  const ModelConfig c = parsed_config(kQwen2Config);
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_TRUE(c.attention_bias);
  EXPECT_EQ(c.dim, 3584);
  EXPECT_EQ(c.hidden_dim, 18944);
  EXPECT_EQ(c.n_heads, 28);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 152064);
  EXPECT_EQ(c.max_seq_len, 32768);
  EXPECT_EQ(c.norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_FALSE(c.rope_scaling.enabled);
  EXPECT_EQ(c.bos_token, 151643);
  EXPECT_EQ(c.eos_token, 151645);
  // transformers' Qwen2 always has q/k/v biases and never reads attention_bias: a config that
  // says false is refused rather than run without them.
  json j = json::parse(kQwen2Config);
  j["attention_bias"] = false;
  ModelConfig refused;
  const Status st = parse_hf_config(j.dump(), &refused);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  EXPECT_NE(st.message().find("attention_bias"), std::string::npos) << st.to_string();
}

TEST(HfConfig, MixtralExperts) {
  const ModelConfig c = parsed_config(kMixtralConfig);
  EXPECT_EQ(c.model_type, "mixtral");
  EXPECT_TRUE(c.is_moe());
  EXPECT_EQ(c.n_experts, 8);
  EXPECT_EQ(c.n_experts_per_token, 2);
  EXPECT_EQ(c.hidden_dim, 14336);
  EXPECT_EQ(c.max_seq_len, 32768);  // "sliding_window": null
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.bos_token, 1);
  EXPECT_EQ(c.eos_token, 2);
  EXPECT_FALSE(c.attention_bias);
}

TEST(HfConfig, MistralHeadDimAndSlidingWindow) {
  // Mistral-Nemo states head_dim (128), which is not hidden_size / heads (160).
  json nemo = json::parse(kMixtralConfig);
  nemo["model_type"] = "mistral";
  nemo.erase("num_local_experts");
  nemo.erase("num_experts_per_tok");
  nemo["hidden_size"] = 5120;
  nemo["head_dim"] = 128;
  nemo["num_hidden_layers"] = 40;
  nemo["vocab_size"] = 131072;
  const ModelConfig c = parsed_config(nemo.dump());
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_FALSE(c.is_moe());
  // Mistral 7B v0.1: a 4096-token window is recorded as a window, not taken as the context length
  // (sequences past it are refused until sliding-window attention is implemented).
  nemo["sliding_window"] = 4096;
  const ModelConfig windowed = parsed_config(nemo.dump());
  EXPECT_EQ(windowed.sliding_window, 4096);
  EXPECT_EQ(windowed.max_seq_len, c.max_seq_len);
}

TEST(HfConfig, DefaultsForAbsentFields) {
  const ModelConfig c = parsed_config(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100, "head_dim": null,
      "rope_scaling": null})");
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.max_seq_len, 2048);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.rope_scaling.enabled);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.rope_style, RopeStyle::kHalf);
}

TEST(HfConfig, BadConfigsNameTheField) {
  const json llama = json::parse(kLlama31Config);
  ModelConfig c;
  struct Bad {
    const char* what;
    std::function<void(json&)> edit;
    StatusCode code;
    std::vector<std::string> mentions;
  };
  const std::vector<Bad> cases = {
      {"missing hidden_size", [](json& j) { j.erase("hidden_size"); }, StatusCode::kInvalidArgument, {"hidden_size", "missing"}},
      {"string hidden_size", [](json& j) { j["hidden_size"] = "4096"; }, StatusCode::kInvalidArgument, {"hidden_size"}},
      {"missing model_type", [](json& j) { j.erase("model_type"); }, StatusCode::kInvalidArgument, {"model_type"}},
      {"unknown model_type", [](json& j) { j["model_type"] = "gpt2"; }, StatusCode::kUnsupported, {"model_type", "gpt2"}},
      {"yarn rope without its original length", [](json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; },
       StatusCode::kInvalidArgument, {"rope_scaling.original_max_position_embeddings", "missing"}},
      {"yarn rope with DeepSeek's mscale", [](json& j) {
         j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}, {"mscale", 1.0}};
       },
       StatusCode::kUnsupported, {"rope_scaling.mscale"}},
      {"linear rope (old key)", [](json& j) { j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; },
       StatusCode::kUnsupported, {"rope_scaling", "linear"}},
      {"llama3 rope without factor", [](json& j) { j["rope_scaling"].erase("factor"); }, StatusCode::kInvalidArgument,
       {"rope_scaling.factor"}},
      {"kv heads not dividing heads", [](json& j) { j["num_key_value_heads"] = 5; }, StatusCode::kInvalidArgument,
       {"n_kv_heads"}},
      {"zero layers", [](json& j) { j["num_hidden_layers"] = 0; }, StatusCode::kInvalidArgument, {"n_layers"}},
      {"gelu", [](json& j) { j["hidden_act"] = "gelu"; }, StatusCode::kUnsupported, {"hidden_act", "gelu"}},
      {"mlp bias", [](json& j) { j["mlp_bias"] = true; }, StatusCode::kUnsupported, {"mlp_bias"}},
      {"bad eos", [](json& j) { j["eos_token_id"] = "</s>"; }, StatusCode::kInvalidArgument, {"eos_token_id"}},
      {"mixtral without experts", [](json& j) { j["model_type"] = "mixtral"; }, StatusCode::kInvalidArgument,
       {"num_local_experts"}},
  };
  for (const auto& b : cases) {
    SCOPED_TRACE(b.what);
    json j = llama;
    b.edit(j);
    const Status st = parse_hf_config(j.dump(), &c);
    expect_error_mentions(st, b.mentions);
    EXPECT_EQ(st.code(), b.code) << st.to_string();
  }
  expect_error_mentions(parse_hf_config("{\"model_type\": ", &c), {"JSON"});
  expect_error_mentions(parse_hf_config("[]", &c), {"object"});
}


}  // namespace
}  // namespace llmq
