// The families beyond Llama as they arrive on disk: config.json as transformers 5.17 saves each
// (qwen3, qwen3_moe, gpt_oss), every family key read or refused by name, and checkpoints in each
// family's layout (Phi-3's fused projections, gpt-oss's fused and MXFP4 experts) loaded into the
// very weights they were written from. The arithmetic is test_model_family_numerics.cpp's.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmq/export.hpp"
#include "llmq/model.hpp"
#include "llmq/model_io.hpp"
#include "llmq/safetensors.hpp"
#include "llmq/scheme.hpp"
#include "llmq/transformer.hpp"
#include "model_family_support.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using family_test::DiskTensorData;
using family_test::family_model;
using family_test::write_family_checkpoint;
using json = nlohmann::json;
using llmq::testing::TempDir;

// config.json of tiny random models saved by transformers 5.17 (AutoConfig.for_model +
// save_pretrained; hidden 64, 2 layers, 4 heads, 2 KV heads, head_dim 16, vocab 128).
const char* kQwen3 = R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": null, "dtype": "float32", "eos_token_id": null, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96, "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 32768, "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "pad_token_id": null, "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "sliding_window": null, "tie_word_embeddings": false, "transformers_version": "5.17.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 128})";
const char* kQwen3Moe = R"({"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": null, "decoder_sparse_step": 1, "dtype": "float32", "eos_token_id": null, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96, "max_position_embeddings": 32768, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 32, "norm_topk_prob": false, "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_key_value_heads": 2, "num_local_experts": 4, "output_router_logits": false, "pad_token_id": null, "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false, "transformers_version": "5.17.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 128})";
const char* kGptOss = R"({"architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0, "bos_token_id": null, "dtype": "float32", "eos_token_id": null, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 64, "layer_types": ["sliding_attention", "full_attention"], "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_key_value_heads": 2, "num_local_experts": 4, "output_router_logits": false, "pad_token_id": null, "rms_norm_eps": 1e-05, "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096, "rope_theta": 150000.0, "rope_type": "yarn", "truncate": false}, "router_aux_loss_coef": 0.001, "sliding_window": 8, "tie_word_embeddings": false, "transformers_version": "5.17.0", "use_cache": true, "vocab_size": 128})";

ModelConfig parsed(const json& j) {
  ModelConfig c;
  const Status st = parse_hf_config(j.dump(), &c);
  EXPECT_TRUE(st.ok()) << st.to_string() << "\n" << j.dump();
  return c;
}

void expect_refused(const json& j, const std::vector<std::string>& mentions) {
  ModelConfig c;
  const Status st = parse_hf_config(j.dump(), &c);
  ASSERT_FALSE(st.ok()) << "accepted:\n" << j.dump();
  for (const std::string& m : mentions) EXPECT_NE(st.message().find(m), std::string::npos) << st.to_string() << " (want " << m << ")";
}

TEST(ModelFamilyConfig, Qwen3AsTransformersSavesIt) {
  const ModelConfig c = parsed(json::parse(kQwen3));
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_FALSE(c.has_window());
  EXPECT_EQ(c.norm_eps, 1e-6);
  // Qwen3Config's own defaults where a key is absent: head_dim 128, not hidden / heads.
  json j = json::parse(kQwen3);
  j.erase("head_dim");
  j["num_attention_heads"] = 1, j["num_key_value_heads"] = 1;
  EXPECT_EQ(parsed(j).head_dim, 128);
  // The window by layer_types, under use_sliding_window.
  j = json::parse(kQwen3);
  j["use_sliding_window"] = true, j["sliding_window"] = 4, j["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_EQ(parsed(j).layer_window(0), 0);
  EXPECT_EQ(parsed(j).layer_window(1), 4);
}

TEST(ModelFamilyConfig, Qwen3MoeAsTransformersSavesIt) {
  json j = json::parse(kQwen3Moe);
  ModelConfig c = parsed(j);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.n_experts, 4);
  EXPECT_EQ(c.n_experts_per_token, 2);
  EXPECT_EQ(c.hidden_dim, 32);  // moe_intermediate_size: every layer is sparse
  EXPECT_FALSE(c.moe_renormalize);
  EXPECT_EQ(c.moe_routing, MoeRouting::kSoftmaxTopK);
  // 4.x configs name the count num_experts; both names must agree.
  j.erase("num_local_experts");
  j["num_experts"] = 6;
  j["norm_topk_prob"] = true;
  c = parsed(j);
  EXPECT_EQ(c.n_experts, 6);
  EXPECT_TRUE(c.moe_renormalize);
  j["num_local_experts"] = 4;
  expect_refused(j, {"num_local_experts", "num_experts", "disagree"});
  // Dense layers between the sparse ones are refused by name.
  j = json::parse(kQwen3Moe);
  j["decoder_sparse_step"] = 2;
  expect_refused(j, {"decoder_sparse_step"});
  j = json::parse(kQwen3Moe);
  j["mlp_only_layers"] = {0};
  expect_refused(j, {"mlp_only_layers"});
}

