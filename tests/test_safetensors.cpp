// Safetensors files: write -> read round trips of every dtype (odd shapes, zero elements,
// scalars), the header layout, every kind of corrupt file, the writer's temp-file discipline and
// sharded checkpoints. (config.json of real families: test_hf_config_families.cpp; tiny models
// loaded tensor by tensor: test_hf_model.cpp.) Values are compared exactly: every expected float is
// computed independently (decoders below) and the conversions involved round at most once.
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
// Round trips and layout

struct DTypeCase {
  DType dtype;
  const char* safetensors_name;
  std::vector<int64_t> shape;
};

TEST(SafetensorsDtype, NamesRoundTripAndUnknownNamesAreNamed) {
  const std::pair<DType, const char*> names[] = {
      {DType::kF32, "F32"}, {DType::kF64, "F64"},       {DType::kF16, "F16"},      {DType::kBF16, "BF16"},
      {DType::kI8, "I8"},   {DType::kI32, "I32"},       {DType::kE4M3, "F8_E4M3"}, {DType::kE5M2, "F8_E5M2"}};
  for (const auto& [dtype, name] : names) {
    ASSERT_NE(safetensors_dtype_name(dtype), nullptr) << dtype_name(dtype);
    EXPECT_STREQ(safetensors_dtype_name(dtype), name);
    DType parsed = DType::kI4;
    ASSERT_TRUE(parse_safetensors_dtype(name, &parsed).ok()) << name;
    EXPECT_EQ(parsed, dtype) << name;
  }
  EXPECT_EQ(safetensors_dtype_name(DType::kE4M3Fnuz), nullptr);
  EXPECT_EQ(safetensors_dtype_name(DType::kI4), nullptr);
  DType parsed;
  for (const char* bad : {"F8_E4M3FNUZ", "f32", "U16", "BOOL", ""}) {
    const Status st = parse_safetensors_dtype(bad, &parsed);
    expect_error_mentions(st, {"\"" + std::string(bad) + "\""});
  }
}

TEST(Safetensors, EveryDtypeRoundTripsWithOddShapesEmptyAndScalar) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  // Wider dtypes first, so every mapped view is aligned to its element (as the reference writer
  // orders them).
  const std::vector<DTypeCase> cases = {
      {DType::kF64, "F64", {3, 5, 7}}, {DType::kF64, "F64", {}},       {DType::kF32, "F32", {19}},
      {DType::kF32, "F32", {0, 4}},    {DType::kI32, "I32", {1, 99}},  {DType::kF16, "F16", {2, 3, 5}},
      {DType::kBF16, "BF16", {7, 1}},  {DType::kF16, "F16", {}},       {DType::kE4M3, "F8_E4M3", {11, 13}},
      {DType::kE5M2, "F8_E5M2", {3, 1, 9}}, {DType::kI8, "I8", {17}}, {DType::kI8, "I8", {}},
      {DType::kE4M3, "F8_E4M3", {5, 0, 3}},
  };
  std::vector<SafetensorsWriteEntry> entries;
  std::vector<std::vector<uint8_t>> data;
  for (size_t i = 0; i < cases.size(); ++i) {
    data.push_back(random_elements(cases[i].dtype, numel_of(cases[i].shape), kSeed + i));
    entries.push_back(raw_entry("t" + std::to_string(i) + "." + cases[i].safetensors_name, cases[i].dtype,
                                cases[i].shape, data.back()));
  }
  write_text(dir.file("config.json"), "{}");
  const std::string path = dir.file("model.safetensors");
  ASSERT_TRUE(write_safetensors(path, entries).ok());

  std::unique_ptr<SafetensorsFile> file;
  const Status open_status = SafetensorsFile::open(path, &file);
  ASSERT_TRUE(open_status.ok()) << open_status.to_string();
  ASSERT_EQ(file->tensors().size(), cases.size());
  int64_t expected_offset = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& info = file->tensors()[i];
    SCOPED_TRACE(info.name);
    EXPECT_EQ(info.name, entries[i].name);  // file order is the written order
    EXPECT_EQ(info.dtype, cases[i].dtype);
    EXPECT_EQ(info.shape, cases[i].shape);
    EXPECT_EQ(info.nbytes, static_cast<int64_t>(data[i].size()));
    EXPECT_EQ(info.offset, expected_offset);  // contiguous, no gaps
    expected_offset += info.nbytes;
    TensorView v;
    ASSERT_TRUE(file->view(info.name, &v).ok());
    EXPECT_EQ(v.dtype, cases[i].dtype);
    EXPECT_EQ(v.shape, cases[i].shape);
    EXPECT_EQ(v.device, Device::kCpu);
    EXPECT_TRUE(v.is_contiguous());
    const int64_t elem_bytes = std::max(1, format_info(cases[i].dtype).bits / 8);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % static_cast<uintptr_t>(elem_bytes), 0u);
    if (!data[i].empty()) {
      EXPECT_EQ(std::memcmp(v.data, data[i].data(), data[i].size()), 0);
    }
  }
  EXPECT_EQ(file->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));

  // read_f32 against the independent decoders.
  std::unique_ptr<Checkpoint> ckpt;
  ASSERT_TRUE(Checkpoint::open(dir.path(), &ckpt).ok());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(entries[i].name);
    Tensor t;
    const Status st = ckpt->read_f32(entries[i].name, &t);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(t.dtype(), DType::kF32);
    EXPECT_EQ(t.shape(), cases[i].shape);
    ASSERT_EQ(t.numel(), numel_of(cases[i].shape));
    for (int64_t k = 0; k < t.numel(); ++k) {
      const float want = element_value(cases[i].dtype, data[i], k);
      if (t.data_as<float>()[k] != want) {
        ADD_FAILURE() << "element " << k << ": got " << t.data_as<float>()[k] << ", want " << want;
        break;
      }
    }
  }
}

