// The KV cache's static FP8 scales through a checkpoint: written by export_quantized under
// --kv-cache-scales (compressed-tensors' kv_cache_scheme and each attention module's k_scale /
// v_scale, from the calibration statistics' KV absmax), read back by read_kv_cache_scales (what the
// GPU loader hands an E4M3 cache), and the checkpoints either refuses.
#include <fstream>
#include <limits>

#include "model_quantize_support.hpp"

namespace llmq {
namespace {

// --kv-cache-scales: compressed-tensors' kv_cache_scheme, and per layer the attention module's
// k_scale and v_scale, each its KV absmax over the heads / 448 (recomputed here from the
// statistics); the checkpoint loads back as before. Refused without KV statistics and in the vLLM
// fp8 format; absent without the flag.
// The dense small model and fp8-dynamic, the scheme both tests export.
const Scheme& fp8_dynamic() {
  static const Scheme s = [] {
    Scheme scheme;
    EXPECT_TRUE(find_scheme("fp8-dynamic", &scheme).ok());
    return scheme;
  }();
  return s;
}

TEST(ExportKvCache, ScalesAreEachLayersAbsmaxOver448AndReadBack) {
  TempDir dir;
  const Scheme& scheme = fp8_dynamic();
  const SmallModel& m = small_model(exportable(scheme, 0));
  const ModelConfig& c = m.model.config;
  ASSERT_FALSE(m.stats.kv_cache.empty());
  const auto src = memory_weight_source(m.model);
  ExportOptions options;
  options.kv_cache_scales = true;
  ExportSummary sum;
  const std::string out = dir.file("kv");
  Status st = export_quantized(*src, scheme, &m.stats, out, options, &sum);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const json q = json::parse(read_text(out + "/config.json"))["quantization_config"];
  ASSERT_TRUE(q["kv_cache_scheme"].is_object()) << q.dump();
  EXPECT_EQ(q["kv_cache_scheme"]["num_bits"], 8);
  EXPECT_EQ(q["kv_cache_scheme"]["type"], "float");
  EXPECT_EQ(q["kv_cache_scheme"]["strategy"], "tensor");
  EXPECT_EQ(q["kv_cache_scheme"]["dynamic"], false);
  std::unique_ptr<SafetensorsFile> file;
  ASSERT_TRUE(SafetensorsFile::open(out + "/model.safetensors", &file).ok());
  const KvCacheStats& kv = m.stats.kv_cache;
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (const auto& [suffix, absmax] : {std::pair<const char*, const std::vector<float>*>{".k_scale", &kv.k_absmax},
                                         {".v_scale", &kv.v_absmax}}) {
      const std::string name = "model.layers." + std::to_string(l) + ".self_attn" + suffix;
      TensorView v;
      ASSERT_TRUE(file->view(name, &v).ok()) << name;
      EXPECT_EQ(v.dtype, DType::kF32) << name;
      EXPECT_EQ(v.shape, std::vector<int64_t>{1}) << name;
      float want = 0.0f;
      for (int64_t h = 0; h < c.n_kv_heads; ++h) want = std::max(want, (*absmax)[static_cast<size_t>(l * c.n_kv_heads + h)]);
      EXPECT_GT(want, 0.0f) << name;
      EXPECT_EQ(*static_cast<const float*>(v.data), want / 448.0f) << name;
    }
  QuantizedModel loaded;
  st = load_quantized_checkpoint(out, &loaded);
  EXPECT_TRUE(st.ok()) << st.to_string();
  // Read back per layer and KV head: each layer's one scale repeated over its heads.
  std::unique_ptr<Checkpoint> ckpt;
  ASSERT_TRUE(Checkpoint::open(out, &ckpt).ok());
  bool declared = false;
  std::vector<float> k_back, v_back;
  st = read_kv_cache_scales(*ckpt, c, &declared, &k_back, &v_back);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(declared);
  ASSERT_EQ(k_back.size(), static_cast<size_t>(c.n_layers * c.n_kv_heads));
  ASSERT_EQ(v_back.size(), k_back.size());
  for (int64_t l = 0; l < c.n_layers; ++l) {
    float kmax = 0.0f, vmax = 0.0f;
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      kmax = std::max(kmax, kv.k_absmax[static_cast<size_t>(l * c.n_kv_heads + h)]);
      vmax = std::max(vmax, kv.v_absmax[static_cast<size_t>(l * c.n_kv_heads + h)]);
    }
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      EXPECT_EQ(k_back[static_cast<size_t>(l * c.n_kv_heads + h)], kmax / 448.0f) << "layer " << l;
      EXPECT_EQ(v_back[static_cast<size_t>(l * c.n_kv_heads + h)], vmax / 448.0f) << "layer " << l;
    }
  }

  const std::string plain = dir.file("plain");
  ASSERT_TRUE(export_quantized(*src, scheme, &m.stats, plain, {}, &sum).ok());
  EXPECT_TRUE(json::parse(read_text(plain + "/config.json"))["quantization_config"]["kv_cache_scheme"].is_null());
  ASSERT_TRUE(SafetensorsFile::open(plain + "/model.safetensors", &file).ok());
  EXPECT_EQ(file->find("model.layers.0.self_attn.k_scale"), nullptr);

