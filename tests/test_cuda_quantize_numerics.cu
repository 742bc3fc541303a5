// The cuda_quantize kernels' numerics, run on the host against the CPU reference (no GPU needed):
// the Philox generator, the element encoders, the INT8 and stochastic FP8 pack paths, scales from
// absmax, and the fast division the kernels index with.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/element.hpp"
#include "cuda/quantize_kernels.cuh"
#include "cuda_quantize_support.hpp"
#include "llmq/format.hpp"
#include "llmq/quantize_tensor.hpp"
#include "llmq/scale.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using namespace cuda_quantize_test;  // NOLINT: the suite's shared helpers

// ---- The kernels' numerics run on the host against the CPU reference (no GPU needed): the same
// __host__ __device__ functions the kernels inline, with the same parameters cuda_quantize builds.

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ~1M float bit patterns spread over the whole range, every format's boundaries, and dense
// random values around the FP8 / INT8 ranges.
const std::vector<float>& sample_floats() {
  static const std::vector<float> v = [] {
    std::vector<float> out;
    for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 4093) out.push_back(float_of(static_cast<uint32_t>(b)));
    for (DType d : kFormats) {
      const auto more = boundary_values(d);
      out.insert(out.end(), more.begin(), more.end());
    }
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> wide(-70000.0f, 70000.0f), narrow(-600.0f, 600.0f), tiny(-0.02f, 0.02f);
    for (int i = 0; i < 100000; ++i) {
      out.push_back(wide(rng));
      out.push_back(narrow(rng));
      out.push_back(tiny(rng));
    }
    return out;
  }();
  return v;
}

TEST(CudaQuantizeNumerics, PhiloxMatchesReference) {
  std::mt19937_64 rng(3);
  for (int i = 0; i < 100000; ++i) {
    const uint64_t seed = i < 10 ? static_cast<uint64_t>(i) : rng(), index = i < 10 ? ~uint64_t{0} - i : rng() >> (i % 64);
    ASSERT_EQ(quant_kernels::philox_u32(seed, index), philox_random_u32(seed, index)) << "seed=" << seed << " index=" << index;
  }
}

TEST(CudaQuantizeNumerics, ElementEncodersMatchReference) {
  const std::vector<float>& xs = sample_floats();
  for (DType format : kFormats)
    for (Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
      QuantSpec spec = QuantSpec::per_tensor(format);
      spec.rounding = rounding;
      spec.seed = kStochasticSeed;
      const quant_kernels::EncodeParams p = quant_kernels::encode_params(spec);
      int64_t differ = 0;
      for (size_t i = 0; i < xs.size(); ++i) {
        const float v = xs[i];
        const uint32_t bits = rounding == Rounding::kStochastic ? philox_random_u32(spec.seed, i) : 0u;
        bool clipped = false;
        const uint32_t want = static_cast<uint32_t>(detail::encode_scaled(v, format, 0, rounding, bits, &clipped)) & 0xFFu;
        uint32_t clips = 0, got = 0;
        if (format == DType::kI8) {
          got = quant_kernels::encode_int8(v, p, bits, clips);
        } else {
          got = quant_kernels::encode_fp8_soft(v, p, bits);
          clips = quant_kernels::fp8_clips(v, p);
        }
        if (got != want || (clips != 0) != clipped) {
          if (++differ <= 5)
            ADD_FAILURE() << dtype_name(format) << (rounding == Rounding::kStochastic ? " stochastic" : " rne") << " x="
                          << float_text(v) << " bits=" << bits << ": ours " << hex2(got) << " clip " << clips
                          << ", reference " << hex2(want) << " clip " << clipped;
        }
      }
      EXPECT_EQ(differ, 0) << dtype_name(format) << " over " << xs.size() << " values";
    }
}

