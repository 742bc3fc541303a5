// GPU tests of the cuBLASLt GEMM runner (include/llmq/cuda_gemm.hpp): the plumbing, each against
// the CPU reference quantized_gemm on the very same operands. Strided batch with gaps between
// entries, per-batch bias, strided output rows, NaN-poisoned outputs (every element written,
// padding untouched), determinism, the plan cache (a second call does not query the heuristic),
// autotuning per M class,
// both scale layouts, BF16 x BF16, can_implement naming why a problem cannot run, and the table
// of scale-mode pairs this device runs. The numerics are tested in test_cuda_fp8_gemm.cu.
// Every test SKIPs (visibly) without an FP8 GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda_gemm_support.hpp"
#include "cuda_support.hpp"
#include "llmq/cuda_gemm.hpp"
#include "llmq/format.hpp"
#include "llmq/gemm.hpp"
#include "llmq/quantize_tensor.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using namespace cuda_gemm_test;  // NOLINT: the suite's shared helpers

// ---------------------------------------------------------------------------------------------
// Scale layouts: llmq's row-major (converted by the runner) and cuBLASLt's own (packed on the
// host) give the same bits.

TEST_F(CudaGemmTest, RowMajorAndCublasLtScaleLayoutsAgree) {
  const int64_t m = 128, n = 208, k = 336;
  const std::vector<float> x = testing::outlier_matrix(m, k, 41);
  const std::vector<float> w = testing::normal_vector(n * k, 42, 0.05f);
  QuantizedTensor qa, qb;
  ASSERT_TRUE(quantize(matrix_view(x.data(), m, k), QuantSpec::per_block(DType::kE4M3, 1, 128), &qa).ok());
  ASSERT_TRUE(quantize(matrix_view(w.data(), n, k), QuantSpec::per_block(DType::kE4M3, 128, 128), &qb).ok());
  const DeviceOperand da = upload_operand(qa), db = upload_operand(qb);
  std::vector<float> pa(static_cast<size_t>(cublaslt_scale_count(GemmScaleMode::kBlock1x128, m, k)));
  std::vector<float> pb(static_cast<size_t>(cublaslt_scale_count(GemmScaleMode::kBlock128x128, n, k)));
  ASSERT_TRUE(pack_scales_for_cublaslt(GemmScaleMode::kBlock1x128, m, k, qa.scales.scales.data_as<float>(), pa.data()).ok());
  ASSERT_TRUE(pack_scales_for_cublaslt(GemmScaleMode::kBlock128x128, n, k, qb.scales.scales.data_as<float>(), pb.data()).ok());
  const DeviceBuffer dpa = upload(pa), dpb = upload(pb);

  const DeviceBuffer d_row_major = poisoned(static_cast<size_t>(m * n * 2));
  const DeviceBuffer d_native = poisoned(static_cast<size_t>(m * n * 2));
  CudaGemmProblem p = problem_of(m, n, k,
                                 input_of(da, DType::kE4M3, GemmScaleMode::kBlock1x128),
                                 input_of(db, DType::kE4M3, GemmScaleMode::kBlock128x128), d_row_major.get());
  // Each run gets exactly workspace_size(): cuBLASLt then sees the same 32 MiB both times, so
  // both runs use one plan (one algorithm) and must agree bit for bit.
  const int64_t converting = runner_->workspace_size(p);
  EXPECT_GT(converting, kCublasLtWorkspaceBytes);  // scratch for the conversion
  const Status st = runner_->run(p, workspace_.get(), converting, stream_);
  ASSERT_TRUE(st.ok()) << st.to_string();

  p.a.scales = dpa.as<float>();
  p.a.scale_layout = ScaleLayout::kCublasLt;
  p.b.scales = dpb.as<float>();
  p.b.scale_layout = ScaleLayout::kCublasLt;
  p.d = d_native.get();
  EXPECT_EQ(runner_->workspace_size(p), kCublasLtWorkspaceBytes);  // nothing to convert
  const Status st_native = runner_->run(p, workspace_.get(), kCublasLtWorkspaceBytes, stream_);
  ASSERT_TRUE(st_native.ok()) << st_native.to_string();
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(runner_->cached_plans(), 1);
  EXPECT_EQ(download(d_row_major), download(d_native));
}

