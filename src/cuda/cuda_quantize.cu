// cuda_quantize: argument checks, the plan (which kernel family, threads per CTA and per team)
// and the launches. The element numerics are in quantize_numerics.cuh, the kernels in
// quantize_kernels.cu. Nothing here allocates or synchronizes.
#include "llmq/cuda_quantize.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_check.cuh"
#include "cuda/device_facts.cuh"
#include "cuda/quantize_kernels.cuh"
#include "llmq/device.hpp"
#include "llmq/format.hpp"
#include "core/int_math.hpp"

namespace llmq {
namespace {

namespace qk = quant_kernels;

// Dynamic per-tensor scales: at most this many partial maxima from the reduce pass (4 KiB).
constexpr int kMaxPartials = 1024;
// Sub-warp teams run in CTAs of this size; CTA teams may have up to kMaxCtaTeamThreads.
constexpr int kSubWarpCtaThreads = 256;
constexpr int64_t kMaxCtaTeamThreads = 1024;
// Unaligned per-tensor problems up to this size run as one generic CTA instead of two launches.
constexpr int64_t kGenericSingleCtaElems = 32768;
// Pack, tile and scale counts are 32-bit on the device.
constexpr int64_t kMax32 = int64_t{1} << 32;

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ---- The current device and its SM count (cuda/device_facts.cuh, cached per device); with FP8
// formats, the FP8 check's error where the device has no FP8 tensor cores.
Status current_device(bool need_fp8, int* ordinal, int* sms) {
  cuda::DeviceFacts dev;
  LLMQ_RETURN_IF_ERROR(cuda::current_device_facts(&dev));
  if (need_fp8 && !cuda::has_fp8(dev)) return require_fp8_device(dev.ordinal);  // the error, with its message
  *ordinal = dev.ordinal;
  *sms = dev.sms;
  return {};
}

// A pointer the kernels may dereference: device memory of the current device, or managed memory.
// One cudaPointerGetAttributes each: only can_implement and CudaQuantizeOptions::check_pointers
// run it, never the default cuda_quantize path.
Status check_device_pointer(const void* p, const char* name, int device) {
  if (p == nullptr) return invalid_argument(std::string(name) + ": null pointer");
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; keep it from being reported by a later launch check
    return invalid_argument(std::string(name) + ": not a pointer CUDA knows (" + cudaGetErrorString(err) + ")");
  }
  if (attr.type == cudaMemoryTypeManaged) return {};
  if (attr.type == cudaMemoryTypeDevice) {
    if (attr.device != device)
      return invalid_argument(std::string(name) + ": memory of CUDA device " + std::to_string(attr.device) +
                              ", but the current device is " + std::to_string(device));
    return {};
  }
  return invalid_argument(std::string(name) + ": points to host memory; cuda_quantize needs device (or managed) memory");
}

// as_matrix for a device view: the shape logic only (it never touches the data), without copying
// the view; strings are built only for errors.
Status device_matrix(const TensorView& v, const char* name, MatrixView* out) {
  if (v.device != Device::kCuda)
    return invalid_argument(std::string(name) + ": must be a CUDA device tensor, got " + v.describe());
  const int64_t r = v.rank();
  if (r < 1) return invalid_argument(std::string(name) + ": tensor has rank 0");
  if (!v.strides.empty() && v.strides.size() != v.shape.size())
    return invalid_argument(std::string(name) + ": strides and shape differ in rank");
  int64_t numel = 1;
  for (int64_t d : v.shape) {
    if (d < 0) return invalid_argument(std::string(name) + ": negative extent in " + v.describe());
    numel *= d;
  }
  if (v.data == nullptr && numel != 0) return invalid_argument(std::string(name) + ": data pointer is null");
  MatrixView m;
  m.data = v.data;
  m.dtype = v.dtype;
  m.cols = v.shape[static_cast<size_t>(r - 1)];
  m.col_stride = v.stride(r - 1);
  if (r == 1) {
    m.rows = 1;
    m.row_stride = m.cols * m.col_stride;
  } else {
    // Leading dimensions must collapse into one: stride(d) == stride(d + 1) * shape(d + 1).
    m.rows = 1;
    for (int64_t d = 0; d < r - 1; ++d) m.rows *= v.shape[static_cast<size_t>(d)];
    m.row_stride = v.stride(r - 2);
    for (int64_t d = 0; d + 1 < r - 1; ++d)
      if (v.shape[static_cast<size_t>(d)] != 1 && v.stride(d) != v.stride(d + 1) * v.shape[static_cast<size_t>(d + 1)])
        return invalid_argument(std::string(name) + ": leading dimensions of " + v.describe() +
                                " cannot be flattened into rows");
  }
  *out = m;
  return {};
}

qk::Encoder encoder_for(const QuantSpec& spec) {
  const bool sr = spec.rounding == Rounding::kStochastic;
  if (spec.format == DType::kI8) return sr ? qk::Encoder::kInt8Sr : qk::Encoder::kInt8;
  if (spec.format == DType::kE4M3) return sr ? qk::Encoder::kE4M3HwSr : qk::Encoder::kE4M3Hw;
  if (spec.format == DType::kE5M2) return sr ? qk::Encoder::kE5M2HwSr : qk::Encoder::kE5M2Hw;
  return sr ? qk::Encoder::kSoftFp8Sr : qk::Encoder::kSoftFp8;
}

// ---- The checked problem.
struct Problem {
  MatrixView x;
  qk::InType in = qk::InType::kF32;
  int64_t x_stride = 0;
  BlockShape block;
  int64_t scale_rows = 1, scale_cols = 1;
  int device = 0;
  int sms = 0;
};

// Everything but the pointers' memory type: shapes, dtypes, spec support, the device's FP8
// support (cached). No allocation and no CUDA call beyond cudaGetDevice on success.
Status check_problem(const TensorView& x, const QuantSpec& spec, const TensorView& q,
                     const TensorView& scales, Problem* out) {
  Problem p;
  LLMQ_RETURN_IF_ERROR(device_matrix(x, "x", &p.x));
  switch (p.x.dtype) {
    case DType::kF32: p.in = qk::InType::kF32; break;
    case DType::kBF16: p.in = qk::InType::kBF16; break;
    case DType::kF16: p.in = qk::InType::kF16; break;
    case DType::kF64: return unsupported("x: f64 input is not supported by cuda_quantize; convert to f32");
    default:
      return invalid_argument(std::string("x: dtype ") + dtype_name(p.x.dtype) +
                              " cannot be quantized; expected f32, bf16 or f16");
  }
  const int64_t rows = p.x.rows, cols = p.x.cols;
  if (cols > 1 && p.x.col_stride != 1)
    return invalid_argument("x: columns must be contiguous (column stride 1), got " + std::to_string(p.x.col_stride) +
                            " in " + x.describe());
  p.x_stride = rows > 1 ? p.x.row_stride : cols;
  if (rows > 1 && p.x_stride < cols)
    return invalid_argument("x: row stride " + std::to_string(p.x_stride) + " is smaller than the " +
                            std::to_string(cols) + " columns");

  LLMQ_RETURN_IF_ERROR(resolve_block_shape(spec, rows, cols, &p.block));
  if (spec.format == DType::kI4) return unsupported("spec.format: int4 is not implemented by cuda_quantize");
  if (!spec.symmetric) return unsupported("spec.symmetric: asymmetric (zero-point) quantization is not implemented by cuda_quantize");
  const bool dynamic = spec.source == ScaleSource::kDynamic;
  if (dynamic && spec.method == ScaleMethod::kMseSearch)
    return unsupported("spec.method: the MSE scale search is not implemented by cuda_quantize (compute scales on the host and pass them as static)");
  if (dynamic && spec.scale_rounding == ScaleRounding::kHardwareSet &&
      spec.hardware_scales.size() > static_cast<size_t>(qk::kMaxHardwareScales))
    return unsupported("spec.hardware_scales: cuda_quantize takes at most " + std::to_string(qk::kMaxHardwareScales) +
                       " hardware scales, got " + std::to_string(spec.hardware_scales.size()));
  if (dynamic && spec.method == ScaleMethod::kAbsmax && std::isinf(1.0f / effective_min_scale(spec)))
    return invalid_argument("spec.min_scale: " + std::to_string(spec.min_scale) +
                            " has no finite float32 reciprocal, so an all-zero block would quantize to NaN");

  // q: codes of spec.format, contiguous, the shape of x.
  MatrixView qm;
  LLMQ_RETURN_IF_ERROR(device_matrix(q, "q", &qm));
  if (q.dtype != spec.format)
    return invalid_argument(std::string("q: dtype ") + dtype_name(q.dtype) + " differs from spec.format " +
                            dtype_name(spec.format));
  if (!q.is_contiguous()) return invalid_argument("q: must be contiguous, got strides in " + q.describe());
  if (qm.rows != rows || qm.cols != cols)
    return invalid_argument("q: shape " + q.describe() + " differs from x " + x.describe());

  // scales: float32 [scale_rows, scale_cols], contiguous (rank 1 of as many elements accepted).
  p.scale_rows = std::max<int64_t>(ceil_div(rows, p.block.rows), 1);
  p.scale_cols = std::max<int64_t>(ceil_div(cols, p.block.cols), 1);
  if (scales.device != Device::kCuda)
    return invalid_argument("scales: must be a CUDA device tensor, got " + scales.describe());
  const bool shape_ok =
      (scales.rank() == 2 && scales.shape[0] == p.scale_rows && scales.shape[1] == p.scale_cols) ||
      (scales.rank() == 1 && scales.shape[0] == p.scale_rows * p.scale_cols);
  if (scales.dtype != DType::kF32 || !shape_ok || !scales.is_contiguous())
    return invalid_argument("scales: expected contiguous float32 [" + std::to_string(p.scale_rows) + ", " +
                            std::to_string(p.scale_cols) + "] for " + describe(spec) + " over x " + x.describe() +
                            ", got " + scales.describe());
  if (scales.data == nullptr) return invalid_argument("scales: data pointer is null");

  if (rows * cols >= kMax32 * qk::kPackElems)
    return unsupported("x: " + std::to_string(rows * cols) + " elements exceed cuda_quantize's 2^36 limit");
  if (p.scale_rows * p.scale_cols >= kMax32)
    return unsupported("scales: more than 2^32 scale blocks");

  LLMQ_RETURN_IF_ERROR(current_device(is_fp8(spec.format), &p.device, &p.sms));
  *out = p;
  return {};
}

// The memory type of every pointer the call would dereference (one driver query each).
Status check_pointers(const TensorView& x, const TensorView& q, const TensorView& scales,
                      const CudaQuantizeOptions& options, int device) {
  if (x.numel() > 0) {
    LLMQ_RETURN_IF_ERROR(check_device_pointer(x.data, "x", device));
    LLMQ_RETURN_IF_ERROR(check_device_pointer(q.data, "q", device));
  }
  LLMQ_RETURN_IF_ERROR(check_device_pointer(scales.data, "scales", device));
  if (options.smooth_divisor != nullptr)
    LLMQ_RETURN_IF_ERROR(check_device_pointer(options.smooth_divisor, "options.smooth_divisor", device));
  if (options.clip_count != nullptr)
    LLMQ_RETURN_IF_ERROR(check_device_pointer(options.clip_count, "options.clip_count", device));
  if (options.workspace != nullptr)
    LLMQ_RETURN_IF_ERROR(check_device_pointer(options.workspace, "options.workspace", device));
  return {};
}

}  // namespace

