// Safetensors and Hugging Face checkpoints: write -> read round trips of every dtype (odd shapes,
// zero elements, scalars), the header layout, every kind of corrupt file, the writer's temp-file
// discipline, sharded checkpoints, config.json of real model families, and tiny random models
// (dense, tied, Qwen2 biases, Mixtral, FP8 / INT8 with per-tensor, per-channel and block scales)
// loaded and compared tensor by tensor. Values are compared exactly: every expected float is
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
#include "support.hpp"

namespace llmq {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr uint64_t kSeed = 20240612;

// ---- files

// A temporary directory per test (tests/support.hpp), named after this suite.
class TempDir : public llmq::testing::TempDir {
 public:
  TempDir() : llmq::testing::TempDir("llmq_safetensors") {}
};

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::vector<uint8_t> bytes;
  EXPECT_TRUE(llmq::testing::read_file(path, &bytes)) << path;
  return bytes;
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

void write_text(const std::string& path, const std::string& text) {
  write_bytes(path, std::vector<uint8_t>(text.begin(), text.end()));
}

uint64_t read_u64_le(const std::vector<uint8_t>& b) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(b[static_cast<size_t>(i)]) << (8 * i);
  return n;
}

// A safetensors file assembled by hand: the 8-byte length, `header` padded with spaces to a
// multiple of 8 (unless a length is forced), then `data_bytes` bytes of data.
void write_raw_safetensors(const std::string& path, std::string header, int64_t data_bytes,
                           int64_t declared_length = -1) {
  while (header.size() % 8 != 0) header += ' ';
  const uint64_t n = declared_length >= 0 ? static_cast<uint64_t>(declared_length) : header.size();
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(n >> (8 * i)));
  bytes.insert(bytes.end(), header.begin(), header.end());
  for (int64_t i = 0; i < data_bytes; ++i) bytes.push_back(static_cast<uint8_t>(i * 7 + 1));
  write_bytes(path, bytes);
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

void expect_error_mentions(const Status& st, const std::vector<std::string>& mentions) {
  ASSERT_FALSE(st.ok()) << "expected an error mentioning " << (mentions.empty() ? "" : mentions[0]);
  for (const auto& m : mentions) EXPECT_TRUE(contains(st.message(), m)) << "'" << m << "' not in: " << st.message();
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- an independent decoder: the value of a finite code of a sign/exponent/mantissa format
// ---- (the generators never draw Inf or NaN codes).

double decode_minifloat(uint32_t code, int exp_bits, int man_bits, int bias) {
  const uint32_t man = code & ((1u << man_bits) - 1);
  const uint32_t e = (code >> man_bits) & ((1u << exp_bits) - 1);
  const bool negative = ((code >> (exp_bits + man_bits)) & 1u) != 0;
  const double mag = e == 0 ? std::ldexp(static_cast<double>(man), 1 - bias - man_bits)
                            : std::ldexp(1.0 + std::ldexp(static_cast<double>(man), -man_bits), static_cast<int>(e) - bias);
  return negative ? -mag : mag;
}

float bf16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Element i of a buffer of `dtype`, as float32.
float element_value(DType dtype, const std::vector<uint8_t>& bytes, int64_t i) {
  const uint8_t* p = bytes.data();
  switch (dtype) {
    case DType::kF32: { float v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case DType::kF64: { double v; std::memcpy(&v, p + 8 * i, 8); return static_cast<float>(v); }
    case DType::kI32: { int32_t v; std::memcpy(&v, p + 4 * i, 4); return static_cast<float>(v); }
    case DType::kF16: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); return static_cast<float>(decode_minifloat(v, 5, 10, 15)); }
    case DType::kBF16: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); return bf16_value(v); }
    case DType::kE4M3: return static_cast<float>(decode_minifloat(p[i], 4, 3, 7));
    case DType::kE5M2: return static_cast<float>(decode_minifloat(p[i], 5, 2, 15));
    case DType::kI8: return static_cast<float>(static_cast<int8_t>(p[i]));
    default: ADD_FAILURE() << "no test decoder for " << dtype_name(dtype); return 0.0f;
  }
}