// What the review of this reader found: published Qwen3-MoE configs carry max_window_layers (no
// class reads it); MXFP4 needs whole 32-value blocks; a huge layer count is refused before anything
// is sized by it; head_dim null / 0 as the classes take them.
TEST(ModelFamilyConfig, EdgesOfTheFamiliesKeys) {
  json moe = json::parse(kQwen3Moe);
  moe["max_window_layers"] = 48;  // Qwen3-30B-A3B's config.json
  EXPECT_FALSE(parsed(moe).has_window());
  moe["use_sliding_window"] = true, moe["sliding_window"] = 8, moe["max_window_layers"] = 1;
  expect_refused(moe, {"max_window_layers"});
  json oss = json::parse(kGptOss);
  oss["quantization_config"] = {{"quant_method", "mxfp4"}};
  oss["hidden_size"] = 48;
  expect_refused(oss, {"multiples of 32"});
  oss = json::parse(kGptOss);
  oss["num_hidden_layers"] = int64_t{1} << 40;
  oss.erase("layer_types");
  expect_refused(oss, {"num_hidden_layers"});
  oss = json::parse(kGptOss);
  oss["head_dim"] = nullptr;  // GptOssConfig derives hidden_size / heads
  EXPECT_EQ(parsed(oss).head_dim, 16);
  oss["head_dim"] = 0;
  expect_refused(oss, {"head_dim"});
  json q3 = json::parse(kQwen3);
  q3["head_dim"] = nullptr;
  expect_refused(q3, {"head_dim"});
  q3 = json::parse(kQwen3);
  q3["layer_types"] = {"full_attention", "sliding_attention"};  // without use_sliding_window
  expect_refused(q3, {"layer_types"});
}

TEST(ModelFamilyConfig, GptOssAsTransformersSavesIt) {
  json j = json::parse(kGptOss);
  const ModelConfig c = parsed(j);
  EXPECT_TRUE(c.attention_sinks);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.moe_bias);
  EXPECT_EQ(c.activation, GluActivation::kClampedSwiglu);
  EXPECT_EQ(c.glu_limit, 7.0);
  EXPECT_EQ(c.moe_routing, MoeRouting::kTopKSoftmax);
  EXPECT_TRUE(c.yarn.enabled);
  EXPECT_EQ(c.yarn.factor, 32.0);
  EXPECT_FALSE(c.yarn.truncate);
  EXPECT_EQ(c.yarn.original_max_position, 4096);
  EXPECT_DOUBLE_EQ(c.yarn.attention_factor, 0.1 * std::log(32.0) + 1.0);
  EXPECT_EQ(c.rope_theta, 150000.0);
  EXPECT_EQ(c.layer_window(0), 8);
  EXPECT_EQ(c.layer_window(1), 0);
  // Without layer_types and RoPE keys: GptOssConfig's alternating layers and YaRN.
  j.erase("layer_types");
  j.erase("rope_parameters");
  j["num_hidden_layers"] = 4;
  const ModelConfig d = parsed(j);
  EXPECT_EQ(d.layer_window(0), 8);
  EXPECT_EQ(d.layer_window(1), 0);
  EXPECT_EQ(d.layer_window(2), 8);
  EXPECT_TRUE(d.yarn.enabled);
  EXPECT_EQ(d.rope_theta, 150000.0);
  // The original release's keys are read where they agree with the class, refused otherwise.
  j = json::parse(kGptOss);
  j["swiglu_limit"] = 7.0, j["experts_per_token"] = 2, j["initial_context_length"] = 4096;
  parsed(j);
  j["swiglu_limit"] = 8.0;
  expect_refused(j, {"swiglu_limit"});
  j["swiglu_limit"] = 7.0, j["experts_per_token"] = 3;
  expect_refused(j, {"experts_per_token"});
  j = json::parse(kGptOss);
  j["use_sliding_window"] = true;
  expect_refused(j, {"use_sliding_window"});
  j = json::parse(kGptOss);
  j["quantization_config"] = {{"quant_method", "mxfp4"}, {"group_size", 32}};
  expect_refused(j, {"quantization_config.group_size"});
}