namespace quant_kernels {
namespace {

// ---- Per-format encoder facts, derived once from the reference itself.
EncodeParams make_fp8_params(DType d) {
  const FormatInfo& info = format_info(d);
  EncodeParams p;
  p.mantissa_bits = info.mantissa_bits;
  p.exponent_bias = info.exponent_bias;
  const float max_f = static_cast<float>(info.max_finite);
  p.max_bits = float_bits(max_f);
  p.max_code = encode_float(max_f, d) & 0x7Fu;
  p.nan_code = encode_float(std::numeric_limits<float>::quiet_NaN(), d);
  p.no_negative_zero = info.nan == NanEncoding::kNegativeZero;
  // The smallest clipping magnitude: exceeds_range is monotone in |x|, false at max, true at Inf.
  uint32_t lo = p.max_bits, hi = 0x7F800000u;
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (exceeds_range(bits_float(mid), d)) hi = mid;
    else lo = mid;
  }
  p.clip_bits = hi;
  return p;
}

}  // namespace

EncodeParams encode_params(const QuantSpec& spec) {
  static const auto table = [] {
    std::array<EncodeParams, static_cast<size_t>(DType::kI32) + 1> t{};
    for (DType d : kAllDTypes)
      if (is_fp8(d)) t[static_cast<size_t>(d)] = make_fp8_params(d);
    return t;
  }();
  EncodeParams p = table[static_cast<size_t>(spec.format)];
  p.stochastic = spec.rounding == Rounding::kStochastic;
  p.seed = spec.seed;
  return p;
}

