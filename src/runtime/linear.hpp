// One linear layer of the GPU runtime, y[M, N] = x[M, K] * W^T, with its weights on the device and
// the way its input is quantized; plan_linear, which picks the kernel once per step-size class when
// a runtime is made, and run_linear, which runs the planned kernel. The kernels:
//   * decode (M <= 16; W8A8 E4M3 to 8, INT8 to 32 rows, decode_gemm_preferred_max_tokens): llmq's
//     decode GEMM (8-bit weights with per-channel scales, W8A8 per-token or W8A16), cuBLASLt BF16;
//   * prefill: cuBLASLt FP8 (outer-vector per-token x per-channel, or 1x128 x 128x128 blocks),
//     llmq's INT8 GEMM, cuBLASLt BF16;
//   * W8A16 past 16 rows (no cuBLASLt GEMM takes it): the decode GEMM over 16-row chunks, and past
//     kDequantMinRows cuBLASLt BF16 on the codes dequantized to BF16 (dequant_weights.hpp), its FP32
//     sums then scaled per channel and rounded once (scale_columns.hpp);
//   * anything those refuse (K not a multiple of 16, F32 weights): the plain
//     CUDA-core kernel of generic_linear.cu, which computes the same function.
// A QKV or gate/up projection is one GpuLinear whose parts are concatenated along N; parts are one
// tensor whenever their scales allow it (always for per-channel scales, blocks when every part's N
// is a multiple of 128), so that the usual case is one GEMM. No CUDA headers here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llmq/cuda_gemm.hpp"
#include "llmq/cuda_stream.hpp"
#include "llmq/dtype.hpp"
#include "llmq/quant_spec.hpp"
#include "llmq/status.hpp"
#include "cuda/device_memory.hpp"

