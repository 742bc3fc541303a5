// GEMM on the GPU through cuBLASLt: D[M, N] = (scale_a (x) scale_b) * (A[M, K] * B[N, K]^T)
// (+ bias[N]), the same problem as the CPU reference quantized_gemm (gemm.hpp). A holds the
// activations, B the weights in nn.Linear layout, both row-major (K contiguous). FP8 operands
// (E4M3, or E5M2 on one side) with FP32 scales, or BF16 operands with no scales (the peer FP8 is
// measured against). FP32 accumulation; BF16 or FP32 output. No CUDA headers here.
//
// Lifecycle (CUTLASS / FlashInfer style): CudaGemmRunner::create once per device, then
// can_implement(problem) says why a problem cannot run, workspace_size(problem) how many bytes of
// workspace run() wants, and run(problem, workspace, stream) enqueues it. The caller owns the
// workspace and the stream. The runner caches one cuBLASLt plan (descriptors and the algorithm the
// heuristic chose) per problem shape, so cublasLtMatmulAlgoGetHeuristic runs once per shape.
//
// Scale tensors (all float32, device memory), for an operand of [rows, K] (rows = M for a, N
// for b) and L = ceil(K / 128):
//   kTensor        one float; a null pointer means 1.
//   kOuterVector   a: per-token scale[M]; b: per-channel scale[N]. Both operands must use it.
//   kBlock1x128    one scale per 1 x 128 block along K.
//   kBlock128x128  one scale per 128 x 128 block.
// Pairs cuBLASLt runs (cuBLAS 13 docs 3.1.4): tensor x tensor (sm_89+); outer-vector x outer-vector,
// and blocks as 1x128 x 128x128, 1x128 x 1x128 or 128x128 x 1x128 (sm_90 only; blocks need
// M % 4 == 0). Never 128x128 on both operands, never a mix of the three families.
// ScaleLayout::kRowMajor is llmq's ScaleSet layout, row-major [ceil(rows / br), ceil(K / bc)]:
//   1x128: [rows, L];  128x128: [ceil(rows / 128), L];  tensor / outer vector: [1, 1] / [rows, 1].
// cuBLASLt wants the block scales in another order (cuBLAS docs 3.1.4.5.1; our a is cuBLASLt's B
// operand and our b its A, see src/cuda/fp8_gemm.cu):
//   1x128:   outer-major, element (r, kb) at kb * rows + r            (rows * L floats)
//   128x128: K-major with the stride rounded up to L4 = round_up(L, 4),
//            element (rb, kb) at rb * L4 + kb, pad entries unused     (ceil(rows / 128) * L4 floats)
// With kRowMajor, run() converts block scales into its workspace with one small kernel per
// operand on the caller's stream (none for 128x128 when L is a multiple of 4: the layouts then
// coincide). With kCublasLt the caller passes that order already (pack_scales_for_cublaslt below
// converts once on the host, e.g. weights at load time) and nothing is copied.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "llmq/cuda_stream.hpp"
#include "llmq/dtype.hpp"
#include "llmq/status.hpp"

