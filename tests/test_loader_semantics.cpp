// Checkpoints read back the way each engine's loader reads them, written here from the loaders'
// published source (not from llmq's own reader), and compared with what llmq meant: a format two
// loaders read differently is a model served wrong without an error somewhere.
//
//   transformers 5.x, quant_method "fp8" (quantizers/quantizer_finegrained_fp8.py,
//     integrations/finegrained_fp8.py): FineGrainedFP8Config, weight_block_size default [128, 128];
//     every Linear not in modules_to_not_convert becomes FP8Linear with parameters `weight` and
//     `weight_scale_inv` ([ceil(N/b0), ceil(K/b1)]); a `weight_scale` tensor is unexpected and the
//     missing weight_scale_inv stays as initialised. The dequantizing path (Fp8Dequantize, used
//     without the FP8 kernels) takes the block from the scale grid, rows // scale_rows, and raises
//     when rows % scale_rows != 0. Activations: dynamic, per token per 128 columns.
//   transformers, quant_method "compressed-tensors": needs the compressed-tensors package; without
//     it from_pretrained raises ImportError (a loud refusal).
//   vLLM, quant_method "fp8" (model_executor/layers/quantization/fp8.py): with weight_block_size,
//     weight_scale_inv [ceil(N/bn), ceil(K/bk)], element (i, j) scaled by [i / bn][j / bk]
//     (DeepSeek-V3 inference/kernel.py weight_dequant: a ceil grid, the last block shorter);
//     without it, a per-tensor `weight_scale` and, when activation_scheme is static, `input_scale`.
//   vLLM / compressed-tensors (compressed_tensors_w8a8_fp8.py, _int8.py; compressed-tensors'
//     QuantizationArgs): config_groups[*].weights.strategy "tensor" ([1] or scalar weight_scale) or
//     "channel" ([N, 1]); input_activations strategy "token" or "tensor", dynamic or static
//     (input_scale); value = code * weight_scale.
//   Which group a layer takes (vLLM compressed_tensors.py _quantization_scheme_map_from_config,
//     utils.py find_matched_target / should_ignore_layer): targets of every group in one map in
//     group order (a target written twice keeps the later group); a layer is vLLM's fused one
//     (q/k/v -> qkv_proj, gate/up -> gate_up_proj) and takes the first target equal to its name
//     or, for "re:" targets, whose pattern re.match-es it (anchored at the start only), else a
//     target contained in its class name ("Linear" in "QKVParallelLinear"), else, for a fused
//     layer, the target its first shard matches when every shard matches one (so k_proj is read
//     under q_proj's group). ignore: a fused layer is ignored when all shards are, and refused
//     (ValueError) when only some are. A group's input_activations apply when its "format", or
//     the global one, is naive-, int- or float-quantized.
//   transformers with the compressed-tensors package (apply_quantization_config): every Linear by
//     its own (unfused) name; ignore first (exact name or re.match); then every group with a
//     target equal to the name, re.match-ing it, or naming its class "Linear". A module two
//     groups take is merged or refused depending on the version: llmq must never write one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "llmq/calibration.hpp"
#include "llmq/export.hpp"
#include "llmq/format.hpp"
#include "llmq/model_io.hpp"
#include "llmq/quant_recipe.hpp"
#include "llmq/quantize_tensor.hpp"
#include "llmq/safetensors.hpp"
#include "support.hpp"

namespace llmq {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// What a loader makes of one linear layer.
struct LinearReading {
  std::vector<float> weight;  // dequantized, row-major [n, k]
  int64_t n = 0, k = 0;
  bool act_quantized = false;
  std::string act;            // "token", "tensor", "group128"
  bool act_dynamic = true;
  float input_scale = 0.0f;   // static activations
};
struct Reading {
  bool refused = false;  // the loader raises (a loud refusal is fine)
  std::string why;
  std::map<std::string, LinearReading> linears;  // quantized linears by module name
};

json config_of(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  return json::parse(in);
}

float code_value(const TensorView& v, int64_t i) {
  const uint8_t* p = static_cast<const uint8_t*>(v.data);
  if (v.dtype == DType::kI8) return static_cast<float>(static_cast<int8_t>(p[i]));
  return fp8_to_float(p[i], v.dtype);
}

std::vector<float> scales_of(const Checkpoint& ckpt, const std::string& name) {
  Tensor t;
  EXPECT_TRUE(ckpt.read_f32(name, &t).ok()) << name;
  return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel());
}