TEST(ModelFamilyConfig, Phi3AndWhatIsRefusedByName) {
  json phi3 = family_test::family_config_json(family_model("phi3").config);
  phi3["auto_map"] = {{"AutoModelForCausalLM", "modeling_phi3.Phi3ForCausalLM"}};
  const ModelConfig c = parsed(phi3);
  EXPECT_EQ(c.layer_window(0), 6);
  EXPECT_EQ(c.layer_window(2), 6);
  EXPECT_FALSE(c.attention_bias);
  // Phi-3's scaled RoPE is longrope (its 'su' and 'yarn' too): refused, naming it.
  for (const char* type : {"longrope", "su", "yarn"}) {
    json j = phi3;
    j["rope_parameters"] = {{"rope_type", type}, {"rope_theta", 10000.0}, {"factor", 4.0},
                            {"original_max_position_embeddings", 64}, {"short_factor", {1.0}}};
    expect_refused(j, {"rope"});
  }
  json partial = phi3;
  partial["partial_rotary_factor"] = 0.75;  // Phi-4-mini
  expect_refused(partial, {"partial_rotary_factor"});
  json bias = phi3;
  bias["attention_bias"] = true;
  expect_refused(bias, {"attention_bias"});
  // Gemma's families are refused by name, never run as a Llama.
  for (const char* type : {"gemma", "gemma2", "gemma3_text", "phi", "gpt2"}) {
    json j = json::parse(kQwen3);
    j["model_type"] = type;
    expect_refused(j, {std::string("model_type '") + type + "'", "not supported"});
  }
}

// ---- checkpoints in each family's layout

bool same(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.nbytes() != b.nbytes()) return false;
  return a.nbytes() == 0 || std::memcmp(a.data(), b.data(), static_cast<size_t>(a.nbytes())) == 0;
}

// The switches that decide the arithmetic, as written and as read back.
void expect_same_features(const ModelConfig& want, const ModelConfig& got) {
  EXPECT_EQ(got.qk_norm, want.qk_norm);
  EXPECT_EQ(got.attention_sinks, want.attention_sinks);
  EXPECT_EQ(got.attention_bias, want.attention_bias);
  EXPECT_EQ(got.moe_bias, want.moe_bias);
  EXPECT_EQ(got.activation, want.activation);
  EXPECT_EQ(got.moe_routing, want.moe_routing);
  EXPECT_EQ(got.moe_renormalize, want.moe_renormalize);
  EXPECT_EQ(got.n_experts, want.n_experts);
  EXPECT_EQ(got.hidden_dim, want.hidden_dim);
  EXPECT_EQ(got.yarn.enabled, want.yarn.enabled);
  EXPECT_EQ(got.yarn.factor, want.yarn.factor);
  EXPECT_EQ(got.yarn.attention_factor, want.yarn.attention_factor);
  EXPECT_EQ(got.rope_theta, want.rope_theta);
  EXPECT_EQ(got.norm_eps, want.norm_eps);
  for (int64_t l = 0; l < want.n_layers; ++l) EXPECT_EQ(got.layer_window(l), want.layer_window(l)) << "layer " << l;
}