TEST(CudaQuantizeNumerics, PhiloxPackMatchesPhilox) {
  std::mt19937_64 rng(5);
  std::vector<uint64_t> bases = {0, 16, 0xFFFFFFF0ull, 0x100000000ull, 0xFFFFFFFFFFFFFFF0ull, 0x7FFFFFFFFFFFFFF0ull};
  for (int i = 0; i < 4000; ++i) bases.push_back((rng() >> (i % 64)) & ~uint64_t{15});
  for (size_t i = 0; i < bases.size(); ++i) {
    const uint64_t seed = i < 6 ? (i % 2 ? ~uint64_t{0} : 0) : rng();
    const quant_kernels::PhiloxPack pack(seed, bases[i]);
    for (uint32_t j = 0; j < 16; ++j)
      ASSERT_EQ(pack.word(j), philox_random_u32(seed, bases[i] + j)) << "seed=" << seed << " flat0=" << bases[i] << " j=" << j;
  }
}

// The INT8 RNE pack path (clamp, then the 1.5 * 2^23 add) and its clip test, on the host.
TEST(CudaQuantizeNumerics, Int8RoundNearestFastPathMatchesReference) {
  const std::vector<float>& xs = sample_floats();
  int64_t differ = 0;
  for (float v : xs) {
    bool clipped = false;
    const uint32_t want = static_cast<uint32_t>(detail::encode_scaled(v, DType::kI8, 0, Rounding::kNearestEven, 0, &clipped)) & 0xFFu;
    const uint32_t got = quant_kernels::int8_rne_bits(v) & 0xFFu;
    const uint32_t clips = quant_kernels::int8_rne_clips(v);
    if (got != want || (clips != 0) != clipped) {
      if (++differ <= 5)
        ADD_FAILURE() << "x=" << float_text(v) << ": ours " << hex2(got) << " clip " << clips << ", reference " << hex2(want)
                      << " clip " << clipped;
    }
  }
  EXPECT_EQ(differ, 0) << "over " << xs.size() << " values";
}

// The stochastic OCP FP8 pack path: noise added to the float bits, truncated to the FP8 grid, then
// the exact conversion (emulated here by the RNE integer encoder, exact on grid values), for every
// magnitude it covers; the rest take the integer path, which ElementEncodersMatchReference checks.
template <int M>
void check_fp8_stochastic_grid(DType format) {
  const std::vector<float>& xs = sample_floats();
  QuantSpec spec = QuantSpec::per_tensor(format);
  spec.rounding = Rounding::kStochastic;
  spec.seed = kStochasticSeed;
  const quant_kernels::EncodeParams p = quant_kernels::encode_params(spec);
  ASSERT_EQ(p.mantissa_bits, M);
  const uint32_t min_normal = quant_kernels::fp8_min_normal_bits(p);
  int64_t differ = 0, covered = 0;
  std::mt19937 rng(11);
  for (size_t i = 0; i < xs.size(); ++i) {
    const float v = xs[i];
    for (int k = 0; k < 3; ++k) {
      // Random bits, and the extremes (never / always round up).
      const uint32_t bits = k == 0 ? philox_random_u32(spec.seed, i) : (k == 1 ? 0u : 0xFFFFFFFFu) ^ (rng() & 1u);
      if (quant_kernels::fp8_sr_needs_soft(bits_of(v), min_normal)) continue;
      ++covered;
      bool clipped = false;
      const uint32_t want = static_cast<uint32_t>(detail::encode_scaled(v, format, 0, Rounding::kStochastic, bits, &clipped)) & 0xFFu;
      const float grid = float_of(quant_kernels::fp8_sr_grid_bits<M>(bits_of(v), p.max_bits, bits));
      const uint32_t got = quant_kernels::encode_fp8_soft_t<false>(grid, p, 0u);
      if (got != want) {
        if (++differ <= 5)
          ADD_FAILURE() << dtype_name(format) << " x=" << float_text(v) << " bits=" << bits << ": ours " << hex2(got)
                        << " (grid " << float_text(grid) << "), reference " << hex2(want);
      }
    }
  }
  EXPECT_GT(covered, static_cast<int64_t>(xs.size()));
  EXPECT_EQ(differ, 0) << dtype_name(format) << " over " << covered << " values";
}