// Modules whose weight is stored as 8-bit codes.
std::vector<std::string> quantized_modules(const Checkpoint& ckpt) {
  std::vector<std::string> out;
  for (const std::string& name : ckpt.tensor_names()) {
    const SafetensorsTensorInfo* info = ckpt.find(name);
    if (name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0 &&
        (is_fp8(info->dtype) || info->dtype == DType::kI8))
      out.push_back(name.substr(0, name.size() - 7));
  }
  return out;
}

// A reading of module m with the shape of its stored codes (viewed in *w).
LinearReading shaped_like(const Checkpoint& ckpt, const std::string& m, TensorView* w) {
  EXPECT_TRUE(ckpt.view(m + ".weight", w).ok()) << m;
  LinearReading l;
  l.n = w->shape.at(0);
  l.k = w->shape.at(1);
  return l;
}

// Block dequantization with an explicit block (vLLM / DeepSeek: ceil grid, shorter last block).
std::vector<float> dequant_blocks(const TensorView& w, const std::vector<float>& s, int64_t br, int64_t bc,
                                  int64_t scale_cols) {
  const int64_t n = w.shape[0], k = w.shape[1];
  std::vector<float> out(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j)
      out[static_cast<size_t>(i * k + j)] = code_value(w, i * k + j) * s[static_cast<size_t>((i / br) * scale_cols + j / bc)];
  return out;
}

Reading read_as_transformers(const std::string& dir) {
  Reading r;
  const json q = config_of(dir)["quantization_config"];
  const std::string method = q.value("quant_method", "");
  if (method == "compressed-tensors") {
    r.refused = true;
    r.why = "ImportError: compressed-tensors is not installed";
    return r;
  }
  EXPECT_EQ(method, "fp8");
  if (q.value("activation_scheme", "dynamic") != "dynamic") {
    r.refused = true;  // FineGrainedFP8Config.post_init: only dynamic activation is supported
    r.why = "activation_scheme must be dynamic";
    return r;
  }
  std::unique_ptr<Checkpoint> ckpt;
  EXPECT_TRUE(Checkpoint::open(dir, &ckpt).ok());
  int64_t b0 = 128, b1 = 128;
  if (q.contains("weight_block_size") && q["weight_block_size"].is_array()) {
    b0 = q["weight_block_size"][0];
    b1 = q["weight_block_size"][1];
  }
  for (const std::string& m : quantized_modules(*ckpt)) {
    TensorView w;
    LinearReading l = shaped_like(*ckpt, m, &w);
    const SafetensorsTensorInfo* s = ckpt->find(m + ".weight_scale_inv");
    if (s == nullptr) {
      // The parameter keeps its initial value: the layer is not what was quantized. NaN marks it.
      l.weight.assign(static_cast<size_t>(l.n * l.k), std::nanf(""));
    } else {
      const int64_t sr = s->shape.at(0), sc = s->shape.at(1);
      if (sr != (l.n + b0 - 1) / b0 || sc != (l.k + b1 - 1) / b1) {
        // transformers installs a mis-shaped scale without a check (a quantizer is active) and
        // its Triton forward asserts on the shape: a failure, though only at the first forward.
        r.refused = true;
        r.why = m + ".weight_scale_inv has the wrong grid";
        return r;
      }
      if (l.n % sr != 0 || l.k % sc != 0) {
        r.refused = true;  // Fp8Dequantize: "Weight shape ... not divisible by scale grid"
        r.why = m + ": weight shape not divisible by scale grid";
        return r;
      }
      l.weight = dequant_blocks(w, scales_of(*ckpt, m + ".weight_scale_inv"), l.n / sr, l.k / sc, sc);
    }
    l.act_quantized = true;
    l.act = "group" + std::to_string(b1);
    r.linears[m] = std::move(l);
  }
  return r;
}

// Python's re.match(pattern, value): anchored at the start only.
bool re_match(const std::string& pattern, const std::string& value) {
  return std::regex_search(value, std::regex(pattern), std::regex_constants::match_continuous);
}
bool vllm_equal_or_regex(const std::string& value, const std::string& target) {
  if (target.rfind("re:", 0) == 0) return re_match(target.substr(3), value);
  return target == value;
}