namespace llmq {

enum class GemmScaleMode { kTensor, kOuterVector, kBlock1x128, kBlock128x128 };
enum class ScaleLayout { kRowMajor, kCublasLt };

const char* gemm_scale_mode_name(GemmScaleMode mode);  // "tensor", "outer-vector", "1x128", ...

// One input matrix [rows, K] in device memory, rows = M for a and N for b. Strides in elements.
struct CudaGemmInput {
  const void* data = nullptr;
  DType dtype = DType::kE4M3;  // kE4M3, kE5M2 or kBF16
  int64_t row_stride = 0;      // elements between rows; 0 means K
  int64_t batch_stride = 0;    // elements between batch entries; 0 means rows * row_stride
  GemmScaleMode scale_mode = GemmScaleMode::kTensor;
  ScaleLayout scale_layout = ScaleLayout::kRowMajor;
  const float* scales = nullptr;  // FP8 only (BF16 operands take none)
  // One matrix read by every batch entry (a batch stride of 0): the dense MoE path, where every
  // expert multiplies the same activations. batch_stride is then ignored.
  bool shared_across_batch = false;
};

struct CudaGemmProblem {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  // Strided batch (MoE experts): entry i reads a.data + i * a.batch_stride, and so on. cuBLASLt
  // has no batch stride for scales, so batch > 1 takes per-tensor scales shared by every entry
  // (per-expert scales belong in a post-GEMM scaling pass).
  int64_t batch = 1;
  CudaGemmInput a;  // activations [M, K]
  CudaGemmInput b;  // weights [N, K]
  void* d = nullptr;  // [M, N] row-major
  DType d_dtype = DType::kBF16;  // kBF16 or kF32
  int64_t d_row_stride = 0;      // 0 means N
  int64_t d_batch_stride = 0;    // 0 means M * d_row_stride
  // Optional bias[N], added in FP32 after the scales. cuBLASLt fixes its type: BF16 for FP8
  // operands (whatever the output), the output type for BF16 operands (required_bias_dtype).
  const void* bias = nullptr;
  DType bias_dtype = DType::kBF16;
  int64_t bias_batch_stride = 0;  // 0: one bias for every batch entry
};

// The bias type cuBLASLt accepts for this problem's operand and output types.
DType required_bias_dtype(const CudaGemmProblem& p);

// Why the problem cannot run on a device of compute capability sm_major.sm_minor (ok when it can):
// dtypes, shapes, strides, pointer alignment (16 bytes; cuBLASLt's FP8 kernels need it), scale
// modes and their combinations as the cuBLAS 13 documentation lists them. Host-only logic.
Status cuda_gemm_can_implement(const CudaGemmProblem& p, int sm_major, int sm_minor);

// "fp8 gemm M=16 N=208 K=336 batch=1 a=e4m3/1x128 b=e4m3/128x128 out=bf16 bias=bf16"
std::string describe(const CudaGemmProblem& p);

// Floats in an operand's scale tensor [rows, K] in llmq's row-major layout and in cuBLASLt's.
int64_t row_major_scale_count(GemmScaleMode mode, int64_t rows, int64_t k);
int64_t cublaslt_scale_count(GemmScaleMode mode, int64_t rows, int64_t k);
// Converts llmq's row-major scales (host) into cuBLASLt's layout (host, cublaslt_scale_count
// floats; padding entries are written as 0). Tensor and outer-vector scales are copied as they are.
Status pack_scales_for_cublaslt(GemmScaleMode mode, int64_t rows, int64_t k, const float* row_major,
                                float* cublaslt);

// Workspace cuBLASLt gets by default: NVIDIA recommends 32 MiB on Hopper (cublasSetWorkspace).
inline constexpr int64_t kCublasLtWorkspaceBytes = int64_t{32} << 20;

// How the runner picks cuBLASLt's algorithm for a new problem shape.
struct CudaGemmOptions {
  // 1: the heuristic's first answer. N > 1: the heuristic's first N answers are each timed on the
  // problem itself (one untimed run, then `timed_runs`), and the fastest is kept for the shape's M
  // class (M rounded up to 16, a power of two up to 256, a multiple of 256 up to 2048, then of 1024),
  // so that an engine whose M changes every step tunes about twenty classes, not every M. Tuning
  // synchronizes the stream, and is skipped while the stream is being captured into a graph (the
  // heuristic's first answer then, not remembered). Results may differ in the last bits between
  // algorithms, so a tuned run is reproducible within a process, not across processes.
  int autotune_candidates = 1;
  // FP8 problems with per-token x per-channel scales and M up to this also time up to nine other
  // tiles of cuBLASLt's first algorithm (64, 128 or 256 weight rows by the M class's tokens, three
  // quarters or half of them; the same algorithm, K unsplit, so the same bits) and keep the fastest
  // for the M class, as above (timed on first use, not while capturing). For FP8 the heuristic gives
  // one answer, a 128 x 128 tile, which at decode sizes runs the N = 4096 projections on 32-64 CTAs
  // of the 132 SMs (H200, Llama-3-8B FP8 decode steps: 64 rows 5.01 -> 3.88 ms, 192 rows 6.81 ->
  // 5.78). 0: off.
  int64_t tile_search_max_m = 0;
  int timed_runs = 3;
  // FP8 GEMMs accumulate in the tensor core's own accumulator over all of K (cuBLASLt's FAST_ACCUM),
  // instead of promoting partial sums to FP32 as they go. Faster (H100, Llama-3-8B shapes: 5% off a
  // decode step of 512 rows and off a prefill of 8192; vLLM's and TensorRT-LLM's FP8 GEMMs accumulate
  // this way), but that accumulator keeps fewer bits than FP32 (DeepSeek-V3's report: about 14), so
  // results drift further from the CPU reference; docs/kernels.md has the measured effect (tested
  // and measured with tensor and outer-vector scales).
  bool fp8_fast_accumulation = false;
};

// Owns a cuBLASLt handle and the plan cache for one device. Not thread-safe: use one runner per
// thread (the plan descriptors carry the per-call scale and bias pointers).
class CudaGemmRunner {
 public:
  // Fails with kUnsupported without CUDA or without a device at `device_ordinal`.
  static Status create(int device_ordinal, std::unique_ptr<CudaGemmRunner>* out);
  static Status create(int device_ordinal, const CudaGemmOptions& options, std::unique_ptr<CudaGemmRunner>* out);
  ~CudaGemmRunner();
  CudaGemmRunner(const CudaGemmRunner&) = delete;
  CudaGemmRunner& operator=(const CudaGemmRunner&) = delete;

  // cuda_gemm_can_implement for this runner's device (FP8 needs sm_89+, finer scales sm_90).
  Status can_implement(const CudaGemmProblem& p) const;
  // Bytes run() wants: scratch for converted block scales plus kCublasLtWorkspaceBytes.
  int64_t workspace_size(const CudaGemmProblem& p) const;
  // Enqueues the GEMM on `stream` (the runner's device must be current). The workspace (256-byte
  // aligned, device memory) must hold at least the converted scales; cuBLASLt gets the rest, and
  // its size is part of the plan key. cuBLASLt refusing a valid problem (no algorithm) gives
  // kUnsupported naming the problem.
  Status run(const CudaGemmProblem& p, void* workspace, int64_t workspace_bytes, CudaStream stream);

  int device_ordinal() const;
  const CudaGemmOptions& options() const;  // as created
  int64_t heuristic_queries() const;  // cublasLtMatmulAlgoGetHeuristic calls so far
  int64_t cached_plans() const;
  int64_t tuned_shapes() const;  // M classes whose algorithm was chosen by timing

 private:
  CudaGemmRunner();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace llmq
