// CPU reference of the scaled 8-bit GEMM (include/llmq/gemm.hpp): C[M, N] = A[M, K] * B[N, K]^T
// (+ bias[N]). Scalar, single-threaded and deterministic; the CUDA kernels are checked against it.
//
// Two paths, chosen by the operands:
//  * W8A8 (both quantized, both FP8 or both integer). K is cut into segments at the union of the
//    two operands' scale-block boundaries along K, so that both scales are constant on each
//    segment. Within a segment the raw codes are multiplied and summed, ascending k:
//      FP8:     decoded codes, products and sum in float32 (a product of two FP8 values is exact
//               in float32; the sum is rounded at each step, as an FP32-accumulating MMA does).
//      integer: (qa - zpa) * (qb - zpb) summed exactly (in int64; see below).
//    Then acc += float(segment_sum) * (scale_a * scale_b), the combined descale formed in float32
//    first (Figure 3 of the FP8 paper), two roundings and no FMA.
//  * Anything with a dense operand (W8A16, W16A8, dense x dense). Each quantized element is
//    dequantized on its own in float32, w = float(decode(q) - zp) * scale, never rounded to the
//    dense operand's dtype; the product a * w is rounded to float32 and summed in float32,
//    ascending k, over the whole of K.
// Bias (float32) is added to the float32 accumulator last; a BF16 output is rounded once (RNE).
//
// Integer segments are summed in int64 so that asymmetric zero points, where |q - zp| reaches
// 255, cannot overflow. For symmetric operands the result equals the INT32 hardware sum exactly,
// because a segment is at most kMaxInt8SegmentK long; gemm_can_implement enforces that bound for
// every integer x integer problem (INT4 included, conservatively).
#include "llmq/gemm.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "core/element.hpp"
#include "llmq/format.hpp"
#include "core/int_math.hpp"

namespace llmq {
namespace {

// What the GEMM needs to know about one operand after validation.
struct OperandInfo {
  const char* name = "";
  const QuantizedTensor* q = nullptr;  // null for a dense operand
  MatrixView dense;                    // dense operand only
  DType dtype = DType::kF32;           // the quantized format or the dense dtype
  int64_t rows = 0;
  int64_t cols = 0;                    // K
  BlockShape block;                    // scale block; a dense operand is one block
  int64_t scale_cols = 0;
  const float* scales = nullptr;       // [ceil(rows / block.rows), scale_cols]
  const int32_t* zero_points = nullptr;  // same shape, or null when symmetric

