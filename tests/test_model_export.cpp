// Export of quantized models to vLLM "fp8" / compressed-tensors directories: config keys, tensor
// names, dtypes and shapes; their load back; the streaming checkpoint path; the output-directory
// rules (never over the input, temp directory and rename, dry run, shards). Models as in
// test_model_quantize.cpp (model_quantize_support.hpp).
#include "model_quantize_support.hpp"

namespace llmq {
namespace {

// Checks what export_quantized wrote for `scheme` from `src` into `out`: the quantization_config
// keys vLLM and compressed-tensors read, and every tensor's name, dtype and shape.
void check_export_layout(const WeightSource& src, const Scheme& scheme, const std::string& out,
                         const ExportSummary& sum, DType keep_dtype) {
  const ModelConfig& c = src.config();
  EXPECT_EQ(dir_entries(out), (std::vector<std::string>{".llmq-output", "config.json", "model.safetensors"}));
  const json config = json::parse(read_text(out + "/config.json"));
  ASSERT_TRUE(config.contains("quantization_config"));
  const json& q = config["quantization_config"];
  EXPECT_EQ(json::parse(sum.quantization_config), q);
  EXPECT_EQ(config.value("torch_dtype", ""), keep_dtype == DType::kBF16 ? "bfloat16" : "float32");
  const bool act_static = is_static(scheme);
  const bool block = scheme.weight.granularity == Granularity::kPerBlock;
  const bool channel = scheme.weight.granularity == Granularity::kPerChannel;
  const bool vllm = scheme.export_format == ExportFormat::kVllmFp8;
  EXPECT_EQ(vllm, block) << "the fp8 format is for blocks only; per-tensor FP8 is compressed-tensors";
  std::vector<std::string> ignore;
  if (vllm) {
    EXPECT_EQ(q.value("quant_method", ""), "fp8");
    EXPECT_EQ(q.value("activation_scheme", ""), act_static ? "static" : "dynamic");
    EXPECT_EQ(q.contains("weight_block_size"), block);
    if (block) {
      EXPECT_EQ(q["weight_block_size"], json::array({128, 128}));
    }
    ASSERT_TRUE(q.contains("ignored_layers") && q["ignored_layers"].is_array());
    ignore = q["ignored_layers"].get<std::vector<std::string>>();
  } else {
    const bool is_float = scheme.weight.format == DType::kE4M3;
    EXPECT_EQ(q.value("quant_method", ""), "compressed-tensors");
    EXPECT_EQ(q.value("format", ""), is_float ? "float-quantized" : "int-quantized");
    ASSERT_TRUE(q.contains("config_groups") && q["config_groups"].contains("group_0"));
    EXPECT_EQ(q["config_groups"].size(), 1u);
    const json& g = q["config_groups"]["group_0"];
    EXPECT_EQ(g["targets"], json::array({"Linear"}));
    const json& w = g["weights"];
    EXPECT_EQ(w["num_bits"], 8);
    EXPECT_EQ(w["type"], is_float ? "float" : "int");
    EXPECT_EQ(w["symmetric"], true);
    EXPECT_EQ(w["strategy"], channel ? "channel" : "tensor");
    EXPECT_EQ(w["dynamic"], false);
    ASSERT_TRUE(g.contains("input_activations"));
    const json& a = g["input_activations"];
    if (!scheme.quantize_activations) {
      EXPECT_TRUE(a.is_null()) << "weight-only: input_activations must be null";
    } else {
      EXPECT_EQ(a["num_bits"], 8);
      EXPECT_EQ(a["type"], is_float ? "float" : "int");
      EXPECT_EQ(a["strategy"], scheme.activation.granularity == Granularity::kPerToken ? "token" : "tensor");
      EXPECT_EQ(a["dynamic"], !act_static);
    }
    ASSERT_TRUE(q.contains("ignore") && q["ignore"].is_array());
    ignore = q["ignore"].get<std::vector<std::string>>();
  }
  EXPECT_NE(std::find(ignore.begin(), ignore.end(), "lm_head"), ignore.end()) << "lm_head must be ignored";
  if (c.is_moe())
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const std::string router = "model.layers." + std::to_string(l) + ".block_sparse_moe.gate";
      EXPECT_NE(std::find(ignore.begin(), ignore.end(), router), ignore.end()) << router << " is not quantized";
    }