// vLLM's fused layer for an unfused module, and the shards it holds.
std::vector<std::string> vllm_shards(const std::string& m) {
  for (const auto& [one, all] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"q_proj", {"q_proj", "k_proj", "v_proj"}}, {"k_proj", {"q_proj", "k_proj", "v_proj"}},
           {"v_proj", {"q_proj", "k_proj", "v_proj"}}, {"gate_proj", {"gate_proj", "up_proj"}},
           {"up_proj", {"gate_proj", "up_proj"}}}) {
    if (m.size() < one.size() || m.compare(m.size() - one.size(), one.size(), one) != 0) continue;
    std::vector<std::string> shards;
    for (const std::string& s : all) shards.push_back(m.substr(0, m.size() - one.size()) + s);
    return shards;
  }
  return {m};
}

// The config group vLLM reads module m's layer under (see the header); false with *why when it
// refuses the checkpoint or would leave the layer unquantized.
bool vllm_group(const json& q, const std::string& m, const json** out, std::string* why) {
  std::vector<std::pair<std::string, const json*>> targets;  // in map order, later groups replace
  for (const auto& [name, g] : q["config_groups"].items())
    for (const std::string t : g["targets"]) {
      auto it = std::find_if(targets.begin(), targets.end(), [&](const auto& e) { return e.first == t; });
      if (it != targets.end()) it->second = &g;
      else targets.push_back({t, &g});
    }
  const std::vector<std::string> shards = vllm_shards(m);
  const bool fused = shards.size() > 1;
  int ignored = 0;
  for (const std::string& s : shards)
    for (const std::string t : q.value("ignore", json::array()))
      if (vllm_equal_or_regex(s, t)) {
        ++ignored;
        break;
      }
  if (ignored != 0) {
    *why = ignored == static_cast<int>(shards.size()) ? m + " is stored 8-bit but ignored (read as float)"
                                                        : "ValueError: shards of " + m + " partly ignored";
    return false;
  }
  std::string layer = m;  // vLLM's name for the layer: model.layers.0.self_attn.qkv_proj
  if (fused) {
    const std::string& first = shards[0];
    const bool qkv = first.size() >= 6 && first.compare(first.size() - 6, 6, "q_proj") == 0;
    layer = first.substr(0, first.size() - (qkv ? 6 : 9)) + (qkv ? "qkv_proj" : "gate_up_proj");
  }
  for (const auto& [t, g] : targets)
    if (vllm_equal_or_regex(layer, t)) return *out = g, true;
  for (const auto& [t, g] : targets)
    if (t == "Linear") return *out = g, true;  // contained in every vLLM linear class name
  std::vector<const json*> per_shard;
  for (const std::string& s : shards)
    for (const auto& [t, g] : targets)
      if (vllm_equal_or_regex(s, t)) {
        per_shard.push_back(g);
        break;
      }
  if (fused && per_shard.size() == shards.size()) return *out = per_shard[0], true;  // the first shard's group
  *why = m + " matches no target (left unquantized, its 8-bit weight read as float)";
  return false;
}

// transformers with compressed-tensors: module m by its own name, or refused (see the header).
Reading read_as_compressed_tensors(const std::string& dir) {
  Reading r;
  const json q = config_of(dir)["quantization_config"];
  std::unique_ptr<Checkpoint> ckpt;
  EXPECT_TRUE(Checkpoint::open(dir, &ckpt).ok());
  EXPECT_EQ(q.value("quant_method", ""), "compressed-tensors");
  for (const std::string& m : quantized_modules(*ckpt)) {
    for (const std::string t : q.value("ignore", json::array()))
      if (t == m || (t.rfind("re:", 0) == 0 && re_match(t.substr(3), m))) {
        r.refused = true;
        r.why = m + " is stored 8-bit but ignored";
        return r;
      }
    std::vector<const json*> groups;
    for (const auto& [name, g] : q["config_groups"].items())
      for (const std::string t : g["targets"])
        if (t == m || t == "Linear" || (t.rfind("re:", 0) == 0 && re_match(t.substr(3), m))) {
          groups.push_back(&g);
          break;
        }
    if (groups.size() != 1) {
      r.refused = true;
      r.why = m + (groups.empty() ? " is in no group" : " is in several groups");
      return r;
    }
    const json& g = *groups[0];
    TensorView w;
    LinearReading l = shaped_like(*ckpt, m, &w);
    l.weight = g["weights"]["strategy"] == "channel" ? dequant_blocks(w, scales_of(*ckpt, m + ".weight_scale"), 1, l.k, 1)
                                                      : dequant_blocks(w, scales_of(*ckpt, m + ".weight_scale"), l.n, l.k, 1);
    const json& a = g["input_activations"];
    l.act_quantized = !a.is_null();
    if (l.act_quantized) {
      l.act = a["strategy"];
      l.act_dynamic = a["dynamic"].get<bool>();
      if (!l.act_dynamic) l.input_scale = scales_of(*ckpt, m + ".input_scale").at(0);
    }
    r.linears[m] = std::move(l);
  }
  return r;
}