  bool quantized() const { return q != nullptr; }
  bool integer() const { return quantized() && !is_fp8(dtype); }
  // Scale-block extent along K; a dense operand never splits K.
  int64_t k_block() const { return quantized() ? block.cols : std::max<int64_t>(cols, 1); }
};

struct GemmPlan {
  OperandInfo a;
  OperandInfo b;
  MatrixView out;
};

std::string shape_text(int64_t rows, int64_t cols) {
  return "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
}


Status inspect_quantized(const QuantizedTensor& q, const char* name, OperandInfo* info) {
  const std::string who(name);
  const DType format = q.data.dtype();
  if (!is_quantized(format))
    return invalid_argument(who + ": data dtype " + dtype_name(format) +
                            " is not a quantized format");
  if (format != q.spec.format)
    return invalid_argument(who + ": data dtype " + dtype_name(format) +
                            " does not match spec.format " + dtype_name(q.spec.format));
  const std::vector<int64_t>& shape = q.data.shape();
  if (shape.size() != 2 || shape[0] < 0 || shape[1] < 0)
    return invalid_argument(who + ": data must be a 2-D [rows, cols] tensor");
  const int64_t rows = shape[0], cols = shape[1];
  if (q.rows != rows || q.cols != cols)
    return invalid_argument(who + ": rows/cols " + shape_text(q.rows, q.cols) +
                            " disagree with the data shape " + shape_text(rows, cols));
  if (format == DType::kI4 && cols % 2 != 0)
    return invalid_argument(who + ": int4 packs two values per byte, so cols must be even, got " +
                            std::to_string(cols));
  if (q.data.nbytes() != dtype_storage_bytes(format, rows * cols))
    return invalid_argument(who + ": data holds " + std::to_string(q.data.nbytes()) +
                            " bytes, expected " +
                            std::to_string(dtype_storage_bytes(format, rows * cols)));
  if (rows * cols > 0 && q.data.data() == nullptr)
    return invalid_argument(who + ": data pointer is null");

  const ScaleSet& s = q.scales;
  if (s.block.rows <= 0 || s.block.cols <= 0)
    return invalid_argument(who + ": scale block " + shape_text(s.block.rows, s.block.cols) +
                            " must be positive");
  info->scale_cols = 0;
  if (rows > 0 && cols > 0) {
    const int64_t want_rows = ceil_div(rows, s.block.rows);
    const int64_t want_cols = ceil_div(cols, s.block.cols);
    if (s.scales.dtype() != DType::kF32 || s.scales.shape().size() != 2 ||
        s.scale_rows() != want_rows || s.scale_cols() != want_cols)
      return invalid_argument(who + ": scales must be float32 " + shape_text(want_rows, want_cols) +
                              " for " + shape_text(rows, cols) + " in blocks of " +
                              shape_text(s.block.rows, s.block.cols) + ", got " +
                              s.scales.view().describe());
    // A ScaleSet is "symmetric" when it holds no zero-point bytes (a default Tensor).
    if (s.zero_points.nbytes() != 0) {
      if (is_fp8(format))
        return invalid_argument(who + ": FP8 tensors have no zero points");
      if (s.zero_points.dtype() != DType::kI32 || s.zero_points.shape() != s.scales.shape())
        return invalid_argument(who + ": zero_points must be int32 with the scales' shape " +
                                shape_text(want_rows, want_cols) + ", got " +
                                s.zero_points.view().describe());
      info->zero_points = s.zero_points.data_as<int32_t>();
    }
    info->scales = s.scales.data_as<float>();
    info->scale_cols = want_cols;
  }
  info->name = name;
  info->q = &q;
  info->dtype = format;
  info->rows = rows;
  info->cols = cols;
  info->block = s.block;
  return {};
}

Status inspect_operand(const GemmOperand& op, const char* name, OperandInfo* info) {
  *info = OperandInfo{};
  if (op.quantized != nullptr) return inspect_quantized(*op.quantized, name, info);
  MatrixView m;
  LLMQ_RETURN_IF_ERROR(as_matrix(op.dense, name, &m));
  if (!is_high_precision(m.dtype))
    return invalid_argument(std::string(name) + ": a dense operand must be f32, f64, bf16 or f16, got " +
                            op.dense.describe() + " (pass a QuantizedTensor for quantized data)");
  info->name = name;
  info->dense = m;
  info->dtype = m.dtype;
  info->rows = m.rows;
  info->cols = m.cols;
  info->block = {std::max<int64_t>(m.rows, 1), std::max<int64_t>(m.cols, 1)};
  return {};
}

Status plan_gemm(const GemmOperand& a, const GemmOperand& b, const TensorView& out, GemmPlan* plan) {
  LLMQ_RETURN_IF_ERROR(inspect_operand(a, "a", &plan->a));
  LLMQ_RETURN_IF_ERROR(inspect_operand(b, "b", &plan->b));
  const OperandInfo& pa = plan->a;
  const OperandInfo& pb = plan->b;
  if (pa.cols != pb.cols)
    return invalid_argument("b: K mismatch: b is [N, K] = " + shape_text(pb.rows, pb.cols) +
                            " but a is [M, K] = " + shape_text(pa.rows, pa.cols));
  if (pa.quantized() && pb.quantized() && is_fp8(pa.dtype) != is_fp8(pb.dtype))
    return invalid_argument(std::string("b: cannot multiply ") + dtype_name(pb.dtype) + " b with " +
                            dtype_name(pa.dtype) +
                            " a: W8A8 needs both operands FP8 or both integer");
  if (pa.integer() && pb.integer()) {
    // The longest segment is the first: it ends at the nearer of the two block boundaries.
    const int64_t longest = std::min({pa.cols, pa.k_block(), pb.k_block()});
    if (longest > kMaxInt8SegmentK)
      return unsupported("b: integer segments of " + std::to_string(longest) +
                         " along K exceed kMaxInt8SegmentK = " + std::to_string(kMaxInt8SegmentK) +
                         " (an INT32 accumulator could overflow); quantize a and b with scale "
                         "blocks no longer than that along K");
  }
  LLMQ_RETURN_IF_ERROR(as_matrix(out, "out", &plan->out));
  if (out.dtype != DType::kF32 && out.dtype != DType::kBF16)
    return invalid_argument("out: dtype must be f32 or bf16, got " + out.describe());
  if (plan->out.rows != pa.rows || plan->out.cols != pb.rows)
    return invalid_argument("out: expected [M, N] = " + shape_text(pa.rows, pb.rows) + ", got " +
                            out.describe());
  return {};
}

// The stored code of element (r, c): FP8 bit pattern or the signed integer.
int32_t stored_code(const QuantizedTensor& q, int64_t r, int64_t c) {
  const int64_t i = r * q.cols + c;
  const uint8_t* bytes = static_cast<const uint8_t*>(q.data.data());
  switch (q.data.dtype()) {
    case DType::kI8: return static_cast<int8_t>(bytes[i]);
    case DType::kI4: return unpack_int4(bytes[i / 2], static_cast<int>(i % 2));
    default: return bytes[i];  // FP8
  }
}

int64_t scale_index(const OperandInfo& op, int64_t r, int64_t c) {
  return (r / op.block.rows) * op.scale_cols + c / op.block.cols;
}

int32_t zero_point_at(const OperandInfo& op, int64_t r, int64_t c) {
  return op.zero_points == nullptr ? 0 : op.zero_points[scale_index(op, r, c)];
}

// Codes in the scaled domain, [rows, K] row-major: decoded FP8 values as float (exact).
std::vector<float> fp8_codes(const OperandInfo& op) {
  std::vector<float> v(static_cast<size_t>(op.rows * op.cols));
  for (int64_t r = 0; r < op.rows; ++r)
    for (int64_t c = 0; c < op.cols; ++c)
      v[r * op.cols + c] =
          static_cast<float>(detail::decode_scaled(stored_code(*op.q, r, c), op.dtype, 0));
  return v;
}

// Integer codes minus their block's zero point, [rows, K] row-major.
std::vector<int32_t> integer_codes(const OperandInfo& op) {
  std::vector<int32_t> v(static_cast<size_t>(op.rows * op.cols));
  for (int64_t r = 0; r < op.rows; ++r)
    for (int64_t c = 0; c < op.cols; ++c)
      v[r * op.cols + c] = stored_code(*op.q, r, c) - zero_point_at(op, r, c);
  return v;
}

// Real values as float32, [rows, K] row-major: dense elements as loaded, quantized elements
// dequantized one by one as float(q - zp) * scale (one float32 rounding).
std::vector<float> real_values(const OperandInfo& op) {
  std::vector<float> v(static_cast<size_t>(op.rows * op.cols));
  for (int64_t r = 0; r < op.rows; ++r)
    for (int64_t c = 0; c < op.cols; ++c) {
      float x;
      if (op.quantized()) {
        const float code = static_cast<float>(
            detail::decode_scaled(stored_code(*op.q, r, c), op.dtype, zero_point_at(op, r, c)));
        x = code * op.scales[scale_index(op, r, c)];
      } else {
        x = load_float(op.dense, r, c);
      }
      v[r * op.cols + c] = x;
    }
  return v;
}

// Segment starts along K plus K itself: the union of both operands' scale-block boundaries.
std::vector<int64_t> segment_bounds(int64_t k, int64_t block_a, int64_t block_b) {
  std::vector<int64_t> bounds{0};
  int64_t at = 0;
  while (at < k) {
    const int64_t next_a = (at / block_a + 1) * block_a;
    const int64_t next_b = (at / block_b + 1) * block_b;
    at = std::min({k, next_a, next_b});
    bounds.push_back(at);
  }
  return bounds;
}

// Each row's scale on each segment, [rows, segments].
std::vector<float> segment_scales(const OperandInfo& op, const std::vector<int64_t>& bounds) {
  const int64_t segments = static_cast<int64_t>(bounds.size()) - 1;
  std::vector<float> s(static_cast<size_t>(op.rows * segments));
  for (int64_t r = 0; r < op.rows; ++r)
    for (int64_t g = 0; g < segments; ++g) s[r * segments + g] = op.scales[scale_index(op, r, bounds[g])];
  return s;
}

void store(const MatrixView& out, DType dtype, int64_t m, int64_t n, float value) {
  const int64_t i = m * out.row_stride + n * out.col_stride;
  void* base = const_cast<void*>(out.data);
  if (dtype == DType::kBF16)
    static_cast<uint16_t*>(base)[i] = float_to_bf16_bits(value);
  else
    static_cast<float*>(base)[i] = value;
}

// W8A8: per-segment raw sums, descaled by scale_a * scale_b into a float32 accumulator.
void run_scaled(const GemmPlan& p, DType out_dtype, const float* bias) {
  const OperandInfo& a = p.a;
  const OperandInfo& b = p.b;
  const int64_t m_size = a.rows, n_size = b.rows, k_size = a.cols;
  const std::vector<int64_t> bounds = segment_bounds(k_size, a.k_block(), b.k_block());
  const int64_t segments = static_cast<int64_t>(bounds.size()) - 1;
  const std::vector<float> scale_a = segment_scales(a, bounds);  // [M, segments]
  const std::vector<float> scale_b = segment_scales(b, bounds);  // [N, segments]
  const bool integer = a.integer();
  std::vector<float> fa, fb;      // FP8 codes, [M, K] and [N, K]
  std::vector<int32_t> ia, ib;    // integer codes minus zero points
  if (integer) {
    ia = integer_codes(a);
    ib = integer_codes(b);
  } else {
    fa = fp8_codes(a);
    fb = fp8_codes(b);
  }
  for (int64_t m = 0; m < m_size; ++m) {
    for (int64_t n = 0; n < n_size; ++n) {
      float acc = 0.0f;
      for (int64_t g = 0; g < segments; ++g) {
        float partial;
        if (integer) {
          const int32_t* ra = ia.data() + m * k_size;
          const int32_t* rb = ib.data() + n * k_size;
          int64_t sum = 0;
          for (int64_t k = bounds[g]; k < bounds[g + 1]; ++k)
            sum += static_cast<int64_t>(ra[k]) * rb[k];
          partial = static_cast<float>(sum);  // the INT32 -> FP32 conversion (RNE)
        } else {
          const float* ra = fa.data() + m * k_size;
          const float* rb = fb.data() + n * k_size;
          float sum = 0.0f;
          for (int64_t k = bounds[g]; k < bounds[g + 1]; ++k) sum += ra[k] * rb[k];
          partial = sum;
        }
        const float descale = scale_a[m * segments + g] * scale_b[n * segments + g];
        acc += partial * descale;
      }
      if (bias != nullptr) acc += bias[n];
      store(p.out, out_dtype, m, n, acc);
    }
  }
}

// A dense operand on either side: per-element dequantization, float32 products and sum.
void run_dequantized(const GemmPlan& p, DType out_dtype, const float* bias) {
  const int64_t m_size = p.a.rows, n_size = p.b.rows, k_size = p.a.cols;
  const std::vector<float> va = real_values(p.a);  // [M, K]
  const std::vector<float> vb = real_values(p.b);  // [N, K]
  for (int64_t m = 0; m < m_size; ++m) {
    const float* ra = va.data() + m * k_size;
    for (int64_t n = 0; n < n_size; ++n) {
      const float* rb = vb.data() + n * k_size;
      float acc = 0.0f;
      for (int64_t k = 0; k < k_size; ++k) acc += ra[k] * rb[k];
      if (bias != nullptr) acc += bias[n];
      store(p.out, out_dtype, m, n, acc);
    }
  }
}

}  // namespace

Status gemm_can_implement(const GemmOperand& a, const GemmOperand& b, const TensorView& out) {
  GemmPlan plan;
  return plan_gemm(a, b, out, &plan);
}

Status quantized_gemm(const GemmOperand& a, const GemmOperand& b, const TensorView& out,
                      const GemmOptions& options) {
  GemmPlan plan;
  LLMQ_RETURN_IF_ERROR(plan_gemm(a, b, out, &plan));
  if (plan.a.quantized() && plan.b.quantized())
    run_scaled(plan, out.dtype, options.bias);
  else
    run_dequantized(plan, out.dtype, options.bias);
  return {};
}

}  // namespace llmq