ScaleParams scale_params(const QuantSpec& spec) {
  ScaleParams s;
  s.unit = spec.method == ScaleMethod::kUnit;
  s.floor = effective_min_scale(spec);
  s.target = static_cast<double>(spec.backoff) * format_info(spec.format).max_finite;
  s.target_f = static_cast<float>(s.target);
  s.float_division = std::isfinite(s.target_f) && static_cast<double>(s.target_f) == s.target;
  switch (spec.scale_rounding) {
    case ScaleRounding::kNone: s.rounding = 0; break;
    case ScaleRounding::kPowerOfTwo: s.rounding = 1; break;
    case ScaleRounding::kHardwareSet: s.rounding = 2; break;
  }
  s.pow2_min_exp = spec.pow2_min_exp;
  s.pow2_max_exp = spec.pow2_max_exp;
  s.hardware_count = static_cast<int>(std::min<size_t>(spec.hardware_scales.size(), kMaxHardwareScales));
  for (int i = 0; i < s.hardware_count; ++i) s.hardware_scales[i] = spec.hardware_scales[static_cast<size_t>(i)];
  return s;
}

}  // namespace quant_kernels

size_t cuda_quantize_workspace_bytes(int64_t rows, int64_t cols, const QuantSpec& spec) {
  BlockShape block;
  if (!resolve_block_shape(spec, rows, cols, &block).ok()) return 0;
  if (spec.source != ScaleSource::kDynamic || spec.method != ScaleMethod::kAbsmax) return 0;
  const int64_t scale_count = std::max<int64_t>(ceil_div(rows, block.rows), 1) *
                              std::max<int64_t>(ceil_div(cols, block.cols), 1);
  // Only one scale for the whole tensor may take the two-pass path, whose partials live here.
  return scale_count == 1 ? kMaxPartials * sizeof(float) : 0;
}