TEST(Safetensors, MisalignedTensorStillReadsAsFloat) {
  // write_safetensors keeps the caller's order: an odd-sized I8 tensor before an F32 one leaves
  // the F32 data off its 4-byte alignment. read_f32 must not care.
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::vector<float> values = {1.5f, -2.25f, 3e-3f};
  const std::vector<SafetensorsWriteEntry> entries = {raw_entry("odd", DType::kI8, {3}, {1, 2, 3}),
                                                      raw_entry("f", DType::kF32, {3}, f32_bytes(values))};
  write_text(dir.file("config.json"), "{}");
  ASSERT_TRUE(write_safetensors(dir.file("model.safetensors"), entries).ok());
  std::unique_ptr<Checkpoint> ckpt;
  ASSERT_TRUE(Checkpoint::open(dir.path(), &ckpt).ok());
  EXPECT_EQ(ckpt->find("f")->offset, 3);
  Tensor t;
  ASSERT_TRUE(ckpt->read_f32("f", &t).ok());
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(t.data_as<float>()[i], values[i]);
}

TEST(Safetensors, HeaderIsPaddedToEightBytesAndKeepsOrder) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  // Name lengths 1..16 move the unpadded header length through every residue mod 8.
  for (int len = 1; len <= 16; ++len) {
    SCOPED_TRACE("name length " + std::to_string(len));
    const std::string path = dir.file("h.safetensors");
    const std::vector<SafetensorsWriteEntry> entries = {
        raw_entry(std::string(static_cast<size_t>(len), 'z'), DType::kF32, {3}, random_elements(DType::kF32, 3, kSeed)),
        raw_entry("alpha", DType::kBF16, {5}, random_elements(DType::kBF16, 5, kSeed + 1)),
        raw_entry("mid", DType::kI8, {2, 2}, random_elements(DType::kI8, 4, kSeed + 2))};
    ASSERT_TRUE(write_safetensors(path, entries).ok());
    const std::vector<uint8_t> bytes = read_bytes(path);
    ASSERT_GE(bytes.size(), 8u);
    const uint64_t n = read_u64_le(bytes);
    EXPECT_EQ(n % 8, 0u);
    EXPECT_EQ(bytes.size(), 8 + n + 12 + 10 + 4);  // no gaps, nothing after the last tensor
    const std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
    EXPECT_EQ(header.rfind("{\"__metadata__\":{\"format\":\"pt\"}", 0), 0u) << header;  // metadata first
    // Entries in the given order, not sorted by name.
    const size_t pz = header.find("\"" + std::string(static_cast<size_t>(len), 'z') + "\"");
    const size_t pa = header.find("\"alpha\""), pm = header.find("\"mid\"");
    ASSERT_NE(pz, std::string::npos);
    EXPECT_LT(pz, pa);
    EXPECT_LT(pa, pm);
    const json parsed = json::parse(header);
    EXPECT_EQ(parsed["alpha"]["dtype"], "BF16");
    EXPECT_EQ(parsed["alpha"]["data_offsets"], json::array({12, 22}));
    EXPECT_EQ(parsed["mid"]["shape"], json::array({2, 2}));

    std::unique_ptr<SafetensorsFile> file;
    ASSERT_TRUE(SafetensorsFile::open(path, &file).ok());
    TensorView v;
    ASSERT_TRUE(file->view(entries[0].name, &v).ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % 8, 0u) << "data section not 8-byte aligned";
  }
}