TEST(CudaQuantizeNumerics, Fp8StochasticGridPathMatchesReference) {
  check_fp8_stochastic_grid<3>(DType::kE4M3);
  check_fp8_stochastic_grid<2>(DType::kE5M2);
}

TEST(CudaQuantizeNumerics, ScaleFromAbsmaxMatchesReference) {
  std::vector<float> absmax = {0.0f, std::numeric_limits<float>::denorm_min(), 1e-38f, 1e-30f, 1e-10f, 1e-6f,
                               1.0f, 448.0f, 57344.0f, 3e38f, std::numeric_limits<float>::max()};
  std::mt19937_64 rng(9);
  for (int i = 0; i < 20000; ++i) absmax.push_back(float_of(static_cast<uint32_t>(rng()) & 0x7F7FFFFFu));
  std::vector<std::function<void(QuantSpec*)>> variants = {
      [](QuantSpec*) {},
      [](QuantSpec* s) { s->backoff = 0.8f; },
      [](QuantSpec* s) { s->backoff = 0.3f; },
      [](QuantSpec* s) { s->backoff = 0.5f; },
      [](QuantSpec* s) { s->min_scale = 0.25f; },
      [](QuantSpec* s) { s->min_scale = 1e-30f; },
      [](QuantSpec* s) { s->scale_rounding = ScaleRounding::kPowerOfTwo; },
      [](QuantSpec* s) {
        s->scale_rounding = ScaleRounding::kPowerOfTwo;
        s->pow2_min_exp = -32;
        s->pow2_max_exp = 31;
        s->backoff = 0.9f;
      },
      [](QuantSpec* s) {
        s->scale_rounding = ScaleRounding::kHardwareSet;
        s->hardware_scales = {1.0f / 256, 1.0f / 16, 1.0f, 16.0f};
      },
      [](QuantSpec* s) { s->method = ScaleMethod::kUnit; },
  };
  for (DType format : kFormats)
    for (const auto& variant : variants) {
      QuantSpec spec = QuantSpec::per_token(format);
      variant(&spec);
      const quant_kernels::ScaleParams p = quant_kernels::scale_params(spec);
      for (float a : absmax) {
        const float want = spec.method == ScaleMethod::kUnit ? 1.0f : round_scale(absmax_scale(a, spec), spec);
        const float got = quant_kernels::scale_from_absmax(a, p);
        ASSERT_EQ(bits_of(got), bits_of(want)) << describe(spec) << " absmax=" << float_text(a) << ": ours "
                                               << float_text(got) << ", reference " << float_text(want);
      }
      // Inf in the block: the reference reports an error; the kernel's scale is +Inf.
      if (spec.method != ScaleMethod::kUnit)
        EXPECT_TRUE(std::isinf(quant_kernels::scale_from_absmax(std::numeric_limits<float>::infinity(), p)));
    }
}

// ---- Host-side pieces of the kernels (no GPU needed).

TEST(CudaQuantizeHost, FastDivmodMatchesDivision) {
  std::mt19937_64 rng(1);
  std::vector<uint32_t> divisors = {1, 2, 3, 5, 7, 8, 16, 17, 100, 128, 255, 256, 257, 4096, 65535, 65536, 65537,
                                    1000003, 0x7FFFFFFFu, 0x80000000u, 0x80000001u, 0xFFFFFFFEu, 0xFFFFFFFFu};
  for (int i = 0; i < 200; ++i) divisors.push_back(static_cast<uint32_t>(rng()) >> (rng() % 32));
  for (uint32_t d : divisors) {
    if (d == 0) continue;
    const quant_kernels::FastDivmod f(d);
    std::vector<uint32_t> ns = {0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, 0xFFFFFFFFu, 0xFFFFFFFEu, 0x80000000u};
    for (int k = 0; k < 2000; ++k) ns.push_back(static_cast<uint32_t>(rng()));
    for (uint32_t n : ns) ASSERT_EQ(f.div(n), n / d) << "n=" << n << " d=" << d;
  }
}

}  // namespace
}  // namespace llmq