  // Tensors: every source tensor, plus the scales of the quantized linears.
  std::unique_ptr<SafetensorsFile> file;
  ASSERT_TRUE(SafetensorsFile::open(out + "/model.safetensors", &file).ok());
  const DType wdtype = scheme.weight.format;
  std::set<std::string> quantized;
  for (const LinearId& id : linear_ids(c))
    if (id.role != LinearRole::kLmHead && id.role != LinearRole::kRouter) quantized.insert(id.hf_name(c));
  int64_t want_tensors = 0, bytes = 0;
  for (const std::string& name : src.tensor_names()) {
    std::vector<int64_t> shape;
    ASSERT_TRUE(src.shape(name, &shape).ok());
    const SafetensorsTensorInfo* info = file->find(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->shape, shape) << name;
    ++want_tensors;
    const std::string module = name.substr(0, name.size() - std::string(".weight").size());
    if (quantized.count(module) == 0) {
      EXPECT_EQ(info->dtype, keep_dtype) << name << " is kept in high precision";
      continue;
    }
    EXPECT_EQ(info->dtype, wdtype) << name;
    const int64_t n = shape[0], k = shape[1];
    const SafetensorsTensorInfo* scale = file->find(module + (block ? ".weight_scale_inv" : ".weight_scale"));
    ASSERT_NE(scale, nullptr) << module;
    ++want_tensors;
    EXPECT_EQ(scale->dtype, DType::kF32) << module;
    std::vector<int64_t> want_scale;
    if (block) want_scale = {n / 128, k / 128};
    else if (channel) want_scale = {n, 1};
    else want_scale = {1};
    EXPECT_EQ(scale->shape, want_scale) << module;
    EXPECT_EQ(file->find(module + (block ? ".weight_scale" : ".weight_scale_inv")), nullptr) << module;
    const SafetensorsTensorInfo* input_scale = file->find(module + ".input_scale");
    EXPECT_EQ(input_scale != nullptr, act_static) << module << ".input_scale present iff static";
    if (input_scale != nullptr) {
      ++want_tensors;
      EXPECT_EQ(input_scale->dtype, DType::kF32);
      EXPECT_EQ(input_scale->shape, std::vector<int64_t>{1}) << module;
    }
  }
  EXPECT_EQ(static_cast<int64_t>(file->tensors().size()), want_tensors) << "no extra tensors";
  for (const auto& info : file->tensors()) bytes += info.nbytes;
  EXPECT_EQ(sum.tensors, want_tensors);
  EXPECT_EQ(sum.bytes, bytes);
  EXPECT_EQ(sum.shards, 1);
  EXPECT_EQ(sum.quantized_linears, static_cast<int64_t>(quantized.size()));
}

// Writes every tensor of the model's Hugging Face view as F32 with its config: an unquantized
// Hugging Face checkpoint of the same model.
void write_hf_checkpoint(const ModelWeights& model, const std::string& dir) {
  fs::create_directories(dir);
  const auto src = memory_weight_source(model);
  std::vector<SafetensorsWriteEntry> entries;
  for (const std::string& name : src->tensor_names()) {
    std::vector<int64_t> shape;
    ASSERT_TRUE(src->shape(name, &shape).ok());
    entries.push_back({name, DType::kF32, shape, [&src, name](uint8_t* dst) -> Status {
                         Tensor t;
                         LLMQ_RETURN_IF_ERROR(src->read(name, &t));
                         std::memcpy(dst, t.data(), static_cast<size_t>(t.nbytes()));
                         return {};
                       }});
  }
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", entries).ok());
  write_text(dir + "/config.json", hf_config_json(src->config()));
}

TEST(Export, KeptTensorsAreBf16ByDefault) {
  TempDir dir;
  for (int64_t experts : {int64_t{0}, int64_t{4}}) {
    // One scheme of each layout: compressed-tensors channel + token, static per-tensor,
    // fp8 blocks, INT8 SmoothQuant (norms divided by s, then rounded to BF16).
    for (const char* name : {"fp8-dynamic", "fp8-tensor-static", "fp8-block", "int8-smoothquant"}) {
      Scheme scheme;
      ASSERT_TRUE(find_scheme(name, &scheme).ok());
      const SmallModel& m = small_model(exportable(scheme, experts));
      const auto src = memory_weight_source(m.model);
      SCOPED_TRACE(scheme_repro(scheme, exportable(scheme, experts)) + " keep_dtype=bf16 (default)");
      const std::string out = dir.file(scheme.name + "-" + std::to_string(experts));
      ExportSummary sum;
      const Status st = export_quantized(*src, scheme, &m.stats, out, {}, &sum);
      ASSERT_TRUE(st.ok()) << st.to_string();
      check_export_layout(*src, scheme, out, sum, DType::kBF16);
    }
  }
}

// Every scheme: export (f32 kept tensors), check the layout, load back, and compare with the
// in-memory QuantizedModel: the same codes, the same scales and, for a model with no q/k
// permutation, the same logits bit for bit.
TEST(Export, EverySchemeWritesWhatEnginesReadAndLoadsBackExactly) {
  TempDir dir;
  for (int64_t experts : {int64_t{0}, int64_t{4}}) {
    for (const Scheme& scheme : all_schemes()) {
      if (scheme.export_format == ExportFormat::kNone) continue;
      if (experts > 0 && slow_weight_search(scheme)) continue;
      const int64_t which = exportable(scheme, experts);
      const SmallModel& m = small_model(which);
      const std::vector<int32_t> tokens = sampled_tokens(m.model, 32, kEvalSeed);
      const auto src = memory_weight_source(m.model);
      SCOPED_TRACE(scheme_repro(scheme, which) + " keep_dtype=f32");
      const std::string out = dir.file(scheme.name + "-" + std::to_string(experts));
      ExportOptions options;
      options.keep_dtype = DType::kF32;
      ExportSummary sum;
      const Status ex = export_quantized(*src, scheme, &m.stats, out, options, &sum);
      ASSERT_TRUE(ex.ok()) << ex.to_string();
      check_export_layout(*src, scheme, out, sum, DType::kF32);
      QuantizedModel loaded;
      const Status st = load_quantized_checkpoint(out, &loaded);
      ASSERT_TRUE(st.ok()) << st.to_string();
      const QuantizedModel& memory = quantized(which, scheme);
      EXPECT_EQ(loaded.scheme.name, scheme.name);
      ASSERT_EQ(loaded.linears.size(), memory.linears.size());
      for (const auto& [name, ml] : memory.linears) {
        const QuantizedLinear* l = loaded.find(name);
        ASSERT_NE(l, nullptr) << name;
        ASSERT_EQ(l->weight.data.nbytes(), ml.weight.data.nbytes()) << name;
        EXPECT_EQ(0, std::memcmp(l->weight.data.data(), ml.weight.data.data(), static_cast<size_t>(ml.weight.data.nbytes())))
            << name << ": codes differ";
        ASSERT_EQ(l->weight.scales.scales.nbytes(), ml.weight.scales.scales.nbytes()) << name;
        EXPECT_EQ(0, std::memcmp(l->weight.scales.scales.data(), ml.weight.scales.scales.data(),
                                 static_cast<size_t>(ml.weight.scales.scales.nbytes())))
            << name << ": scales differ";
        EXPECT_EQ(l->quantize_input, ml.quantize_input) << name;
        if (ml.quantize_input) {  // a weight-only model's activation spec is unused
          EXPECT_EQ(l->input_spec.source, ml.input_spec.source) << name;
          EXPECT_EQ(l->input_spec.granularity, ml.input_spec.granularity) << name;
          if (ml.input_spec.source == ScaleSource::kStatic) {
            EXPECT_EQ(l->static_input_scale.scales.data_as<float>()[0],
                      ml.static_input_scale.scales.data_as<float>()[0])
                << name;
          }
        }
        EXPECT_EQ(l->weight.scales.block.rows, ml.weight.scales.block.rows) << name;
        EXPECT_EQ(l->weight.scales.block.cols, ml.weight.scales.block.cols) << name;
      }
      QuantizedLinearBackend lb(loaded), mb(memory);
      const std::vector<float> got = logits_of(loaded.weights, &lb, tokens);
      const std::vector<float> want = logits_of(memory.weights, &mb, tokens);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
            << "logit " << i << ": loaded " << got[i] << " vs in-memory " << want[i];
    }
  }
}

TEST(Export, Stories260KRoundTripsThroughEveryScheme) {
  if (!have_stories()) GTEST_SKIP() << skip_reason();
  const ModelWeights& model = small_model(kStories).model;
  const CalibrationStats& stats = small_model(kStories).stats;
  ASSERT_EQ(model.config.rope_style, RopeStyle::kInterleaved);
  ASSERT_TRUE(model.config.tie_embeddings);
  const std::vector<int32_t> tokens = sampled_tokens(model, 48, kEvalSeed);
  const auto src = memory_weight_source(model);
  TempDir dir;
  // The same model in Hugging Face layout (q/k rows permuted, rotate-half RoPE), unquantized: the
  // exported checkpoint must equal this model quantized in memory, bit for bit.
  write_hf_checkpoint(model, dir.file("hf"));
  ModelWeights hf_model;
  ASSERT_TRUE(load_hf_model(dir.file("hf"), &hf_model).ok());
  for (const Scheme& scheme : all_schemes()) {
    if (scheme.export_format == ExportFormat::kNone || slow_weight_search(scheme)) continue;
    SCOPED_TRACE("REPRO scheme=" + scheme.name + " model=stories260K keep_dtype=f32");
    const std::string out = dir.file(scheme.name);
    ExportOptions options;
    options.keep_dtype = DType::kF32;
    ExportSummary sum;
    const Status ex = export_quantized(*src, scheme, &stats, out, options, &sum);
    if (is_block(scheme)) {  // dims 64 and 172: partial 128x128 blocks, refused before anything is written
      EXPECT_FALSE(ex.ok());
      EXPECT_TRUE(contains(ex.message(), "not a whole number of 128x128 blocks")) << ex.to_string();
      EXPECT_FALSE(fs::exists(out));
      continue;
    }
    ASSERT_TRUE(ex.ok()) << ex.to_string();
    const json q = json::parse(read_text(out + "/config.json"))["quantization_config"];
    const json& ignore = q.contains("ignore") ? q["ignore"] : q["ignored_layers"];
    EXPECT_NE(std::find(ignore.begin(), ignore.end(), "lm_head"), ignore.end())
        << "a tied lm_head stays the high-precision embedding and must be listed as not quantized";
    QuantizedModel loaded, hf_memory;
    const Status st = load_quantized_checkpoint(out, &loaded);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(loaded.weights.config.rope_style, RopeStyle::kHalf);
    ASSERT_TRUE(quantize_model(hf_model, scheme, &stats, {}, &hf_memory).ok());
    const QuantizedModel& memory = quantized(kStories, scheme);
    EXPECT_EQ(loaded.linears.size(), memory.linears.size());
    QuantizedLinearBackend lb(loaded), hb(hf_memory), mb(memory);
    const std::vector<float> got = logits_of(loaded.weights, &lb, tokens);
    const std::vector<float> want = logits_of(hf_memory.weights, &hb, tokens);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
          << "logit " << i << ": loaded " << got[i] << " vs HF-layout in-memory " << want[i];
    // Against the llama2.c-layout model: the same next-token distributions up to reordered sums.
    const std::vector<float> orig = logits_of(memory.weights, &mb, tokens);
    const EvalAccumulator::Summary s = compare(orig, got, tokens, model.config.vocab_size);
    EXPECT_LE(s.kl.mean, kPermutedRoundTripMaxKl);
    EXPECT_LE(rel_diff(got, orig), kPermutedRoundTripRelTolerance);
    std::printf("  stories260K %-20s KL(llama2.c layout || exported) %.2e  max rel logit diff %.2e\n",
                scheme.name.c_str(), s.kl.mean, rel_diff(got, orig));
  }
}

TEST(Export, LmHeadIsQuantizedOnlyWhenAsked) {
  const ModelWeights model = make_default_model(small_options(0));
  const auto src = memory_weight_source(model);
  Scheme scheme;
  ASSERT_TRUE(find_scheme("fp8-dynamic", &scheme).ok());
  TempDir dir;
  ExportOptions options;
  options.keep_dtype = DType::kF32;
  options.quantize.quantize_lm_head = true;
  ExportSummary sum;
  ASSERT_TRUE(export_quantized(*src, scheme, nullptr, dir.file("q"), options, &sum).ok());
  std::unique_ptr<SafetensorsFile> file;
  ASSERT_TRUE(SafetensorsFile::open(dir.file("q") + "/model.safetensors", &file).ok());
  ASSERT_NE(file->find("lm_head.weight"), nullptr);
  EXPECT_EQ(file->find("lm_head.weight")->dtype, DType::kE4M3);
  ASSERT_NE(file->find("lm_head.weight_scale"), nullptr);
  EXPECT_EQ(file->find("lm_head.weight_scale")->shape, (std::vector<int64_t>{model.config.vocab_size, 1}));
  const json q = json::parse(read_text(dir.file("q") + "/config.json"))["quantization_config"];
  const auto ignore = q["ignore"].get<std::vector<std::string>>();
  EXPECT_EQ(std::find(ignore.begin(), ignore.end(), "lm_head"), ignore.end());

  QuantizedModel loaded, memory;
  ASSERT_TRUE(load_quantized_checkpoint(dir.file("q"), &loaded).ok());
  ASSERT_TRUE(quantize_model(model, scheme, nullptr, options.quantize, &memory).ok());
  ASSERT_NE(loaded.find("lm_head"), nullptr);
  const std::vector<int32_t> tokens = sampled_tokens(model, 16, kEvalSeed);
  QuantizedLinearBackend lb(loaded), mb(memory);
  const std::vector<float> got = logits_of(loaded.weights, &lb, tokens), want = logits_of(memory.weights, &mb, tokens);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
}

// read_quantized_linear (what the GPU loader streams through) reads a linear as
// load_quantized_checkpoint does, codes left in the file; float and absent linears read as not
// quantized; an unquantized checkpoint is recognised as such.
TEST(Export, ReadQuantizedLinearAgreesWithTheHostLoader) {
  const ModelWeights model = make_default_model(small_options(0));
  const auto src = memory_weight_source(model);
  TempDir dir;
  for (const std::string name : {"fp8-block", "int8-w8a8", "fp8-tensor-dynamic"}) {
    SCOPED_TRACE("REPRO scheme=" + name);
    Scheme scheme;
    ASSERT_TRUE(find_scheme(name, &scheme).ok());
    const auto scheme_src = memory_weight_source(small_model(exportable(scheme, 0)).model);
    ExportSummary sum;
    ASSERT_TRUE(export_quantized(*scheme_src, scheme, nullptr, dir.file(name), {}, &sum).ok());
    std::unique_ptr<Checkpoint> ckpt;
    ASSERT_TRUE(Checkpoint::open(dir.file(name), &ckpt).ok());
    EXPECT_TRUE(is_quantized_checkpoint(*ckpt));
    EXPECT_EQ(quantized_checkpoint_scheme(*ckpt), name);
    QuantizedModel loaded;
    ASSERT_TRUE(load_quantized_checkpoint(dir.file(name), &loaded).ok());
    ASSERT_FALSE(loaded.linears.empty());
    for (const auto& [module, want] : loaded.linears) {
      QuantizedLinear got;
      bool quantized = false;
      const Status st = read_quantized_linear(*ckpt, module, false, &quantized, &got);
      ASSERT_TRUE(st.ok()) << module << ": " << st.to_string();
      ASSERT_TRUE(quantized) << module;
      EXPECT_EQ(got.weight.data.nbytes(), 0) << module << ": codes copied although with_codes is false";
      EXPECT_EQ(got.weight.rows, want.weight.rows);
      EXPECT_EQ(got.weight.cols, want.weight.cols);
      EXPECT_EQ(got.weight.spec.granularity, want.weight.spec.granularity) << module;
      ASSERT_EQ(got.weight.scales.scales.nbytes(), want.weight.scales.scales.nbytes()) << module;
      EXPECT_EQ(0, std::memcmp(got.weight.scales.scales.data(), want.weight.scales.scales.data(),
                               static_cast<size_t>(want.weight.scales.scales.nbytes())))
          << module;
      EXPECT_EQ(got.quantize_input, want.quantize_input) << module;
      EXPECT_EQ(got.input_spec.granularity, want.input_spec.granularity) << module;
    }
    QuantizedLinear unused;
    bool quantized = true;
    ASSERT_TRUE(read_quantized_linear(*ckpt, "lm_head", false, &quantized, &unused).ok());
    EXPECT_FALSE(quantized) << "lm_head is kept in float by default";
    quantized = true;
    ASSERT_TRUE(read_quantized_linear(*ckpt, "model.layers.99.mlp.down_proj", false, &quantized, &unused).ok());
    EXPECT_FALSE(quantized) << "an absent weight (a tied lm_head) reads as not quantized";
  }
  ExportOptions plain;
  plain.unquantized = true;
  Scheme any;
  ASSERT_TRUE(find_scheme("fp8-dynamic", &any).ok());
  ExportSummary sum;
  ASSERT_TRUE(export_quantized(*src, any, nullptr, dir.file("plain"), plain, &sum).ok());
  std::unique_ptr<Checkpoint> ckpt;
  ASSERT_TRUE(Checkpoint::open(dir.file("plain"), &ckpt).ok());
  EXPECT_FALSE(is_quantized_checkpoint(*ckpt));
  EXPECT_EQ(quantized_checkpoint_scheme(*ckpt), "");
}

// The streaming path (a memory-mapped checkpoint) and the in-memory path must write the same bytes.
TEST(Export, StreamingFromACheckpointEqualsExportingFromMemory) {
  std::vector<std::pair<std::string, int64_t>> models = {{"dense", 0}, {"moe", 4}, {"aligned", kAligned}};
  if (have_stories())
    models.emplace_back("stories260K", kStories);
  else
    std::printf("  note: %s; the streaming test runs on the default models only\n", skip_reason().c_str());
  TempDir dir;
  for (const auto& [label, which] : models) {
    const ModelWeights& model = small_model(which).model;
    const CalibrationStats& stats = small_model(which).stats;
    const std::string hf = dir.file(label + "-hf");
    write_hf_checkpoint(model, hf);
    std::unique_ptr<WeightSource> ckpt;
    const Status open = checkpoint_weight_source(hf, &ckpt);
    ASSERT_TRUE(open.ok()) << open.to_string();
    EXPECT_EQ(ckpt->tensor_names(), memory_weight_source(model)->tensor_names());

    // The unquantized checkpoint is the same model (stories260K: up to the q.k summation order).
    ModelWeights reloaded;
    ASSERT_TRUE(load_hf_model(hf, &reloaded).ok());
    const std::vector<int32_t> tokens = sampled_tokens(model, 24, kEvalSeed);
    EXPECT_LE(rel_diff(logits_of(reloaded, nullptr, tokens), logits_of(model, nullptr, tokens)),
              kPermutedFloatRelTolerance)
        << label;

    for (const char* name : {"fp8-dynamic", "fp8-smoothquant", "fp8-block", "int8-smoothquant"}) {
      SCOPED_TRACE("REPRO model=" + label + " scheme=" + name);
      Scheme scheme;
      ASSERT_TRUE(find_scheme(name, &scheme).ok());
      const std::string a = dir.file(label + "-" + name + "-mem"), b = dir.file(label + "-" + name + "-ckpt");
      ExportSummary sa, sb;
      const Status sta = export_quantized(*memory_weight_source(model), scheme, &stats, a, {}, &sa);
      const Status st = export_quantized(*ckpt, scheme, &stats, b, {}, &sb);
      if (is_block(scheme) && which != kAligned) {  // partial blocks: both paths refuse alike
        EXPECT_FALSE(sta.ok());
        EXPECT_EQ(sta.to_string(), st.to_string());
        continue;
      }
      ASSERT_TRUE(sta.ok()) << sta.to_string();
      ASSERT_TRUE(st.ok()) << st.to_string();
      EXPECT_EQ(read_text(a + "/model.safetensors"), read_text(b + "/model.safetensors"));
      EXPECT_EQ(read_text(a + "/config.json"), read_text(b + "/config.json"));
      EXPECT_EQ(sa.bytes, sb.bytes);
      EXPECT_EQ(sa.tensors, sb.tensors);
    }
  }
}

TEST(Export, ExistingOutputIsRefusedUnlessOverwrite) {
  const ModelWeights model = make_default_model(small_options(0));
  const auto src = memory_weight_source(model);
  Scheme scheme;
  ASSERT_TRUE(find_scheme("fp8-dynamic", &scheme).ok());
  TempDir dir;
  const std::string out = dir.file("out");
  fs::create_directories(out);
  write_text(out + "/keep.txt", "user data");
  ExportSummary sum;
  const Status st = export_quantized(*src, scheme, nullptr, out, {}, &sum);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "--out")) << st.message();
  EXPECT_TRUE(contains(st.message(), "exists")) << st.message();
  EXPECT_EQ(dir_entries(out), std::vector<std::string>{"keep.txt"}) << "a refused export touches nothing";
  // Not even with overwrite: the directory is not an llmq output (it has no .llmq-output marker).
  ExportOptions overwrite;
  overwrite.overwrite = true;
  const Status forced = export_quantized(*src, scheme, nullptr, out, overwrite, &sum);
  ASSERT_FALSE(forced.ok());
  EXPECT_TRUE(contains(forced.message(), "not an llmq output directory")) << forced.message();
  EXPECT_EQ(dir_entries(out), std::vector<std::string>{"keep.txt"}) << "a refused export touches nothing";
  // An llmq output is refused without overwrite and replaced with it.
  fs::remove_all(out);
  ASSERT_TRUE(export_quantized(*src, scheme, nullptr, out, {}, &sum).ok());
  const Status again = export_quantized(*src, scheme, nullptr, out, {}, &sum);
  ASSERT_FALSE(again.ok());
  EXPECT_TRUE(contains(again.message(), "--force")) << again.message();
  ASSERT_TRUE(export_quantized(*src, scheme, nullptr, out, overwrite, &sum).ok());
  EXPECT_EQ(dir_entries(out), (std::vector<std::string>{".llmq-output", "config.json", "model.safetensors"}));
  EXPECT_EQ(dir_entries(dir.path()), std::vector<std::string>{"out"}) << "no temp directory left";
}

