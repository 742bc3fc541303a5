// CudaGemmRunner (include/llmq/cuda_gemm.hpp): FP8 and BF16 GEMM through cuBLASLt, with a plan
// cache so that cublasLtMatmulAlgoGetHeuristic runs once per problem shape, and the kernels that
// convert llmq's row-major block scales into the order cuBLASLt reads.
//
// Row-major to column-major. llmq computes D[M, N] = A[M, K] * B[N, K]^T with every matrix
// row-major; cuBLASLt is column-major. A row-major [r, c] matrix with row stride ld is a
// column-major [c, r] matrix with leading dimension ld, so cuBLASLt computes the transpose:
//     D^T [N, M] = B [N, K] * A^T [K, M]
// with cuBLASLt's A := our B (stored [K, N] column-major, op T), cuBLASLt's B := our A (stored
// [K, M], op N) and cuBLASLt's (m, n, k) = (N, M, K). That is the "TN" form FP8 kernels require on
// Hopper. Every per-operand setting swaps with it: A_SCALE_* carries our b's scales, B_SCALE_* our
// a's; the bias runs along cuBLASLt's rows, which are our N output channels.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <vector>

#include "cuda/cublas_check.cuh"
#include "cuda/cublaslt_handles.cuh"
#include "cuda/cuda_check.cuh"
#include "llmq/cuda_gemm.hpp"
#include "llmq/device.hpp"
#include "core/int_math.hpp"

namespace llmq {
namespace {

using detail::LtHandle;
using detail::LtMatmulDesc;
using detail::LtMatrixLayout;
using detail::LtPreference;

constexpr int64_t kWorkspaceAlign = 256;  // cublasLtMatmul's workspace alignment
constexpr int64_t kMaxPointerAlign = 256;  // cuBLASLt's default alignment assumption


cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::kE4M3: return CUDA_R_8F_E4M3;
    case DType::kE5M2: return CUDA_R_8F_E5M2;
    case DType::kBF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;  // kF32; can_implement admits nothing else
  }
}

