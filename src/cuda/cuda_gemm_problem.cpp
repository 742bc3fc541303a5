// Host-side half of the cuBLASLt GEMM (include/llmq/cuda_gemm.hpp): problem validation with the
// reason a problem cannot run, and the scale-tensor layouts. Plain C++, built with or without CUDA
// so that it is tested on machines without a GPU; without CUDA it also holds the runner's stubs.
//
// The rules below come from the cuBLAS 13 documentation of cublasLtMatmul:
//  * FP8 kernels: compute type 32F, "TN" layout (our row-major A and B are exactly that), A/B types
//    E4M3 x E4M3, E4M3 x E5M2 or E5M2 x E4M3 (never E5M2 x E5M2), D = BF16 / FP16 / FP32, and
//    "pointers and matrix dimensions must support 16-byte alignment".
//  * Bias: BF16 for every FP8 case (also FP32 output); the C type for BF16 operands.
//  * Scaling modes (3.1.4): tensor-wide on sm_89+; outer-vector (both operands), 128-element 1D
//    and 128x128 2D blocks on sm_90 only, blocks as 1D x 1D, 1D x 2D or 2D x 1D but not 2D x 2D;
//    block scales must start 16-byte aligned and "M and N must be multiples of 4".
//  * No attribute gives scale tensors a batch stride, so batch > 1 keeps tensor-wide scales.
#include "llmq/cuda_gemm.hpp"
#include "llmq/device.hpp"
#include "core/int_math.hpp"

#include <cstring>
#include <limits>

namespace llmq {
namespace {

constexpr int64_t kAlignBytes = 16;


bool is_block(GemmScaleMode mode) {
  return mode == GemmScaleMode::kBlock1x128 || mode == GemmScaleMode::kBlock128x128;
}

bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

int64_t element_bytes(DType d) { return dtype_storage_bytes(d, 1); }

std::string operand_text(const CudaGemmInput& x) {
  std::string t = dtype_name(x.dtype);
  if (is_fp8(x.dtype)) t += std::string("/") + gemm_scale_mode_name(x.scale_mode);
  if (x.shared_across_batch) t += "/shared";
  return t;
}

// Row stride, batch stride and pointer checks of one input [rows, K].
Status check_input(const CudaGemmInput& x, const char* name, int64_t rows, int64_t k, int64_t batch) {
  const std::string who(name);
  const int64_t eb = element_bytes(x.dtype);
  const int64_t ld = x.row_stride == 0 ? k : x.row_stride;
  if (ld < k)
    return invalid_argument(who + ".row_stride " + std::to_string(ld) + " is less than K = " +
                            std::to_string(k));
  if ((ld * eb) % kAlignBytes != 0)
    return invalid_argument(who + ".row_stride: " + std::to_string(ld) + " elements of " +
                            dtype_name(x.dtype) + " is not a multiple of 16 bytes (cuBLASLt " +
                            "needs 16-byte aligned rows)");
  if (batch > 1 && !x.shared_across_batch) {
    const int64_t bs = x.batch_stride == 0 ? rows * ld : x.batch_stride;
    if (bs < 0 || (bs * eb) % kAlignBytes != 0)
      return invalid_argument(who + ".batch_stride " + std::to_string(bs) +
                              " must be non-negative and a multiple of 16 bytes");
  }
  if (x.data != nullptr && !aligned(x.data, kAlignBytes))
    return invalid_argument(who + ".data is not 16-byte aligned");
  return {};
}

Status check_scales(const CudaGemmInput& x, const char* name) {
  const std::string who(name);
  if (!is_fp8(x.dtype)) {
    if (x.scales != nullptr || x.scale_mode != GemmScaleMode::kTensor)
      return invalid_argument(who + ": " + dtype_name(x.dtype) +
                              " operands take no scales (leave scale_mode kTensor and scales null)");
    return {};
  }
  if (x.scale_mode != GemmScaleMode::kTensor && x.scales == nullptr)
    return invalid_argument(who + ".scales: " + gemm_scale_mode_name(x.scale_mode) +
                            " scales need a device pointer");
  if (x.scales != nullptr) {
    // cuBLASLt reads block scales with 16-byte loads; single floats need only their own alignment.
    const int64_t need = is_block(x.scale_mode) ? kAlignBytes : 4;
    if (!aligned(x.scales, need))
      return invalid_argument(who + ".scales is not " + std::to_string(need) + "-byte aligned");
  }
  return {};
}

// Which (a, b) scale-mode pairs cuBLASLt documents, with the device they need.
Status check_scale_modes(const CudaGemmProblem& p, int sm_major) {
  const GemmScaleMode sa = p.a.scale_mode, sb = p.b.scale_mode;
  if (sa == GemmScaleMode::kTensor && sb == GemmScaleMode::kTensor) return {};
  const std::string pair = std::string("a ") + gemm_scale_mode_name(sa) + " x b " +
                           gemm_scale_mode_name(sb);
  const bool outer = sa == GemmScaleMode::kOuterVector && sb == GemmScaleMode::kOuterVector;
  const bool blocks = is_block(sa) && is_block(sb);
  if (!outer && !blocks)
    return unsupported("scale modes " + pair +
                       ": cuBLASLt combines tensor x tensor, outer-vector x outer-vector, or "
                       "128-element blocks (1x128 / 128x128) on both operands");
  if (sa == GemmScaleMode::kBlock128x128 && sb == GemmScaleMode::kBlock128x128)
    return unsupported("scale modes " + pair +
                       ": cuBLASLt does not support 128x128 blocks on both operands (use 1x128 "
                       "activations with 128x128 weights)");
  if (sm_major != 9)
    return unsupported("scale modes " + pair + ": cuBLASLt implements outer-vector and "
                       "128-element block FP32 scales on sm_90 only, device is sm_" +
                       std::to_string(sm_major) + "x");
  if (p.batch > 1)
    return unsupported("scale modes " + pair + " with batch " + std::to_string(p.batch) +
                       ": cuBLASLt has no batch stride for scale tensors, so a strided batch "
                       "takes per-tensor scales shared by every entry");
  if (blocks && p.m % 4 != 0)
    return unsupported("scale modes " + pair + ": cuBLASLt block scaling needs M and N to be "
                       "multiples of 4, M = " + std::to_string(p.m));
  return {};
}

}  // namespace

const char* gemm_scale_mode_name(GemmScaleMode mode) {
  switch (mode) {
    case GemmScaleMode::kTensor: return "tensor";
    case GemmScaleMode::kOuterVector: return "outer-vector";
    case GemmScaleMode::kBlock1x128: return "1x128";
    case GemmScaleMode::kBlock128x128: return "128x128";
  }
  return "?";
}

DType required_bias_dtype(const CudaGemmProblem& p) {
  return is_fp8(p.a.dtype) ? DType::kBF16 : p.d_dtype;
}

std::string describe(const CudaGemmProblem& p) {
  std::string t = is_fp8(p.a.dtype) ? "fp8 gemm" : std::string(dtype_name(p.a.dtype)) + " gemm";
  t += " M=" + std::to_string(p.m) + " N=" + std::to_string(p.n) + " K=" + std::to_string(p.k);
  t += " batch=" + std::to_string(p.batch) + " a=" + operand_text(p.a) + " b=" + operand_text(p.b);
  t += std::string(" out=") + dtype_name(p.d_dtype);
  if (p.bias != nullptr) t += std::string(" bias=") + dtype_name(p.bias_dtype);
  return t;
}

Status cuda_gemm_can_implement(const CudaGemmProblem& p, int sm_major, int sm_minor) {
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.batch <= 0)
    return invalid_argument("M, N, K and batch must be positive, got M=" + std::to_string(p.m) +
                            " N=" + std::to_string(p.n) + " K=" + std::to_string(p.k) +
                            " batch=" + std::to_string(p.batch));
  if (p.batch > std::numeric_limits<int32_t>::max())
    return invalid_argument("batch " + std::to_string(p.batch) + " exceeds cuBLASLt's int32 count");