Reading read_as_vllm(const std::string& dir) {
  Reading r;
  const json q = config_of(dir)["quantization_config"];
  std::unique_ptr<Checkpoint> ckpt;
  EXPECT_TRUE(Checkpoint::open(dir, &ckpt).ok());
  const std::string method = q.value("quant_method", "");
  for (const std::string& m : quantized_modules(*ckpt)) {
    TensorView w;
    LinearReading l = shaped_like(*ckpt, m, &w);
    auto require = [&](const std::string& name) {
      if (ckpt->find(name) != nullptr) return true;
      r.refused = true;
      r.why = "missing " + name;
      return false;
    };
    bool static_input = false;
    if (method == "fp8") {
      if (q.contains("weight_block_size")) {
        const int64_t bn = q["weight_block_size"][0], bk = q["weight_block_size"][1];
        if (!require(m + ".weight_scale_inv")) return r;
        const std::vector<int64_t>& ss = ckpt->find(m + ".weight_scale_inv")->shape;
        if (ss != std::vector<int64_t>{(l.n + bn - 1) / bn, (l.k + bk - 1) / bk}) {
          r.refused = true;
          r.why = m + ".weight_scale_inv has the wrong grid";
          return r;
        }
        l.weight = dequant_blocks(w, scales_of(*ckpt, m + ".weight_scale_inv"), bn, bk, ss[1]);
        l.act = "group" + std::to_string(bk);
      } else {
        if (!require(m + ".weight_scale")) return r;
        const std::vector<float> s = scales_of(*ckpt, m + ".weight_scale");
        l.weight = dequant_blocks(w, {s.at(0)}, l.n, l.k, 1);
        l.act = "tensor";
        static_input = q.value("activation_scheme", "dynamic") == "static";
      }
      l.act_quantized = true;
    } else {
      EXPECT_EQ(method, "compressed-tensors");
      const json* group = nullptr;
      std::string why;
      if (!vllm_group(q, m, &group, &why)) {
        r.refused = true;
        r.why = why;
        return r;
      }
      const json& g = *group;
      const std::string strategy = g["weights"]["strategy"];
      if (!require(m + ".weight_scale")) return r;
      const std::vector<float> s = scales_of(*ckpt, m + ".weight_scale");
      const std::vector<int64_t>& ss = ckpt->find(m + ".weight_scale")->shape;
      if (strategy == "channel") {
        if (ss != std::vector<int64_t>{l.n, 1}) {
          r.refused = true;
          r.why = m + ".weight_scale is not [N, 1]";
          return r;
        }
        l.weight = dequant_blocks(w, s, 1, l.k, 1);
      } else if (strategy == "tensor") {
        if (s.size() != 1) {
          r.refused = true;
          r.why = m + ".weight_scale is not one value";
          return r;
        }
        l.weight = dequant_blocks(w, s, l.n, l.k, 1);
      } else {
        r.refused = true;
        r.why = "weights strategy " + strategy;
        return r;
      }
      const json& a = g["input_activations"];
      const std::string format = g.contains("format") ? g["format"] : q["format"];
      l.act_quantized = !a.is_null() && (format == "naive-quantized" || format == "int-quantized" ||
                                         format == "float-quantized");
      if (l.act_quantized) {
        l.act = a["strategy"];
        static_input = !a["dynamic"].get<bool>();
      }
    }
    if (static_input) {
      if (!require(m + ".input_scale")) return r;
      l.act_dynamic = false;
      l.input_scale = scales_of(*ckpt, m + ".input_scale").at(0);
    }
    r.linears[m] = std::move(l);
  }
  return r;
}

// What llmq meant: the exporter's own reader, dequantized.
Reading read_as_llmq(const std::string& dir) {
  Reading r;
  QuantizedModel qm;
  const Status st = load_quantized_checkpoint(dir, &qm);
  EXPECT_TRUE(st.ok()) << st.to_string();
  for (const auto& [m, ql] : qm.linears) {
    LinearReading l;
    l.n = ql.weight.rows;
    l.k = ql.weight.cols;
    l.weight.resize(static_cast<size_t>(l.n * l.k));
    TensorView out{l.weight.data(), DType::kF32, {l.n, l.k}};
    EXPECT_TRUE(dequantize(ql.weight, out).ok()) << m;
    l.act_quantized = ql.quantize_input;
    if (ql.quantize_input) {
      const QuantSpec& a = ql.input_spec;
      l.act = a.granularity == Granularity::kPerToken    ? "token"
              : a.granularity == Granularity::kPerTensor ? "tensor"
                                                         : "group" + std::to_string(a.block_cols);
      l.act_dynamic = a.source == ScaleSource::kDynamic;
      if (!l.act_dynamic) l.input_scale = ql.static_input_scale.scales.data_as<float>()[0];
    }
    r.linears[m] = std::move(l);
  }
  return r;
}