TEST(Safetensors, MetadataRoundTrips) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::vector<SafetensorsWriteEntry> entries = {raw_entry("w", DType::kF32, {2}, random_elements(DType::kF32, 2, kSeed))};
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"llmq.scheme", "e4m3 per-channel"}, {"quote", "a\"b\\c\nd"}, {"unicode", "\xc2\xb5s"}};
  ASSERT_TRUE(write_safetensors(dir.file("m.safetensors"), entries, meta).ok());
  std::unique_ptr<SafetensorsFile> file;
  ASSERT_TRUE(SafetensorsFile::open(dir.file("m.safetensors"), &file).ok());
  EXPECT_EQ(file->metadata(), meta);

  // No metadata at all: no __metadata__ key.
  ASSERT_TRUE(write_safetensors(dir.file("n.safetensors"), entries, {}).ok());
  ASSERT_TRUE(SafetensorsFile::open(dir.file("n.safetensors"), &file).ok());
  EXPECT_TRUE(file->metadata().empty());
  const std::vector<uint8_t> bytes = read_bytes(dir.file("n.safetensors"));
  EXPECT_FALSE(contains(std::string(bytes.begin(), bytes.end()), "__metadata__"));
}

TEST(Safetensors, EmptyFileListRoundTrips) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(write_safetensors(dir.file("e.safetensors"), {}).ok());
  std::unique_ptr<SafetensorsFile> file;
  const Status st = SafetensorsFile::open(dir.file("e.safetensors"), &file);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(file->tensors().empty());
  TensorView v;
  expect_error_mentions(file->view("nope", &v), {"'nope'", "e.safetensors"});
}

// ---------------------------------------------------------------------------------------------
// Corrupt files: each error names the file, and the tensor when there is one.

struct CorruptCase {
  const char* what;
  std::string header;
  int64_t data_bytes;
  std::vector<std::string> mentions;
};