  // Operand types.
  const DType ta = p.a.dtype, tb = p.b.dtype;
  const bool fp8 = is_fp8(ta) || is_fp8(tb);
  if (fp8) {
    const bool a_ok = ta == DType::kE4M3 || ta == DType::kE5M2;
    const bool b_ok = tb == DType::kE4M3 || tb == DType::kE5M2;
    if (!a_ok || !b_ok)
      return unsupported(std::string("operands ") + dtype_name(ta) + " x " + dtype_name(tb) +
                         ": cuBLASLt FP8 takes OCP e4m3 and e5m2 on both sides (no fnuz, IEEE-like "
                         "e4m3 or mixed FP8 x high precision)");
    if (ta == DType::kE5M2 && tb == DType::kE5M2)
      return unsupported("operands e5m2 x e5m2: cuBLASLt FP8 needs e4m3 on at least one side");
    if (!compute_capability_has_fp8(sm_major, sm_minor))
      return unsupported("FP8 GEMM needs FP8 tensor cores (sm_89 or newer), device is sm_" +
                         std::to_string(sm_major) + std::to_string(sm_minor));
  } else if (ta != DType::kBF16 || tb != DType::kBF16) {
    return unsupported(std::string("operands ") + dtype_name(ta) + " x " + dtype_name(tb) +
                       ": the cuBLASLt runner takes FP8 (e4m3 / e5m2) or bf16 x bf16");
  }
  if (p.d_dtype != DType::kBF16 && p.d_dtype != DType::kF32)
    return unsupported(std::string("out: ") + dtype_name(p.d_dtype) +
                       " output; the runner writes bf16 or f32");