// A loader that takes the checkpoint must read every quantized linear as llmq meant it, bit for bit.
void expect_reads_as_meant(const Reading& got, const Reading& meant, const std::string& loader) {
  if (got.refused) return;
  ASSERT_EQ(got.linears.size(), meant.linears.size()) << loader;
  for (const auto& [m, want] : meant.linears) {
    const auto it = got.linears.find(m);
    ASSERT_NE(it, got.linears.end()) << loader << ": " << m;
    const LinearReading& l = it->second;
    ASSERT_EQ(l.weight.size(), want.weight.size()) << loader << ": " << m;
    int64_t differ = 0;
    for (size_t i = 0; i < want.weight.size(); ++i)
      if (std::memcmp(&l.weight[i], &want.weight[i], sizeof(float)) != 0) ++differ;
    EXPECT_EQ(differ, 0) << loader << " reads " << differ << " of " << want.weight.size() << " weights of " << m
                         << " differently from llmq";
    EXPECT_EQ(l.act_quantized, want.act_quantized) << loader << ": " << m;
    if (!want.act_quantized) continue;
    EXPECT_EQ(l.act, want.act) << loader << ": " << m;
    EXPECT_EQ(l.act_dynamic, want.act_dynamic) << loader << ": " << m;
    if (!want.act_dynamic) EXPECT_EQ(l.input_scale, want.input_scale) << loader << ": " << m;
  }
}

DefaultModelOptions options(int64_t dim, int64_t hidden) {
  DefaultModelOptions o;
  o.dim = dim;
  o.hidden_dim = hidden;
  o.n_layers = 2;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.vocab_size = 160;
  o.max_seq_len = 64;
  o.seed = 11;
  return o;
}

CalibrationStats calibrated(const ModelWeights& model) {
  std::vector<std::vector<int32_t>> seqs;
  EXPECT_TRUE(sample_token_sequences(model, 2, 24, 5, &seqs).ok());
  CalibrationStats stats;
  for (auto& s : seqs) {
    s.insert(s.begin(), model.config.bos_token);
    EXPECT_TRUE(calibrate(model, s, static_cast<int64_t>(s.size()), &stats).ok());
  }
  return stats;
}

// Every scheme llmq exports, from a model whose linears are whole 128x128 blocks and from one whose
// are not (dim 144, hidden 136): each loader either refuses loudly or reads exactly what llmq
// meant, and vLLM takes every checkpoint llmq writes.
TEST(LoaderSemantics, EveryLoaderThatTakesAnExportReadsWhatLlmqMeant) {
  testing::TempDir dir("llmq_loaders");
  for (const auto& [label, o] : {std::pair<std::string, DefaultModelOptions>{"aligned", options(256, 256)},
                                 std::pair<std::string, DefaultModelOptions>{"partial", options(144, 136)}}) {
    const ModelWeights model = make_default_model(o);
    const CalibrationStats stats = calibrated(model);
    const auto src = memory_weight_source(model);
    for (const Scheme& scheme : all_schemes()) {
      if (scheme.export_format == ExportFormat::kNone) continue;
      SCOPED_TRACE("REPRO model=" + label + " scheme=" + scheme.name);
      const std::string out = dir.file(label + "-" + scheme.name);
      ExportSummary sum;
      const Status st = export_quantized(*src, scheme, &stats, out, {}, &sum);
      if (scheme.weight.granularity == Granularity::kPerBlock && label == "partial") {
        EXPECT_FALSE(st.ok()) << "partial 128x128 blocks must be refused";
        EXPECT_NE(st.message().find("not a whole number of 128x128 blocks"), std::string::npos) << st.to_string();
        continue;
      }
      ASSERT_TRUE(st.ok()) << st.to_string();
      const Reading meant = read_as_llmq(out);
      ASSERT_FALSE(meant.linears.empty());
      const Reading vllm = read_as_vllm(out), hf = read_as_transformers(out);
      EXPECT_FALSE(vllm.refused) << "vLLM refuses: " << vllm.why;
      expect_reads_as_meant(vllm, meant, "vLLM");
      expect_reads_as_meant(hf, meant, "transformers");
      std::printf("  %-8s %-20s %-18s vLLM %s, transformers %s\n", label.c_str(), scheme.name.c_str(),
                  export_format_name(scheme.export_format), vllm.refused ? "refuses" : "reads it as meant",
                  hf.refused ? ("refuses (" + hf.why + ")").c_str() : "reads it as meant");
    }
  }
}