int32_t lt_scale_mode(GemmScaleMode mode) {
  switch (mode) {
    case GemmScaleMode::kTensor: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    case GemmScaleMode::kOuterVector: return CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    case GemmScaleMode::kBlock1x128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case GemmScaleMode::kBlock128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  }
  return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

// cuBLASLt's tile of `rows` x `cols` (its m x n: our weight rows x tokens), for the sizes the tile
// search asks for; CUBLASLT_MATMUL_TILE_UNDEFINED otherwise.
int32_t tile_id(int64_t rows, int64_t cols) {
  struct Tile {
    int64_t rows, cols;
    cublasLtMatmulTile_t id;
  };
  static constexpr Tile kTiles[] = {
      {64, 8, CUBLASLT_MATMUL_TILE_64x8},       {64, 16, CUBLASLT_MATMUL_TILE_64x16},
      {64, 24, CUBLASLT_MATMUL_TILE_64x24},     {64, 32, CUBLASLT_MATMUL_TILE_64x32},
      {64, 48, CUBLASLT_MATMUL_TILE_64x48},     {64, 64, CUBLASLT_MATMUL_TILE_64x64},
      {64, 96, CUBLASLT_MATMUL_TILE_64x96},     {64, 128, CUBLASLT_MATMUL_TILE_64x128},
      {64, 192, CUBLASLT_MATMUL_TILE_64x192},   {64, 256, CUBLASLT_MATMUL_TILE_64x256},
      {128, 8, CUBLASLT_MATMUL_TILE_128x8},     {128, 16, CUBLASLT_MATMUL_TILE_128x16},
      {128, 24, CUBLASLT_MATMUL_TILE_128x24},   {128, 32, CUBLASLT_MATMUL_TILE_128x32},
      {128, 48, CUBLASLT_MATMUL_TILE_128x48},   {128, 64, CUBLASLT_MATMUL_TILE_128x64},
      {128, 96, CUBLASLT_MATMUL_TILE_128x96},   {128, 128, CUBLASLT_MATMUL_TILE_128x128},
      {128, 192, CUBLASLT_MATMUL_TILE_128x192}, {128, 256, CUBLASLT_MATMUL_TILE_128x256},
      {256, 8, CUBLASLT_MATMUL_TILE_256x8},     {256, 16, CUBLASLT_MATMUL_TILE_256x16},
      {256, 24, CUBLASLT_MATMUL_TILE_256x24},   {256, 32, CUBLASLT_MATMUL_TILE_256x32},
      {256, 48, CUBLASLT_MATMUL_TILE_256x48},   {256, 64, CUBLASLT_MATMUL_TILE_256x64},
      {256, 96, CUBLASLT_MATMUL_TILE_256x96},   {256, 128, CUBLASLT_MATMUL_TILE_256x128},
      {256, 192, CUBLASLT_MATMUL_TILE_256x192}, {256, 256, CUBLASLT_MATMUL_TILE_256x256},
  };
  for (const Tile& t : kTiles)
    if (t.rows == rows && t.cols == cols) return static_cast<int32_t>(t.id);
  return static_cast<int32_t>(CUBLASLT_MATMUL_TILE_UNDEFINED);
}

// Largest power of two (up to 256) dividing an address or byte offset. cuBLASLt picks kernels by
// the alignment it is promised, so the promise is part of the plan key.
int64_t alignment_of(uint64_t value) {
  if (value == 0) return kMaxPointerAlign;
  int64_t a = 1;
  while (a < kMaxPointerAlign && value % static_cast<uint64_t>(2 * a) == 0) a *= 2;
  return a;
}
int64_t pointer_alignment(const void* p) {
  return alignment_of(reinterpret_cast<uintptr_t>(p));
}

// Everything a plan depends on, resolved (strides with their defaults filled in).
struct Resolved {
  int64_t lda, ldb, ldd;        // row strides, elements
  int64_t a_bs, b_bs, d_bs;     // batch strides, elements
  int64_t align_a, align_b, align_d;  // of every batch entry's pointer
};

Resolved resolve(const CudaGemmProblem& p) {
  Resolved r{};
  r.lda = p.a.row_stride == 0 ? p.k : p.a.row_stride;
  r.ldb = p.b.row_stride == 0 ? p.k : p.b.row_stride;
  r.ldd = p.d_row_stride == 0 ? p.n : p.d_row_stride;
  r.a_bs = p.a.shared_across_batch ? 0 : p.a.batch_stride == 0 ? p.m * r.lda : p.a.batch_stride;
  r.b_bs = p.b.shared_across_batch ? 0 : p.b.batch_stride == 0 ? p.n * r.ldb : p.b.batch_stride;
  r.d_bs = p.d_batch_stride == 0 ? p.m * r.ldd : p.d_batch_stride;
  const int64_t ea = dtype_storage_bytes(p.a.dtype, 1), eb = dtype_storage_bytes(p.b.dtype, 1);
  const int64_t ed = dtype_storage_bytes(p.d_dtype, 1);
  const bool batched = p.batch > 1;
  r.align_a = std::min(pointer_alignment(p.a.data), batched ? alignment_of(static_cast<uint64_t>(r.a_bs * ea)) : kMaxPointerAlign);
  r.align_b = std::min(pointer_alignment(p.b.data), batched ? alignment_of(static_cast<uint64_t>(r.b_bs * eb)) : kMaxPointerAlign);
  r.align_d = std::min(pointer_alignment(p.d), batched ? alignment_of(static_cast<uint64_t>(r.d_bs * ed)) : kMaxPointerAlign);
  return r;
}

// A bias entry's pointer alignment: its base and, in a batch, its stride.
int64_t bias_alignment(const CudaGemmProblem& p) {
  const int64_t base = pointer_alignment(p.bias);
  if (p.batch <= 1) return base;
  return std::min(base, alignment_of(static_cast<uint64_t>(p.bias_batch_stride) *
                                     static_cast<uint64_t>(dtype_storage_bytes(p.bias_dtype, 1))));
}

using PlanKey = std::array<int64_t, 25>;

PlanKey make_key(const CudaGemmProblem& p, const Resolved& r, const float* a_scales,
                 const float* b_scales, int64_t lt_workspace_bytes) {
  const bool bias = p.bias != nullptr;
  return {p.m, p.n, p.k, p.batch,
          static_cast<int64_t>(p.a.dtype), static_cast<int64_t>(p.b.dtype),
          static_cast<int64_t>(p.d_dtype),
          static_cast<int64_t>(p.a.scale_mode), static_cast<int64_t>(p.b.scale_mode),
          a_scales != nullptr ? pointer_alignment(a_scales) : 0,
          b_scales != nullptr ? pointer_alignment(b_scales) : 0,
          r.lda, r.ldb, r.ldd, r.a_bs, r.b_bs, r.d_bs,
          r.align_a, r.align_b, r.align_d,
          bias ? 1 : 0, bias ? static_cast<int64_t>(p.bias_dtype) : 0,
          bias ? p.bias_batch_stride : 0, bias ? bias_alignment(p) : 0,
          lt_workspace_bytes};
}

// One cached problem shape: the descriptors and the algorithm the heuristic chose for them.
struct Plan {
  LtMatmulDesc desc;
  LtMatrixLayout lt_a;  // our b: column-major [K, N], ld = ldb
  LtMatrixLayout lt_b;  // our a: column-major [K, M], ld = lda
  LtMatrixLayout lt_d;  // our d: column-major [N, M], ld = ldd (also C; beta = 0)
  cublasLtMatmulAlgo_t algo{};
};

Status build_descriptors(const CudaGemmProblem& p, const Resolved& r, bool fp8_fast_accumulation, Plan* plan) {
  LLMQ_RETURN_IF_ERROR(detail::create_matmul_desc(CUBLAS_COMPUTE_32F, CUDA_R_32F, &plan->desc));
  const int32_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  LLMQ_RETURN_IF_ERROR(detail::set_desc_attribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, op_t));
  LLMQ_RETURN_IF_ERROR(detail::set_desc_attribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, op_n));
  if (is_fp8(p.a.dtype)) {
    // Swapped operands: cuBLASLt's A is our b.
    LLMQ_RETURN_IF_ERROR(detail::set_desc_attribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                    lt_scale_mode(p.b.scale_mode)));
    LLMQ_RETURN_IF_ERROR(detail::set_desc_attribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                    lt_scale_mode(p.a.scale_mode)));
    if (fp8_fast_accumulation) {
      const int8_t fast = 1;
      LLMQ_RETURN_IF_ERROR(detail::set_desc_attribute(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast));
    }
  }
  if (p.bias != nullptr) {
    const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = cuda_type(p.bias_dtype);
    LLMQ_RETURN_IF_ERROR(detail::set_desc_attribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue));
    LLMQ_RETURN_IF_ERROR(
        detail::set_desc_attribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type));
    if (p.batch > 1)
      LLMQ_RETURN_IF_ERROR(detail::set_desc_attribute(
          plan->desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, p.bias_batch_stride));
  }
  const int32_t batch = static_cast<int32_t>(p.batch);
  LLMQ_RETURN_IF_ERROR(detail::create_matrix_layout(cuda_type(p.b.dtype), static_cast<uint64_t>(p.k),
                                                    static_cast<uint64_t>(p.n), r.ldb, batch, r.b_bs,
                                                    &plan->lt_a));
  LLMQ_RETURN_IF_ERROR(detail::create_matrix_layout(cuda_type(p.a.dtype), static_cast<uint64_t>(p.k),
                                                    static_cast<uint64_t>(p.m), r.lda, batch, r.a_bs,
                                                    &plan->lt_b));
  LLMQ_RETURN_IF_ERROR(detail::create_matrix_layout(cuda_type(p.d_dtype), static_cast<uint64_t>(p.n),
                                                    static_cast<uint64_t>(p.m), r.ldd, batch, r.d_bs,
                                                    &plan->lt_d));
  return {};
}