// n random, finite, non-zero elements of `dtype`.
std::vector<uint8_t> random_elements(DType dtype, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<uint8_t> out(static_cast<size_t>(dtype_storage_bytes(dtype, n)));
  uint8_t* p = out.data();
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kF32: {
        float v = static_cast<float>(normal(rng));
        if (v == 0.0f) v = 0.5f;
        std::memcpy(p + 4 * i, &v, 4);
        break;
      }
      case DType::kF64: {
        double v = normal(rng);
        if (v == 0.0) v = 0.5;
        std::memcpy(p + 8 * i, &v, 8);
        break;
      }
      case DType::kF16:
      case DType::kBF16: {
        const int mant = dtype == DType::kF16 ? 10 : 7;
        const uint32_t exp_mask = dtype == DType::kF16 ? 0x1Fu : 0xFFu;
        uint16_t c;
        do c = static_cast<uint16_t>(rng()); while ((c & 0x7FFF) == 0 || ((c >> mant) & exp_mask) == exp_mask);
        std::memcpy(p + 2 * i, &c, 2);
        break;
      }
      case DType::kE4M3: {
        uint8_t c;
        do c = static_cast<uint8_t>(rng()); while ((c & 0x7F) == 0 || (c & 0x7F) == 0x7F);
        p[i] = c;
        break;
      }
      case DType::kE5M2: {
        uint8_t c;
        do c = static_cast<uint8_t>(rng()); while ((c & 0x7F) == 0 || ((c >> 2) & 0x1F) == 0x1F);
        p[i] = c;
        break;
      }
      case DType::kI8: {
        uint8_t c;
        do c = static_cast<uint8_t>(rng()); while (c == 0);
        p[i] = c;
        break;
      }
      case DType::kI32: {
        uint32_t c;
        do c = static_cast<uint32_t>(rng()); while (c == 0);
        std::memcpy(p + 4 * i, &c, 4);
        break;
      }
      default: ADD_FAILURE() << "no generator for " << dtype_name(dtype); break;
    }
  }
  return out;
}