// The two checkpoints llmq used to write and no longer does, read by the same rules: the rules above
// are what would have caught them.
TEST(LoaderSemantics, TheFormerlyWrittenCheckpointsReadWrongInTransformers) {
  testing::TempDir dir("llmq_loaders");
  // 1. Per-tensor FP8 as quant_method "fp8" (a scalar weight_scale): vLLM reads it, transformers
  //    does not find weight_scale_inv and keeps the parameter's initial value.
  // 2. 128x128 blocks over a [172, 64] weight (scale grid [2, 1]): vLLM reads rows 0-127 with the
  //    first scale, transformers' dequantizer rows 0-85.
  const int64_t n = 172, k = 64;
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>((i * 37 + 11) % 0x7e);  // finite e4m3
  auto write = [&](const std::string& d, const json& q, const std::string& scale_name, std::vector<int64_t> scale_shape,
                   std::vector<float> scales) {
    fs::create_directories(d);
    std::vector<SafetensorsWriteEntry> e;
    e.push_back({"model.layers.0.mlp.up_proj.weight", DType::kE4M3, {n, k}, [&codes](uint8_t* dst) -> Status {
                   std::memcpy(dst, codes.data(), codes.size());
                   return {};
                 }});
    e.push_back({"model.layers.0.mlp.up_proj." + scale_name, DType::kF32, scale_shape,
                 [scales](uint8_t* dst) -> Status {
                   std::memcpy(dst, scales.data(), scales.size() * 4);
                   return {};
                 }});
    ASSERT_TRUE(write_safetensors(d + "/model.safetensors", e).ok());
    std::ofstream(d + "/config.json") << json{{"quantization_config", q}}.dump();
  };
  const std::string per_tensor = dir.file("per-tensor-fp8"), partial = dir.file("partial-blocks");
  write(per_tensor, {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}}, "weight_scale", {}, {0.5f});
  write(partial, {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}}},
        "weight_scale_inv", {2, 1}, {0.25f, 4.0f});

  const Reading v1 = read_as_vllm(per_tensor), h1 = read_as_transformers(per_tensor);
  ASSERT_FALSE(v1.refused);
  ASSERT_FALSE(h1.refused) << "transformers loads it without an error";
  EXPECT_EQ(v1.linears.begin()->second.weight[1], fp8_to_float(codes[1], DType::kE4M3) * 0.5f);
  EXPECT_TRUE(std::isnan(h1.linears.begin()->second.weight[1])) << "transformers never reads the scale";

  const Reading v2 = read_as_vllm(partial), h2 = read_as_transformers(partial);
  ASSERT_FALSE(v2.refused);
  ASSERT_FALSE(h2.refused) << "172 rows divide into 2 scale rows: transformers loads it without an error";
  const int64_t row = 100;  // in vLLM's first block, transformers' second
  EXPECT_EQ(v2.linears.begin()->second.weight[row * k], fp8_to_float(codes[row * k], DType::kE4M3) * 0.25f);
  EXPECT_EQ(h2.linears.begin()->second.weight[row * k], fp8_to_float(codes[row * k], DType::kE4M3) * 4.0f);
}

