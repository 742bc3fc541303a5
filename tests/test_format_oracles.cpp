// Bit-exactness of llmq's conversions against two independent oracles:
//  1. PyTorch's Tensor.to(dtype), recorded in $LLMQ_TESTDATA/fp8_conversions.bin (layout in the
//     .json beside it): 184k float32 inputs through every FP8 format, saturating and not, and
//     BF16 / FP16.
//  2. NVIDIA's cuda_fp8.h host conversions (__nv_cvt_float_to_fp8 and friends), where the header
//     is present. Exhaustive over every float32 bit pattern would take minutes; the test walks
//     every FP8 midpoint +-1 ulp plus a seeded sweep.
// Every mismatching input is reported (input bits, ours, theirs), not only the first.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "llmq/format.hpp"
#include "support.hpp"

#ifdef LLMQ_HAVE_CUDA_FP8_H
#include <cuda_fp8.h>
#endif

namespace llmq {
namespace {

struct Mismatches {
  int64_t count = 0;
  std::ostringstream text;
  void add(float input, uint32_t ours, uint32_t theirs) {
    ++count;
    uint32_t bits;
    std::memcpy(&bits, &input, 4);
    text << "  input " << input << " (0x" << std::hex << bits << ") ours 0x" << ours << " theirs 0x"
           << theirs << std::dec << "\n";
  }
};

struct TorchColumns {
  int64_t n = 0;
  std::vector<uint8_t> raw;
  const float* input = nullptr;
  const uint8_t* column(int index) const {  // 0-based among the uint8 columns
    return raw.data() + n * 4 + n * index;
  }
  const uint16_t* column16(int index) const {  // 0: bf16, 1: f16
    const uint8_t* base = raw.data() + n * 4 + n * 8;
    return reinterpret_cast<const uint16_t*>(base + n * 2 * index);
  }
};

bool load_torch(TorchColumns* t, std::string* why) {
  const std::string dir = testing::testdata_dir();
  std::vector<uint8_t> json;
  if (!testing::read_file(dir + "/fp8_conversions.json", &json) ||
      !testing::read_file(dir + "/fp8_conversions.bin", &t->raw)) {
    *why = testing::test_data_absent(dir + "/fp8_conversions.json") + " (PyTorch reference vectors; set LLMQ_TESTDATA)";
    return false;
  }
  // n is the first number after "n": in the json; the column order is fixed by the generator.
  const std::string text(json.begin(), json.end());
  const auto pos = text.find("\"n\":");
  if (pos == std::string::npos) {
    *why = "fp8_conversions.json has no \"n\"";
    return false;
  }
  t->n = std::stoll(text.substr(pos + 4));
  const int64_t expected = t->n * (4 + 8 + 4);
  if (static_cast<int64_t>(t->raw.size()) != expected) {
    *why = "fp8_conversions.bin has " + std::to_string(t->raw.size()) + " bytes, expected " +
           std::to_string(expected);
    return false;
  }
  t->input = reinterpret_cast<const float*>(t->raw.data());
  return true;
}

struct TorchCase {
  const char* column;
  int index;
  DType dtype;
  Saturation saturation;
};

const TorchCase kTorchCases[] = {
    {"e4m3fn", 0, DType::kE4M3, Saturation::kNonSaturating},
    {"e4m3fn_satfinite", 1, DType::kE4M3, Saturation::kSatFinite},
    {"e5m2", 2, DType::kE5M2, Saturation::kNonSaturating},
    {"e5m2_satfinite", 3, DType::kE5M2, Saturation::kSatFinite},
    {"e4m3fnuz", 4, DType::kE4M3Fnuz, Saturation::kNonSaturating},
    {"e4m3fnuz_satfinite", 5, DType::kE4M3Fnuz, Saturation::kSatFinite},
    {"e5m2fnuz", 6, DType::kE5M2Fnuz, Saturation::kNonSaturating},
    {"e5m2fnuz_satfinite", 7, DType::kE5M2Fnuz, Saturation::kSatFinite},
};

TEST(TorchOracle, Fp8ConversionsBitExact) {
  TorchColumns t;
  std::string why;
  if (!load_torch(&t, &why)) GTEST_SKIP() << why;
  for (const TorchCase& c : kTorchCases) {
    Mismatches bad;
    const uint8_t* expect = t.column(c.index);
    for (int64_t i = 0; i < t.n; ++i) {
      const uint8_t ours = float_to_fp8(t.input[i], c.dtype, {Rounding::kNearestEven, c.saturation});
      if (ours != expect[i]) bad.add(t.input[i], ours, expect[i]);
    }
    EXPECT_EQ(bad.count, 0) << c.column << ": " << bad.count << " of " << t.n << " inputs differ\n"
                            << bad.text.str();
  }
}

TEST(TorchOracle, Bf16AndFp16BitExact) {
  TorchColumns t;
  std::string why;
  if (!load_torch(&t, &why)) GTEST_SKIP() << why;
  Mismatches bf, hf;
  for (int64_t i = 0; i < t.n; ++i) {
    // NaN -> BF16 has three spellings among the references (c10 scalar 0x7FC0, PyTorch's
    // vectorised path 0xFFFF as recorded here, CUDA's __float2bfloat16 0x7FFF): any NaN passes.
    const uint16_t b = float_to_bf16_bits(t.input[i]);
    const bool both_nan = std::isnan(bf16_bits_to_float(b)) && std::isnan(bf16_bits_to_float(t.column16(0)[i]));
    if (b != t.column16(0)[i] && !both_nan) bf.add(t.input[i], b, t.column16(0)[i]);
    const uint16_t h = float_to_fp16_bits(t.input[i]);
    if (h != t.column16(1)[i]) hf.add(t.input[i], h, t.column16(1)[i]);
  }
  EXPECT_EQ(bf.count, 0) << "bf16: " << bf.count << " inputs differ\n" << bf.text.str();
  EXPECT_EQ(hf.count, 0) << "f16: " << hf.count << " inputs differ\n" << hf.text.str();
}

TEST(TorchOracle, DecodeRoundTripsEveryFiniteCode) {
  // Decoding then re-encoding each code must return it (the PyTorch inputs pin the encoder).
  for (const TorchCase& c : kTorchCases) {
    for (uint32_t code = 0; code < 256; ++code) {
      const float v = fp8_to_float(static_cast<uint8_t>(code), c.dtype);
      if (!std::isfinite(v)) continue;  // Inf saturates to max under satfinite: not a round trip
      const uint8_t back = float_to_fp8(v, c.dtype, {Rounding::kNearestEven, c.saturation});
      EXPECT_EQ(back, code) << c.column << " code 0x" << std::hex << code << " decodes to " << v;
    }
  }
}

#ifdef LLMQ_HAVE_CUDA_FP8_H

// Inputs that stress rounding: every FP8 value, the midpoints between neighbours and one float32
// ulp either side, values past max, subnormals, zeros, Inf, NaN, plus a seeded sweep.
std::vector<float> nvidia_probe_inputs(DType dtype) {
  std::vector<float> xs = {0.0f, -0.0f, INFINITY, -INFINITY, std::nanf(""), -std::nanf(""),
                           1e30f, -1e30f, 1e-30f, -1e-30f, 464.0f, 480.0f, 61440.0f, 65536.0f};
  std::vector<double> grid;
  for (uint32_t code = 0; code < 128; ++code) {
    const float v = fp8_to_float(static_cast<uint8_t>(code), dtype);
    if (std::isfinite(v)) grid.push_back(v);
  }
  grid.push_back(format_info(dtype).max_finite * (dtype == DType::kE4M3 ? 480.0 / 448.0 : 65536.0 / 57344.0));
  for (size_t i = 0; i + 1 < grid.size(); ++i) {
    const float mid = static_cast<float>((grid[i] + grid[i + 1]) / 2);
    for (float v : {static_cast<float>(grid[i]), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      xs.push_back(v);
      xs.push_back(-v);
    }
  }
  for (float v : testing::normal_vector(20000, 7, 300.0f)) xs.push_back(v);
  for (float v : testing::normal_vector(20000, 8, 0.01f)) xs.push_back(v);
  return xs;
}

uint8_t nvidia_convert(float x, DType dtype, Saturation sat) {
  const __nv_saturation_t s = sat == Saturation::kSatFinite ? __NV_SATFINITE : __NV_NOSAT;
  const __nv_fp8_interpretation_t f = dtype == DType::kE4M3 ? __NV_E4M3 : __NV_E5M2;
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, s, f));
}

TEST(NvidiaOracle, FloatToFp8BitExact) {
  for (DType dtype : {DType::kE4M3, DType::kE5M2}) {
    for (Saturation sat : {Saturation::kSatFinite, Saturation::kNonSaturating}) {
      Mismatches bad;
      for (float x : nvidia_probe_inputs(dtype)) {
        uint8_t ours = float_to_fp8(x, dtype, {Rounding::kNearestEven, sat});
        uint8_t theirs = nvidia_convert(x, dtype, sat);
        // NaN payloads: cuda_fp8.h returns 0x7F/0xFF by input sign, as we do; compare all bits.
        if (ours != theirs) bad.add(x, ours, theirs);
      }
      EXPECT_EQ(bad.count, 0) << dtype_name(dtype)
                              << (sat == Saturation::kSatFinite ? " satfinite" : " nosat") << ": "
                              << bad.count << " inputs differ\n" << bad.text.str();
    }
  }
}

TEST(NvidiaOracle, Bf16ToFp8BitExact) {
  // cuda_fp8.h converts BF16 directly; llmq widens BF16 to float32 (exact) and converts once.
  for (DType dtype : {DType::kE4M3, DType::kE5M2}) {
    Mismatches bad;
    for (uint32_t bits = 0; bits < 65536; ++bits) {
      const float x = bf16_bits_to_float(static_cast<uint16_t>(bits));
      __nv_bfloat16_raw raw;
      raw.x = static_cast<unsigned short>(bits);
      const uint8_t theirs = static_cast<uint8_t>(__nv_cvt_bfloat16raw_to_fp8(
          raw, __NV_SATFINITE, dtype == DType::kE4M3 ? __NV_E4M3 : __NV_E5M2));
      const uint8_t ours = float_to_fp8(x, dtype);
      if (ours != theirs) bad.add(x, ours, theirs);
    }
    EXPECT_EQ(bad.count, 0) << dtype_name(dtype) << " from every bf16: " << bad.count
                            << " differ\n" << bad.text.str();
  }
}

TEST(NvidiaOracle, DecodeEveryCode) {
  for (DType dtype : {DType::kE4M3, DType::kE5M2}) {
    Mismatches bad;
    for (uint32_t code = 0; code < 256; ++code) {
      const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code),
                                                   dtype == DType::kE4M3 ? __NV_E4M3 : __NV_E5M2);
      const float theirs = fp16_bits_to_float(h.x);
      const float ours = fp8_to_float(static_cast<uint8_t>(code), dtype);
      const bool same = (std::isnan(ours) && std::isnan(theirs)) ||
                        (ours == theirs && std::signbit(ours) == std::signbit(theirs));
      if (!same) {
        uint32_t a, b;
        std::memcpy(&a, &ours, 4);
        std::memcpy(&b, &theirs, 4);
        bad.add(static_cast<float>(code), a, b);
      }
    }
    EXPECT_EQ(bad.count, 0) << dtype_name(dtype) << " decode (input column = code): " << bad.text.str();
  }
}

#else

TEST(NvidiaOracle, FloatToFp8BitExact) {
  GTEST_SKIP() << "cuda_fp8.h not found at build time: NVIDIA oracle not run";
}

#endif

}  // namespace
}  // namespace llmq