namespace llmq::runtime {

// Device memory is a CUDA primitive (cuda/device_memory.hpp); the runtime names it unqualified.
using cuda::DeviceAllocation;
using cuda::device_memory_info;
using cuda::format_bytes;

// How a linear's input reaches it.
enum class ActQuant {
  kNone,           // BF16 activations (BF16 / F32 weights, and W8A16)
  kPerToken,       // dynamic, one scale per row, computed by the producing kernel
  kStaticTensor,   // static (calibrated) per-tensor scale; producers write it as a per-row vector
  kDynamicTensor,  // dynamic per-tensor: BF16 from the producer, then cuda_quantize + broadcast
  kBlock1x128,     // dynamic 1 x 128 blocks: BF16 from the producer, then cuda_quantize
};

enum class WeightScale { kNone, kChannel, kBlock128 };

struct LinearPart {
  int64_t n = 0;         // rows of this part (output channels)
  int64_t n_offset = 0;  // first output column it writes
  DType w_dtype = DType::kBF16;  // kF32, kBF16, kE4M3 or kI8
  WeightScale scale_kind = WeightScale::kNone;
  DeviceAllocation w;         // [n, k]
  DeviceAllocation w_scale;   // f32 [n] (kChannel) or [ceil(n/128), ceil(k/128)] (kBlock128)
  DeviceAllocation w_scale_lt;  // kBlock128 in cuBLASLt's order (pack_scales_for_cublaslt)
  // kChannel and every value of w_scale the same (a per-tensor weight, or parts merged under one
  // scale): with per-tensor activations the GEMM may take cuBLASLt's tensor-wide scales.
  bool uniform_scale = false;
};

// Whether a part's per-channel scales are one value repeated (LinearPart::uniform_scale).
inline bool one_scale(const std::vector<float>& scales) {
  for (float s : scales)
    if (s != scales.front()) return false;
  return !scales.empty();
}

struct GpuLinear {
  std::string name;  // "layers.3.qkv"
  int64_t n = 0;
  int64_t k = 0;
  ActQuant act = ActQuant::kNone;
  DType act_dtype = DType::kBF16;  // the codes' format when act != kNone (kE4M3 or kI8)
  QuantSpec act_spec;              // the scheme's activation spec (for cuda_quantize)
  float static_scale = 0.0f;       // kStaticTensor
  std::vector<LinearPart> parts;
  int64_t bytes() const;
};

// An activation as the consumer wants it. bf16 when act == kNone (or as the source of a separate
// quantize); codes + scales otherwise: scales f32 [rows] (per-token, static and dynamic tensor
// after broadcast) or [rows, ceil(k/128)] (1x128).
struct LinearInput {
  const uint16_t* bf16 = nullptr;
  const void* codes = nullptr;
  const float* scales = nullptr;
};

// What run_linear needs beyond the operands; the runtime owns all of it.
struct LinearContext {
  CudaGemmRunner* gemm = nullptr;
  void* workspace = nullptr;  // cuBLASLt workspace + converted scales
  int64_t workspace_bytes = 0;
  CudaStream stream = nullptr;
  // Scratch of kDequantBf16 (one part's codes in BF16, then FP32 sums of a row chunk):
  // dequant_scratch_bytes of the plans.
  void* dequant = nullptr;
  int64_t dequant_bytes = 0;
  int sm_major = 9;
  int sm_minor = 0;
};

enum class LinearOut { kBF16, kF32 };

enum class LinearPath {
  kDecodeGemm,
  kDecodeGemmChunks,  // the decode GEMM over chunks of rows, where only the CUDA-core kernel would take M
  kDequantBf16,       // W8A16 at prefill sizes: cuBLASLt BF16 on the dequantized codes (chunks to kDequantMinRows)
  kCublasFp8Outer,
  kCublasFp8Tensor,
  kCublasFp8Block,
  kCublasBf16,
  kInt8Gemm,
  kGeneric
};

// The kernel of each part of a linear, for the two step sizes a runtime runs: decode-sized steps
// (M <= small_max_rows: as far as the decode GEMM is preferred for the linear's operands,
// decode_gemm_preferred_max_tokens) and larger ones up to max_rows. Each class is planned at its
// largest M: every kernel's can_implement condition on M is an upper bound (extents, tile counts)
// or holds for every M of the class (the decode GEMM's token bound; block scales' M % 4, met by
// padded rows), so the plan holds for every M of the class. One path chooses its kernel by M
// inside the class: kDequantBf16 (W8A16), planned at the largest M, runs the decode GEMM's chunks
// up to kDequantMinRows rows and the dequantized BF16 GEMM above (linear.cu). The output's type
// and row stride are part of the plan.
struct LinearPlan {
  LinearOut y_type = LinearOut::kBF16;
  int64_t ldy = 0;
  int64_t max_rows = 0;
  int64_t small_max_rows = 0;
  std::vector<LinearPath> small;  // per part: M <= small_max_rows
  std::vector<LinearPath> large;  // per part: small_max_rows < M <= max_rows
};
LinearPlan plan_linear(const GpuLinear& linear, int64_t max_rows, LinearOut y_type, int64_t ldy, const LinearContext& ctx);

// y[m, part columns] for every part, by the plan's kernels; y has the plan's row stride. M may be 0.
Status run_linear(const GpuLinear& linear, const LinearPlan& plan, const LinearInput& x, int64_t m, void* y,
                  const LinearContext& ctx);

// Bytes of BF16 scratch the plan's kDequantBf16 parts need (the largest part's weights), or 0; and
// the most any plan of this linear up to max_rows could need (for sizing memory before planning).
int64_t dequant_scratch_bytes(const GpuLinear& linear, const LinearPlan& plan);
int64_t dequant_scratch_bound(const GpuLinear& linear, int64_t max_rows, LinearOut y_type);

// The kernels the plan runs at M rows, e.g. "decode-gemm e4m3/e4m3" (for reports).
std::string linear_path(const GpuLinear& linear, const LinearPlan& plan, int64_t m);

// Rows the activation buffers of this linear must have for M rows (cuBLASLt block scales need
// M % 4 == 0, so they are padded).
int64_t padded_rows(const GpuLinear& linear, int64_t m);

// The plain kernel (generic_linear.cu): every combination above, any shape, one warp per output.
struct GenericLinearArgs {
  int64_t m = 0, n = 0, k = 0;
  DType a_dtype = DType::kBF16;  // kBF16, kE4M3 or kI8
  const void* a = nullptr;
  const float* a_scale = nullptr;  // [m] or [m, ceil(k/128)] (a_block)
  bool a_block = false;
  DType w_dtype = DType::kBF16;    // kF32, kBF16, kE4M3, kI8
  const void* w = nullptr;
  const float* w_scale = nullptr;  // [n] or [ceil(n/128), ceil(k/128)] (w_block); null for F32/BF16
  bool w_block = false;
  void* y = nullptr;
  bool y_f32 = false;
  int64_t ldy = 0;
};
Status generic_linear(const GenericLinearArgs& args, CudaStream stream);

}  // namespace llmq::runtime