// --format: a scheme is written in another format only where every loader reads it right.
TEST(LoaderSemantics, FormatOverrideRefusesWhatALoaderWouldReadWrong) {
  testing::TempDir dir("llmq_loaders");
  const ModelWeights model = make_default_model(options(256, 256));
  const auto src = memory_weight_source(model);
  auto export_as = [&](const std::string& name, ExportFormat f) {
    Scheme scheme;
    EXPECT_TRUE(find_scheme(name, &scheme).ok());
    ExportOptions opt;
    opt.format = f;
    ExportSummary sum;
    return export_quantized(*src, scheme, nullptr, dir.file(name + "-" + export_format_name(f)), opt, &sum);
  };
  const Status tensor_fp8 = export_as("fp8-tensor-dynamic", ExportFormat::kVllmFp8);
  EXPECT_FALSE(tensor_fp8.ok());
  EXPECT_NE(tensor_fp8.message().find("transformers reads every quant_method 'fp8' checkpoint as 128x128 blocks"),
            std::string::npos)
      << tensor_fp8.to_string();
  const Status channel_fp8 = export_as("fp8-dynamic", ExportFormat::kVllmFp8);
  EXPECT_FALSE(channel_fp8.ok());
  const Status block_ct = export_as("fp8-block", ExportFormat::kCompressedTensors);
  EXPECT_FALSE(block_ct.ok());
  EXPECT_NE(block_ct.message().find("--format fp8"), std::string::npos) << block_ct.to_string();
  EXPECT_TRUE(export_as("fp8-block", ExportFormat::kVllmFp8).ok());
  EXPECT_TRUE(export_as("fp8-tensor-dynamic", ExportFormat::kCompressedTensors).ok());
  EXPECT_FALSE(fs::exists(dir.file("fp8-tensor-dynamic-fp8"))) << "a refused export writes nothing";
}

// Mixed recipes (quant_recipe.hpp): several config groups with exact-name targets and an ignore
// list. vLLM and transformers + compressed-tensors both read every quantized linear as llmq meant:
// weights, activation strategy, static scales.
TEST(LoaderSemantics, MixedRecipeExportsAreReadAsMeantByEveryLoader) {
  testing::TempDir dir("llmq_loaders");
  const ModelWeights model = make_default_model(options(256, 256));
  const CalibrationStats stats = calibrated(model);
  const auto src = memory_weight_source(model);
  QuantRecipe int_and_float;
  int_and_float.groups = {{"attn", "int8-w8a8", {"re:.*self_attn\\..*"}},
                          {"gate_up", "fp8-channel-static", {"re:.*mlp\\.(gate|up)_proj"}},
                          {"down", "fp8-weight-only", {"re:.*down_proj"}}};
  int_and_float.ignore = {"model.layers.0.mlp.down_proj"};
  QuantRecipe float_only;
  float_only.groups = {{"attn", "fp8-tensor-static", {"re:.*self_attn\\..*"}}, {"mlp", "fp8-dynamic", {"re:.*mlp\\..*"}}};
  float_only.ignore = {"re:model\\.layers\\.1\\.self_attn\\..*"};
  for (const auto& [label, recipe] : {std::pair<std::string, QuantRecipe>{"int-and-float", int_and_float},
                                      std::pair<std::string, QuantRecipe>{"float-only", float_only}}) {
    SCOPED_TRACE("REPRO recipe=" + label);
    const std::string out = dir.file(label);
    ExportSummary sum;
    const Status st = export_quantized(*src, recipe, &stats, out, {}, &sum);
    ASSERT_TRUE(st.ok()) << st.to_string();
    const json q = config_of(out)["quantization_config"];
    EXPECT_EQ(q["config_groups"].size(), 3u - (label == "float-only" ? 1u : 0u));
    EXPECT_EQ(q["format"], label == "float-only" ? "float-quantized" : "mixed-precision");
    // Every 8-bit module is the exact target of one group; every other linear is in ignore.
    ResolvedRecipe resolved;
    ASSERT_TRUE(resolve_recipe(recipe, model.config, &resolved).ok());
    std::map<std::string, int> targeted;
    for (const auto& [name, g] : q["config_groups"].items())
      for (const std::string t : g["targets"]) {
        EXPECT_NE(t.rfind("re:", 0), 0u) << "mixed targets are exact names: " << t;
        ++targeted[t];
      }
    for (const auto& [m, s] : resolved.scheme_of) EXPECT_EQ(targeted[m], 1) << m;
    EXPECT_EQ(targeted.size(), resolved.scheme_of.size());
    EXPECT_EQ(q["ignore"].get<std::vector<std::string>>(), resolved.kept);
    const Reading meant = read_as_llmq(out), vllm = read_as_vllm(out), ct = read_as_compressed_tensors(out);
    ASSERT_EQ(meant.linears.size(), resolved.scheme_of.size());
    EXPECT_FALSE(vllm.refused) << "vLLM refuses: " << vllm.why;
    EXPECT_FALSE(ct.refused) << "compressed-tensors refuses: " << ct.why;
    expect_reads_as_meant(vllm, meant, "vLLM");
    expect_reads_as_meant(ct, meant, "transformers + compressed-tensors");
  }
}