TEST(SafetensorsCorrupt, HeadersThatBreakARuleAreRejectedWithTheirTensorNamed) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string f32_2 = R"("dtype":"F32","shape":[2])";
  const std::vector<CorruptCase> cases = {
      {"bad JSON", R"({"w": {"dtype": "F32", "shape": [2])", 8, {"JSON"}},
      {"not an object", "[1, 2]", 0, {"object"}},
      {"unknown dtype", R"({"w":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", 8, {"'w'", "F7"}},
      {"wrong byte count", R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12, {"'w'", "16", "12"}},
      {"overlap", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
       24, {"'a'", "'b'", "overlap"}},
      {"gap", "{\"a\":{" + f32_2 + ",\"data_offsets\":[0,8]},\"b\":{" + f32_2 + ",\"data_offsets\":[12,20]}}", 20,
       {"'a'", "'b'", "gap"}},
      {"gap at the start", "{\"b\":{" + f32_2 + ",\"data_offsets\":[4,12]}}", 12, {"'b'", "gap"}},
      {"uncovered tail", "{\"a\":{" + f32_2 + ",\"data_offsets\":[0,8]}}", 12, {"'a'", "no tensor"}},
      {"past the data", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8, {"'a'", "past the data section"}},
      {"duplicate name", "{\"a\":{" + f32_2 + ",\"data_offsets\":[0,8]},\"a\":{" + f32_2 + ",\"data_offsets\":[8,16]}}", 16,
       {"'a'", "twice"}},
      {"negative extent", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0, {"'w'", "shape"}},
      {"fractional extent", R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,10]}})", 10, {"'w'", "shape"}},
      {"reversed offsets", R"({"w":{"dtype":"I8","shape":[0],"data_offsets":[8,0]}})", 8, {"'w'", "data_offsets"}},
      {"missing offsets", "{\"w\":{" + f32_2 + "}}", 8, {"'w'", "data_offsets"}},
      {"missing dtype", R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8, {"'w'", "dtype"}},
      {"overflowing shape", R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8, {"'w'"}},
      {"metadata not a string", R"({"__metadata__":{"k":1}})", 0, {"__metadata__"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string path = dir.file("bad.safetensors");
    write_raw_safetensors(path, c.header, c.data_bytes);
    std::unique_ptr<SafetensorsFile> file;
    const Status st = SafetensorsFile::open(path, &file);
    std::vector<std::string> mentions = c.mentions;
    mentions.push_back(path);
    expect_error_mentions(st, mentions);
    EXPECT_EQ(file, nullptr);
  }
  // The same rules accept the well-formed neighbour of those cases (the test can tell them apart).
  write_raw_safetensors(dir.file("good.safetensors"),
                        "{\"a\":{" + f32_2 + ",\"data_offsets\":[0,8]},\"b\":{" + f32_2 + ",\"data_offsets\":[8,16]}}", 16);
  std::unique_ptr<SafetensorsFile> file;
  EXPECT_TRUE(SafetensorsFile::open(dir.file("good.safetensors"), &file).ok());
}

TEST(SafetensorsCorrupt, TruncatedFilesAreRejected) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("t.safetensors");
  ASSERT_TRUE(write_safetensors(path, {raw_entry("first", DType::kF32, {2}, random_elements(DType::kF32, 2, kSeed)),
                                       raw_entry("last", DType::kF32, {2}, random_elements(DType::kF32, 2, kSeed + 1))})
                  .ok());
  const std::vector<uint8_t> full = read_bytes(path);
  const uint64_t n = read_u64_le(full);
  std::unique_ptr<SafetensorsFile> file;

  // Inside the data: the last tensor runs past the end.
  write_bytes(path, std::vector<uint8_t>(full.begin(), full.end() - 4));
  expect_error_mentions(SafetensorsFile::open(path, &file), {path, "'last'", "past the data section"});
  // Inside the header: the length prefix points past the end of the file.
  write_bytes(path, std::vector<uint8_t>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n / 2)));
  expect_error_mentions(SafetensorsFile::open(path, &file), {path, "header length"});
  // Inside the length prefix, and empty.
  write_bytes(path, std::vector<uint8_t>(full.begin(), full.begin() + 5));
  expect_error_mentions(SafetensorsFile::open(path, &file), {path, "too short"});
  write_bytes(path, {});
  expect_error_mentions(SafetensorsFile::open(path, &file), {path, "too short"});
  // A length that is absurd rather than merely too long.
  write_raw_safetensors(path, "{}", 0, int64_t{1} << 40);
  expect_error_mentions(SafetensorsFile::open(path, &file), {path, "header length"});
  // A file that does not exist.
  expect_error_mentions(SafetensorsFile::open(dir.file("absent.safetensors"), &file), {"absent.safetensors"});
  // The untouched file still opens.
  write_bytes(path, full);
  EXPECT_TRUE(SafetensorsFile::open(path, &file).ok());
}

// ---------------------------------------------------------------------------------------------
// The writer: temp file, rename, refusal of bad requests.

