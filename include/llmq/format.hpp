// Element conversions: float32 / BF16 -> FP8, INT8, INT4, BF16, FP16 and back. This file is the
// specification every kernel is checked against bit for bit.
//
// Rules (identical for every floating-point target):
//  * Round to nearest, ties to even (RNE), on the exact input value; or stochastic rounding, where
//    a value between neighbours lo < x < hi rounds up with probability (x - lo) / (hi - lo),
//    decided by 32 random bits (round up iff bits < floor(frac * 2^32)). A value on the grid is
//    never moved. Stochastic rounding is unbiased to 2^-32 of an ulp.
//  * Saturating ("satfinite"): a magnitude above the largest finite value, Inf included, becomes
//    +-max. NaN stays NaN. This is PTX cvt.satfinite and what llmq's quantizers use.
//  * Non-saturating: a value whose rounded magnitude exceeds max becomes Inf where the format has
//    Inf (E5M2, IEEE-like E4M3, FP16, BF16) and NaN where it has none (E4M3, the fnuz formats).
//    For E4M3 that is anything above 464, the midpoint to the would-be 480 (464 ties to 448).
//  * NaN input gives the format's NaN: 0x7F for E4M3 / E5M2 / IEEE-like E4M3 whatever the sign
//    (what Hopper's cvt instruction and cuda_fp8.h write; PyTorch's scalar path keeps the sign,
//    so -NaN is the one input where the two oracles disagree), 0x80 for the fnuz formats, 0x7FC0
//    for BF16 and 0x7E00 | sign for FP16. Overflow to NaN (non-saturating E4M3) keeps the sign.
//  * fnuz formats have no negative zero: -0 and negative values that round to zero give 0x00.
//  * Integers: RNE (or stochastic) to an integer, then clamp to [qmin, qmax]. NaN gives 0 (an
//    integer has no NaN; llmq documents and tests this choice); +-Inf clamps to qmax / qmin.
#pragma once

#include <cstdint>

#include "llmq/dtype.hpp"

namespace llmq {

enum class Rounding { kNearestEven, kStochastic };
enum class Saturation { kSatFinite, kNonSaturating };

struct ConvertOptions {
  Rounding rounding = Rounding::kNearestEven;
  Saturation saturation = Saturation::kSatFinite;
};

// ---- floating-point targets (FP8 formats, BF16, FP16). `random_bits` is read only when
// ---- rounding == kStochastic.
uint32_t encode_float(float x, DType target, ConvertOptions options = {}, uint32_t random_bits = 0);
float decode_float(uint32_t code, DType source);  // every code of every float format

inline uint8_t float_to_fp8(float x, DType target, ConvertOptions options = {},
                            uint32_t random_bits = 0) {
  return static_cast<uint8_t>(encode_float(x, target, options, random_bits));
}
inline float fp8_to_float(uint8_t code, DType source) { return decode_float(code, source); }

// BF16 <-> float32 by bit pattern (RNE, NaN -> 0x7FC0).
uint16_t float_to_bf16_bits(float x);
float bf16_bits_to_float(uint16_t bits);
uint16_t float_to_fp16_bits(float x);
float fp16_bits_to_float(uint16_t bits);

// ---- integer targets. Returns the clamped integer; `clipped` (optional) is set when the rounded
// ---- value was outside [qmin, qmax].
int32_t encode_int(float x, DType target, Rounding rounding = Rounding::kNearestEven,
                   uint32_t random_bits = 0, bool* clipped = nullptr);

// INT4 packing: element i lives in byte i / 2, the low nibble for even i.
inline uint8_t pack_int4(int32_t even, int32_t odd) {
  return static_cast<uint8_t>((static_cast<uint32_t>(even) & 0xFu) |
                              ((static_cast<uint32_t>(odd) & 0xFu) << 4));
}
inline int32_t unpack_int4(uint8_t byte, int which) {
  const int32_t nibble = (which == 0) ? (byte & 0xF) : (byte >> 4);
  return nibble >= 8 ? nibble - 16 : nibble;
}

// Would x clip: does round-to-nearest carry it past the largest finite value (integers: outside
// [qmin, qmax])? Inf clips; NaN does not. Used to count saturated elements.
bool exceeds_range(float x, DType target);

// Counter-based random numbers for stochastic rounding: Philox4x32-10 keyed by `seed`, counter =
// element index. Same seed and index -> same bits on the CPU and the GPU, in any order.
uint32_t philox_random_u32(uint64_t seed, uint64_t index);

}  // namespace llmq