// Why llmq keeps q/k/v in one group and never lets two groups take a module: the same files with
// k_proj moved into a group of its own are read by vLLM under q_proj's group (the fused layer
// takes its first shard's) and by compressed-tensors under its own; a "Linear" group beside the
// exact names makes compressed-tensors' matching ambiguous.
TEST(LoaderSemantics, SplitFusedLayersAndOverlappingGroupsReadDifferently) {
  testing::TempDir dir("llmq_loaders");
  const ModelWeights model = make_default_model(options(256, 256));
  const auto src = memory_weight_source(model);
  QuantRecipe recipe;
  recipe.groups = {{"attn", "fp8-dynamic", {"re:.*self_attn\\..*"}}, {"mlp", "fp8-tensor-dynamic", {"re:.*mlp\\..*"}}};
  const std::string out = dir.file("mixed");
  ExportSummary sum;
  ASSERT_TRUE(export_quantized(*src, recipe, nullptr, out, {}, &sum).ok());
  json config = config_of(out);
  json& groups = config["quantization_config"]["config_groups"];
  const std::string k = "model.layers.0.self_attn.k_proj";
  std::string attn_group;
  for (auto& [name, g] : groups.items()) {
    auto& t = g["targets"];
    const auto it = std::find(t.begin(), t.end(), k);
    if (it == t.end()) continue;
    attn_group = name;
    t.erase(it);
  }
  ASSERT_FALSE(attn_group.empty());
  json own = groups[attn_group];
  own["targets"] = {k};
  own["input_activations"]["strategy"] = "tensor";  // the same weights, activations per tensor
  groups["group_k"] = own;
  std::ofstream(out + "/config.json") << config.dump(2);
  const Reading vllm = read_as_vllm(out), ct = read_as_compressed_tensors(out);
  ASSERT_FALSE(vllm.refused) << vllm.why;
  ASSERT_FALSE(ct.refused) << ct.why;
  EXPECT_EQ(vllm.linears.at(k).act, "token") << "vLLM reads k_proj under q_proj's group";
  EXPECT_EQ(ct.linears.at(k).act, "tensor") << "compressed-tensors reads k_proj under its own group";

  groups["group_all"] = groups[attn_group];
  groups["group_all"]["targets"] = {"Linear"};
  std::ofstream(out + "/config.json") << config.dump(2);
  EXPECT_TRUE(read_as_compressed_tensors(out).refused) << "a module in two groups";
}

// A recipe's schemes must all be writable as compressed-tensors, and the fp8 format holds one.
TEST(LoaderSemantics, MixedRecipesLlmqCannotWriteForEveryLoaderAreRefused) {
  testing::TempDir dir("llmq_loaders");
  const ModelWeights model = make_default_model(options(256, 256));
  const auto src = memory_weight_source(model);
  QuantRecipe blocks;
  blocks.groups = {{"attn", "fp8-block", {"re:.*self_attn\\..*"}}, {"mlp", "fp8-dynamic", {"re:.*mlp\\..*"}}};
  ExportSummary sum;
  const Status b = export_quantized(*src, blocks, nullptr, dir.file("blocks"), {}, &sum);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.message().find("fp8-block"), std::string::npos) << b.to_string();
  QuantRecipe two;
  two.groups = {{"attn", "fp8-dynamic", {"re:.*self_attn\\..*"}}, {"mlp", "int8-w8a8", {"re:.*mlp\\..*"}}};
  ExportOptions fp8;
  fp8.format = ExportFormat::kVllmFp8;
  const Status f = export_quantized(*src, two, nullptr, dir.file("fp8"), fp8, &sum);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.message().find("compressed-tensors only"), std::string::npos) << f.to_string();
  EXPECT_FALSE(fs::exists(dir.file("blocks")) || fs::exists(dir.file("fp8"))) << "a refused export writes nothing";
  // One scheme with layers kept is written as that scheme is: fp8 blocks with ignored_layers.
  QuantRecipe kept = uniform_recipe("fp8-block");
  kept.ignore = {"re:model\\.layers\\.1\\..*"};
  ASSERT_TRUE(export_quantized(*src, kept, nullptr, dir.file("kept"), {}, &sum).ok());
  const json q = config_of(dir.file("kept"))["quantization_config"];
  EXPECT_EQ(q["quant_method"], "fp8");
  const Reading meant = read_as_llmq(dir.file("kept")), vllm = read_as_vllm(dir.file("kept"));
  EXPECT_EQ(meant.linears.size(), 7u);
  expect_reads_as_meant(vllm, meant, "vLLM");
}

}  // namespace
}  // namespace llmq