SafetensorsWriteEntry raw_entry(const std::string& name, DType dtype, std::vector<int64_t> shape,
                                std::vector<uint8_t> bytes) {
  SafetensorsWriteEntry e;
  e.name = name;
  e.dtype = dtype;
  e.shape = std::move(shape);
  auto data = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  e.fill = [data](uint8_t* dst) {
    if (!data->empty()) std::memcpy(dst, data->data(), data->size());
    return Status();
  };
  return e;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

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
  for (const char* bad : {"F8_E4M3FNUZ", "f32", "U8", "BOOL", ""}) {
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

std::string index_json(const std::map<std::string, std::string>& weight_map) {
  json j;
  j["metadata"] = {{"total_size", 0}};
  j["weight_map"] = weight_map;
  return j.dump(2);
}

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
      {"yarn rope", [](json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; }, StatusCode::kUnsupported,
       {"rope_scaling", "yarn"}},
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

// ---------------------------------------------------------------------------------------------
// Tiny models written by the test and loaded with load_hf_model

// How a test checkpoint stores a linear weight, and so what the loader must undo.
enum class WeightStore {
  kF32,
  kBF16,
  kE4M3PerChannel,        // weight_scale [out] (+ an input_scale the loader ignores)
  kE4M3PerChannelColumn,  // weight_scale [out, 1]
  kE5M2PerTensor,         // weight_scale [1], stored as BF16
  kE4M3PerTensorScalar,   // weight_scale [] (shape-less scalar)
  kI8ZeroPoint,           // weight_scale [out] and weight_zero_point [out] (I8)
  kE4M3Block,             // weight_scale_inv [ceil(out / bm), ceil(in / bk)]
  kE4M3NoScale,           // an error
  kE4M3BadScale,          // weight_scale [out + 1]: an error
};

// Collects tensors to write and the float32 values loading must produce for each.
class CheckpointBuilder {
 public:
  explicit CheckpointBuilder(uint64_t seed) : seed_(seed) {}

  void f32(const std::string& name, const std::vector<int64_t>& shape) {
    const std::vector<float> v = llmq::testing::normal_vector(numel_of(shape), seed_++, 0.5f);
    add(raw_entry(name, DType::kF32, shape, f32_bytes(v)), v);
  }
  void bf16(const std::string& name, const std::vector<int64_t>& shape) { typed(name, DType::kBF16, shape); }
  // Random codes of `dtype`; the expectation is their decoded value.
  void typed(const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
    const std::vector<uint8_t> bytes = random_elements(dtype, numel_of(shape), seed_++);
    std::vector<float> v(static_cast<size_t>(numel_of(shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = element_value(dtype, bytes, static_cast<int64_t>(i));
    add(raw_entry(name, dtype, shape, bytes), v);
  }
  // Written but never loaded (rotary inv_freq, activation scales).
  void extra(const std::string& name, const std::vector<int64_t>& shape) {
    entries_.push_back(raw_entry(name, DType::kF32, shape, random_elements(DType::kF32, numel_of(shape), seed_++)));
  }

  void linear_weight(const std::string& module, int64_t out, int64_t in, WeightStore store) {
    const std::string name = module + ".weight";
    std::mt19937_64 rng(seed_++);
    std::uniform_real_distribution<float> scale_dist(1e-3f, 2e-2f);
    switch (store) {
      case WeightStore::kF32: f32(name, {out, in}); return;
      case WeightStore::kBF16: bf16(name, {out, in}); return;
      default: break;
    }
    const DType dtype = store == WeightStore::kE5M2PerTensor ? DType::kE5M2
                        : store == WeightStore::kI8ZeroPoint ? DType::kI8
                                                              : DType::kE4M3;
    const std::vector<uint8_t> codes = random_elements(dtype, out * in, seed_++);
    entries_.push_back(raw_entry(name, dtype, {out, in}, codes));
    if (store == WeightStore::kE4M3NoScale) return;

    // Scales: which one covers (r, c), the scale tensor itself, and its values.
    const int64_t grid_r = (out + block_rows - 1) / block_rows, grid_c = (in + block_cols - 1) / block_cols;
    std::vector<int64_t> scale_shape;
    int64_t n_scales = out;
    std::function<int64_t(int64_t, int64_t)> scale_index = [](int64_t r, int64_t) { return r; };
    std::string scale_name = module + ".weight_scale";
    switch (store) {
      case WeightStore::kE4M3PerChannel: case WeightStore::kI8ZeroPoint: scale_shape = {out}; break;
      case WeightStore::kE4M3PerChannelColumn: scale_shape = {out, 1}; break;
      case WeightStore::kE5M2PerTensor: scale_shape = {1}; n_scales = 1; break;
      case WeightStore::kE4M3PerTensorScalar: scale_shape = {}; n_scales = 1; break;
      case WeightStore::kE4M3BadScale: scale_shape = {out + 1}; n_scales = out + 1; break;
      case WeightStore::kE4M3Block:
        scale_shape = {grid_r, grid_c};
        n_scales = grid_r * grid_c;
        scale_index = [this, grid_c](int64_t r, int64_t c) { return (r / block_rows) * grid_c + c / block_cols; };
        scale_name = module + ".weight_scale_inv";
        break;
      default: break;
    }
    if (n_scales == 1) scale_index = [](int64_t, int64_t) { return int64_t{0}; };
    std::vector<float> scales(static_cast<size_t>(n_scales));
    for (auto& s : scales) s = scale_dist(rng);
    if (store == WeightStore::kE5M2PerTensor) {  // BF16 scale: keep the top 16 bits
      std::vector<uint8_t> bits(2);
      uint32_t u;
      std::memcpy(&u, &scales[0], 4);
      const auto b16 = static_cast<uint16_t>(u >> 16);
      std::memcpy(bits.data(), &b16, 2);
      scales[0] = bf16_value(b16);
      entries_.push_back(raw_entry(scale_name, DType::kBF16, scale_shape, bits));
    } else {
      entries_.push_back(raw_entry(scale_name, DType::kF32, scale_shape, f32_bytes(scales)));
    }
    if (store == WeightStore::kE4M3PerChannel) extra(module + ".input_scale", {});
    std::vector<float> zero_points(static_cast<size_t>(n_scales), 0.0f);
    if (store == WeightStore::kI8ZeroPoint) {
      std::vector<uint8_t> zp_bytes(static_cast<size_t>(n_scales));
      for (size_t i = 0; i < zp_bytes.size(); ++i) {
        const auto zp = static_cast<int8_t>(static_cast<int>(rng() % 17) - 8);
        zero_points[i] = zp;
        zp_bytes[i] = static_cast<uint8_t>(zp);
      }
      entries_.push_back(raw_entry(module + ".weight_zero_point", DType::kI8, {n_scales}, zp_bytes));
    }
    if (store == WeightStore::kE4M3BadScale) return;
    // (q - zp) and the scale are exact in double, so their product is exact and rounding it to
    // float is the loader's single float32 multiply.
    std::vector<float> want(static_cast<size_t>(out * in));
    for (int64_t r = 0; r < out; ++r)
      for (int64_t c = 0; c < in; ++c) {
        const int64_t k = scale_index(r, c);
        const double q = element_value(dtype, codes, r * in + c);
        want[static_cast<size_t>(r * in + c)] =
            static_cast<float>((q - zero_points[static_cast<size_t>(k)]) * static_cast<double>(scales[static_cast<size_t>(k)]));
      }
    expected_[name] = want;
  }

  void remove(const std::string& name) {
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                  [&](const SafetensorsWriteEntry& e) { return e.name == name; }),
                   entries_.end());
  }

  // config.json plus model.safetensors, or `shards` shards and an index.
  Status write(const std::string& dir, const std::string& config, int shards = 1) const {
    write_text(dir + "/config.json", config);
    if (shards == 1) return write_safetensors(dir + "/model.safetensors", entries_);
    std::map<std::string, std::string> weight_map;
    const size_t per_shard = (entries_.size() + static_cast<size_t>(shards) - 1) / static_cast<size_t>(shards);
    for (int s = 0; s < shards; ++s) {
      const std::string file = "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors";
      const size_t begin = std::min(entries_.size(), static_cast<size_t>(s) * per_shard);
      const size_t end = std::min(entries_.size(), begin + per_shard);
      const std::vector<SafetensorsWriteEntry> part(entries_.begin() + static_cast<std::ptrdiff_t>(begin),
                                                    entries_.begin() + static_cast<std::ptrdiff_t>(end));
      for (const auto& e : part) weight_map[e.name] = file;
      LLMQ_RETURN_IF_ERROR(write_safetensors(dir + "/" + file, part));
    }
    write_text(dir + "/model.safetensors.index.json", index_json(weight_map));
    return {};
  }

  const std::vector<float>* expected(const std::string& name) const {
    const auto it = expected_.find(name);
    return it == expected_.end() ? nullptr : &it->second;
  }

  int64_t block_rows = 128;
  int64_t block_cols = 128;

 private:
  void add(SafetensorsWriteEntry e, std::vector<float> values) {
    expected_[e.name] = std::move(values);
    entries_.push_back(std::move(e));
  }
  uint64_t seed_;
  std::vector<SafetensorsWriteEntry> entries_;
  std::map<std::string, std::vector<float>> expected_;
};

struct TinySpec {
  std::string model_type = "llama";
  int64_t dim = 16, hidden = 36, layers = 2, heads = 4, kv_heads = 2, vocab = 33;
  int64_t experts = 0, top_k = 0;
  bool tie = false;           // tie_word_embeddings in config.json
  bool write_lm_head = true;  // lm_head.weight in the file
  bool qkv_bias = false;      // q/k/v biases in the file
  json extra = json::object();  // merged into config.json
  int64_t head_dim() const { return dim / heads; }
};

std::string tiny_config(const TinySpec& s) {
  json j = {{"model_type", s.model_type},     {"hidden_size", s.dim},        {"intermediate_size", s.hidden},
            {"num_hidden_layers", s.layers},  {"num_attention_heads", s.heads}, {"num_key_value_heads", s.kv_heads},
            {"vocab_size", s.vocab},          {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-5},
            {"rope_theta", 10000.0},          {"tie_word_embeddings", s.tie}, {"bos_token_id", 1},
            {"eos_token_id", 2},              {"hidden_act", "silu"}};
  if (s.experts > 0) {
    j["num_local_experts"] = s.experts;
    j["num_experts_per_tok"] = s.top_k;
  }
  j.update(s.extra);
  return j.dump(2);
}

using StoreFor = std::function<WeightStore(const std::string& module)>;

// Every tensor of the tiny model, named by hand (not through LinearId::hf_name, so the test checks
// the loader's names).
void add_tiny_model(CheckpointBuilder* b, const TinySpec& s, const StoreFor& store) {
  const int64_t q_out = s.heads * s.head_dim(), kv_out = s.kv_heads * s.head_dim();
  auto linear = [&](const std::string& module, int64_t out, int64_t in) { b->linear_weight(module, out, in, store(module)); };
  b->f32("model.embed_tokens.weight", {s.vocab, s.dim});
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    b->bf16(p + "input_layernorm.weight", {s.dim});
    b->f32(p + "post_attention_layernorm.weight", {s.dim});
    linear(p + "self_attn.q_proj", q_out, s.dim);
    linear(p + "self_attn.k_proj", kv_out, s.dim);
    linear(p + "self_attn.v_proj", kv_out, s.dim);
    linear(p + "self_attn.o_proj", s.dim, q_out);
    if (s.qkv_bias) {
      b->f32(p + "self_attn.q_proj.bias", {q_out});
      b->bf16(p + "self_attn.k_proj.bias", {kv_out});
      b->f32(p + "self_attn.v_proj.bias", {kv_out});
    }
    b->extra(p + "self_attn.rotary_emb.inv_freq", {s.head_dim() / 2});
    if (s.experts > 0) {
      linear(p + "block_sparse_moe.gate", s.experts, s.dim);
      for (int64_t e = 0; e < s.experts; ++e) {
        const std::string ep = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
        linear(ep + "w1", s.hidden, s.dim);
        linear(ep + "w3", s.hidden, s.dim);
        linear(ep + "w2", s.dim, s.hidden);
      }
    } else {
      linear(p + "mlp.gate_proj", s.hidden, s.dim);
      linear(p + "mlp.up_proj", s.hidden, s.dim);
      linear(p + "mlp.down_proj", s.dim, s.hidden);
    }
  }
  b->bf16("model.norm.weight", {s.dim});
  if (s.write_lm_head) linear("lm_head", s.vocab, s.dim);
}

void expect_values(const Tensor& t, const std::vector<int64_t>& shape, const std::vector<float>* want,
                   const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_NE(want, nullptr) << "no expectation recorded";
  EXPECT_EQ(t.dtype(), DType::kF32);
  ASSERT_EQ(t.shape(), shape);
  ASSERT_EQ(t.numel(), static_cast<int64_t>(want->size()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float got = t.data_as<float>()[i], w = (*want)[static_cast<size_t>(i)];
    if (got != w) {
      ADD_FAILURE() << what << " element " << i << ": got " << got << ", want " << w;
      return;
    }
  }
}

void expect_linear(const Linear& l, const CheckpointBuilder& b, const std::string& module, int64_t out, int64_t in,
                   int64_t layer, LinearRole role, int64_t expert) {
  EXPECT_EQ(l.id.layer, layer) << module;
  EXPECT_EQ(l.id.role, role) << module;
  EXPECT_EQ(l.id.expert, expert) << module;
  expect_values(l.weight, {out, in}, b.expected(module + ".weight"), module + ".weight");
}

void expect_tiny_model(const ModelWeights& w, const TinySpec& s, const CheckpointBuilder& b) {
  const int64_t q_out = s.heads * s.head_dim(), kv_out = s.kv_heads * s.head_dim();
  EXPECT_EQ(w.config.dim, s.dim);
  EXPECT_EQ(w.config.n_layers, s.layers);
  EXPECT_EQ(w.config.n_experts, s.experts);
  expect_values(w.token_embedding, {s.vocab, s.dim}, b.expected("model.embed_tokens.weight"), "embedding");
  ASSERT_EQ(static_cast<int64_t>(w.layers.size()), s.layers);
  for (int64_t i = 0; i < s.layers; ++i) {
    const LayerWeights& L = w.layers[static_cast<size_t>(i)];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    expect_values(L.attn_norm, {s.dim}, b.expected(p + "input_layernorm.weight"), p + "input_layernorm");
    expect_values(L.ffn_norm, {s.dim}, b.expected(p + "post_attention_layernorm.weight"), p + "post_attention_layernorm");
    expect_linear(L.q, b, p + "self_attn.q_proj", q_out, s.dim, i, LinearRole::kQ, -1);
    expect_linear(L.k, b, p + "self_attn.k_proj", kv_out, s.dim, i, LinearRole::kK, -1);
    expect_linear(L.v, b, p + "self_attn.v_proj", kv_out, s.dim, i, LinearRole::kV, -1);
    expect_linear(L.o, b, p + "self_attn.o_proj", s.dim, q_out, i, LinearRole::kO, -1);
    if (s.qkv_bias) {
      expect_values(L.q.bias, {q_out}, b.expected(p + "self_attn.q_proj.bias"), "q bias");
      expect_values(L.k.bias, {kv_out}, b.expected(p + "self_attn.k_proj.bias"), "k bias");
      expect_values(L.v.bias, {kv_out}, b.expected(p + "self_attn.v_proj.bias"), "v bias");
    } else {
      EXPECT_EQ(L.q.bias.nbytes(), 0);
      EXPECT_EQ(L.k.bias.nbytes(), 0);
    }
    EXPECT_EQ(L.o.bias.nbytes(), 0);
    if (s.experts > 0) {
      expect_linear(L.router, b, p + "block_sparse_moe.gate", s.experts, s.dim, i, LinearRole::kRouter, -1);
      ASSERT_EQ(static_cast<int64_t>(L.experts.size()), s.experts);
      for (int64_t e = 0; e < s.experts; ++e) {
        const std::string ep = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
        const Expert& x = L.experts[static_cast<size_t>(e)];
        expect_linear(x.gate, b, ep + "w1", s.hidden, s.dim, i, LinearRole::kGate, e);
        expect_linear(x.up, b, ep + "w3", s.hidden, s.dim, i, LinearRole::kUp, e);
        expect_linear(x.down, b, ep + "w2", s.dim, s.hidden, i, LinearRole::kDown, e);
      }
    } else {
      EXPECT_TRUE(L.experts.empty());
      expect_linear(L.mlp.gate, b, p + "mlp.gate_proj", s.hidden, s.dim, i, LinearRole::kGate, -1);
      expect_linear(L.mlp.up, b, p + "mlp.up_proj", s.hidden, s.dim, i, LinearRole::kUp, -1);
      expect_linear(L.mlp.down, b, p + "mlp.down_proj", s.dim, s.hidden, i, LinearRole::kDown, -1);
    }
  }
  expect_values(w.final_norm, {s.dim}, b.expected("model.norm.weight"), "final norm");
  EXPECT_EQ(w.lm_head.id.layer, -1);
  EXPECT_EQ(w.lm_head.id.role, LinearRole::kLmHead);
  const bool tied = s.tie || !s.write_lm_head;
  EXPECT_EQ(w.config.tie_embeddings, tied);
  expect_values(w.lm_head.weight, {s.vocab, s.dim},
                b.expected(tied ? "model.embed_tokens.weight" : "lm_head.weight"), "lm_head");
  // Every linear's id names the tensor it was loaded from.
  for (const Linear* l : w.linears()) {
    const std::string name = (l->id.role == LinearRole::kLmHead && tied) ? "model.embed_tokens.weight"
                                                                          : l->id.hf_name(w.config) + ".weight";
    const std::vector<float>* want = b.expected(name);
    ASSERT_NE(want, nullptr) << name;
    EXPECT_EQ(l->weight.numel(), static_cast<int64_t>(want->size())) << name;
  }
}

ModelWeights load_ok(const std::string& dir) {
  ModelWeights w;
  const Status st = load_hf_model(dir, &w);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return w;
}

const StoreFor kAllF32 = [](const std::string&) { return WeightStore::kF32; };

TEST(HfModel, TinyLlamaLoadsEveryTensorInPlace) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TinySpec s;
  CheckpointBuilder b(kSeed);
  // Mixed storage: BF16 for the MLP, float32 elsewhere.
  add_tiny_model(&b, s, [](const std::string& m) { return contains(m, "mlp") ? WeightStore::kBF16 : WeightStore::kF32; });
  ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
  const ModelWeights w = load_ok(dir.path());
  expect_tiny_model(w, s, b);
  EXPECT_EQ(w.config.n_kv_heads, 2);
  EXPECT_EQ(w.config.head_dim, 4);
  EXPECT_EQ(w.linears().size(), 2u * 7u + 1u);
}

TEST(HfModel, ShardedTinyLlamaLoads) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TinySpec s;
  CheckpointBuilder b(kSeed + 1);
  add_tiny_model(&b, s, kAllF32);
  ASSERT_TRUE(b.write(dir.path(), tiny_config(s), 3).ok());
  EXPECT_FALSE(fs::exists(dir.file("model.safetensors")));
  expect_tiny_model(load_ok(dir.path()), s, b);
}

TEST(HfModel, TiedLmHeadCopiesTheEmbedding) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TinySpec s;
  s.tie = true;
  s.write_lm_head = false;
  CheckpointBuilder b(kSeed + 2);
  add_tiny_model(&b, s, kAllF32);
  ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
  ModelWeights w = load_ok(dir.path());
  expect_tiny_model(w, s, b);
  // A copy, not an alias: changing one leaves the other.
  ASSERT_GT(w.lm_head.weight.numel(), 0);
  w.lm_head.weight.data_as<float>()[0] += 1.0f;
  EXPECT_NE(w.lm_head.weight.data_as<float>()[0], w.token_embedding.data_as<float>()[0]);
}