TEST(SafetensorsWriter, FailingFillLeavesNoTempFileAndKeepsTheDestination) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("out.safetensors");
  write_text(path, "original contents");
  std::vector<SafetensorsWriteEntry> entries = {raw_entry("good", DType::kF32, {4}, random_elements(DType::kF32, 4, kSeed))};
  SafetensorsWriteEntry bad;
  bad.name = "bad.weight";
  bad.dtype = DType::kE4M3;
  bad.shape = {3, 3};
  bad.fill = [](uint8_t*) { return invalid_argument("source tensor went missing"); };
  entries.push_back(bad);
  const Status st = write_safetensors(path, entries);
  expect_error_mentions(st, {"'bad.weight'", "source tensor went missing"});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);  // the fill's code is kept
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"out.safetensors"});
  const std::vector<uint8_t> after = read_bytes(path);
  EXPECT_EQ(std::string(after.begin(), after.end()), "original contents");

  // A fill that throws is reported the same way.
  entries[1].fill = [](uint8_t*) -> Status { throw std::runtime_error("kaboom"); };
  expect_error_mentions(write_safetensors(path, entries), {"'bad.weight'", "kaboom"});
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"out.safetensors"});

  // A good write replaces the destination and leaves nothing else behind.
  entries.pop_back();
  ASSERT_TRUE(write_safetensors(path, entries).ok());
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"out.safetensors"});
  std::unique_ptr<SafetensorsFile> file;
  ASSERT_TRUE(SafetensorsFile::open(path, &file).ok());
  EXPECT_EQ(file->tensors().size(), 1u);
}

TEST(SafetensorsWriter, RefusesBadRequestsBeforeCreatingAnything) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("x.safetensors");
  const auto good = raw_entry("w", DType::kF32, {2}, random_elements(DType::kF32, 2, kSeed));
  expect_error_mentions(write_safetensors(path, {good, good}), {"'w'", "twice"});
  expect_error_mentions(write_safetensors(path, {raw_entry("p", DType::kI4, {4}, {0x12, 0x34})}), {"'p'", "int4"});
  expect_error_mentions(write_safetensors(path, {raw_entry("f", DType::kE4M3Fnuz, {1}, {1})}), {"'f'"});
  expect_error_mentions(write_safetensors(path, {raw_entry("__metadata__", DType::kF32, {0}, {})}), {"__metadata__"});
  expect_error_mentions(write_safetensors(path, {raw_entry("neg", DType::kF32, {-1}, {})}), {"'neg'"});
  SafetensorsWriteEntry no_fill;
  no_fill.name = "nofill";
  no_fill.shape = {2};
  expect_error_mentions(write_safetensors(path, {no_fill}), {"'nofill'"});
  EXPECT_TRUE(list_dir(dir.path()).empty());
  // A destination in a directory that does not exist: an I/O error naming it.
  const Status st = write_safetensors(dir.file("no/such/dir.safetensors"), {good});
  expect_error_mentions(st, {"no/such/dir.safetensors"});
  EXPECT_EQ(st.code(), StatusCode::kIoError);
}

TEST(SafetensorsWriter, FillGetsAZeroedBufferOfExactlyTheTensorsBytes) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  // The first fill dirties the whole buffer; the second writes nothing: its tensor must be zeros,
  // not the first tensor's bytes.
  SafetensorsWriteEntry a, b;
  a.name = "a";
  a.dtype = DType::kI8;
  a.shape = {7};
  a.fill = [](uint8_t* dst) { std::memset(dst, 0x5A, 7); return Status(); };
  b = a;
  b.name = "b";
  b.shape = {5};
  b.fill = [](uint8_t*) { return Status(); };
  ASSERT_TRUE(write_safetensors(dir.file("z.safetensors"), {a, b}).ok());
  std::unique_ptr<SafetensorsFile> file;
  ASSERT_TRUE(SafetensorsFile::open(dir.file("z.safetensors"), &file).ok());
  TensorView v;
  ASSERT_TRUE(file->view("b", &v).ok());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(static_cast<const uint8_t*>(v.data)[i], 0);
}

// ---------------------------------------------------------------------------------------------
// Checkpoint directories