TEST(Export, TrailingSlashInTheOutputPathWorks) {
  const ModelWeights model = make_default_model(small_options(0));
  const auto src = memory_weight_source(model);
  Scheme scheme;
  ASSERT_TRUE(find_scheme("fp8-dynamic", &scheme).ok());
  TempDir dir;
  ExportSummary sum;
  const Status st = export_quantized(*src, scheme, nullptr, dir.file("out/"), {}, &sum);
  ASSERT_TRUE(st.ok()) << st.to_string() << " REPRO out='<tmp>/out/'";
  EXPECT_EQ(dir_entries(dir.file("out")), (std::vector<std::string>{".llmq-output", "config.json", "model.safetensors"}));
  EXPECT_EQ(dir_entries(dir.path()), std::vector<std::string>{"out"});
  ExportOptions overwrite;
  overwrite.overwrite = true;
  const Status again = export_quantized(*src, scheme, nullptr, dir.file("out/"), overwrite, &sum);
  ASSERT_TRUE(again.ok()) << again.to_string();
  EXPECT_EQ(dir_entries(dir.file("out")), (std::vector<std::string>{".llmq-output", "config.json", "model.safetensors"}));
}

TEST(Export, NeverWritesOverItsInput) {
  const ModelWeights model = make_default_model(small_options(0));
  TempDir dir;
  const std::string hf = dir.file("parent/hf");
  write_hf_checkpoint(model, hf);
  const std::string before = read_text(hf + "/model.safetensors");
  std::unique_ptr<WeightSource> src;
  ASSERT_TRUE(checkpoint_weight_source(hf, &src).ok());
  Scheme scheme;
  ASSERT_TRUE(find_scheme("fp8-dynamic", &scheme).ok());
  ExportOptions overwrite;
  overwrite.overwrite = true;
  // The input itself, however it is spelled, and a directory that holds the input.
  for (const std::string& out : {hf, hf + "/", hf + "/.", dir.file("parent/../parent/hf"), dir.file("parent")}) {
    SCOPED_TRACE("REPRO out=" + out + " overwrite=true");
    ExportSummary sum;
    const Status st = export_quantized(*src, scheme, nullptr, out, overwrite, &sum);
    ASSERT_FALSE(st.ok());
    EXPECT_TRUE(contains(st.message(), "input")) << st.message();
    EXPECT_EQ(read_text(hf + "/model.safetensors"), before);
    EXPECT_EQ(dir_entries(hf), (std::vector<std::string>{"config.json", "model.safetensors"}));
  }
  EXPECT_EQ(dir_entries(dir.file("parent")), std::vector<std::string>{"hf"});
}