// An untied config without lm_head.weight is not silently tied: transformers would start the
// classifier from random weights, so the two files describe different models.
TEST(HfModel, UntiedConfigWithoutLmHeadIsRefused) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TinySpec s;
  s.tie = false;
  s.write_lm_head = false;
  CheckpointBuilder b(kSeed + 2);
  add_tiny_model(&b, s, kAllF32);
  ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
  ModelWeights w;
  expect_error_mentions(load_hf_model(dir.path(), &w), {"lm_head.weight", "tie_word_embeddings"});
}

TEST(HfModel, Qwen2BiasesLoadAndAreRequired) {
  TinySpec s;
  s.model_type = "qwen2";
  s.qkv_bias = true;
  {
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    CheckpointBuilder b(kSeed + 3);
    add_tiny_model(&b, s, kAllF32);
    ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
    const ModelWeights w = load_ok(dir.path());
    EXPECT_TRUE(w.config.attention_bias);
    expect_tiny_model(w, s, b);
  }
  {  // qwen2 without its biases
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    CheckpointBuilder b(kSeed + 3);
    add_tiny_model(&b, s, kAllF32);
    b.remove("model.layers.1.self_attn.v_proj.bias");
    ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
    ModelWeights w;
    expect_error_mentions(load_hf_model(dir.path(), &w), {"model.layers.1.self_attn.v_proj.bias", "missing"});
  }
  {  // a llama whose file has biases its config does not mention: not silently dropped
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    TinySpec llama;
    llama.qkv_bias = true;
    CheckpointBuilder b(kSeed + 3);
    add_tiny_model(&b, llama, kAllF32);
    ASSERT_TRUE(b.write(dir.path(), tiny_config(llama)).ok());
    ModelWeights w;
    expect_error_mentions(load_hf_model(dir.path(), &w), {"model.layers.0.self_attn.q_proj.bias"});
  }
}