// The per-call pointers live in the descriptor; set them before every matmul (and before the
// heuristic, which reads the bias pointer's alignment).
Status bind_pointers(const CudaGemmProblem& p, const float* a_scales, const float* b_scales,
                     const Plan& plan) {
  if (is_fp8(p.a.dtype)) {
    const void* lt_a_scale = b_scales;  // swapped: cuBLASLt's A is our b
    const void* lt_b_scale = a_scales;
    LLMQ_RETURN_IF_ERROR(
        detail::set_desc_attribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, lt_a_scale));
    LLMQ_RETURN_IF_ERROR(
        detail::set_desc_attribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, lt_b_scale));
  }
  if (p.bias != nullptr)
    LLMQ_RETURN_IF_ERROR(detail::set_desc_attribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias));
  return {};
}

// ---- block-scale conversion (llmq row-major -> cuBLASLt), one thread per destination float so
// ---- that the writes are coalesced; the tensors are tiny (rows x K/128 floats).

// 1x128: src [rows, blocks] row-major -> dst outer-major, (r, kb) at kb * rows + r.
__global__ void repack_1x128_scales(const float* __restrict__ src, float* __restrict__ dst,
                                    int64_t rows, int64_t blocks) {
  const int64_t total = rows * blocks;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t kb = i / rows, r = i - kb * rows;
    dst[i] = src[r * blocks + kb];
  }
}