void expect_same_weights(const ModelWeights& want, const ModelWeights& got) {
  ASSERT_EQ(got.layers.size(), want.layers.size());
  EXPECT_TRUE(same(got.token_embedding, want.token_embedding));
  for (size_t l = 0; l < want.layers.size(); ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const LayerWeights &a = want.layers[l], &b = got.layers[l];
    EXPECT_TRUE(same(a.q_norm, b.q_norm) && same(a.k_norm, b.k_norm) && same(a.sinks, b.sinks));
    std::vector<const Linear*> wl, gl;
    for (const LayerWeights* L : {&a, &b}) {
      auto& v = L == &a ? wl : gl;
      for (const Linear* x : {&L->q, &L->k, &L->v, &L->o, &L->mlp.gate, &L->mlp.up, &L->mlp.down, &L->router}) v.push_back(x);
      for (const Expert& e : L->experts)
        for (const Linear* x : {&e.gate, &e.up, &e.down}) v.push_back(x);
    }
    ASSERT_EQ(wl.size(), gl.size());
    for (size_t i = 0; i < wl.size(); ++i) {
      EXPECT_TRUE(same(wl[i]->weight, gl[i]->weight)) << wl[i]->id.hf_name(want.config);
      EXPECT_TRUE(same(wl[i]->bias, gl[i]->bias)) << wl[i]->id.hf_name(want.config) << " bias";
    }
  }
  EXPECT_TRUE(same(got.lm_head.weight, want.lm_head.weight));
}

TEST(ModelFamilyCheckpoint, EachFamilyLoadsIntoTheWeightsItWasWrittenFrom) {
  TempDir tmp("llmq_families");
  for (const char* type : {"qwen3", "qwen3_moe", "phi3", "gpt_oss", "mistral"})
    for (bool mxfp4 : {false, true}) {
      if (mxfp4 && std::string(type) != "gpt_oss") continue;
      SCOPED_TRACE(std::string(type) + (mxfp4 ? " (MXFP4)" : ""));
      const ModelWeights w = family_model(type);
      const std::string dir = tmp.file(std::string(type) + (mxfp4 ? "-mxfp4" : ""));
      write_family_checkpoint(dir, w, mxfp4);
      ModelWeights got;
      const Status st = load_model(dir, &got);
      ASSERT_TRUE(st.ok()) << st.to_string();
      EXPECT_EQ(got.config.model_type, type);
      EXPECT_EQ(got.config.experts_mxfp4, mxfp4);
      expect_same_features(w.config, got.config);
      expect_same_weights(w, got);
      // And the same model: identical logits from the loaded and the written weights.
      ModelWeights want = w;
      want.config = got.config;
      std::vector<int32_t> ids = {1, 5, 9, 17, 33, 65, 80, 3, 44, 21, 8, 90};
      std::vector<float> a(ids.size() * 96), b(a.size());
      Transformer ta(want), tb(got);
      ASSERT_TRUE(ta.forward(ids.data(), static_cast<int64_t>(ids.size()), 0, a.data()).ok());
      ASSERT_TRUE(tb.forward(ids.data(), static_cast<int64_t>(ids.size()), 0, b.data()).ok());
      EXPECT_EQ(a, b);
    }
}

// Phi-3's fused qkv_proj / gate_up_proj are the same model as the unfused Llama tensors.
TEST(ModelFamilyCheckpoint, Phi3FusedIsTheLlamaItSplitsInto) {
  TempDir tmp("llmq_phi3");
  ModelWeights w = family_model("phi3");
  write_family_checkpoint(tmp.file("phi3"), w);
  w.config.model_type = "mistral";  // the same window on every layer, unfused
  write_family_checkpoint(tmp.file("mistral"), w);
  ModelWeights a, b;
  ASSERT_TRUE(load_model(tmp.file("phi3"), &a).ok());
  ASSERT_TRUE(load_model(tmp.file("mistral"), &b).ok());
  const std::vector<int32_t> ids = {1, 7, 3, 50, 60, 11, 2, 95, 40};
  std::vector<float> la(ids.size() * 96), lb(la.size());
  Transformer ta(a), tb(b);
  ASSERT_TRUE(ta.forward(ids.data(), 9, 0, la.data()).ok());
  ASSERT_TRUE(tb.forward(ids.data(), 9, 0, lb.data()).ok());
  EXPECT_EQ(la, lb);
}