TEST(Export, DryRunPlansButWritesNothing) {
  const ModelWeights model = make_default_model(small_options(0));
  const CalibrationStats stats = calibrated(model);
  const auto src = memory_weight_source(model);
  Scheme scheme;
  ASSERT_TRUE(find_scheme("fp8-tensor-static", &scheme).ok());
  TempDir dir;
  ExportOptions dry;
  dry.dry_run = true;
  ExportSummary planned, written;
  ASSERT_TRUE(export_quantized(*src, scheme, &stats, dir.file("out"), dry, &planned).ok());
  EXPECT_TRUE(dir_entries(dir.path()).empty()) << "dry run created something";
  ASSERT_TRUE(export_quantized(*src, scheme, &stats, dir.file("out"), {}, &written).ok());
  EXPECT_EQ(planned.tensors, written.tensors);
  EXPECT_EQ(planned.bytes, written.bytes);
  EXPECT_EQ(planned.shards, written.shards);
  EXPECT_EQ(planned.quantized_linears, written.quantized_linears);
  EXPECT_EQ(planned.quantization_config, written.quantization_config);
  // A dry run onto an existing directory is fine and leaves it alone.
  const std::string before = read_text(dir.file("out") + "/model.safetensors");
  ASSERT_TRUE(export_quantized(*src, scheme, &stats, dir.file("out"), dry, &planned).ok());
  EXPECT_EQ(read_text(dir.file("out") + "/model.safetensors"), before);
}

