// QuantSpec: everything that says how a tensor is quantized: the format, the granularity of the
// scales, how the scales are chosen, and whether they are static (calibrated) or dynamic.
//
// Tensors are matrices [rows, cols]. For activations X [tokens, K] a row is a token; for weights
// W [N, K] (nn.Linear layout, out x in) a row is an output channel and a column an input channel.
// Every granularity is a block shape (block_rows x block_cols) over that matrix; scales form a
// float32 matrix [ceil(rows / block_rows), ceil(cols / block_cols)]. Edge blocks may be partial.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llmq/dtype.hpp"
#include "llmq/format.hpp"
#include "llmq/status.hpp"

namespace llmq {

enum class Granularity {
  kPerTensor,        // one scale
  kPerToken,         // one per row (activations); block 1 x cols
  kPerChannel,       // one per output channel = row of W [N, K]; block 1 x cols
  kPerInputChannel,  // one per column; block rows x 1
  kPerBlock,         // block_rows x block_cols (1 x 128, 128 x 128, ...), partial edge blocks
  kPerGroup,         // 1 x group_size along K; cols must be a multiple of group_size
};

enum class ScaleMethod {
  kAbsmax,     // s = absmax / (backoff * r_q), floored at min_scale
  kUnit,       // s = 1 (values beyond r_q saturate)
  kMseSearch,  // argmin_{s in S} || x - s Q(x / s) ||^2 over a candidate set (FP8 paper eq. 22-25)
};

// What a computed scale is rounded to (applied after the method, before use).
enum class ScaleRounding {
  kNone,
  kPowerOfTwo,   // s = 2^ceil(log2 s), then clamped to [2^pow2_min_exp, 2^pow2_max_exp]
  kHardwareSet,  // smallest member of hardware_scales >= s (the largest member if none is)
};

// Candidate sets for kMseSearch.
enum class CandidateSet {
  kGrid,         // absmax scale x {1, 1 - 1/n, ..., grid_min} (n = grid_points) plus explicit ones
  kPowerOfTwo,   // 2^e for e in [ceil(log2 s_absmax) - pow2_search_below, ceil(log2 s_absmax)]
  kHardwareSet,  // every member of hardware_scales
};

enum class ScaleSource { kDynamic, kStatic };

struct QuantSpec {
  DType format = DType::kE4M3;
  Granularity granularity = Granularity::kPerTensor;
  int64_t block_rows = 128;  // kPerBlock
  int64_t block_cols = 128;  // kPerBlock
  int64_t group_size = 128;  // kPerGroup

  ScaleMethod method = ScaleMethod::kAbsmax;
  float backoff = 1.0f;       // beta in (0, 1]: headroom, s = absmax / (beta r_q)
  float min_scale = 0.0f;     // floor for all-zero blocks; 0 means the default 1 / (r_q * 512)
  ScaleRounding scale_rounding = ScaleRounding::kNone;
  int pow2_min_exp = -126;    // range of power-of-two scales (Gaudi 3: -32 .. 31)
  int pow2_max_exp = 127;
  std::vector<float> hardware_scales;  // e.g. {2^-8, 2^-4, 2^0, 2^4} (Gaudi 2)

  CandidateSet candidates = CandidateSet::kGrid;
  int grid_points = 100;
  float grid_min = 0.2f;
  int pow2_search_below = 8;
  std::vector<float> explicit_candidates;  // added to kGrid as absolute scales

  bool symmetric = true;  // false: integer formats get a zero point per block (asymmetric)
  ScaleSource source = ScaleSource::kDynamic;
  Rounding rounding = Rounding::kNearestEven;
  uint64_t seed = 0;  // stochastic rounding: Philox key; the counter is the flat element index

  // Convenience constructors for the common schemes.
  static QuantSpec per_tensor(DType format);
  static QuantSpec per_token(DType format);
  static QuantSpec per_channel(DType format);
  static QuantSpec per_block(DType format, int64_t block_rows, int64_t block_cols);
  static QuantSpec per_group(DType format, int64_t group_size);
};

// The block shape a spec implies for a [rows, cols] matrix, after validating the spec.
struct BlockShape {
  int64_t rows = 1;
  int64_t cols = 1;
};
Status resolve_block_shape(const QuantSpec& spec, int64_t rows, int64_t cols, BlockShape* out);
Status validate_spec(const QuantSpec& spec);
// Default MIN_SCALE: 1 / (r_q * 512), as vLLM uses for per-token FP8.
float effective_min_scale(const QuantSpec& spec);
std::string describe(const QuantSpec& spec);  // "e4m3 per-token absmax dynamic"
const char* granularity_name(Granularity g);
const char* scale_method_name(ScaleMethod m);

}  // namespace llmq
