// plan_linear and run_linear (linear.hpp): which kernel takes a linear layer at M rows, decided once
// per step-size class, and the call into it.
#include <algorithm>

#include <string>

#include "llmq/cuda_decode_gemm.hpp"
#include "llmq/cuda_int8_gemm.hpp"
#include "llmq/device.hpp"
#include "runtime/dequant_weights.hpp"
#include "runtime/linear.hpp"
#include "runtime/scale_columns.hpp"

namespace llmq::runtime {
namespace {

using Path = LinearPath;

const char* path_name(Path p) {
  switch (p) {
    case Path::kDecodeGemm: return "decode-gemm";
    case Path::kDecodeGemmChunks: return "decode-gemm in row chunks";
    case Path::kDequantBf16: return "cublaslt-bf16 on dequantized weights";
    case Path::kCublasFp8Outer: return "cublaslt-fp8 per-token x per-channel";
    case Path::kCublasFp8Tensor: return "cublaslt-fp8 per-tensor x per-tensor";
    case Path::kCublasFp8Block: return "cublaslt-fp8 1x128 x 128x128";
    case Path::kCublasBf16: return "cublaslt-bf16";
    case Path::kInt8Gemm: return "int8-gemm";
    case Path::kGeneric: return "generic (cuda cores)";
  }
  return "?";
}

bool quantized_input(const GpuLinear& l) { return l.act != ActQuant::kNone; }
bool per_tensor_act(const GpuLinear& l) { return l.act == ActQuant::kStaticTensor || l.act == ActQuant::kDynamicTensor; }
bool per_row_scales(const GpuLinear& l) {
  return l.act == ActQuant::kPerToken || l.act == ActQuant::kStaticTensor || l.act == ActQuant::kDynamicTensor;
}

DecodeGemmProblem decode_problem(const GpuLinear& l, const LinearPart& part, const LinearInput& x, int64_t m,
                                 void* y, int64_t ldy) {
  DecodeGemmProblem p;
  p.m = m;
  p.n = part.n;
  p.k = l.k;
  if (quantized_input(l)) {
    p.a = x.codes;
    p.a_dtype = l.act_dtype;
    p.a_scale = x.scales;
  } else {
    p.a = x.bf16;
    p.a_dtype = DType::kBF16;
  }
  p.w = part.w.get();
  p.w_dtype = part.w_dtype;
  p.w_scale = part.w_scale.as<float>();
  p.d = y;
  p.d_row_stride = ldy;
  return p;
}

CudaGemmProblem cublas_problem(const GpuLinear& l, const LinearPart& part, const LinearInput& x, int64_t m, void* y,
                               LinearOut y_type, int64_t ldy, Path path) {
  CudaGemmProblem p;
  p.m = m;
  p.n = part.n;
  p.k = l.k;
  p.d = y;
  p.d_dtype = y_type == LinearOut::kF32 ? DType::kF32 : DType::kBF16;
  p.d_row_stride = ldy;
  p.b.data = part.w.get();
  p.b.dtype = part.w_dtype;
  if (path == Path::kCublasBf16) {
    p.a.data = x.bf16;
    p.a.dtype = DType::kBF16;
  } else {
    p.a.data = x.codes;
    p.a.dtype = DType::kE4M3;
    p.a.scales = x.scales;
    if (path == Path::kCublasFp8Outer) {
      p.a.scale_mode = p.b.scale_mode = GemmScaleMode::kOuterVector;
      p.b.scales = part.w_scale.as<float>();
    } else if (path == Path::kCublasFp8Tensor) {
      // One scale each: the activation's is every row's (static, or broadcast after the dynamic
      // tensor's absmax), the weight's every channel's (uniform_scale); their first elements.
      p.a.scale_mode = p.b.scale_mode = GemmScaleMode::kTensor;
      p.b.scales = part.w_scale.as<float>();
    } else {
      p.a.scale_mode = GemmScaleMode::kBlock1x128;
      p.b.scale_mode = GemmScaleMode::kBlock128x128;
      p.b.scale_layout = ScaleLayout::kCublasLt;
      p.b.scales = part.w_scale_lt.as<float>();
    }
  }
  return p;
}

// Stand-in operands for can_implement at planning time, when no pointer is known: 16-byte aligned,
// never dereferenced.
alignas(16) const char kStandIn[16] = {};
LinearInput stand_in_input() {
  return {reinterpret_cast<const uint16_t*>(kStandIn), kStandIn, reinterpret_cast<const float*>(kStandIn)};
}

// The most rows this linear's decode-sized class takes: as far as the decode GEMM beats cuBLASLt
// for its operands (decode_gemm_preferred_max_tokens), the one rule for both the class and the kernel.
int64_t decode_class_rows(const GpuLinear& l) {
  const DType a = quantized_input(l) ? l.act_dtype : DType::kBF16;
  const DType w = l.parts.empty() ? DType::kBF16 : l.parts[0].w_dtype;
  return std::min<int64_t>(kMaxDecodeGemmM, decode_gemm_preferred_max_tokens(a, w));
}

// Whether the decode GEMM takes this part at m rows: 8-bit weights with per-channel scales, BF16
// input or the weight's own format with per-row scales. Its can_implement checks K, alignment and
// the INT32 bound; pointers are not known here, so only the shape-dependent conditions are tested
// with stand-in pointers.
bool decode_gemm_takes(const GpuLinear& l, const LinearPart& part, int64_t m, LinearOut y_type, int64_t ldy,
                       const LinearContext& ctx) {
  const bool eight_bit = part.w_dtype == DType::kE4M3 || part.w_dtype == DType::kI8;
  if (!(eight_bit && part.scale_kind == WeightScale::kChannel && y_type == LinearOut::kBF16 &&
        (!quantized_input(l) || (per_row_scales(l) && l.act_dtype == part.w_dtype)) &&
        (part.w_dtype == DType::kI8 || compute_capability_has_fp8(ctx.sm_major, ctx.sm_minor))))
    return false;
  DecodeGemmProblem p = decode_problem(l, part, stand_in_input(), std::max<int64_t>(m, 1), const_cast<char*>(kStandIn), ldy);
  p.w = kStandIn;
  p.w_scale = reinterpret_cast<const float*>(kStandIn);
  return cuda_decode_gemm_can_implement(p).ok();
}

// W8A16 past this many rows: cuBLASLt BF16 on the codes dequantized to BF16 instead of the decode
// GEMM streaming the 8-bit weights once per 16 rows. Measured crossover (H200, Llama-3-8B decode
// at ctx 512, bench/results/2026-11-28-h200-w8a16-dequant.json): the chunks take 8.43 / 11.99 /
// 14.39 / 15.67 ms a step at 32 / 48 / 49 / 64 rows, the dequantized path 11.97 / 12.49 ms at 49 /
// 64 (a fixed ~11 ms: 8 GB read, 16 GB written and read again), so they meet at 48 rows.
constexpr int64_t kDequantMinRows = 48;

// Whether a kDequantBf16 part runs the dequantized GEMM at m rows (else its decode-GEMM chunks):
// the one place the threshold is read.
bool dequant_runs_at(int64_t m) { return m > kDequantMinRows; }

// What a planned path runs at m rows: kDequantBf16 runs its chunks up to the threshold (run_part).
Path path_at(Path planned, int64_t m) {
  return planned == Path::kDequantBf16 && !dequant_runs_at(m) ? Path::kDecodeGemmChunks : planned;
}

// Rows of FP32 sums the dequantized path holds at once (its scratch: kDequantRowChunk x N floats).
constexpr int64_t kDequantRowChunk = 1024;

// The operands kDequantBf16 takes: 8-bit weights with per-channel scales, BF16 activations, a BF16
// output (its epilogue writes BF16; F32 outputs keep the chunks).
bool dequant_operands(const GpuLinear& l, const LinearPart& part, LinearOut y_type) {
  return !quantized_input(l) && (part.w_dtype == DType::kE4M3 || part.w_dtype == DType::kI8) &&
         part.scale_kind == WeightScale::kChannel && y_type == LinearOut::kBF16;
}

// The BF16 GEMM over a part's dequantized codes, as cuBLASLt sees it: b the scratch copy, FP32 sums
// into `acc` (rows part.n floats apart); the channel scales come after (scale_columns_to_bf16).
CudaGemmProblem dequant_problem(const GpuLinear& l, const LinearPart& part, const LinearInput& x, int64_t m, float* acc,
                                const void* w_bf16) {
  CudaGemmProblem p = cublas_problem(l, part, x, m, acc, LinearOut::kF32, part.n, Path::kCublasBf16);
  p.b.data = w_bf16;
  p.b.dtype = DType::kBF16;
  return p;
}

// Scratch of one part: its codes in BF16 (256-byte aligned end), then kDequantRowChunk rows of sums.
int64_t dequant_part_bytes(const GpuLinear& l, const LinearPart& part) {
  return (part.n * l.k * 2 + 255) / 256 * 256 + kDequantRowChunk * part.n * 4;
}

Path choose_path(const GpuLinear& l, const LinearPart& part, int64_t m, LinearOut y_type, int64_t ldy,
                 const LinearContext& ctx) {
  if (m <= decode_class_rows(l) && decode_gemm_takes(l, part, m, y_type, ldy, ctx)) return Path::kDecodeGemm;
  const int64_t mm = std::max<int64_t>(padded_rows(l, m), 4);
  auto cublas_ok = [&](Path path) {
    if (ctx.gemm == nullptr) return false;
    CudaGemmProblem p = cublas_problem(l, part, stand_in_input(), mm, const_cast<char*>(kStandIn), y_type, ldy, path);
    p.b.data = kStandIn;
    if (path != Path::kCublasBf16) p.b.scales = reinterpret_cast<const float*>(kStandIn);  // BF16 takes none
    return cuda_gemm_can_implement(p, ctx.sm_major, ctx.sm_minor).ok();
  };
  if (part.w_dtype == DType::kBF16 && !quantized_input(l) && cublas_ok(Path::kCublasBf16)) return Path::kCublasBf16;
  if (part.w_dtype == DType::kE4M3 && l.act_dtype == DType::kE4M3) {
    // Tensor-wide scales where both are one number: cuBLASLt's outer-vector kernels run 0.88x its
    // tensor-scaled ones at the Llama-3-8B shapes (H100, bench_cuda_gemm, M 256-8192), the same
    // arithmetic (acc x scale_a x scale_b) otherwise.
    if (part.scale_kind == WeightScale::kChannel && part.uniform_scale && per_tensor_act(l) &&
        cublas_ok(Path::kCublasFp8Tensor))
      return Path::kCublasFp8Tensor;
    if (part.scale_kind == WeightScale::kChannel && per_row_scales(l) && cublas_ok(Path::kCublasFp8Outer))
      return Path::kCublasFp8Outer;
    if (part.scale_kind == WeightScale::kBlock128 && l.act == ActQuant::kBlock1x128 && !part.w_scale_lt.empty() &&
        cublas_ok(Path::kCublasFp8Block))
      return Path::kCublasFp8Block;
  }
  if (part.w_dtype == DType::kI8 && l.act_dtype == DType::kI8 && per_row_scales(l) &&
      part.scale_kind == WeightScale::kChannel && y_type == LinearOut::kBF16 && ldy == part.n &&
      l.parts.size() == 1 && cuda_int8_gemm_can_implement(m, part.n, l.k).ok())
    return Path::kInt8Gemm;
  // Nothing above for these operands at this M (W8A16: no cuBLASLt GEMM takes 8-bit weights with
  // BF16 activations): the decode GEMM a chunk of its class's rows at a time, which streams the
  // weights once a chunk and still runs far ahead of the CUDA-core kernel (H200, Llama-3-8B
  // fp8-weight-only decode at 32 rows: 111 ms a step on the CUDA-core kernel).
  if (decode_gemm_takes(l, part, decode_class_rows(l), y_type, ldy, ctx)) {
    // W8A16 at prefill sizes: cuBLASLt BF16 on the dequantized weights, where it takes the shape.
    if (dequant_operands(l, part, y_type) && dequant_runs_at(m) && ctx.gemm != nullptr &&
        cuda_gemm_can_implement(dequant_problem(l, part, stand_in_input(), std::min(mm, kDequantRowChunk),
                                                reinterpret_cast<float*>(const_cast<char*>(kStandIn)), kStandIn),
                                ctx.sm_major, ctx.sm_minor)
            .ok())
      return Path::kDequantBf16;
    return Path::kDecodeGemmChunks;
  }
  return Path::kGeneric;
}

}  // namespace

static int64_t part_bytes(const LinearPart& p) { return p.w.bytes() + p.w_scale.bytes() + p.w_scale_lt.bytes(); }

int64_t GpuLinear::bytes() const {
  int64_t b = 0;
  for (const LinearPart& p : parts) b += part_bytes(p);
  return b;
}

int64_t padded_rows(const GpuLinear& linear, int64_t m) {
  return linear.act == ActQuant::kBlock1x128 ? (m + 3) / 4 * 4 : m;
}

LinearPlan plan_linear(const GpuLinear& l, int64_t max_rows, LinearOut y_type, int64_t ldy, const LinearContext& ctx) {
  LinearPlan plan;
  plan.y_type = y_type;
  plan.ldy = ldy;
  plan.max_rows = max_rows;
  plan.small_max_rows = decode_class_rows(l);
  const int64_t small_m = std::min<int64_t>(plan.small_max_rows, std::max<int64_t>(max_rows, 1));
  for (const LinearPart& part : l.parts) plan.small.push_back(choose_path(l, part, small_m, y_type, ldy, ctx));
  for (const LinearPart& part : l.parts)
    plan.large.push_back(max_rows > plan.small_max_rows ? choose_path(l, part, max_rows, y_type, ldy, ctx) : Path::kGeneric);
  return plan;
}

int64_t dequant_scratch_bytes(const GpuLinear& l, const LinearPlan& plan) {
  int64_t bytes = 0;
  for (size_t i = 0; i < l.parts.size() && i < plan.large.size(); ++i)
    if (plan.large[i] == Path::kDequantBf16) bytes = std::max(bytes, dequant_part_bytes(l, l.parts[i]));
  return bytes;
}

int64_t dequant_scratch_bound(const GpuLinear& l, int64_t max_rows, LinearOut y_type) {
  int64_t bytes = 0;
  if (!dequant_runs_at(max_rows)) return 0;
  for (const LinearPart& part : l.parts)
    if (dequant_operands(l, part, y_type)) bytes = std::max(bytes, dequant_part_bytes(l, part));
  return bytes;
}

std::string linear_path(const GpuLinear& l, const LinearPlan& plan, int64_t m) {
  const std::vector<Path>& paths = m <= plan.small_max_rows ? plan.small : plan.large;
  std::string s;
  for (size_t i = 0; i < l.parts.size() && i < paths.size(); ++i) {
    if (!s.empty()) s += " + ";
    s += path_name(path_at(paths[i], m));
    s += std::string(" ") + dtype_name(l.parts[i].w_dtype);
    if (l.act != ActQuant::kNone) s += std::string("/") + dtype_name(l.act_dtype);
  }
  return s;
}

namespace {

// The decode GEMM over chunks of its class's rows. Rows are independent: chunk r's activations,
// scales and outputs start r rows in.
Status run_chunks(const GpuLinear& l, const LinearPart& part, const LinearInput& x, int64_t m, void* yp, int64_t ldy,
                  const LinearContext& ctx) {
  const int64_t chunk = decode_class_rows(l);
  for (int64_t r = 0; r < m; r += chunk) {
    LinearInput xr = x;
    if (xr.bf16 != nullptr) xr.bf16 += r * l.k;
    if (xr.codes != nullptr) xr.codes = static_cast<const char*>(xr.codes) + r * l.k;
    if (xr.scales != nullptr) xr.scales += r;
    void* yr = static_cast<char*>(yp) + r * ldy * 2;
    LLMQ_RETURN_IF_ERROR(cuda_decode_gemm(decode_problem(l, part, xr, std::min(chunk, m - r), yr, ldy), ctx.stream));
  }
  return {};
}

// W8A16 past the threshold: the codes dequantized exactly into BF16 (no scale), cuBLASLt BF16 into
// FP32 sums kDequantRowChunk rows at a time, and each sum times its channel's scale rounded once
// to BF16: the reference's operation order (acc * w_scale, one rounding); only the order of the
// sum over K differs, as between any two GEMMs.
Status run_dequantized(const GpuLinear& l, const LinearPart& part, const LinearInput& x, int64_t m, void* yp,
                       int64_t ldy, const LinearContext& ctx) {
  const int64_t need = dequant_part_bytes(l, part);
  if (ctx.dequant == nullptr || ctx.dequant_bytes < need)
    return Status(StatusCode::kInternal, "dequantized-weights scratch of " + std::to_string(ctx.dequant_bytes) +
                                             " bytes, " + std::to_string(need) + " needed");
  auto* w = static_cast<uint16_t*>(ctx.dequant);
  auto* acc = reinterpret_cast<float*>(static_cast<char*>(ctx.dequant) + (part.n * l.k * 2 + 255) / 256 * 256);
  LLMQ_RETURN_IF_ERROR(dequantize_weights_bf16(part.w.get(), part.w_dtype, part.n, l.k, w, ctx.stream));
  for (int64_t r = 0; r < m; r += kDequantRowChunk) {
    const int64_t rows = std::min(kDequantRowChunk, m - r);
    LinearInput xr = x;
    xr.bf16 += r * l.k;
    LLMQ_RETURN_IF_ERROR(
        ctx.gemm->run(dequant_problem(l, part, xr, rows, acc, w), ctx.workspace, ctx.workspace_bytes, ctx.stream));
    LLMQ_RETURN_IF_ERROR(scale_columns_to_bf16(acc, rows, part.n, part.w_scale.as<float>(),
                                               static_cast<uint16_t*>(yp) + r * ldy, ldy, ctx.stream));
  }
  return {};
}

Status run_part(const GpuLinear& l, const LinearPart& part, const LinearInput& x, int64_t m, void* yp, LinearOut y_type,
                int64_t ldy, const LinearContext& ctx, Path path) {
  switch (path) {
    case Path::kDecodeGemm:
      return cuda_decode_gemm(decode_problem(l, part, x, m, yp, ldy), ctx.stream);
    case Path::kDecodeGemmChunks: return run_chunks(l, part, x, m, yp, ldy, ctx);
    case Path::kDequantBf16:
      return dequant_runs_at(m) ? run_dequantized(l, part, x, m, yp, ldy, ctx) : run_chunks(l, part, x, m, yp, ldy, ctx);
    case Path::kCublasFp8Outer:
    case Path::kCublasFp8Tensor:
    case Path::kCublasBf16:
    case Path::kCublasFp8Block: {
      // Block scales want M % 4 == 0: the activation buffers hold padded rows (quantized zeros or
      // stale finite rows beyond M), and the extra output rows land in rows the output buffer also
      // holds (the runtime sizes every buffer for padded rows).
      const int64_t mm = path == Path::kCublasFp8Block ? padded_rows(l, m) : m;
      return ctx.gemm->run(cublas_problem(l, part, x, mm, yp, y_type, ldy, path), ctx.workspace, ctx.workspace_bytes,
                           ctx.stream);
    }
    case Path::kInt8Gemm:
      return cuda_int8_gemm(static_cast<const int8_t*>(x.codes), part.w.as<int8_t>(), x.scales, part.w_scale.as<float>(),
                            nullptr, static_cast<uint16_t*>(yp), m, part.n, l.k, ctx.stream);
    case Path::kGeneric: break;
  }
  GenericLinearArgs g;
  g.m = m;
  g.n = part.n;
  g.k = l.k;
  if (quantized_input(l)) {
    g.a_dtype = l.act_dtype;
    g.a = x.codes;
    g.a_scale = x.scales;
    g.a_block = l.act == ActQuant::kBlock1x128;
  } else {
    g.a = x.bf16;
  }
  g.w_dtype = part.w_dtype;
  g.w = part.w.get();
  g.w_scale = part.scale_kind == WeightScale::kNone ? nullptr : part.w_scale.as<float>();
  g.w_block = part.scale_kind == WeightScale::kBlock128;
  g.y = yp;
  g.y_f32 = y_type == LinearOut::kF32;
  g.ldy = ldy;
  return generic_linear(g, ctx.stream);
}

}  // namespace

Status run_linear(const GpuLinear& l, const LinearPlan& plan, const LinearInput& x, int64_t m, void* y,
                  const LinearContext& ctx) {
  if (m == 0) return {};
  if (m < 0 || m > plan.max_rows || plan.small.size() != l.parts.size() || plan.large.size() != l.parts.size())
    return Status(StatusCode::kInternal, l.name + ": M=" + std::to_string(m) + " outside its plan (" +
                                             std::to_string(plan.max_rows) + " rows, " + std::to_string(plan.small.size()) +
                                             " parts of " + std::to_string(l.parts.size()) + ")");
  const std::vector<Path>& paths = m <= plan.small_max_rows ? plan.small : plan.large;
  const int64_t y_elem = plan.y_type == LinearOut::kF32 ? 4 : 2;
  for (size_t i = 0; i < l.parts.size(); ++i) {
    const LinearPart& part = l.parts[i];
    void* yp = static_cast<char*>(y) + part.n_offset * y_elem;
    const Status st = run_part(l, part, x, m, yp, plan.y_type, plan.ldy, ctx, paths[i]);
    if (!st.ok()) return Status(st.code(), l.name + " (" + path_name(path_at(paths[i], m)) + ", M=" + std::to_string(m) + "): " + st.message());
  }
  return {};
}

}  // namespace llmq::runtime