  // Shapes. K is the contiguous extent of both inputs and N that of the output; cuBLASLt's FP8
  // kernels want every dimension 16-byte aligned, and N is also the FP8 operand B's column count.
  const int64_t eb = element_bytes(ta);
  const int64_t k_multiple = kAlignBytes / eb;  // 16 for FP8, 8 for BF16
  if (p.k % k_multiple != 0)
    return unsupported("K = " + std::to_string(p.k) + " is not a multiple of " +
                       std::to_string(k_multiple) + " (cuBLASLt needs 16-byte aligned rows of " +
                       dtype_name(ta) + ")");
  const int64_t n_multiple = fp8 ? 16 : kAlignBytes / element_bytes(p.d_dtype);
  if (p.n % n_multiple != 0)
    return unsupported("N = " + std::to_string(p.n) + " is not a multiple of " +
                       std::to_string(n_multiple) + " (cuBLASLt needs 16-byte aligned " +
                       (fp8 ? "FP8 dimensions" : "output rows") + ")");

  LLMQ_RETURN_IF_ERROR(check_input(p.a, "a", p.m, p.k, p.batch));
  LLMQ_RETURN_IF_ERROR(check_input(p.b, "b", p.n, p.k, p.batch));
  LLMQ_RETURN_IF_ERROR(check_scales(p.a, "a"));
  LLMQ_RETURN_IF_ERROR(check_scales(p.b, "b"));
  if (fp8) LLMQ_RETURN_IF_ERROR(check_scale_modes(p, sm_major));

  // Output.
  const int64_t db = element_bytes(p.d_dtype);
  const int64_t ldd = p.d_row_stride == 0 ? p.n : p.d_row_stride;
  if (ldd < p.n)
    return invalid_argument("d_row_stride " + std::to_string(ldd) + " is less than N = " +
                            std::to_string(p.n));
  if ((ldd * db) % kAlignBytes != 0)
    return invalid_argument("d_row_stride " + std::to_string(ldd) + " is not a multiple of 16 bytes");
  if (p.batch > 1) {
    const int64_t bs = p.d_batch_stride == 0 ? p.m * ldd : p.d_batch_stride;
    if ((bs * db) % kAlignBytes != 0 || bs < p.m * ldd)
      return invalid_argument("d_batch_stride " + std::to_string(bs) +
                              " must cover M rows and be a multiple of 16 bytes");
  }
  if (p.d != nullptr && !aligned(p.d, kAlignBytes))
    return invalid_argument("d is not 16-byte aligned");

  // Bias.
  if (p.bias != nullptr) {
    const DType want = required_bias_dtype(p);
    if (p.bias_dtype != want)
      return unsupported(std::string("bias: cuBLASLt takes a ") + dtype_name(want) + " bias for " +
                         dtype_name(ta) + " operands with " + dtype_name(p.d_dtype) +
                         " output, got " + dtype_name(p.bias_dtype));
    if (!aligned(p.bias, kAlignBytes)) return invalid_argument("bias is not 16-byte aligned");
    if (p.batch > 1 && (p.bias_batch_stride * element_bytes(p.bias_dtype)) % kAlignBytes != 0)
      return invalid_argument("bias_batch_stride " + std::to_string(p.bias_batch_stride) +
                              " is not a multiple of 16 bytes");
  }
  return {};
}

int64_t row_major_scale_count(GemmScaleMode mode, int64_t rows, int64_t k) {
  const int64_t blocks = ceil_div(k, 128);
  switch (mode) {
    case GemmScaleMode::kTensor: return 1;
    case GemmScaleMode::kOuterVector: return rows;
    case GemmScaleMode::kBlock1x128: return rows * blocks;
    case GemmScaleMode::kBlock128x128: return ceil_div(rows, 128) * blocks;
  }
  return 0;
}

int64_t cublaslt_scale_count(GemmScaleMode mode, int64_t rows, int64_t k) {
  if (mode == GemmScaleMode::kBlock128x128) return ceil_div(rows, 128) * round_up(ceil_div(k, 128), 4);
  return row_major_scale_count(mode, rows, k);
}

Status pack_scales_for_cublaslt(GemmScaleMode mode, int64_t rows, int64_t k, const float* row_major,
                                float* cublaslt) {
  if (rows <= 0 || k <= 0) return invalid_argument("scales: rows and K must be positive");
  if (row_major == nullptr || cublaslt == nullptr) return invalid_argument("scales: null pointer");
  const int64_t blocks = ceil_div(k, 128);
  switch (mode) {
    case GemmScaleMode::kTensor:
    case GemmScaleMode::kOuterVector:
      std::memcpy(cublaslt, row_major, sizeof(float) * static_cast<size_t>(row_major_scale_count(mode, rows, k)));
      return {};
    case GemmScaleMode::kBlock1x128:  // [rows, L] -> outer-major: (r, kb) at kb * rows + r
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t kb = 0; kb < blocks; ++kb) cublaslt[kb * rows + r] = row_major[r * blocks + kb];
      return {};
    case GemmScaleMode::kBlock128x128: {  // [RB, L] -> K-major with stride L4
      const int64_t row_blocks = ceil_div(rows, 128), blocks4 = round_up(blocks, 4);
      for (int64_t rb = 0; rb < row_blocks; ++rb)
        for (int64_t kb = 0; kb < blocks4; ++kb)
          cublaslt[rb * blocks4 + kb] = kb < blocks ? row_major[rb * blocks + kb] : 0.0f;
      return {};
    }
  }
  return invalid_argument("scales: unknown scale mode");
}

}  // namespace llmq