// 128x128: src [row_blocks, blocks] row-major -> dst K-major with stride blocks4 (a multiple of
// 4), pad entries 0.
__global__ void repack_128x128_scales(const float* __restrict__ src, float* __restrict__ dst,
                                      int64_t row_blocks, int64_t blocks, int64_t blocks4) {
  const int64_t total = row_blocks * blocks4;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t rb = i / blocks4, kb = i - rb * blocks4;
    dst[i] = kb < blocks ? src[rb * blocks + kb] : 0.0f;
  }
}

// Does this operand's scale tensor need converting, and into how many bytes of workspace?
int64_t repack_bytes(const CudaGemmInput& x, int64_t rows, int64_t k) {
  if (!is_fp8(x.dtype) || x.scale_layout != ScaleLayout::kRowMajor) return 0;
  if (x.scale_mode == GemmScaleMode::kBlock1x128 ||
      (x.scale_mode == GemmScaleMode::kBlock128x128 && ceil_div(k, 128) % 4 != 0))
    return round_up(cublaslt_scale_count(x.scale_mode, rows, k) * int64_t{sizeof(float)},
                    kWorkspaceAlign);
  return 0;  // tensor, outer vector, and 128x128 with L % 4 == 0 are already in cuBLASLt's order
}

Status repack_scales(const CudaGemmInput& x, int64_t rows, int64_t k, float* dst,
                     cudaStream_t stream) {
  const int64_t blocks = ceil_div(k, 128);
  constexpr int kThreads = 256;
  const int64_t total = cublaslt_scale_count(x.scale_mode, rows, k);
  const int grid = static_cast<int>(std::min<int64_t>(ceil_div(total, kThreads), 1024));
  if (x.scale_mode == GemmScaleMode::kBlock1x128) {
    repack_1x128_scales<<<grid, kThreads, 0, stream>>>(x.scales, dst, rows, blocks);
    LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("repack_1x128_scales");
  } else {
    repack_128x128_scales<<<grid, kThreads, 0, stream>>>(x.scales, dst, ceil_div(rows, 128), blocks,
                                                         round_up(blocks, 4));
    LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("repack_128x128_scales");
  }
  return {};
}

// The M class a tuned algorithm is remembered for (CudaGemmOptions): kernels change their tiling
// at powers of two for small M and by whole waves of tiles for large M.
int64_t m_class(int64_t m) {
  if (m <= 16) return 16;
  if (m <= 256) {
    int64_t c = 32;
    while (c < m) c *= 2;
    return c;
  }
  if (m <= 2048) return round_up(m, 256);
  return round_up(m, 1024);
}

// Two events for timing candidate algorithms, made on first use.
struct TimingEvents {
  cudaEvent_t start = nullptr, stop = nullptr;
  TimingEvents() = default;
  TimingEvents(const TimingEvents&) = delete;
  TimingEvents& operator=(const TimingEvents&) = delete;
  ~TimingEvents() {
    if (start != nullptr) (void)cudaEventDestroy(start);
    if (stop != nullptr) (void)cudaEventDestroy(stop);
  }
  Status ensure() {
    if (start == nullptr) LLMQ_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
    if (stop == nullptr) LLMQ_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
    return {};
  }
};

}  // namespace