  st = export_quantized(*src, scheme, nullptr, dir.file("no_stats"), options, &sum);
  EXPECT_TRUE(contains(st.message(), "--kv-cache-scales: needs calibration statistics")) << st.to_string();
  CalibrationStats no_kv = m.stats;
  no_kv.kv_cache = KvCacheStats{};
  st = export_quantized(*src, scheme, &no_kv, dir.file("no_kv"), options, &sum);
  EXPECT_TRUE(contains(st.message(), "with the KV cache")) << st.to_string();
  Scheme block;
  ASSERT_TRUE(find_scheme("fp8-block", &block).ok());
  const SmallModel& mb = small_model(exportable(block, 0));
  st = export_quantized(*memory_weight_source(mb.model), block, &mb.stats, dir.file("block"), options, &sum);
  EXPECT_TRUE(contains(st.message(), "compressed-tensors checkpoints only")) << st.to_string();
  EXPECT_FALSE(std::filesystem::exists(dir.file("block"))) << "nothing written when refused";
}


// Checkpoints that declare KV scales wrong are refused by name; one that declares none reads as such.
TEST(ExportKvCache, DeclaredScalesAreReadOrRefusedByName) {
  TempDir dir;
  const Scheme& scheme = fp8_dynamic();
  const SmallModel& m = small_model(exportable(scheme, 0));
  const ModelConfig& c = m.model.config;
  const auto src = memory_weight_source(m.model);
  ExportSummary sum;
  bool declared = true;
  std::vector<float> k, v;
  const std::string plain = dir.file("plain");
  ASSERT_TRUE(export_quantized(*src, scheme, &m.stats, plain, {}, &sum).ok());
  std::unique_ptr<Checkpoint> ckpt;
  ASSERT_TRUE(Checkpoint::open(plain, &ckpt).ok());
  ASSERT_TRUE(read_kv_cache_scales(*ckpt, c, &declared, &k, &v).ok());
  EXPECT_FALSE(declared);
  EXPECT_TRUE(k.empty() && v.empty());

  // A declared scheme llmq does not read: refused, naming the field.
  const std::string odd = dir.file("odd");
  ExportOptions options;
  options.kv_cache_scales = true;
  ASSERT_TRUE(export_quantized(*src, scheme, &m.stats, odd, options, &sum).ok());
  json config = json::parse(read_text(odd + "/config.json"));
  config["quantization_config"]["kv_cache_scheme"]["strategy"] = "channel";
  write_text(odd + "/config.json", config.dump());
  ASSERT_TRUE(Checkpoint::open(odd, &ckpt).ok());
  Status st = read_kv_cache_scales(*ckpt, c, &declared, &k, &v);
  EXPECT_TRUE(contains(st.message(), "quantization_config.kv_cache_scheme")) << st.to_string();
  config["quantization_config"]["kv_cache_scheme"]["strategy"] = "attn_head";  // wants [kv_heads] each
  write_text(odd + "/config.json", config.dump());
  ASSERT_TRUE(Checkpoint::open(odd, &ckpt).ok());
  st = read_kv_cache_scales(*ckpt, c, &declared, &k, &v);
  EXPECT_TRUE(contains(st.message(), "model.layers.0.self_attn.k_scale holds 1 values")) << st.to_string();
  EXPECT_TRUE(contains(st.message(), "wants " + std::to_string(c.n_kv_heads))) << st.to_string();

  // A kv_cache_scheme that is not an object: refused, naming the field.
  config["quantization_config"]["kv_cache_scheme"] = "fp8";
  write_text(odd + "/config.json", config.dump());
  ASSERT_TRUE(Checkpoint::open(odd, &ckpt).ok());
  st = read_kv_cache_scales(*ckpt, c, &declared, &k, &v);
  EXPECT_TRUE(contains(st.message(), "quantization_config.kv_cache_scheme is \"fp8\"")) << st.to_string();

  // A scale that is NaN, then one that is negative: refused, naming the tensor.
  ASSERT_TRUE(export_quantized(*src, scheme, &m.stats, dir.file("bad_value"), options, &sum).ok());
  const std::string file = dir.file("bad_value") + "/model.safetensors";
  int64_t at = -1;
  {
    const std::string bytes = read_text(file);
    SafetensorsHeader header;
    ASSERT_TRUE(parse_safetensors_header(file, reinterpret_cast<const uint8_t*>(bytes.data()),
                                         static_cast<int64_t>(bytes.size()), &header).ok());
    for (const SafetensorsTensorInfo& t : header.tensors)
      if (t.name == "model.layers.1.self_attn.v_scale") at = header.data_start + t.offset;
  }
  ASSERT_GE(at, 0);
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -0.5f}) {
    {
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(at);
      f.write(reinterpret_cast<const char*>(&bad), 4);
    }
    ASSERT_TRUE(Checkpoint::open(dir.file("bad_value"), &ckpt).ok());
    st = read_kv_cache_scales(*ckpt, c, &declared, &k, &v);
    EXPECT_TRUE(contains(st.message(), "model.layers.1.self_attn.v_scale holds")) << st.to_string();
    EXPECT_TRUE(contains(st.message(), "not a finite positive scale")) << st.to_string();
  }
}

}  // namespace
}  // namespace llmq