// Bad tensors of the new layouts: an error naming the tensor, never a different model.
TEST(ModelFamilyCheckpoint, BadFusedAndMxfp4TensorsAreRefusedByName) {
  TempDir tmp("llmq_families_bad");
  const ModelWeights w = family_model("gpt_oss");
  struct Bad {
    const char* what;
    std::function<void(json&, std::vector<DiskTensorData>&)> edit;
    std::vector<std::string> mentions;
  };
  auto find = [](std::vector<DiskTensorData>& t, const std::string& name) -> DiskTensorData& {
    for (auto& x : t)
      if (x.name == name) return x;
    ADD_FAILURE() << "no " << name;
    return t.front();
  };
  const std::string e = "model.layers.1.mlp.experts.";
  const std::vector<Bad> cases = {
      {"NaN scale", [&](json&, std::vector<DiskTensorData>& t) { find(t, e + "down_proj_scales").bytes[5] = 255; },
       {e + "down_proj_scales", "255", "NaN"}},
      {"missing scales",
       [&](json&, std::vector<DiskTensorData>& t) {
         t.erase(std::find_if(t.begin(), t.end(), [&](const DiskTensorData& x) { return x.name == e + "gate_up_proj_scales"; }));
       },
       {e + "gate_up_proj_scales", "missing"}},
      {"blocks of the wrong shape",
       [&](json&, std::vector<DiskTensorData>& t) {
         DiskTensorData& b = find(t, e + "gate_up_proj_blocks");
         b.shape = {b.shape[0], b.shape[1] * 2, b.shape[2] / 2, 16};
       },
       {e + "gate_up_proj_blocks", "shape"}},
      {"blocks stored as I8",
       [&](json&, std::vector<DiskTensorData>& t) { find(t, e + "down_proj_blocks").dtype = DType::kI8; },
       {e + "down_proj_blocks", "U8"}},
      {"MXFP4 tensors without quantization_config",
       [&](json& j, std::vector<DiskTensorData>&) { j.erase("quantization_config"); }, {"gate_up_proj"}},
      {"an expert bias missing",
       [&](json&, std::vector<DiskTensorData>& t) {
         t.erase(std::find_if(t.begin(), t.end(), [&](const DiskTensorData& x) { return x.name == e + "down_proj_bias"; }));
       },
       {e + "down_proj_bias", "missing"}},
      {"sinks of the wrong size",
       [&](json&, std::vector<DiskTensorData>& t) {
         DiskTensorData& s = find(t, "model.layers.0.self_attn.sinks");
         s.shape = {2};
         s.bytes.resize(8);
       },
       {"model.layers.0.self_attn.sinks", "shape"}},
  };
  int i = 0;
  for (const Bad& b : cases) {
    SCOPED_TRACE(b.what);
    const std::string dir = tmp.file("bad" + std::to_string(i++));
    write_family_checkpoint(dir, w, true, b.edit);
    ModelWeights got;
    const Status st = load_model(dir, &got);
    ASSERT_FALSE(st.ok());
    for (const std::string& m : b.mentions) EXPECT_NE(st.message().find(m), std::string::npos) << st.to_string();
  }
}