struct CudaGemmRunner::Impl {
  int ordinal = 0;
  int sm_major = 0;
  int sm_minor = 0;
  CudaGemmOptions options;
  LtHandle handle;
  std::map<PlanKey, Plan> plans;
  std::map<PlanKey, cublasLtMatmulAlgo_t> tuned;  // keyed by the problem with M replaced by its class
  TimingEvents events;
  int64_t heuristic_queries = 0;

  // Whether a new plan for `p` times the tiles of append_tiles: FP8 with per-token x per-channel
  // scales (the heuristic's one answer; the bits of every tile were checked for these alone), up to
  // the option's M. BF16's heuristic gives several answers, and searching its tiles lost a little.
  bool tile_search(const CudaGemmProblem& p) const {
    return p.m <= options.tile_search_max_m && is_fp8(p.a.dtype) && p.a.scale_mode == GemmScaleMode::kOuterVector &&
           p.b.scale_mode == GemmScaleMode::kOuterVector;
  }

  // One GEMM with `algo` on the plan's descriptors and the problem's pointers.
  cublasStatus_t matmul(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const CudaGemmProblem& p,
                        void* lt_workspace, int64_t lt_workspace_bytes, cudaStream_t stream) {
    const float alpha = 1.0f, beta = 0.0f;  // the scales are in the descriptor; C is unused
    return cublasLtMatmul(handle.get(), plan.desc.get(), &alpha, p.b.data, plan.lt_a.get(), p.a.data,
                          plan.lt_b.get(), &beta, p.d, plan.lt_d.get(), p.d, plan.lt_d.get(), &algo,
                          lt_workspace, static_cast<size_t>(lt_workspace_bytes), stream);
  }