TEST(HfModel, TinyMixtralExpertsAndRouter) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TinySpec s;
  s.model_type = "mixtral";
  s.experts = 3;
  s.top_k = 2;
  s.hidden = 20;
  CheckpointBuilder b(kSeed + 4);
  add_tiny_model(&b, s, kAllF32);
  ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
  const ModelWeights w = load_ok(dir.path());
  EXPECT_TRUE(w.config.is_moe());
  EXPECT_EQ(w.config.n_experts_per_token, 2);
  expect_tiny_model(w, s, b);
  EXPECT_EQ(w.linears().size(), 2u * (4u + 1u + 3u * 3u) + 1u);
}

TEST(HfModel, MissingTensorsAndWrongShapesAreNamed) {
  TinySpec s;
  {
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    CheckpointBuilder b(kSeed + 5);
    add_tiny_model(&b, s, kAllF32);
    b.remove("model.layers.1.mlp.up_proj.weight");
    ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
    ModelWeights w;
    expect_error_mentions(load_hf_model(dir.path(), &w), {"model.layers.1.mlp.up_proj.weight", "missing"});
  }
  {
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    CheckpointBuilder b(kSeed + 5);
    add_tiny_model(&b, s, kAllF32);
    TinySpec wider = s;
    wider.hidden = 40;  // config.json disagrees with the tensors
    ASSERT_TRUE(b.write(dir.path(), tiny_config(wider)).ok());
    ModelWeights w;
    expect_error_mentions(load_hf_model(dir.path(), &w),
                          {"model.layers.0.mlp.gate_proj.weight", "[40, 16]", "[36, 16]"});
  }
  {
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    CheckpointBuilder b(kSeed + 5);
    add_tiny_model(&b, s, kAllF32);
    TinySpec bad = s;
    bad.model_type = "falcon";
    ASSERT_TRUE(b.write(dir.path(), tiny_config(bad)).ok());
    ModelWeights w;
    const Status st = load_hf_model(dir.path(), &w);
    expect_error_mentions(st, {"model_type", "falcon"});
    EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  }
}