Status cuda_quantize_can_implement(const TensorView& x, const QuantSpec& spec, const TensorView& q,
                                   const TensorView& scales, const CudaQuantizeOptions& options) {
  Problem p;
  LLMQ_RETURN_IF_ERROR(check_problem(x, spec, q, scales, &p));
  return check_pointers(x, q, scales, options, p.device);
}

Status cuda_quantize(const TensorView& x, const QuantSpec& spec, const TensorView& q,
                     const TensorView& scales, const CudaQuantizeOptions& options) {
  Problem p;
  LLMQ_RETURN_IF_ERROR(check_problem(x, spec, q, scales, &p));
  if (options.check_pointers) LLMQ_RETURN_IF_ERROR(check_pointers(x, q, scales, options, p.device));
  if (options.clip_count != nullptr && (reinterpret_cast<uintptr_t>(options.clip_count) & 7u) != 0)
    return invalid_argument("options.clip_count: must be 8-byte aligned");
  const cudaStream_t stream = options.stream;
  const int64_t rows = p.x.rows, cols = p.x.cols, numel = rows * cols;
  const bool dynamic = spec.source == ScaleSource::kDynamic;
  const qk::Encoder enc = encoder_for(spec);
  const int in_bytes = p.in == qk::InType::kF32 ? 4 : 2;
  const int max_slots = qk::slots_for(p.in, enc);

  qk::CommonArgs c;
  c.x = p.x.data;
  c.rows = rows;
  c.cols = cols;
  c.x_stride = p.x_stride;
  c.q = static_cast<uint8_t*>(q.data);
  c.scales = static_cast<float*>(scales.data);
  c.scale_rows = p.scale_rows;
  c.scale_cols = p.scale_cols;
  c.block_rows = p.block.rows;
  c.block_cols = p.block.cols;
  c.smooth = options.smooth_divisor;
  c.clip_count = options.clip_count;
  c.enc = qk::encode_params(spec);
  c.scale = qk::scale_params(spec);
  const uint32_t num_tiles = static_cast<uint32_t>(p.scale_rows * p.scale_cols);

  // Static scales of an empty tensor: nothing to do. Dynamic: the scales still get written (the
  // floor, or 1 for kUnit), as compute_scale does, by the generic kernel over empty blocks.
  const auto run_generic = [&]() -> Status {
    const int64_t tile_elems = std::min(p.block.rows, std::max<int64_t>(rows, 1)) *
                               std::min(p.block.cols, std::max<int64_t>(cols, 1));
    if (tile_elems >= kMax32) return unsupported("spec: scale blocks of more than 2^32 elements need aligned rows (cols % 16 == 0)");
    qk::TileArgs t;
    t.c = c;
    t.num_tiles = num_tiles;
    t.scale_cols_div = qk::FastDivmod(static_cast<uint32_t>(p.scale_cols));
    return qk::launch_generic_tiles(t, p.in, enc, p.device, p.sms, stream);
  };
  if (numel == 0) return dynamic ? run_generic() : Status{};

  // The 16-byte pack path: every pack of 16 elements starts 16-byte aligned in x and q and lies in
  // one scale block.
  const bool packs = cols % qk::kPackElems == 0 && aligned16(c.x) && aligned16(c.q) &&
                     (rows <= 1 || (p.x_stride * in_bytes) % 16 == 0) &&
                     (c.smooth == nullptr || aligned16(c.smooth)) &&
                     (p.block.cols % qk::kPackElems == 0 || p.block.cols >= cols);
  const uint32_t total_packs = packs ? static_cast<uint32_t>(numel / qk::kPackElems) : 0u;
  const bool need_row_col = (rows > 1 && p.x_stride != cols) || c.smooth != nullptr;
  const auto fill_pack_geometry = [&](auto* args) {
    args->total_packs = total_packs;
    if (packs) args->packs_per_row = qk::FastDivmod(static_cast<uint32_t>(cols / qk::kPackElems));
  };

  // Known scales: static, or the unit scale. One elementwise pass.
  if (!dynamic || spec.method == ScaleMethod::kUnit) {
    qk::ElementwiseArgs e;
    e.c = c;
    e.source = dynamic ? qk::ScaleSource::kUnit
                       : (num_tiles == 1 ? qk::ScaleSource::kTensor : qk::ScaleSource::kBlocks);
    fill_pack_geometry(&e);
    e.need_row_col = need_row_col || e.source == qk::ScaleSource::kBlocks;
    if (packs) {
      e.block_rows_div = qk::FastDivmod(static_cast<uint32_t>(std::min(p.block.rows, rows)));
      e.block_cols_div = qk::FastDivmod(static_cast<uint32_t>(std::min(p.block.cols, cols)));
    }
    return qk::launch_elementwise(e, p.in, enc, packs, p.device, p.sms, stream);
  }

  // Dynamic absmax scales. One pass with each scale block in registers when the block fits.
  const int64_t tile_packs = packs ? std::min(p.block.rows, rows) * (std::min(p.block.cols, cols) / qk::kPackElems) : 0;
  if (packs && tile_packs <= kMaxCtaTeamThreads * max_slots) {
    qk::TileArgs t;
    t.c = c;
    t.num_tiles = num_tiles;
    t.scale_cols_div = qk::FastDivmod(static_cast<uint32_t>(p.scale_cols));
    if (tile_packs <= 32 * max_slots) {
      // Short blocks (1 x 128, groups, short rows): a power-of-two team of lanes per block, as few
      // as keep every lane at <= max_slots packs; several teams per warp.
      int lanes = 1;
      while (static_cast<int64_t>(lanes) * max_slots < tile_packs) lanes *= 2;
      t.team_lanes = lanes;
      t.slots = static_cast<int>(ceil_div(tile_packs, lanes));
      const int64_t teams_per_cta = kSubWarpCtaThreads / lanes;
      return qk::launch_tiles(t, p.in, enc, /*cta_team=*/false, kSubWarpCtaThreads,
                              static_cast<uint64_t>(ceil_div(num_tiles, teams_per_cta)), p.device, p.sms, stream);
    }
    // Long blocks (rows of 4096+, 128 x 128): the whole CTA is the team, with as few threads as
    // keep each at <= max_slots packs (more CTAs per SM, shorter reductions).
    const int threads = static_cast<int>(ceil_div(ceil_div(tile_packs, max_slots), 32) * 32);
    t.team_lanes = threads;
    t.slots = static_cast<int>(ceil_div(tile_packs, threads));
    return qk::launch_tiles(t, p.in, enc, /*cta_team=*/true, threads, num_tiles, p.device, p.sms, stream);
  }

  if (num_tiles == 1 && (packs || numel > kGenericSingleCtaElems)) {
    // Large per-tensor: partial maxima, then quantize with every CTA reducing the partials.
    if (options.workspace == nullptr || options.workspace_bytes < kMaxPartials * sizeof(float))
      return invalid_argument("options.workspace: dynamic per-tensor scales need " +
                              std::to_string(kMaxPartials * sizeof(float)) +
                              " bytes of device workspace (cuda_quantize_workspace_bytes), got " +
                              std::to_string(options.workspace_bytes));
    if ((reinterpret_cast<uintptr_t>(options.workspace) & 3u) != 0)
      return invalid_argument("options.workspace: must be 4-byte aligned");
    qk::ReduceArgs r;
    r.c = c;
    r.partials = static_cast<float*>(options.workspace);
    fill_pack_geometry(&r);
    r.need_row_col = need_row_col;
    int num_partials = 0;
    LLMQ_RETURN_IF_ERROR(qk::launch_reduce(r, p.in, packs, p.device, p.sms, kMaxPartials, stream, &num_partials));
    qk::ElementwiseArgs e;
    e.c = c;
    e.source = qk::ScaleSource::kPartials;
    e.partials = r.partials;
    e.num_partials = num_partials;
    fill_pack_geometry(&e);
    e.need_row_col = need_row_col;
    return qk::launch_elementwise(e, p.in, enc, packs, p.device, p.sms, stream);
  }
  return run_generic();
}

}  // namespace llmq