TEST(Checkpoint, ShardedIndexResolvesNamesAcrossShards) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::vector<float> a = {1, 2, 3}, b = {-4, 5}, c = {0.25f, 0.5f, 0.75f, 1.0f};
  const std::string s1 = "model-00001-of-00002.safetensors", s2 = "model-00002-of-00002.safetensors";
  write_text(dir.file("config.json"), R"({"model_type": "llama"})");
  ASSERT_TRUE(write_safetensors(dir.file(s1), {raw_entry("a", DType::kF32, {3}, f32_bytes(a)),
                                               raw_entry("b", DType::kF32, {2}, f32_bytes(b))}).ok());
  ASSERT_TRUE(write_safetensors(dir.file(s2), {raw_entry("c", DType::kF32, {2, 2}, f32_bytes(c))}).ok());
  write_text(dir.file("model.safetensors.index.json"), index_json({{"a", s1}, {"b", s1}, {"c", s2}}));

  std::unique_ptr<Checkpoint> ckpt;
  const Status st = Checkpoint::open(dir.path(), &ckpt);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(ckpt->config_json(), R"({"model_type": "llama"})");
  EXPECT_EQ(ckpt->tensor_names(), (std::vector<std::string>{"a", "b", "c"}));
  ASSERT_NE(ckpt->find("c"), nullptr);
  EXPECT_EQ(ckpt->find("c")->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(ckpt->find("zz"), nullptr);
  Tensor t;
  ASSERT_TRUE(ckpt->read_f32("c", &t).ok());
  for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(t.data_as<float>()[i], c[i]);
  ASSERT_TRUE(ckpt->read_f32("b", &t).ok());
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(t.data_as<float>()[i], b[i]);
  TensorView v;
  expect_error_mentions(ckpt->view("zz", &v), {"'zz'"});
  expect_error_mentions(ckpt->read_f32("zz", &t), {"'zz'"});

  // A shard the index lists but the directory lacks.
  write_text(dir.file("model.safetensors.index.json"),
             index_json({{"a", s1}, {"b", s1}, {"c", s2}, {"d", "model-00003-of-00003.safetensors"}}));
  expect_error_mentions(Checkpoint::open(dir.path(), &ckpt), {"model-00003-of-00003.safetensors"});
  // A tensor listed in a shard that does not hold it.
  write_text(dir.file("model.safetensors.index.json"), index_json({{"a", s1}, {"b", s2}, {"c", s2}}));
  expect_error_mentions(Checkpoint::open(dir.path(), &ckpt), {"'b'", s2});
  // A shard name that is a path.
  write_text(dir.file("model.safetensors.index.json"), index_json({{"a", "../" + s1}}));
  expect_error_mentions(Checkpoint::open(dir.path(), &ckpt), {"../" + s1});
  // The same tensor in two shards.
  ASSERT_TRUE(write_safetensors(dir.file(s2), {raw_entry("c", DType::kF32, {2, 2}, f32_bytes(c)),
                                               raw_entry("a", DType::kF32, {3}, f32_bytes(a))}).ok());
  write_text(dir.file("model.safetensors.index.json"), index_json({{"a", s1}, {"b", s1}, {"c", s2}}));
  expect_error_mentions(Checkpoint::open(dir.path(), &ckpt), {"'a'", s1, s2});
}

TEST(Checkpoint, MissingFilesAreNamed) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<Checkpoint> ckpt;
  Status st = Checkpoint::open(dir.path(), &ckpt);
  expect_error_mentions(st, {dir.file("config.json")});
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  write_text(dir.file("config.json"), "{}");
  expect_error_mentions(Checkpoint::open(dir.path(), &ckpt), {"model.safetensors"});
  write_text(dir.file("model.safetensors.index.json"), "{\"weight_map\": 3}");
  expect_error_mentions(Checkpoint::open(dir.path(), &ckpt), {"weight_map"});
  write_text(dir.file("model.safetensors.index.json"), "{oops");
  expect_error_mentions(Checkpoint::open(dir.path(), &ckpt), {"model.safetensors.index.json", "JSON"});
  EXPECT_EQ(ckpt, nullptr);
}

}  // namespace
}  // namespace llmq