TEST(HfModel, Fp8PerChannelAndPerTensorScalesDequantize) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TinySpec s;
  CheckpointBuilder b(kSeed + 6);
  add_tiny_model(&b, s, [](const std::string& m) {
    if (contains(m, "q_proj")) return WeightStore::kE5M2PerTensor;
    if (contains(m, "k_proj")) return WeightStore::kE4M3PerChannelColumn;
    if (contains(m, "v_proj")) return WeightStore::kI8ZeroPoint;
    if (contains(m, "o_proj")) return WeightStore::kE4M3PerTensorScalar;
    return WeightStore::kE4M3PerChannel;  // MLP and lm_head, with an ignored input_scale
  });
  // 8-bit weights are read only under a quantization_config (without one, transformers would
  // load the codes as plain numbers).
  s.extra = {{"quantization_config", {{"quant_method", "fp8"}}}};
  ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
  expect_tiny_model(load_ok(dir.path()), s, b);
}

// Sizes not multiples of the block, so edge blocks are partial: q [160, 160] has a 2 x 2 scale
// grid, gate [272, 160] 3 x 2, down [160, 272] 2 x 3.
TinySpec partial_block_spec() {
  TinySpec s;
  s.dim = 160;
  s.hidden = 272;
  s.heads = 5;
  s.kv_heads = 1;
  s.layers = 1;
  s.vocab = 20;
  return s;
}