// A WeightSource that fails to read one tensor: the failure happens while the shard is written.
class FailingSource : public WeightSource {
 public:
  FailingSource(const WeightSource& inner, std::string fail) : inner_(inner), fail_(std::move(fail)) {}
  const ModelConfig& config() const override { return inner_.config(); }
  std::vector<std::string> tensor_names() const override { return inner_.tensor_names(); }
  Status shape(const std::string& name, std::vector<int64_t>* out) const override { return inner_.shape(name, out); }
  Status read(const std::string& name, Tensor* out) const override {
    if (name == fail_) return {StatusCode::kIoError, "injected read failure of " + name};
    return inner_.read(name, out);
  }
  std::string config_json() const override { return inner_.config_json(); }

 private:
  const WeightSource& inner_;
  std::string fail_;
};

TEST(Export, AFailedExportLeavesNoTempDirectoryAndKeepsTheOldOutput) {
  const ModelWeights model = make_default_model(small_options(0));
  const auto mem = memory_weight_source(model);
  const FailingSource src(*mem, "model.norm.weight");  // late: earlier tensors are already written
  Scheme scheme;
  ASSERT_TRUE(find_scheme("fp8-dynamic", &scheme).ok());
  TempDir dir;
  ExportSummary sum;
  const Status st = export_quantized(src, scheme, nullptr, dir.file("out"), {}, &sum);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "injected read failure")) << st.message();
  EXPECT_TRUE(dir_entries(dir.path()).empty()) << "left behind: " << (dir_entries(dir.path()).empty() ? "" : dir_entries(dir.path())[0]);

  // With overwrite, the previous output survives a failed export.
  ASSERT_TRUE(export_quantized(*mem, scheme, nullptr, dir.file("out"), {}, &sum).ok());
  const std::string before = read_text(dir.file("out") + "/model.safetensors");
  ExportOptions overwrite;
  overwrite.overwrite = true;
  ASSERT_FALSE(export_quantized(src, scheme, nullptr, dir.file("out"), overwrite, &sum).ok());
  EXPECT_EQ(read_text(dir.file("out") + "/model.safetensors"), before);
  EXPECT_EQ(dir_entries(dir.path()), std::vector<std::string>{"out"});
}