// Exported, a family keeps its own config and tensors (q/k norms), Phi-3 becomes the unfused
// Llama / Mistral it is, and gpt-oss (whose fused writer does not exist yet) is refused.
TEST(ModelFamilyCheckpoint, ExportWritesEachFamilyAsAReaderExpectsIt) {
  const ModelWeights qwen3 = family_model("qwen3");
  auto source = memory_weight_source(qwen3);
  const std::vector<std::string> names = source->tensor_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "model.layers.2.self_attn.k_norm.weight"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "model.layers.2.self_attn.o_proj.bias"), names.end());
  const ModelConfig back = parsed(json::parse(source->config_json()));
  EXPECT_EQ(back.model_type, "qwen3");
  EXPECT_TRUE(back.qk_norm && back.attention_bias);
  for (int64_t l = 0; l < 3; ++l) EXPECT_EQ(back.layer_window(l), qwen3.config.layer_window(l)) << l;

  // gpt-oss without YaRN keeps its plain RoPE when written (its class defaults to YaRN).
  ModelConfig plain_oss = family_model("gpt_oss").config;
  plain_oss.yarn = YarnScaling{};
  ModelConfig oss_back;
  ASSERT_TRUE(parse_hf_config(hf_config_json(plain_oss), &oss_back).ok());
  EXPECT_FALSE(oss_back.yarn.enabled);
  EXPECT_EQ(oss_back.layer_window(0), plain_oss.layer_window(0));

  const ModelWeights phi3 = family_model("phi3");
  const ModelConfig as_written = parsed(json::parse(memory_weight_source(phi3)->config_json()));
  EXPECT_EQ(as_written.model_type, "mistral");
  EXPECT_EQ(as_written.layer_window(1), 6);

  const ModelWeights moe = family_model("qwen3_moe");
  const ModelConfig moe_back = parsed(json::parse(memory_weight_source(moe)->config_json()));
  EXPECT_EQ(moe_back.model_type, "qwen3_moe");
  EXPECT_FALSE(moe_back.moe_renormalize);
  EXPECT_EQ(moe_back.hidden_dim, moe.config.hidden_dim);

  TempDir tmp("llmq_family_export");
  Scheme scheme;
  ASSERT_TRUE(find_scheme("fp8-dynamic", &scheme).ok());
  ExportSummary summary;
  const ModelWeights oss = family_model("gpt_oss");
  const Status st = export_quantized(*memory_weight_source(oss), scheme, nullptr, tmp.file("oss"), {}, &summary);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  EXPECT_NE(st.message().find("gpt_oss"), std::string::npos) << st.to_string();
  EXPECT_FALSE(std::filesystem::exists(tmp.file("oss")));
}

// The CLI on each family's checkpoint: logits of every family, and `eval` of gpt-oss read from
// MXFP4 under FP8 schemes, whose weight error is the MXFP4 -> FP8 conversion's.
int run_cli(const std::string& args, std::string* output) {
  TempDir tmp("llmq_family_cli");
  const std::string cmd = std::string("'") + LLMQ_CLI_PATH + "' " + args + " > '" + tmp.file("out") + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream f(tmp.file("out"));
  std::stringstream ss;
  ss << f.rdbuf();
  *output = ss.str();
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(ModelFamilyCli, LogitsOfEveryFamilyAndTheMxfp4ConversionError) {
  TempDir tmp("llmq_family_cli_models");
  std::string out;
  for (const char* type : {"qwen3", "qwen3_moe", "phi3", "gpt_oss"}) {
    SCOPED_TRACE(type);
    const std::string dir = tmp.file(type);
    write_family_checkpoint(dir, family_model(type), std::string(type) == "gpt_oss");
    ASSERT_EQ(run_cli("logits --model '" + dir + "' --ids '1 5 9 17 33 65 80 3 44 21' -o '" + dir + ".bin'", &out), 0) << out;
    EXPECT_EQ(std::filesystem::file_size(dir + ".bin"), 10u * 96u * sizeof(float));
  }
  ASSERT_EQ(run_cli("eval --model '" + tmp.file("gpt_oss") + "' --scheme fp8-dynamic,fp8-block --samples 2 --length 12 --json", &out), 0)
      << out;
  const json j = json::parse(out.substr(out.find('{')));
  ASSERT_EQ(j["results"].size(), 2u);
  for (const json& r : j["results"]) {
    SCOPED_TRACE(r["scheme"].get<std::string>());
    const json& w = r["weight_error"];
    // FP8 holds E2M1 x 2^s values with a relative error of a few percent at most; not all exactly.
    EXPECT_GT(w["expert_rel_l2"].get<double>(), 0.0);
    EXPECT_LT(w["expert_rel_l2"].get<double>(), 0.05);
    EXPECT_GE(w["exact_fraction"].get<double>(), 0.0);
    EXPECT_LE(w["exact_fraction"].get<double>(), 1.0);
    EXPECT_GT(w["elements"].get<int64_t>(), 3 * 4 * 3 * 64 * 64);  // every expert of every layer, and more
  }
}

}  // namespace
}  // namespace llmq