TEST(HfModel, BlockFp8ScaleInvDequantizes) {
  const std::vector<std::pair<int64_t, int64_t>> blocks = {{128, 128}, {64, 32}};
  for (const auto& [block_rows, block_cols] : blocks) {
    SCOPED_TRACE("block " + std::to_string(block_rows) + "x" + std::to_string(block_cols));
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    TinySpec s = partial_block_spec();
    s.extra = {{"quantization_config", {{"quant_method", "fp8"}}}};
    if (block_rows != 128)
      s.extra = {{"quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {block_rows, block_cols}}}}};
    CheckpointBuilder b(kSeed + 7);
    b.block_rows = block_rows;
    b.block_cols = block_cols;
    add_tiny_model(&b, s, [](const std::string&) { return WeightStore::kE4M3Block; });
    ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
    expect_tiny_model(load_ok(dir.path()), s, b);
  }
}

// Found while writing fuzz/fuzz_hf_config.cpp: the scale grid was ceil(rows / block) computed as
// (rows + block - 1) / block, which overflows int64 for a weight_block_size near INT64_MAX (UBSan
// stops the asan preset there). Any block at least as large as the weight is one block.
TEST(HfModel, WeightBlockSizeUpToInt64MaxIsOneBlock) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TinySpec s = partial_block_spec();
  const int64_t huge = std::numeric_limits<int64_t>::max();
  s.extra = {{"quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {huge, huge}}}}};
  CheckpointBuilder b(kSeed + 9);
  b.block_rows = b.block_cols = int64_t{1} << 20;  // the same single block, scales [1, 1]
  add_tiny_model(&b, s, [](const std::string&) { return WeightStore::kE4M3Block; });
  ASSERT_TRUE(b.write(dir.path(), tiny_config(s)).ok());
  expect_tiny_model(load_ok(dir.path()), s, b);
}

TEST(HfModel, QuantizedWeightsWithoutUsableScalesAreErrors) {
  TinySpec s;
  const std::pair<WeightStore, std::vector<std::string>> cases[] = {
      {WeightStore::kE4M3NoScale, {"model.layers.0.self_attn.o_proj.weight", "weight_scale"}},
      {WeightStore::kE4M3BadScale, {"model.layers.0.self_attn.o_proj.weight_scale", "[17]"}},
  };
  for (const auto& [store, mentions] : cases) {
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    CheckpointBuilder b(kSeed + 8);
    add_tiny_model(&b, s, [store = store](const std::string& m) { return contains(m, "o_proj") ? store : WeightStore::kF32; });
    TinySpec quantized = s;  // 8-bit weights are read only under a quantization_config
    quantized.extra = {{"quantization_config", {{"quant_method", "fp8"}}}};
    ASSERT_TRUE(b.write(dir.path(), tiny_config(quantized)).ok());
    ModelWeights w;
    expect_error_mentions(load_hf_model(dir.path(), &w), mentions);
  }
}

}  // namespace
}  // namespace llmq