// ---------------------------------------------------------------------------------------------
// Strided batch (MoE experts): per-tensor scales shared by the batch, gaps between entries,
// a bias per entry.

TEST_F(CudaGemmTest, StridedBatchMatchesPerEntryReference) {
  const int64_t batch = 3, n = 208, k = 336;
  for (int64_t m : {1, 16}) {
    const uint64_t seed = 4000 + static_cast<uint64_t>(m);
    // One per-tensor scale over all entries: quantize the stacked matrices, then slice.
    const std::vector<float> x = testing::outlier_matrix(batch * m, k, seed);
    const std::vector<float> w = testing::normal_vector(batch * n * k, seed + 1, 0.05f);
    QuantizedTensor qa_all, qb_all;
    ASSERT_TRUE(quantize(matrix_view(x.data(), batch * m, k), QuantSpec::per_tensor(DType::kE4M3), &qa_all).ok());
    ASSERT_TRUE(quantize(matrix_view(w.data(), batch * n, k), QuantSpec::per_tensor(DType::kE4M3), &qb_all).ok());
    const std::vector<float> bias_all = bf16_grid_bias(batch * n, seed + 2);

    // Device layout with gaps: a entries every m*k + 64 bytes, d entries every m*n + 32 elements.
    const int64_t a_stride = m * k + 64, d_stride = m * n + 32;
    std::vector<uint8_t> a_host(static_cast<size_t>(batch * a_stride), 0);
    for (int64_t e = 0; e < batch; ++e)
      std::memcpy(a_host.data() + e * a_stride, qa_all.data.data_as<uint8_t>() + e * m * k,
                  static_cast<size_t>(m * k));
    const DeviceBuffer da = upload(a_host);
    const DeviceBuffer db = upload(qb_all.data.data(), static_cast<size_t>(qb_all.data.nbytes()));
    const DeviceBuffer dsa = upload(qa_all.scales.scales.data(), 4);
    const DeviceBuffer dsb = upload(qb_all.scales.scales.data(), 4);
    const DeviceBuffer dbias = upload(to_bf16_bits(bias_all));
    const DeviceBuffer dd = poisoned(static_cast<size_t>(batch * d_stride * 2));

    CudaGemmProblem p;
    p.m = m;
    p.n = n;
    p.k = k;
    p.batch = batch;
    p.a.data = da.get();
    p.a.batch_stride = a_stride;
    p.a.scales = dsa.as<float>();
    p.b.data = db.get();
    p.b.scales = dsb.as<float>();
    p.d = dd.get();
    p.d_batch_stride = d_stride;
    p.bias = dbias.get();
    p.bias_batch_stride = n;
    const Status st = run(p);
    ASSERT_TRUE(st.ok()) << describe(p) << ": " << st.to_string();
    const std::vector<uint8_t> got = download(dd);

    for (int64_t e = 0; e < batch; ++e) {
      // The reference on entry e's slices.
      QuantizedTensor qa = qa_all, qb = qb_all;
      qa.rows = m;
      qa.data = Tensor(DType::kE4M3, {m, k});
      std::memcpy(qa.data.data(), qa_all.data.data_as<uint8_t>() + e * m * k, static_cast<size_t>(m * k));
      qa.scales.block = {m, k};
      qb.rows = n;
      qb.data = Tensor(DType::kE4M3, {n, k});
      std::memcpy(qb.data.data(), qb_all.data.data_as<uint8_t>() + e * n * k, static_cast<size_t>(n * k));
      qb.scales.block = {n, k};
      const std::vector<float> bias(bias_all.begin() + e * n, bias_all.begin() + (e + 1) * n);
      const std::vector<float> want = reference(qa, qb, DType::kBF16, &bias);
      int64_t nans = 0;
      const std::vector<float> entry = read_output(got, DType::kBF16, m, n, n, e * d_stride, &nans);
      const std::string what = describe(p) + " entry " + std::to_string(e) + " seed=" + std::to_string(seed);
      EXPECT_EQ(nans, 0) << what;
      const double err = rel_frobenius(entry, want);
      EXPECT_LT(err, kRelFrobError) << what;
      std::printf("[ measured ] rel frobenius %.3e  %s\n", err, what.c_str());
      // The gap after each entry is never written.
      for (int64_t i = m * n; i < d_stride; ++i)
        ASSERT_EQ(output_bits(got, DType::kBF16, e * d_stride + i), 0xFFFFu) << what << " gap " << i;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Plan cache, output strides, determinism.

TEST_F(CudaGemmTest, PlanCacheQueriesTheHeuristicOncePerShape) {
  std::unique_ptr<CudaGemmRunner> runner;
  ASSERT_TRUE(CudaGemmRunner::create(0, &runner).ok());
  const int64_t n = 208, k = 336;
  const QuantizedTensor qb = grid_operand(DType::kE4M3, GemmScaleMode::kTensor, n, k, 7);
  const DeviceOperand db = upload_operand(qb);
  auto problem = [&](const DeviceOperand& da, const DeviceBuffer& dd, int64_t m) {
    CudaGemmProblem p = problem_of(m, n, k,
                                   input_of(da, DType::kE4M3, GemmScaleMode::kTensor),
                                   input_of(db, DType::kE4M3, GemmScaleMode::kTensor), dd.get());
    return p;
  };
  const DeviceOperand a16 = upload_operand(grid_operand(DType::kE4M3, GemmScaleMode::kTensor, 16, k, 8));
  const DeviceOperand a16b = upload_operand(grid_operand(DType::kE4M3, GemmScaleMode::kTensor, 16, k, 9));
  const DeviceOperand a32 = upload_operand(grid_operand(DType::kE4M3, GemmScaleMode::kTensor, 32, k, 10));
  const DeviceBuffer d1 = poisoned(32 * n * 2), d2 = poisoned(32 * n * 2);

  ASSERT_TRUE(run(problem(a16, d1, 16), runner.get()).ok());
  EXPECT_EQ(runner->heuristic_queries(), 1);
  EXPECT_EQ(runner->cached_plans(), 1);
  // Same shape, other buffers: a cache hit.
  ASSERT_TRUE(run(problem(a16b, d2, 16), runner.get()).ok());
  EXPECT_EQ(runner->heuristic_queries(), 1);
  EXPECT_EQ(runner->cached_plans(), 1);
  // Another M: one more plan.
  ASSERT_TRUE(run(problem(a32, d1, 32), runner.get()).ok());
  EXPECT_EQ(runner->heuristic_queries(), 2);
  EXPECT_EQ(runner->cached_plans(), 2);
  ASSERT_TRUE(run(problem(a16, d2, 16), runner.get()).ok());
  EXPECT_EQ(runner->heuristic_queries(), 2);
}

// Autotuning (CudaGemmOptions): every candidate the runner may keep computes the same product, one
// timing per M class (100 and 120 share the class 128), none while the stream is being captured.
TEST_F(CudaGemmTest, AutotunedRunnerTunesOncePerMClassAndMatchesReference) {
  std::unique_ptr<CudaGemmRunner> refused;
  CudaGemmOptions bad;
  bad.autotune_candidates = 0;
  EXPECT_EQ(CudaGemmRunner::create(0, bad, &refused).code(), StatusCode::kInvalidArgument);
  CudaGemmOptions tune;
  tune.autotune_candidates = 8;
  std::unique_ptr<CudaGemmRunner> runner;
  ASSERT_TRUE(CudaGemmRunner::create(0, tune, &runner).ok());
  const int64_t n = 384, k = 1024;
  const std::vector<float> w = testing::normal_vector(n * k, 61, 0.05f);
  QuantizedTensor qb;
  ASSERT_TRUE(quantize(matrix_view(w.data(), n, k), QuantSpec::per_channel(DType::kE4M3), &qb).ok());
  const DeviceOperand db = upload_operand(qb);
  auto check = [&](int64_t m, uint64_t seed, bool capture) {
    const std::vector<float> x = testing::outlier_matrix(m, k, seed);
    QuantizedTensor qa;
    ASSERT_TRUE(quantize(matrix_view(x.data(), m, k), QuantSpec::per_token(DType::kE4M3), &qa).ok());
    const DeviceOperand da = upload_operand(qa);
    const DeviceBuffer d = poisoned(static_cast<size_t>(m * n * 2));
    CudaGemmProblem p = problem_of(m, n, k,
                                   input_of(da, DType::kE4M3, GemmScaleMode::kOuterVector),
                                   input_of(db, DType::kE4M3, GemmScaleMode::kOuterVector), d.get());
    if (capture) {
      ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      const Status st = runner->run(p, workspace_.get(), kWorkspaceBytes, stream_);
      cudaGraph_t graph = nullptr;
      ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
      ASSERT_TRUE(st.ok()) << st.message();
      cudaGraphExec_t exec = nullptr;
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      (void)cudaGraphExecDestroy(exec);
      (void)cudaGraphDestroy(graph);
    } else {
      ASSERT_TRUE(run(p, runner.get()).ok());
    }
    int64_t nans = 0;
    const std::vector<float> got = read_output(download(d), DType::kBF16, m, n, n, 0, &nans);
    EXPECT_EQ(nans, 0) << "M=" << m;
    EXPECT_LT(rel_frobenius(got, reference(qa, qb, DType::kBF16, nullptr)), kRelFrobError) << "M=" << m;
  };
  check(100, 62, false);
  const int64_t after_first = runner->tuned_shapes();
  EXPECT_LE(after_first, 1);
  check(120, 63, false);  // the same M class: remembered, not timed again
  EXPECT_EQ(runner->tuned_shapes(), after_first);
  check(1000, 64, true);  // a new class while capturing: the heuristic's first answer, not remembered
  EXPECT_EQ(runner->tuned_shapes(), after_first);
  check(1000, 65, false);  // the same plan, cached from the capture
  EXPECT_EQ(runner->cached_plans(), 3);
  check(300, 66, false);
  EXPECT_LE(runner->tuned_shapes(), after_first + 1);
  EXPECT_EQ(runner->heuristic_queries(), 4);
}

// Tile search (CudaGemmOptions::tile_search_max_m): FP8 problems up to the option's M time a few
// tiles of cuBLASLt's first algorithm once per M class, whichever tile wins computes the very bits
// of the heuristic's own tile (the same algorithm and K order), and nothing past the option's M, or
// BF16, is searched.
TEST_F(CudaGemmTest, TileSearchKeepsTheHeuristicsBitsAndSearchesOncePerMClass) {
  CudaGemmOptions searching;
  searching.tile_search_max_m = 256;
  std::unique_ptr<CudaGemmRunner> plain, search;
  ASSERT_TRUE(CudaGemmRunner::create(0, &plain).ok());
  ASSERT_TRUE(CudaGemmRunner::create(0, searching, &search).ok());
  const int64_t n = 1024, k = 4096;
  const std::vector<float> w = testing::normal_vector(n * k, 81, 0.05f);
  QuantizedTensor qb;
  ASSERT_TRUE(quantize(matrix_view(w.data(), n, k), QuantSpec::per_channel(DType::kE4M3), &qb).ok());
  const DeviceOperand db = upload_operand(qb);
  auto same_bits = [&](int64_t m, uint64_t seed) {
    const std::vector<float> x = testing::outlier_matrix(m, k, seed);
    QuantizedTensor qa;
    ASSERT_TRUE(quantize(matrix_view(x.data(), m, k), QuantSpec::per_token(DType::kE4M3), &qa).ok());
    const DeviceOperand da = upload_operand(qa);
    std::vector<uint8_t> out[2];
    CudaGemmRunner* runners[2] = {plain.get(), search.get()};
    for (int r = 0; r < 2; ++r) {
      const DeviceBuffer d = poisoned(static_cast<size_t>(m * n * 2));
      const CudaGemmProblem p = problem_of(m, n, k, input_of(da, DType::kE4M3, GemmScaleMode::kOuterVector),
                                           input_of(db, DType::kE4M3, GemmScaleMode::kOuterVector), d.get());
      ASSERT_TRUE(run(p, runners[r]).ok()) << "M=" << m;
      out[r] = download(d);
    }
    EXPECT_TRUE(out[0] == out[1]) << "M=" << m << ": the searched tile's output differs from the heuristic's";
    int64_t nans = 0;
    const std::vector<float> got = read_output(out[1], DType::kBF16, m, n, n, 0, &nans);
    EXPECT_EQ(nans, 0) << "M=" << m;
    EXPECT_LT(rel_frobenius(got, reference(qa, qb, DType::kBF16, nullptr)), kRelFrobError) << "M=" << m;
  };
  same_bits(40, 82);
  EXPECT_EQ(search->tuned_shapes(), 1);  // the class of 64
  same_bits(64, 83);
  EXPECT_EQ(search->tuned_shapes(), 1);  // the same class: remembered
  same_bits(9, 84);
  same_bits(200, 85);
  EXPECT_EQ(search->tuned_shapes(), 3);  // classes 16 and 256
  same_bits(300, 86);
  EXPECT_EQ(search->tuned_shapes(), 3);  // past the option's M
  EXPECT_EQ(plain->tuned_shapes(), 0);
}

// FP8 fast accumulation (CudaGemmOptions::fp8_fast_accumulation) at the longest K of Llama-3-8B
// (the down projection, 14336): the tensor core's own accumulator over all of K stays within the
// suite's bound of the exact product, like the promoting default, and both error sizes are
// recorded (the fast one is the larger in practice; docs/kernels.md).
TEST_F(CudaGemmTest, FastAccumulationStaysWithinTheBoundAtLongK) {
  const int64_t m = 256, n = 512, k = 14336;
  const std::vector<float> x = testing::outlier_matrix(m, k, 71);
  const std::vector<float> w = testing::normal_vector(n * k, 72, 0.02f);
  QuantizedTensor qa, qb;
  ASSERT_TRUE(quantize(matrix_view(x.data(), m, k), QuantSpec::per_token(DType::kE4M3), &qa).ok());
  ASSERT_TRUE(quantize(matrix_view(w.data(), n, k), QuantSpec::per_channel(DType::kE4M3), &qb).ok());
  const std::vector<float> want = reference(qa, qb, DType::kBF16, nullptr);
  const DeviceOperand da = upload_operand(qa), db = upload_operand(qb);
  double err[2] = {0, 0};
  for (int fast = 0; fast < 2; ++fast) {
    CudaGemmOptions options;
    options.fp8_fast_accumulation = fast == 1;
    std::unique_ptr<CudaGemmRunner> runner;
    ASSERT_TRUE(CudaGemmRunner::create(0, options, &runner).ok());
    const DeviceBuffer d = poisoned(static_cast<size_t>(m * n * 2));
    CudaGemmProblem p = problem_of(m, n, k,
                                   input_of(da, DType::kE4M3, GemmScaleMode::kOuterVector),
                                   input_of(db, DType::kE4M3, GemmScaleMode::kOuterVector), d.get());
    ASSERT_TRUE(run(p, runner.get()).ok());
    int64_t nans = 0;
    const std::vector<float> got = read_output(download(d), DType::kBF16, m, n, n, 0, &nans);
    EXPECT_EQ(nans, 0) << "fast accumulation " << fast;
    err[fast] = rel_frobenius(got, want);
    EXPECT_LT(err[fast], kRelFrobError) << "fast accumulation " << fast;
  }
  RecordProperty("rel_frobenius_promoting", std::to_string(err[0]));
  RecordProperty("rel_frobenius_fast", std::to_string(err[1]));
}

TEST_F(CudaGemmTest, StridedOutputRowsLeavePaddingUntouchedAndRunsAreDeterministic) {
  const int64_t m = 128, n = 208, k = 1024, ldd = n + 16;
  const std::vector<float> x = testing::outlier_matrix(m, k, 51);
  const std::vector<float> w = testing::normal_vector(n * k, 52, 0.05f);
  QuantizedTensor qa, qb;
  ASSERT_TRUE(quantize(matrix_view(x.data(), m, k), QuantSpec::per_token(DType::kE4M3), &qa).ok());
  ASSERT_TRUE(quantize(matrix_view(w.data(), n, k), QuantSpec::per_channel(DType::kE4M3), &qb).ok());
  const std::vector<float> want = reference(qa, qb, DType::kBF16, nullptr);
  const DeviceOperand da = upload_operand(qa), db = upload_operand(qb);
  const DeviceBuffer d1 = poisoned(static_cast<size_t>(m * ldd * 2));
  const DeviceBuffer d2 = poisoned(static_cast<size_t>(m * ldd * 2));
  CudaGemmProblem p = problem_of(m, n, k,
                                 input_of(da, DType::kE4M3, GemmScaleMode::kOuterVector),
                                 input_of(db, DType::kE4M3, GemmScaleMode::kOuterVector), d1.get());
  p.d_row_stride = ldd;
  ASSERT_TRUE(run(p).ok());
  p.d = d2.get();
  ASSERT_TRUE(run(p).ok());
  const std::vector<uint8_t> got1 = download(d1), got2 = download(d2);
  EXPECT_EQ(got1, got2) << "two runs of " << describe(p) << " differ";
  int64_t nans = 0;
  const std::vector<float> got = read_output(got1, DType::kBF16, m, n, ldd, 0, &nans);
  EXPECT_EQ(nans, 0);
  EXPECT_LT(rel_frobenius(got, want), kRelFrobError);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = n; c < ldd; ++c)
      ASSERT_EQ(output_bits(got1, DType::kBF16, r * ldd + c), 0xFFFFu) << "padding (" << r << ", " << c << ")";
}

// ---------------------------------------------------------------------------------------------
// BF16 x BF16: the peer the benchmark measures FP8 against.

TEST_F(CudaGemmTest, Bf16GemmMatchesReference) {
  uint64_t seed = 5000;
  for (int64_t m : {1, 16, 333})
    for (DType out : {DType::kBF16, DType::kF32}) {
      ++seed;
      const int64_t n = 208, k = 336;
      std::vector<float> x = testing::outlier_matrix(m, k, seed);
      std::vector<float> w = testing::normal_vector(n * k, seed + 1, 0.05f);
      const std::vector<uint16_t> xb = to_bf16_bits(x), wb = to_bf16_bits(w);
      TensorView va{const_cast<uint16_t*>(xb.data()), DType::kBF16, {m, k}, {}, Device::kCpu};
      TensorView vb{const_cast<uint16_t*>(wb.data()), DType::kBF16, {n, k}, {}, Device::kCpu};
      const std::vector<float> bias = bf16_grid_bias(n, seed + 2);
      Tensor ref(out, {m, n});
      GemmOptions options;
      options.bias = bias.data();
      ASSERT_TRUE(quantized_gemm(GemmOperand::of(va), GemmOperand::of(vb), ref.view(), options).ok());
      std::vector<uint8_t> ref_bytes(static_cast<size_t>(ref.nbytes()));
      std::memcpy(ref_bytes.data(), ref.data(), ref_bytes.size());
      std::vector<float> want(static_cast<size_t>(m * n));
      for (int64_t i = 0; i < m * n; ++i) want[i] = output_value(ref_bytes, out, i);

      const DeviceBuffer da = upload(xb), db = upload(wb);
      // The bias takes the output's type for BF16 operands.
      const DeviceBuffer dbias = out == DType::kBF16 ? upload(to_bf16_bits(bias)) : upload(bias);
      const DeviceBuffer dd = poisoned(static_cast<size_t>(m * n * (out == DType::kBF16 ? 2 : 4)));
      CudaGemmProblem p;
      p.m = m;
      p.n = n;
      p.k = k;
      p.a.data = da.get();
      p.a.dtype = DType::kBF16;
      p.b.data = db.get();
      p.b.dtype = DType::kBF16;
      p.d = dd.get();
      p.d_dtype = out;
      p.bias = dbias.get();
      p.bias_dtype = required_bias_dtype(p);
      const std::string what = describe(p) + " seed=" + std::to_string(seed);
      const Status st = run(p);
      ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
      int64_t nans = 0;
      const std::vector<float> got = read_output(download(dd), out, m, n, n, 0, &nans);
      EXPECT_EQ(nans, 0) << what;
      const double err = rel_frobenius(got, want);
      EXPECT_LT(err, kRelFrobError) << what;
      std::printf("[ measured ] rel frobenius %.3e  %s\n", err, what.c_str());
    }
}

// ---------------------------------------------------------------------------------------------
// What cannot run says why (checked on the device, before any launch).

TEST_F(CudaGemmTest, CanImplementNamesTheReason) {
  DeviceBuffer a(1 << 20), b(1 << 20), d(1 << 20), s(1 << 16);
  CudaGemmProblem base;
  base.m = 16;
  base.n = 208;
  base.k = 336;
  base.a.data = a.get();
  base.b.data = b.get();
  base.d = d.get();
  base.a.scales = s.as<float>();
  base.b.scales = s.as<float>() + 64;
  ASSERT_TRUE(runner_->can_implement(base).ok()) << runner_->can_implement(base).to_string();

  struct Case {
    const char* name;
    void (*mutate)(CudaGemmProblem*);
    const char* reason;
  };
  const Case cases[] = {
      {"K not a multiple of 16", [](CudaGemmProblem* p) { p->k = 100; }, "K = 100 is not a multiple of 16"},
      {"N not a multiple of 16", [](CudaGemmProblem* p) { p->n = 200; }, "N = 200 is not a multiple of 16"},
      {"e5m2 x e5m2", [](CudaGemmProblem* p) { p->a.dtype = p->b.dtype = DType::kE5M2; }, "e5m2 x e5m2"},
      {"fnuz", [](CudaGemmProblem* p) { p->a.dtype = DType::kE4M3Fnuz; }, "no fnuz"},
      {"fp8 x bf16", [](CudaGemmProblem* p) { p->b.dtype = DType::kBF16; }, "FP8 x high precision"},
      {"tensor x outer", [](CudaGemmProblem* p) { p->b.scale_mode = GemmScaleMode::kOuterVector; },
       "outer-vector x outer-vector"},
      {"128x128 x 128x128",
       [](CudaGemmProblem* p) { p->a.scale_mode = p->b.scale_mode = GemmScaleMode::kBlock128x128; },
       "128x128 blocks on both operands"},
      {"blocks with M = 333",
       [](CudaGemmProblem* p) {
         p->m = 333;
         p->a.scale_mode = GemmScaleMode::kBlock1x128;
         p->b.scale_mode = GemmScaleMode::kBlock128x128;
       },
       "multiples of 4, M = 333"},
      {"outer vector in a batch",
       [](CudaGemmProblem* p) {
         p->batch = 3;
         p->a.scale_mode = p->b.scale_mode = GemmScaleMode::kOuterVector;
       },
       "no batch stride for scale tensors"},
      {"fp32 bias", [](CudaGemmProblem* p) {
         p->bias = p->d;
         p->bias_dtype = DType::kF32;
       }, "takes a bf16 bias"},
      {"misaligned a", [](CudaGemmProblem* p) { p->a.data = static_cast<const char*>(p->a.data) + 8; },
       "a.data is not 16-byte aligned"},
      {"short row stride", [](CudaGemmProblem* p) { p->a.row_stride = 320; }, "less than K"},
      {"f16 output", [](CudaGemmProblem* p) { p->d_dtype = DType::kF16; }, "f16 output"},
      {"scales on bf16", [](CudaGemmProblem* p) { p->a.dtype = p->b.dtype = DType::kBF16; },
       "take no scales"},
  };
  for (const Case& c : cases) {
    CudaGemmProblem p = base;
    c.mutate(&p);
    const Status st = runner_->can_implement(p);
    EXPECT_FALSE(st.ok()) << c.name;
    EXPECT_NE(st.message().find(c.reason), std::string::npos)
        << c.name << ": got \"" << st.message() << "\", want it to mention \"" << c.reason << "\"";
    // run() refuses the same problem with the same reason, before launching anything.
    const Status ran = runner_->run(p, workspace_.get(), kWorkspaceBytes, stream_);
    EXPECT_EQ(ran.message(), st.message()) << c.name;
  }
}

// ---------------------------------------------------------------------------------------------
// Which scale-mode pairs, with and without bias, cuBLASLt runs on this device: a table, and the
// documented pairs must run.

TEST_F(CudaGemmTest, ScaleModeSupportTable) {
  const GemmScaleMode modes[] = {GemmScaleMode::kTensor, GemmScaleMode::kOuterVector,
                                 GemmScaleMode::kBlock1x128, GemmScaleMode::kBlock128x128};
  std::printf("%-14s %-14s %-5s %-5s %s\n", "a", "b", "out", "bias", "result");
  uint64_t seed = 6000;
  for (GemmScaleMode ma : modes)
    for (GemmScaleMode mb : modes)
      for (DType out : {DType::kBF16, DType::kF32})
        for (bool with_bias : {false, true}) {
          ++seed;
          const int64_t m = 128, n = 256, k = 512;
          const QuantizedTensor qa = grid_operand(DType::kE4M3, ma, m, k, seed);
          const QuantizedTensor qb = grid_operand(DType::kE4M3, mb, n, k, seed + 1);
          std::vector<float> bias(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) bias[i] = static_cast<float>(i % 5) - 2.0f;
          const DeviceOperand da = upload_operand(qa), db = upload_operand(qb);
          const DeviceBuffer dbias = upload(to_bf16_bits(bias));
          const DeviceBuffer dd = poisoned(static_cast<size_t>(m * n * 4));
          CudaGemmProblem p = problem_of(m, n, k, input_of(da, DType::kE4M3, ma), input_of(db, DType::kE4M3, mb), dd.get());
          p.d_dtype = out;
          if (with_bias) p.bias = dbias.get();
          std::string result;
          const Status can = runner_->can_implement(p);
          bool ran = false;
          if (!can.ok()) {
            result = "can_implement: " + can.message();
          } else {
            const Status st = run(p);
            if (!st.ok()) {
              result = "cuBLASLt refused: " + st.message();
            } else {
              ran = true;
              const std::vector<float> want = reference(qa, qb, out, with_bias ? &bias : nullptr);
              int64_t nans = 0;
              const std::vector<float> got = read_output(download(dd), out, m, n, n, 0, &nans);
              const double err = rel_frobenius(got, want);
              char text[64];
              std::snprintf(text, sizeof(text), "ran, rel err %.1e, %lld NaN", err, static_cast<long long>(nans));
              result = text;
              EXPECT_EQ(err, 0.0) << describe(p);  // grid operands: exact
              EXPECT_EQ(nans, 0) << describe(p);
            }
          }
          std::printf("%-14s %-14s %-5s %-5s %s\n", gemm_scale_mode_name(ma), gemm_scale_mode_name(mb),
                      dtype_name(out), with_bias ? "yes" : "no", result.c_str());
          bool documented = false;
          for (const ModePair& pair : kSupportedPairs) documented |= pair.a == ma && pair.b == mb;
          if (documented && !with_bias) EXPECT_TRUE(ran) << describe(p) << ": " << result;
        }
}

}  // namespace
}  // namespace llmq
