// Helpers shared by the safetensors tests (test_safetensors.cpp: the format; test_hf_model.cpp:
// config.json and Hugging Face checkpoints loaded as models): files, an independent decoder of
// every element format, seeded random elements, and raw writer entries.
#pragma once

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
namespace safetensors_test {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr uint64_t kSeed = 20240612;

// ---- files

// A temporary directory per test (tests/support.hpp), named after this suite.
class TempDir : public llmq::testing::TempDir {
 public:
  TempDir() : llmq::testing::TempDir("llmq_safetensors") {}
};

inline std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::vector<uint8_t> bytes;
  EXPECT_TRUE(llmq::testing::read_file(path, &bytes)) << path;
  return bytes;
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline void write_text(const std::string& path, const std::string& text) {
  write_bytes(path, std::vector<uint8_t>(text.begin(), text.end()));
}

inline uint64_t read_u64_le(const std::vector<uint8_t>& b) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(b[static_cast<size_t>(i)]) << (8 * i);
  return n;
}

// A safetensors file assembled by hand: the 8-byte length, `header` padded with spaces to a
// multiple of 8 (unless a length is forced), then `data_bytes` bytes of data.
inline void write_raw_safetensors(const std::string& path, std::string header, int64_t data_bytes,
                           int64_t declared_length = -1) {
  while (header.size() % 8 != 0) header += ' ';
  const uint64_t n = declared_length >= 0 ? static_cast<uint64_t>(declared_length) : header.size();
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(n >> (8 * i)));
  bytes.insert(bytes.end(), header.begin(), header.end());
  for (int64_t i = 0; i < data_bytes; ++i) bytes.push_back(static_cast<uint8_t>(i * 7 + 1));
  write_bytes(path, bytes);
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

inline void expect_error_mentions(const Status& st, const std::vector<std::string>& mentions) {
  ASSERT_FALSE(st.ok()) << "expected an error mentioning " << (mentions.empty() ? "" : mentions[0]);
  for (const auto& m : mentions) EXPECT_TRUE(contains(st.message(), m)) << "'" << m << "' not in: " << st.message();
}

inline int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- an independent decoder: the value of a finite code of a sign/exponent/mantissa format
// ---- (the generators never draw Inf or NaN codes).

inline double decode_minifloat(uint32_t code, int exp_bits, int man_bits, int bias) {
  const uint32_t man = code & ((1u << man_bits) - 1);
  const uint32_t e = (code >> man_bits) & ((1u << exp_bits) - 1);
  const bool negative = ((code >> (exp_bits + man_bits)) & 1u) != 0;
  const double mag = e == 0 ? std::ldexp(static_cast<double>(man), 1 - bias - man_bits)
                            : std::ldexp(1.0 + std::ldexp(static_cast<double>(man), -man_bits), static_cast<int>(e) - bias);
  return negative ? -mag : mag;
}

inline float bf16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Element i of a buffer of `dtype`, as float32.
inline float element_value(DType dtype, const std::vector<uint8_t>& bytes, int64_t i) {
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
inline std::vector<uint8_t> random_elements(DType dtype, int64_t n, uint64_t seed) {
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

inline SafetensorsWriteEntry raw_entry(const std::string& name, DType dtype, std::vector<int64_t> shape,
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

inline std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// model.safetensors.index.json text for a weight map.
inline std::string index_json(const std::map<std::string, std::string>& weight_map) {
  json j;
  j["metadata"] = {{"total_size", 0}};
  j["weight_map"] = weight_map;
  return j.dump(2);
}

}  // namespace safetensors_test
}  // namespace llmq