  // Times each candidate on the problem itself (it writes D, which the caller's run overwrites)
  // and returns the index of the fastest; candidates cuBLASLt fails to run are passed over.
  Status fastest(const Plan& plan, const cublasLtMatmulHeuristicResult_t* results, int count,
                 const CudaGemmProblem& p, void* lt_workspace, int64_t lt_workspace_bytes,
                 cudaStream_t stream, int* best) {
    LLMQ_RETURN_IF_ERROR(events.ensure());
    float best_ms = 0.0f;
    bool have = false;
    *best = 0;
    for (int i = 0; i < count; ++i) {
      if (matmul(plan, results[i].algo, p, lt_workspace, lt_workspace_bytes, stream) != CUBLAS_STATUS_SUCCESS)
        continue;
      LLMQ_CUDA_RETURN_IF_ERROR(cudaEventRecord(events.start, stream));
      bool ran = true;
      for (int r = 0; r < options.timed_runs && ran; ++r)
        ran = matmul(plan, results[i].algo, p, lt_workspace, lt_workspace_bytes, stream) == CUBLAS_STATUS_SUCCESS;
      LLMQ_CUDA_RETURN_IF_ERROR(cudaEventRecord(events.stop, stream));
      LLMQ_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(events.stop));
      float ms = 0.0f;
      LLMQ_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, events.start, events.stop));
      if (ran && (!have || ms < best_ms)) {
        have = true;
        best_ms = ms;
        *best = i;
      }
    }
    return {};
  }

  // Finds the plan for `key`, building it (and asking the heuristic, and with autotuning timing its
  // answers) on a miss.
  Status plan_for(const PlanKey& key, const CudaGemmProblem& p, const Resolved& r,
                  const float* a_scales, const float* b_scales, void* lt_workspace,
                  int64_t lt_workspace_bytes, cudaStream_t stream, Plan** out) {
    auto it = plans.find(key);
    if (it != plans.end()) {
      *out = &it->second;
      return {};
    }
    Plan plan;
    LLMQ_RETURN_IF_ERROR(build_descriptors(p, r, options.fp8_fast_accumulation, &plan));
    LLMQ_RETURN_IF_ERROR(bind_pointers(p, a_scales, b_scales, plan));
    LtPreference pref;
    LLMQ_RETURN_IF_ERROR(detail::create_preference(&pref));
    const uint64_t max_workspace = static_cast<uint64_t>(lt_workspace_bytes);
    LLMQ_RETURN_IF_ERROR(detail::set_preference_attribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_workspace));
    // Promise only the alignment these pointers have (cuBLASLt assumes 256 bytes otherwise).
    const uint32_t align_a = static_cast<uint32_t>(r.align_b);  // cuBLASLt's A is our b
    const uint32_t align_b = static_cast<uint32_t>(r.align_a);
    const uint32_t align_d = static_cast<uint32_t>(r.align_d);
    LLMQ_RETURN_IF_ERROR(detail::set_preference_attribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a));
    LLMQ_RETURN_IF_ERROR(detail::set_preference_attribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b));
    LLMQ_RETURN_IF_ERROR(detail::set_preference_attribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d));
    LLMQ_RETURN_IF_ERROR(detail::set_preference_attribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d));

    constexpr int kMaxCandidates = 32;
    std::array<cublasLtMatmulHeuristicResult_t, kMaxCandidates> results{};
    const int wanted = std::clamp(options.autotune_candidates, 1, kMaxCandidates);
    int returned = 0;
    ++heuristic_queries;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        handle.get(), plan.desc.get(), plan.lt_a.get(), plan.lt_b.get(), plan.lt_d.get(),
        plan.lt_d.get(), pref.get(), wanted, results.data(), &returned);
    // can_implement has vetted our side, so INVALID_VALUE here is cuBLASLt refusing the combination
    // (e.g. an epilogue it does not offer with these scale modes), like NOT_SUPPORTED.
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE ||
        (st == CUBLAS_STATUS_SUCCESS && returned == 0))
      return unsupported("cuBLASLt has no algorithm for " + describe(p) + " (heuristic: " +
                         cublasLtGetStatusName(st) + ", " + std::to_string(returned) + " results)");
    LLMQ_RETURN_IF_ERROR(detail::cublas_status(st, "cublasLtMatmulAlgoGetHeuristic"));
    plan.algo = results[0].algo;
    if (returned > 1 || tile_search(p)) LLMQ_RETURN_IF_ERROR(choose_tuned(p, a_scales, b_scales, lt_workspace, lt_workspace_bytes,
                                                         stream, results.data(), returned, &plan));
    auto inserted = plans.emplace(key, std::move(plan));
    *out = &inserted.first->second;
    return {};
  }

  // The tiles a tile search times besides the heuristic's (CudaGemmOptions::tile_search_max_m): of
  // `first`'s algorithm, those cuBLASLt accepts for the plan's problem within the workspace, cut
  // 64, 128 or 256 weight rows by the M class's tokens (at most 256), three quarters or half of
  // them. At decode sizes the fastest cut varied by shape (H200, Llama-3-8B FP8 at M = 64: 64 x 64
  // for the down projection, 128 x 64 for gate/up, 128 x 32 for O), and a search of every tile the
  // algorithm offers (~70 here) costs a new M class ~70 ms where these nine cost a few. The
  // algorithm, its K split (none) and its reduction stay `first`'s: every candidate gave the same
  // bits.
  void append_tiles(const Plan& plan, const cublasLtMatmulHeuristicResult_t& first, int64_t m,
                    int64_t lt_workspace_bytes, std::vector<cublasLtMatmulHeuristicResult_t>* out) {
    size_t bytes = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&first.algo, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &bytes) !=
            CUBLAS_STATUS_SUCCESS ||
        bytes == 0)
      return;
    std::vector<int32_t> offered(bytes / sizeof(int32_t));
    if (cublasLtMatmulAlgoCapGetAttribute(&first.algo, CUBLASLT_ALGO_CAP_TILE_IDS, offered.data(), bytes, &bytes) !=
        CUBLAS_STATUS_SUCCESS)
      return;
    int32_t first_tile = 0;
    (void)cublasLtMatmulAlgoConfigGetAttribute(&first.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &first_tile,
                                               sizeof(first_tile), nullptr);
    const int64_t tokens = std::min<int64_t>(m_class(m), 256);
    for (int64_t t : {tokens, tokens * 3 / 4, tokens / 2}) {
      for (int64_t w : {64, 128, 256}) {
        const int32_t tile = tile_id(w, t);
        if (tile == CUBLASLT_MATMUL_TILE_UNDEFINED || tile == first_tile ||
            std::find(offered.begin(), offered.end(), tile) == offered.end())
          continue;
        cublasLtMatmulHeuristicResult_t v = first;
        if (cublasLtMatmulAlgoConfigSetAttribute(&v.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile)) !=
            CUBLAS_STATUS_SUCCESS)
          continue;
        cublasLtMatmulHeuristicResult_t check{};
        if (cublasLtMatmulAlgoCheck(handle.get(), plan.desc.get(), plan.lt_a.get(), plan.lt_b.get(), plan.lt_d.get(),
                                    plan.lt_d.get(), &v.algo, &check) != CUBLAS_STATUS_SUCCESS ||
            check.workspaceSize > static_cast<size_t>(lt_workspace_bytes))
          continue;
        out->push_back(v);
      }
    }
  }

  // Autotuning (CudaGemmOptions): the algorithm remembered for this M class if cuBLASLt accepts it
  // for this M, else the fastest candidate timed now (not while the stream is being captured).
  Status choose_tuned(const CudaGemmProblem& p, const float* a_scales, const float* b_scales, void* lt_workspace,
                      int64_t lt_workspace_bytes, cudaStream_t stream, const cublasLtMatmulHeuristicResult_t* results,
                      int count, Plan* plan) {
    CudaGemmProblem cls = p;
    cls.m = m_class(p.m);
    const PlanKey class_key = make_key(cls, resolve(cls), a_scales, b_scales, lt_workspace_bytes);
    auto known = tuned.find(class_key);
    if (known != tuned.end()) {
      cublasLtMatmulHeuristicResult_t check{};
      if (cublasLtMatmulAlgoCheck(handle.get(), plan->desc.get(), plan->lt_a.get(), plan->lt_b.get(),
                                  plan->lt_d.get(), plan->lt_d.get(), &known->second, &check) == CUBLAS_STATUS_SUCCESS &&
          check.workspaceSize <= static_cast<size_t>(lt_workspace_bytes))
        plan->algo = known->second;
      return {};
    }
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) return {};
    std::vector<cublasLtMatmulHeuristicResult_t> candidates(results, results + count);
    if (tile_search(p)) append_tiles(*plan, results[0], p.m, lt_workspace_bytes, &candidates);
    int best = 0;
    LLMQ_RETURN_IF_ERROR(fastest(*plan, candidates.data(), static_cast<int>(candidates.size()), p, lt_workspace,
                                 lt_workspace_bytes, stream, &best));
    plan->algo = candidates[best].algo;
    tuned.emplace(class_key, plan->algo);
    return {};
  }
};

