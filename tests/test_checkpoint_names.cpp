// The on-disk table of quantized linears (src/model/checkpoint/checkpoint_names.hpp): every (format, scale
// layout) row is written by export_quantized exactly as the table says and read back the same by
// both readers (read_quantized_linear: as stored; load_hf_model: dequantized); a file that holds
// both weight_scale and weight_scale_inv, or a scale of the wrong shape, is refused by both with
// the tensor named.
#include "model_quantize_support.hpp"
#include "llmq/quantize_tensor.hpp"
#include "model/checkpoint/checkpoint_names.hpp"

namespace llmq {
namespace {

// One tensor of a checkpoint with its raw bytes, for rewriting a file with one thing changed.
struct RawTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Copies the single-file checkpoint `from` to `to` with `edit` applied to its tensors.
void rewrite_checkpoint(const std::string& from, const std::string& to,
                        const std::function<void(std::vector<RawTensor>*)>& edit) {
  std::unique_ptr<SafetensorsFile> file;
  ASSERT_TRUE(SafetensorsFile::open(from + "/model.safetensors", &file).ok());
  std::vector<RawTensor> tensors;
  for (const SafetensorsTensorInfo& info : file->tensors()) {
    TensorView v;
    ASSERT_TRUE(file->view(info.name, &v).ok()) << info.name;
    const auto* p = static_cast<const uint8_t*>(v.data);
    tensors.push_back({info.name, info.dtype, info.shape, std::vector<uint8_t>(p, p + info.nbytes)});
  }
  edit(&tensors);
  std::vector<SafetensorsWriteEntry> entries;
  for (const RawTensor& t : tensors) {
    auto bytes = std::make_shared<std::vector<uint8_t>>(t.bytes);
    entries.push_back({t.name, t.dtype, t.shape, [bytes](uint8_t* dst) {
                         if (!bytes->empty()) std::memcpy(dst, bytes->data(), bytes->size());
                         return Status();
                       },
                       nullptr});
  }
  fs::create_directories(to);
  ASSERT_TRUE(write_safetensors(to + "/model.safetensors", entries).ok());
  write_text(to + "/config.json", read_text(from + "/config.json"));
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

RawTensor* find_raw(std::vector<RawTensor>* tensors, const std::string& name) {
  for (RawTensor& t : *tensors)
    if (t.name == name) return &t;
  ADD_FAILURE() << name << " is not in the checkpoint";
  return nullptr;
}

// A refusal that names `tensor` (and every string in `also`).
void expect_refused(const Status& st, const std::string& tensor, const std::vector<std::string>& also = {}) {
  ASSERT_FALSE(st.ok()) << "accepted; expected a refusal naming " << tensor;
  EXPECT_TRUE(contains(st.message(), "'" + tensor + "'")) << st.to_string();
  for (const std::string& s : also) EXPECT_TRUE(contains(st.message(), s)) << st.to_string();
}

// A scheme exported once per test binary from the small model, with its weight scale layout.
struct Exported {
  Scheme scheme;
  ScaleLayout layout = ScaleLayout::kTensor;
  std::string dir;
};
const Exported& exported(const std::string& scheme_name) {
  static TempDir root;  // shared by every test: the exports are read only
  static std::map<std::string, Exported> cache;
  auto it = cache.find(scheme_name);
  if (it != cache.end()) return it->second;
  Exported e;
  EXPECT_TRUE(find_scheme(scheme_name, &e.scheme).ok()) << scheme_name;
  EXPECT_TRUE(scale_layout_of(e.scheme.weight, &e.layout).ok()) << scheme_name;
  const int64_t which = exportable(e.scheme, 0);
  const auto src = memory_weight_source(small_model(which).model);
  e.dir = root.file(scheme_name);
  ExportSummary sum;
  const Status st = export_quantized(*src, e.scheme, &small_model(which).stats, e.dir, {}, &sum);
  EXPECT_TRUE(st.ok()) << scheme_name << ": " << st.to_string();
  return cache.emplace(scheme_name, std::move(e)).first->second;
}

// One exportable scheme per (format, layout, weight dtype, static input): every row of the table.
std::vector<const Exported*> one_per_row() {
  std::vector<const Exported*> rows;
  std::set<std::string> seen;
  for (const Scheme& scheme : all_schemes()) {
    if (scheme.export_format == ExportFormat::kNone || slow_weight_search(scheme)) continue;
    ScaleLayout layout;
    if (!scale_layout_of(scheme.weight, &layout).ok()) continue;
    const std::string key = std::string(quant_method_name(scheme.export_format)) + " " + scale_layout_name(layout) +
                            " " + dtype_name(scheme.weight.format) + (is_static(scheme) ? " static" : "");
    if (seen.insert(key).second) rows.push_back(&exported(scheme.name));
  }
  return rows;
}

// A quantized module of an exported checkpoint and its weight shape.
struct Module {
  std::string name;
  int64_t n = 0, k = 0;
};
Module first_quantized(const std::string& dir) {
  std::unique_ptr<Checkpoint> ckpt;
  EXPECT_TRUE(Checkpoint::open(dir, &ckpt).ok());
  const SafetensorsTensorInfo* w = ckpt->find("model.layers.0.self_attn.q_proj.weight");
  EXPECT_NE(w, nullptr);
  return {"model.layers.0.self_attn.q_proj", w->shape[0], w->shape[1]};
}

// Both readers on `dir`: load_hf_model and, for `module`, read_quantized_linear.
Status read_as_stored(const std::string& dir, const std::string& module) {
  std::unique_ptr<Checkpoint> ckpt;
  if (Status st = Checkpoint::open(dir, &ckpt); !st.ok()) return st;
  bool quantized = false;
  QuantizedLinear ql;
  return read_quantized_linear(*ckpt, module, true, &quantized, &ql);
}
Status read_dequantized(const std::string& dir) {
  ModelWeights w;
  return load_hf_model(dir, &w);
}

// ---- the table itself

TEST(CheckpointNames, EveryWrittenRowIsReadableUnderItsOwnName) {
  // What export writes must be what the readers accept under that name: no row may write a
  // layout its scale name does not hold when read.
  for (const WrittenLinear& w : kWrittenLinears) {
    const WeightScaleName* name = nullptr;
    for (const WeightScaleName& s : kWeightScaleNames)
      if (std::string(s.suffix) == w.scale_suffix) name = &s;
    ASSERT_NE(name, nullptr) << w.scale_suffix << " is written but no reader looks for it";
    const int64_t n = 256, k = 384;
    ScaleLayout got;
    const Status st = classify_weight_scale(*name, "m" + std::string(w.scale_suffix),
                                            written_scale_shape(w.layout, n, k, 128, 128), n, k, 128, 128, &got);
    ASSERT_TRUE(st.ok()) << w.quant_method << " " << scale_layout_name(w.layout) << ": " << st.to_string();
    EXPECT_EQ(got, w.layout) << w.quant_method << " " << scale_layout_name(w.layout);
  }
  EXPECT_STREQ(quant_method_name(ExportFormat::kVllmFp8), "fp8");
  EXPECT_STREQ(quant_method_name(ExportFormat::kCompressedTensors), "compressed-tensors");
  EXPECT_STREQ(quant_method_name(ExportFormat::kNone), "");
}

TEST(CheckpointNames, ScaleShapesClassifyByTheTable) {
  const WeightScaleName& plain = kWeightScaleNames[0];
  const WeightScaleName& inv = kWeightScaleNames[1];
  ASSERT_STREQ(plain.suffix, ".weight_scale");
  ASSERT_STREQ(inv.suffix, ".weight_scale_inv");
  // Weight [300, 200] in 128x128 blocks: a 3 x 2 grid (partial edge blocks both ways).
  const int64_t n = 300, k = 200;
  struct Case {
    const WeightScaleName* name;
    std::vector<int64_t> shape;
    bool ok;
    ScaleLayout layout;
  };
  const Case cases[] = {
      {&plain, {}, true, ScaleLayout::kTensor},          {&plain, {1}, true, ScaleLayout::kTensor},
      {&plain, {1, 1}, true, ScaleLayout::kTensor},      {&plain, {n}, true, ScaleLayout::kChannel},
      {&plain, {n, 1}, true, ScaleLayout::kChannel},     {&plain, {3, 2}, true, ScaleLayout::kBlock},
      {&inv, {3, 2}, true, ScaleLayout::kBlock},         {&inv, {1}, false, {}},
      {&inv, {n, 1}, false, {}},                         {&plain, {1, n}, false, {}},
      {&plain, {n + 1}, false, {}},                      {&plain, {1, 1, 1}, false, {}},
      {&plain, {2, 2}, false, {}},                       {&inv, {3, 3}, false, {}},
      {&plain, {0}, false, {}},
  };
  for (const Case& c : cases) {
    const std::string tensor = std::string("m") + c.name->suffix;
    SCOPED_TRACE(tensor + " " + shape_string(c.shape));
    ScaleLayout got = ScaleLayout::kTensor;
    const Status st = classify_weight_scale(*c.name, tensor, c.shape, n, k, 128, 128, &got);
    EXPECT_EQ(st.ok(), c.ok) << st.to_string();
    if (c.ok) EXPECT_EQ(got, c.layout);
    else expect_refused(st, tensor, {shape_string(c.shape), "[300, 200]"});
  }
}

// ---- (a) every format through the writer and both readers

TEST(CheckpointNames, EveryFormatRoundTripsThroughTheWriterAndBothReaders) {
  std::set<std::pair<ExportFormat, ScaleLayout>> covered;
  bool static_covered = false;
  for (const Exported* row : one_per_row()) {
    const Exported& e = *row;
    SCOPED_TRACE("REPRO scheme=" + e.scheme.name + " dir=" + e.dir);
    const bool act_static = is_static(e.scheme);
    covered.insert({e.scheme.export_format, e.layout});
    static_covered |= act_static;
    std::unique_ptr<Checkpoint> ckpt;
    ASSERT_TRUE(Checkpoint::open(e.dir, &ckpt).ok());
    ModelWeights dequantized;
    const Status hf = load_hf_model(e.dir, &dequantized);
    ASSERT_TRUE(hf.ok()) << hf.to_string();
    const QuantizedModel& memory = quantized(exportable(e.scheme, 0), e.scheme);
    int64_t linears = 0;
    for (const Linear* l : dequantized.linears()) {
      const std::string module = l->id.hf_name(dequantized.config);
      const QuantizedLinear* want = memory.find(module);
      QuantizedLinear got;
      bool is_quantized = false;
      const Status st = read_quantized_linear(*ckpt, module, true, &is_quantized, &got);
      ASSERT_TRUE(st.ok()) << module << ": " << st.to_string();
      ASSERT_EQ(is_quantized, want != nullptr) << module;
      if (want == nullptr) continue;
      ++linears;
      const int64_t n = got.weight.rows, k = got.weight.cols;
      // The writer: exactly the table's tensors, names, dtypes and shapes.
      std::vector<DiskTensor> disk;
      ASSERT_TRUE(written_linear_tensors(e.scheme.export_format, e.scheme.weight, act_static, module, n, k, &disk).ok());
      ASSERT_EQ(disk.size(), act_static ? 3u : 2u) << module;
      for (const DiskTensor& t : disk) {
        const SafetensorsTensorInfo* info = ckpt->find(t.name);
        ASSERT_NE(info, nullptr) << t.name;
        EXPECT_EQ(info->dtype, t.dtype) << t.name;
        EXPECT_EQ(info->shape, t.shape) << t.name;
      }
      for (const char* suffix : kCompanionSuffixes) {
        const std::string name = module + suffix;
        const bool listed = std::any_of(disk.begin(), disk.end(), [&](const DiskTensor& t) { return t.name == name; });
        EXPECT_EQ(ckpt->find(name) != nullptr, listed) << name << ": only the table's tensors are written";
      }
      // Reader 1, as stored: the in-memory quantization, bit for bit.
      EXPECT_EQ(got.weight.spec.granularity, want->weight.spec.granularity) << module;
      ASSERT_EQ(got.weight.data.nbytes(), want->weight.data.nbytes()) << module;
      EXPECT_EQ(0, std::memcmp(got.weight.data.data(), want->weight.data.data(),
                               static_cast<size_t>(want->weight.data.nbytes())))
          << module;
      ASSERT_EQ(got.weight.scales.scales.shape(), want->weight.scales.scales.shape()) << module;
      EXPECT_EQ(0, std::memcmp(got.weight.scales.scales.data(), want->weight.scales.scales.data(),
                               static_cast<size_t>(want->weight.scales.scales.nbytes())))
          << module;
      EXPECT_EQ(got.weight.scales.block.rows, want->weight.scales.block.rows) << module;
      EXPECT_EQ(got.weight.scales.block.cols, want->weight.scales.block.cols) << module;
      if (act_static)
        EXPECT_EQ(got.static_input_scale.scales.data_as<float>()[0],
                  want->static_input_scale.scales.data_as<float>()[0])
            << module;
      // Reader 2, dequantized: the same codes times the same scales, bit for bit.
      Tensor expect(DType::kF32, {n, k});
      ASSERT_TRUE(dequantize(got.weight, expect.view()).ok()) << module;
      ASSERT_EQ(l->weight.shape(), expect.shape()) << module;
      EXPECT_EQ(0, std::memcmp(l->weight.data(), expect.data(), static_cast<size_t>(expect.nbytes())))
          << module << ": load_hf_model and read_quantized_linear read different weights";
    }
    EXPECT_GT(linears, 0);
  }
  // Every row of the writer's table was exercised, and a static input scale.
  for (const WrittenLinear& w : kWrittenLinears)
    EXPECT_EQ(covered.count({w.format, w.layout}), 1u) << w.quant_method << " " << scale_layout_name(w.layout);
  EXPECT_TRUE(static_covered);
}

// ---- (b) both scale names: ambiguous, refused by both readers

TEST(CheckpointNames, BothWeightScaleAndWeightScaleInvAreRefusedByBothReaders) {
  TempDir dir;
  // A block checkpoint gains a per-tensor weight_scale; a channel one gains a block
  // weight_scale_inv. Either way each name alone would be a valid file.
  for (const char* scheme : {"fp8-block", "fp8-dynamic"}) {
    const Exported& e = exported(scheme);
    SCOPED_TRACE(std::string("REPRO scheme=") + scheme);
    const Module m = first_quantized(e.dir);
    const bool block = e.layout == ScaleLayout::kBlock;
    const std::string added = m.name + (block ? kWeightScaleSuffix : kWeightScaleInvSuffix);
    const std::vector<int64_t> shape =
        block ? std::vector<int64_t>{1} : std::vector<int64_t>{(m.n + 127) / 128, (m.k + 127) / 128};
    const std::string out = dir.file(scheme);
    rewrite_checkpoint(e.dir, out, [&](std::vector<RawTensor>* t) {
      t->push_back({added, DType::kF32, shape, f32_bytes(std::vector<float>(static_cast<size_t>(numel_of(shape)), 0.5f))});
    });
    const std::vector<std::string> both = {m.name + kWeightScaleSuffix, m.name + kWeightScaleInvSuffix, "ambiguous"};
    expect_refused(read_as_stored(out, m.name), m.name + kWeightScaleInvSuffix, both);
    expect_refused(read_dequantized(out), m.name + kWeightScaleInvSuffix, both);
    QuantizedModel qm;
    expect_refused(load_quantized_checkpoint(out, &qm), m.name + kWeightScaleInvSuffix, both);
  }
}

// ---- (c) a scale of the wrong shape, refused naming it

TEST(CheckpointNames, AScaleOfTheWrongShapeIsRefusedNamingIt) {
  TempDir dir;
  struct Case {
    const char* scheme;
    const char* suffix;
    std::function<std::vector<int64_t>(const Module&)> shape;
    bool dequantizing_reader_reads_it;  // load_hf_model reads weight scales only
  };
  const Case cases[] = {
      // [1, N] holds N values, but not on the channel axis: read_quantized_linear used to take
      // any N values as per-channel scales.
      {"fp8-dynamic", kWeightScaleSuffix, [](const Module& m) { return std::vector<int64_t>{1, m.n}; }, true},
      {"fp8-dynamic", kWeightScaleSuffix, [](const Module& m) { return std::vector<int64_t>{m.n + 1, 1}; }, true},
      {"fp8-tensor-dynamic", kWeightScaleSuffix, [](const Module&) { return std::vector<int64_t>{2}; }, true},
      {"fp8-block", kWeightScaleInvSuffix,
       [](const Module& m) { return std::vector<int64_t>{m.n / 128 + 1, m.k / 128}; }, true},
      {"fp8-block", kWeightScaleInvSuffix, [](const Module&) { return std::vector<int64_t>{1}; }, true},
      // A static input scale is one value; the first of several would be a guess.
      {"fp8-tensor-static", kInputScaleSuffix, [](const Module&) { return std::vector<int64_t>{2}; }, false},
  };
  int i = 0;
  for (const Case& c : cases) {
    const Exported& e = exported(c.scheme);
    const Module m = first_quantized(e.dir);
    const std::vector<int64_t> shape = c.shape(m);
    const std::string tensor = m.name + c.suffix;
    SCOPED_TRACE("REPRO scheme=" + std::string(c.scheme) + " " + tensor + " " + shape_string(shape));
    const std::string out = dir.file("case" + std::to_string(i++));
    rewrite_checkpoint(e.dir, out, [&](std::vector<RawTensor>* t) {
      RawTensor* s = find_raw(t, tensor);
      ASSERT_NE(s, nullptr);
      s->shape = shape;
      s->bytes = f32_bytes(std::vector<float>(static_cast<size_t>(numel_of(shape)), 0.25f));
    });
    expect_refused(read_as_stored(out, m.name), tensor, {shape_string(shape)});
    if (c.dequantizing_reader_reads_it) expect_refused(read_dequantized(out), tensor, {shape_string(shape)});
    else EXPECT_TRUE(read_dequantized(out).ok()) << "load_hf_model ignores activation scales";
  }
}

// A zero point is subtracted by the dequantizing reader; the as-stored reader (whose consumers
// are symmetric) refuses it rather than reading the file as a different model.
TEST(CheckpointNames, AZeroPointIsReadDequantizedAndRefusedAsStored) {
  TempDir dir;
  const Exported& e = exported("int8-w8a8");
  ASSERT_EQ(e.layout, ScaleLayout::kChannel);
  const Module m = first_quantized(e.dir);
  const std::string out = dir.file("zp");
  rewrite_checkpoint(e.dir, out, [&](std::vector<RawTensor>* t) {
    t->push_back({m.name + kZeroPointSuffix, DType::kI8, {m.n}, std::vector<uint8_t>(static_cast<size_t>(m.n), 0)});
  });
  EXPECT_TRUE(read_dequantized(out).ok());
  expect_refused(read_as_stored(out, m.name), m.name + kZeroPointSuffix);
}

}  // namespace
}  // namespace llmq