TEST(Export, AQuantizedCheckpointIsRefusedAsInput) {
  const ModelWeights model = make_default_model(small_options(0));
  Scheme scheme;
  ASSERT_TRUE(find_scheme("fp8-dynamic", &scheme).ok());
  TempDir dir;
  ExportSummary sum;
  ASSERT_TRUE(export_quantized(*memory_weight_source(model), scheme, nullptr, dir.file("q"), {}, &sum).ok());
  std::unique_ptr<WeightSource> src;
  const Status st = checkpoint_weight_source(dir.file("q"), &src);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "already quantized")) << st.message();
  EXPECT_TRUE(contains(st.message(), dir.file("q"))) << st.message();

  // 8-bit tensors without a quantization_config are refused too.
  const std::string bare = dir.file("bare");
  fs::create_directories(bare);
  fs::copy_file(dir.file("q") + "/model.safetensors", bare + "/model.safetensors");
  write_text(bare + "/config.json", hf_config_json(model.config));
  const Status st2 = checkpoint_weight_source(bare, &src);
  ASSERT_FALSE(st2.ok());
  EXPECT_TRUE(contains(st2.message(), "no quantization_config")) << st2.message();
}

TEST(Export, ShardsWriteAnIndexAndLoadBack) {
  const ModelWeights model = make_default_model(small_options(4));
  const CalibrationStats stats = calibrated(model);
  const auto src = memory_weight_source(model);
  Scheme scheme;
  ASSERT_TRUE(find_scheme("fp8-channel-static", &scheme).ok());
  TempDir dir;
  ExportOptions one, many;
  one.keep_dtype = many.keep_dtype = DType::kF32;
  ExportSummary s1, sn;
  ASSERT_TRUE(export_quantized(*src, scheme, &stats, dir.file("one"), one, &s1).ok());
  many.max_shard_bytes = s1.bytes / 5;  // about six shards; the largest tensors get one each
  ASSERT_TRUE(export_quantized(*src, scheme, &stats, dir.file("many"), many, &sn).ok());
  ASSERT_GT(sn.shards, 2);
  EXPECT_EQ(sn.bytes, s1.bytes);
  EXPECT_EQ(sn.tensors, s1.tensors);

  std::vector<std::string> want_files = {".llmq-output", "config.json", "model.safetensors.index.json"};
  char file[64];
  for (int64_t i = 1; i <= sn.shards; ++i) {
    std::snprintf(file, sizeof file, "model-%05lld-of-%05lld.safetensors", static_cast<long long>(i),
                  static_cast<long long>(sn.shards));
    want_files.push_back(file);
  }
  std::sort(want_files.begin(), want_files.end());
  EXPECT_EQ(dir_entries(dir.file("many")), want_files);

  const json index = json::parse(read_text(dir.file("many") + "/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], sn.bytes);
  EXPECT_EQ(static_cast<int64_t>(index["weight_map"].size()), sn.tensors);
  int64_t data_bytes = 0;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    std::unique_ptr<SafetensorsFile> f;
    ASSERT_TRUE(SafetensorsFile::open(dir.file("many") + "/" + shard.get<std::string>(), &f).ok());
    ASSERT_NE(f->find(name), nullptr) << name << " not in " << shard;
    data_bytes += f->find(name)->nbytes;
    EXPECT_LE(f->find(name)->nbytes, std::max<int64_t>(many.max_shard_bytes, f->find(name)->nbytes));
  }
  EXPECT_EQ(data_bytes, sn.bytes);

  QuantizedModel a, b;
  ASSERT_TRUE(load_quantized_checkpoint(dir.file("one"), &a).ok());
  const Status st = load_quantized_checkpoint(dir.file("many"), &b);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const std::vector<int32_t> tokens = sampled_tokens(model, 24, kEvalSeed);
  QuantizedLinearBackend ba(a), bb(b);
  const std::vector<float> la = logits_of(a.weights, &ba, tokens), lb = logits_of(b.weights, &bb, tokens);
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float))) << "sharding changed the model";
}

TEST(Export, KeepDtypeMustBeAFloatType) {
  const ModelWeights model = make_default_model(small_options(0));
  Scheme scheme;
  ASSERT_TRUE(find_scheme("fp8-dynamic", &scheme).ok());
  TempDir dir;
  ExportOptions options;
  options.keep_dtype = DType::kI8;
  ExportSummary sum;
  const Status st = export_quantized(*memory_weight_source(model), scheme, nullptr, dir.file("o"), options, &sum);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "--keep-dtype")) << st.message();
  EXPECT_TRUE(dir_entries(dir.path()).empty());
}

}  // namespace
}  // namespace llmq