CudaGemmRunner::CudaGemmRunner() : impl_(std::make_unique<Impl>()) {}
CudaGemmRunner::~CudaGemmRunner() = default;

Status CudaGemmRunner::create(int device_ordinal, std::unique_ptr<CudaGemmRunner>* out) {
  return create(device_ordinal, CudaGemmOptions{}, out);
}

Status CudaGemmRunner::create(int device_ordinal, const CudaGemmOptions& options, std::unique_ptr<CudaGemmRunner>* out) {
  if (options.autotune_candidates < 1 || options.timed_runs < 1)
    return invalid_argument("CudaGemmOptions: autotune_candidates = " + std::to_string(options.autotune_candidates) +
                            " and timed_runs = " + std::to_string(options.timed_runs) + " must be >= 1");
  if (out == nullptr) return invalid_argument("out: null");
  std::unique_ptr<CudaGemmRunner> runner(new CudaGemmRunner());
  // The compute capability from the device facts (query_cuda_device checks the ordinal).
  CudaDeviceInfo info;
  LLMQ_RETURN_IF_ERROR(query_cuda_device(device_ordinal, &info));
  runner->impl_->sm_major = info.major;
  runner->impl_->sm_minor = info.minor;
  runner->impl_->ordinal = device_ordinal;
  runner->impl_->options = options;
  LLMQ_RETURN_IF_ERROR(detail::create_lt_handle(&runner->impl_->handle));
  *out = std::move(runner);
  return {};
}

Status CudaGemmRunner::can_implement(const CudaGemmProblem& p) const {
  return cuda_gemm_can_implement(p, impl_->sm_major, impl_->sm_minor);
}

int64_t CudaGemmRunner::workspace_size(const CudaGemmProblem& p) const {
  return repack_bytes(p.a, p.m, p.k) + repack_bytes(p.b, p.n, p.k) + kCublasLtWorkspaceBytes;
}

Status CudaGemmRunner::run(const CudaGemmProblem& p, void* workspace, int64_t workspace_bytes,
                           CudaStream stream) {
  LLMQ_RETURN_IF_ERROR(can_implement(p));
  if (p.a.data == nullptr || p.b.data == nullptr || p.d == nullptr)
    return invalid_argument("a.data, b.data and d must be device pointers, got a null one");
  int current = -1;
  LLMQ_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
  if (current != impl_->ordinal)
    return invalid_argument("the runner belongs to device " + std::to_string(impl_->ordinal) +
                            " but device " + std::to_string(current) + " is current");

  // Workspace: converted scales first (256-byte aligned pieces), cuBLASLt gets the rest.
  const int64_t a_repack = repack_bytes(p.a, p.m, p.k), b_repack = repack_bytes(p.b, p.n, p.k);
  if (workspace_bytes < a_repack + b_repack || workspace_bytes < 0)
    return invalid_argument("workspace: " + std::to_string(workspace_bytes) +
                            " bytes, but converting the block scales needs " +
                            std::to_string(a_repack + b_repack) + " (workspace_size() = " +
                            std::to_string(workspace_size(p)) + ")");
  if (workspace_bytes > 0 &&
      (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % kWorkspaceAlign != 0))
    return invalid_argument("workspace must be a 256-byte aligned device pointer");
  char* ws = static_cast<char*>(workspace);
  const float* a_scales = p.a.scales;
  const float* b_scales = p.b.scales;
  if (a_repack > 0) {
    LLMQ_RETURN_IF_ERROR(repack_scales(p.a, p.m, p.k, reinterpret_cast<float*>(ws), stream));
    a_scales = reinterpret_cast<const float*>(ws);
  }
  if (b_repack > 0) {
    LLMQ_RETURN_IF_ERROR(repack_scales(p.b, p.n, p.k, reinterpret_cast<float*>(ws + a_repack), stream));
    b_scales = reinterpret_cast<const float*>(ws + a_repack);
  }
  void* lt_workspace = workspace_bytes > a_repack + b_repack ? ws + a_repack + b_repack : nullptr;
  const int64_t lt_workspace_bytes = lt_workspace != nullptr ? workspace_bytes - a_repack - b_repack : 0;

  const Resolved r = resolve(p);
  const PlanKey key = make_key(p, r, a_scales, b_scales, lt_workspace_bytes);
  Plan* plan = nullptr;
  LLMQ_RETURN_IF_ERROR(impl_->plan_for(key, p, r, a_scales, b_scales, lt_workspace, lt_workspace_bytes, stream, &plan));
  LLMQ_RETURN_IF_ERROR(bind_pointers(p, a_scales, b_scales, *plan));

  const cublasStatus_t st = impl_->matmul(*plan, plan->algo, p, lt_workspace, lt_workspace_bytes, stream);
  if (st != CUBLAS_STATUS_SUCCESS) {
    const Status failed = detail::cublas_status(st, "cublasLtMatmul");
    return {failed.code(), describe(p) + ": " + failed.message()};
  }
  return {};
}

int CudaGemmRunner::device_ordinal() const { return impl_->ordinal; }
const CudaGemmOptions& CudaGemmRunner::options() const { return impl_->options; }
int64_t CudaGemmRunner::heuristic_queries() const { return impl_->heuristic_queries; }
int64_t CudaGemmRunner::cached_plans() const { return static_cast<int64_t>(impl_->plans.size()); }
int64_t CudaGemmRunner::tuned_shapes() const { return static_cast<int64_t>(impl_->tuned.size()); }

}  // namespace llmq
