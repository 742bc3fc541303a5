// GPU tests of the decode GEMM (include/llmq/cuda_decode_gemm.hpp) against the CPU reference
// llmq::quantized_gemm:
//  * Realistic: activations with outlier channels for 32 tokens, Gaussian weights quantized per
//    channel by llmq::quantize (E4M3 and INT8); W8A8 quantizes the activations per token in the
//    weight's format, W8A16 passes them as BF16 (the reference reads the same BF16 view). The
//    kernel for M in {1, 2, 4, 8, 13, 16} (W8A8 also 17, 24, 32: four token tiles) uses the first
//    M tokens, so one 32-token reference per case serves every M. Pass: relative Frobenius error < kMaxRelativeError, and INT8 W8A8 equal
//    to the reference bit for bit (INT32 sums and the reference's float epilogue).
//  * Bias: the reference's FP32 accumulators (F32 output) plus bias, rounded once to BF16 on the
//    host: the float operations quantized_gemm does with options.bias.
//  * Each run writes over a different poison (NaN, then a finite pattern); the two outputs must be
//    equal byte for byte: every element written, and the same bits each run (determinism).
//  * Every plan knob (cluster split_k 1-8, ring depth, stage width, L2 prefetch) on shapes with
//    K and N tails, strided A and D, per-tensor scales; argument errors name the field.
// Without a GPU every test that launches SKIPS with the reason.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_support.hpp"
#include "llmq/cuda_decode_gemm.hpp"
#include "llmq/format.hpp"
#include "llmq/gemm.hpp"
#include "llmq/quantize_tensor.hpp"
#include "support.hpp"

namespace llmq {
namespace {

// Kernel vs reference: both sum exact products in FP32 (or INT32) but in different orders and
// round to BF16 once, so they differ by an occasional BF16 ulp (2^-8 relative) on few elements;
// the error budget is an order above that and far below any indexing or scaling mistake.
constexpr double kMaxRelativeError = 2e-3;

using ::llmq::testing::DeviceBuffer;

// ---------------------------------------------------------------------------------------------
// Problems

enum class Mode { kW8A16E4M3, kW8A16Int8, kW8A8E4M3, kW8A8Int8 };
const Mode kAllModes[] = {Mode::kW8A16E4M3, Mode::kW8A16Int8, Mode::kW8A8E4M3, Mode::kW8A8Int8};

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kW8A16E4M3: return "w8a16_e4m3";
    case Mode::kW8A16Int8: return "w8a16_int8";
    case Mode::kW8A8E4M3: return "w8a8_e4m3";
    case Mode::kW8A8Int8: return "w8a8_int8";
  }
  return "?";
}
DType weight_format(Mode m) {
  return (m == Mode::kW8A16E4M3 || m == Mode::kW8A8E4M3) ? DType::kE4M3 : DType::kI8;
}
bool is_w8a8(Mode m) { return m == Mode::kW8A8E4M3 || m == Mode::kW8A8Int8; }

// Quantized weights of one (K, N, format, granularity), shared by the W8A16 and W8A8 cases.
struct WeightSet {
  QuantizedTensor qw;
  std::vector<float> bias;
  std::unique_ptr<DeviceBuffer<uint8_t>> d_w;
  std::unique_ptr<DeviceBuffer<float>> d_w_scale, d_bias;
};

// Everything of one (K, N, mode, scale granularity) case: host tensors, the 32-token reference
// (FP32, no bias) and the device copies.
struct Case {
  int64_t k = 0, n = 0, tokens = 0;
  int64_t lda = 0;  // A row stride in elements (>= k)
  Mode mode = Mode::kW8A16E4M3;
  bool per_tensor = false;
  uint64_t seed = 0;
  const WeightSet* weights = nullptr;
  QuantizedTensor qa;             // W8A8
  std::vector<uint16_t> a_bf16;   // W8A16, [tokens, lda]
  Tensor reference;               // F32 [tokens, n], no bias
  std::unique_ptr<DeviceBuffer<uint8_t>> d_a;
  std::unique_ptr<DeviceBuffer<float>> d_a_scale;
  bool ready = false;  // built without a fatal failure

  std::string text() const {
    return std::string(mode_name(mode)) + (per_tensor ? "/tensor" : "") + " K=" + std::to_string(k) +
           " N=" + std::to_string(n) + " seed=" + std::to_string(seed);
  }
};

// Gaussian weights quantized per channel (or per tensor), and a bias. Fatal failures abort.
void make_weights(int64_t k, int64_t n, DType format, bool per_tensor, uint64_t seed, WeightSet* w) {
  const std::vector<float> xw = testing::normal_vector(n * k, seed, 0.05f);
  w->bias = testing::normal_vector(n, seed + 1, 0.5f);
  const QuantSpec spec = per_tensor ? QuantSpec::per_tensor(format) : QuantSpec::per_channel(format);
  ASSERT_TRUE(quantize(matrix_view(xw.data(), n, k), spec, &w->qw).ok());
  const size_t scales = static_cast<size_t>(w->qw.scales.scales.numel());
  w->d_w = std::make_unique<DeviceBuffer<uint8_t>>(static_cast<size_t>(n * k));
  w->d_w_scale = std::make_unique<DeviceBuffer<float>>(scales);
  w->d_bias = std::make_unique<DeviceBuffer<float>>(w->bias.size());
  ASSERT_TRUE(w->d_w->ok() && w->d_w_scale->ok() && w->d_bias->ok());
  CUDA_ASSERT(w->d_w->upload(w->qw.data.data_as<uint8_t>(), static_cast<size_t>(n * k)));
  CUDA_ASSERT(w->d_w_scale->upload(w->qw.scales.scales.data_as<float>(), scales));
  CUDA_ASSERT(w->d_bias->upload(w->bias.data(), w->bias.size()));
}

// Builds the activations, the reference and device buffers. Fatal failures abort the caller.
void make_case(int64_t k, int64_t n, Mode mode, bool per_tensor, int64_t lda, uint64_t seed,
               const WeightSet* weights, Case* c) {
  const int64_t tokens = kMaxDecodeGemmM;
  c->k = k;
  c->n = n;
  c->tokens = tokens;
  c->lda = lda;
  c->mode = mode;
  c->per_tensor = per_tensor;
  c->seed = seed;
  c->weights = weights;
  const DType format = weight_format(mode);
  const std::vector<float> xa = testing::outlier_matrix(tokens, k, seed);

  Tensor ref(DType::kF32, {tokens, n});
  std::vector<uint8_t> a_bytes;  // device image of A, [tokens, lda] elements
  if (is_w8a8(mode)) {
    const QuantSpec aspec = per_tensor ? QuantSpec::per_tensor(format) : QuantSpec::per_token(format);
    ASSERT_TRUE(quantize(matrix_view(xa.data(), tokens, k), aspec, &c->qa).ok());
    const Status st = quantized_gemm(GemmOperand::of(c->qa), GemmOperand::of(weights->qw), ref.view());
    ASSERT_TRUE(st.ok()) << st.to_string();
    a_bytes.assign(static_cast<size_t>(tokens * lda), 0x11);  // padding between rows: any bytes
    const uint8_t* codes = c->qa.data.data_as<uint8_t>();
    for (int64_t r = 0; r < tokens; ++r) std::memcpy(&a_bytes[r * lda], codes + r * k, static_cast<size_t>(k));
  } else {
    c->a_bf16.assign(static_cast<size_t>(tokens * lda), 0x7FC0);  // NaN padding: must never be read
    for (int64_t r = 0; r < tokens; ++r)
      for (int64_t i = 0; i < k; ++i) c->a_bf16[r * lda + i] = float_to_bf16_bits(xa[r * k + i]);
    TensorView av{c->a_bf16.data(), DType::kBF16, {tokens, k}, {lda, 1}};
    const Status st = quantized_gemm(GemmOperand::of(av), GemmOperand::of(weights->qw), ref.view());
    ASSERT_TRUE(st.ok()) << st.to_string();
    a_bytes.resize(c->a_bf16.size() * 2);
    std::memcpy(a_bytes.data(), c->a_bf16.data(), a_bytes.size());
  }
  c->reference = std::move(ref);

  c->d_a = std::make_unique<DeviceBuffer<uint8_t>>(a_bytes.size());
  ASSERT_TRUE(c->d_a->ok());
  CUDA_ASSERT(c->d_a->upload(a_bytes.data(), a_bytes.size()));
  if (is_w8a8(mode)) {
    const size_t scales = static_cast<size_t>(c->qa.scales.scales.numel());
    c->d_a_scale = std::make_unique<DeviceBuffer<float>>(scales);
    ASSERT_TRUE(c->d_a_scale->ok());
    CUDA_ASSERT(c->d_a_scale->upload(c->qa.scales.scales.data_as<float>(), scales));
  }
}

DecodeGemmProblem problem_for(const Case& c, int64_t m, bool with_bias, void* d, int64_t ldd) {
  DecodeGemmProblem p;
  p.m = m;
  p.n = c.n;
  p.k = c.k;
  p.a = c.d_a->get();
  p.a_dtype = is_w8a8(c.mode) ? weight_format(c.mode) : DType::kBF16;
  p.a_row_stride = c.lda;
  if (is_w8a8(c.mode)) {
    p.a_scale = c.d_a_scale->get();
    p.a_scale_per_tensor = c.per_tensor;
  }
  p.w = c.weights->d_w->get();
  p.w_dtype = weight_format(c.mode);
  p.w_scale = c.weights->d_w_scale->get();
  p.w_scale_per_tensor = c.per_tensor;
  p.bias = with_bias ? c.weights->d_bias->get() : nullptr;
  p.d = d;
  p.d_row_stride = ldd;
  return p;
}

// The reference output for the first m tokens: FP32 accumulator (+ bias) rounded once to BF16.
std::vector<uint16_t> reference_bf16(const Case& c, int64_t m, bool with_bias) {
  std::vector<uint16_t> out(static_cast<size_t>(m * c.n));
  const float* acc = c.reference.data_as<float>();
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < c.n; ++j) {
      float v = acc[r * c.n + j];
      if (with_bias) v += c.weights->bias[j];
      out[r * c.n + j] = float_to_bf16_bits(v);
    }
  return out;
}

struct Outcome {
  double rel_error = 0;      // ||out - ref||_F / ||ref||_F
  int64_t differ = 0;        // elements whose bits differ from the reference
  int64_t non_finite = 0;
  std::string plan;
};

// Runs the kernel twice over different poison (0xFF: BF16 NaN; 0x7F: 0x7F7F, finite), checks
// that both runs wrote the same bytes (and nothing outside the M x N view of a strided D), and
// compares with the reference. Fatal failures abort the caller.
void run_and_compare(const Case& c, int64_t m, bool with_bias, const DecodeGemmConfig& config, int64_t ldd,
                     const std::string& what, Outcome* result) {
  const int64_t rows_stride = ldd == 0 ? c.n : ldd;
  DeviceBuffer<uint16_t> d(static_cast<size_t>(m * rows_stride));
  ASSERT_TRUE(d.ok());
  const DecodeGemmProblem p = problem_for(c, m, with_bias, d.get(), ldd);
  DecodeGemmPlan plan;
  const Status pst = cuda_decode_gemm_plan(p, config, &plan);
  ASSERT_TRUE(pst.ok()) << what << ": " << pst.to_string();
  result->plan = describe(plan);
  std::vector<uint16_t> out[2];
  const int poison[2] = {0xFF, 0x7F};
  for (int run = 0; run < 2; ++run) {
    CUDA_ASSERT(d.fill_bytes(poison[run]));
    const Status st = cuda_decode_gemm(p, nullptr, config);
    ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());
    CUDA_ASSERT(d.download(&out[run]));
  }
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = c.n; j < rows_stride; ++j) {  // padding of a strided D stays poisoned
      const size_t i = static_cast<size_t>(r * rows_stride + j);
      ASSERT_EQ(out[0][i], 0xFFFF) << what << ": wrote d[" << r << ", " << j << "] past N";
      ASSERT_EQ(out[1][i], 0x7F7F) << what << ": wrote d[" << r << ", " << j << "] past N";
    }
    ASSERT_EQ(std::memcmp(&out[0][r * rows_stride], &out[1][r * rows_stride], static_cast<size_t>(c.n) * 2), 0)
        << what << ": row " << r << " differs between two runs over different poison "
        << "(unwritten elements or a race); plan " << result->plan;
  }
  const std::vector<uint16_t> ref = reference_bf16(c, m, with_bias);
  double diff2 = 0, ref2 = 0;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < c.n; ++j) {
      const uint16_t got_bits = out[0][r * rows_stride + j], want_bits = ref[r * c.n + j];
      const double got = bf16_bits_to_float(got_bits), want = bf16_bits_to_float(want_bits);
      if (!std::isfinite(got)) ++result->non_finite;
      if (got_bits != want_bits) ++result->differ;
      diff2 += (got - want) * (got - want);
      ref2 += want * want;
    }
  result->rel_error = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  EXPECT_EQ(result->non_finite, 0) << what << ": non-finite outputs; plan " << result->plan;
  EXPECT_LT(result->rel_error, kMaxRelativeError) << what << ": relative Frobenius error vs quantized_gemm; plan "
                                                  << result->plan;
  if (c.mode == Mode::kW8A8Int8)
    EXPECT_EQ(result->differ, 0) << what << ": INT8 W8A8 must equal the reference bit for bit; plan "
                                 << result->plan;
}

// Cases are expensive on the host (quantize + scalar reference): built once per test binary.
// The map nodes never move, so the references handed out stay valid.
const Case& cached_case(int64_t k, int64_t n, Mode mode, bool per_tensor, int64_t lda) {
  static std::map<std::tuple<int64_t, int64_t, DType, bool>, std::unique_ptr<WeightSet>> weights;
  static std::map<std::tuple<int64_t, int64_t, int, bool, int64_t>, std::unique_ptr<Case>> cases;
  const auto key = std::make_tuple(k, n, static_cast<int>(mode), per_tensor, lda);
  auto it = cases.find(key);
  if (it != cases.end()) return *it->second;
  const DType format = weight_format(mode);
  const auto wkey = std::make_tuple(k, n, format, per_tensor);
  const uint64_t seed = static_cast<uint64_t>(k * 7919 + n * 31 + (per_tensor ? 1 : 0));
  auto wit = weights.find(wkey);
  if (wit == weights.end()) {
    auto w = std::make_unique<WeightSet>();
    make_weights(k, n, format, per_tensor, seed + (format == DType::kI8 ? 100 : 0), w.get());
    wit = weights.emplace(wkey, std::move(w)).first;
  }
  auto c = std::make_unique<Case>();
  if (!::testing::Test::HasFatalFailure())
    make_case(k, n, mode, per_tensor, lda, seed + 7 * static_cast<uint64_t>(mode), wit->second.get(), c.get());
  c->ready = !::testing::Test::HasFatalFailure();
  return *cases.emplace(key, std::move(c)).first->second;
}

bool is_sm90() {
  CudaDeviceInfo info;
  return query_cuda_device(0, &info).ok() && info.major == 9;
}

// ---------------------------------------------------------------------------------------------
// Argument checks (host only; no GPU needed)

DecodeGemmProblem valid_problem() {
  DecodeGemmProblem p;
  p.m = 4;
  p.n = 64;
  p.k = 128;
  p.a = reinterpret_cast<const void*>(uintptr_t{0x10000});
  p.a_dtype = DType::kBF16;
  p.w = reinterpret_cast<const void*>(uintptr_t{0x20000});
  p.w_dtype = DType::kE4M3;
  p.w_scale = reinterpret_cast<const float*>(uintptr_t{0x30000});
  p.d = reinterpret_cast<void*>(uintptr_t{0x40000});
  return p;
}

void expect_error(const DecodeGemmProblem& p, StatusCode code, const std::string& needle) {
  const Status st = cuda_decode_gemm_can_implement(p);
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_NE(st.message().find(needle), std::string::npos) << "want '" << needle << "' in: " << st.to_string();
}

TEST(CudaDecodeGemm, CanImplementNamesTheReason) {
  EXPECT_TRUE(cuda_decode_gemm_can_implement(valid_problem()).ok());
  DecodeGemmProblem p = valid_problem();
  p.m = 33;
  expect_error(p, StatusCode::kInvalidArgument, "m: must be in [0, 32]");
  p.m = 17;  // bf16 activations (W8A16): 16 tokens at most
  expect_error(p, StatusCode::kUnsupported, "W8A16 (bf16 activations) takes at most 16");
  p.a_dtype = DType::kE4M3;
  p.a_scale = reinterpret_cast<const float*>(uintptr_t{0x50000});
  p.m = 32;
  EXPECT_TRUE(cuda_decode_gemm_can_implement(p).ok()) << "W8A8 takes 32 tokens";
  p = valid_problem();
  p.m = 0;
  p.a = nullptr;
  EXPECT_TRUE(cuda_decode_gemm_can_implement(p).ok()) << "M = 0 is a no-op";
  p = valid_problem();
  p.k = 40;
  expect_error(p, StatusCode::kInvalidArgument, "k: must be a positive multiple of 16");
  p.k = 0;
  expect_error(p, StatusCode::kInvalidArgument, "k: must be a positive multiple of 16");
  p = valid_problem();
  p.w_dtype = DType::kE5M2;
  expect_error(p, StatusCode::kInvalidArgument, "w_dtype: must be e4m3 or int8");
  p = valid_problem();
  p.a_dtype = DType::kI8;  // e4m3 weights with int8 activations
  expect_error(p, StatusCode::kInvalidArgument, "a_dtype: must be bf16 (W8A16) or the weight format");
  p = valid_problem();
  p.a = reinterpret_cast<const void*>(uintptr_t{0x10008});
  expect_error(p, StatusCode::kInvalidArgument, "a: must be 16-byte aligned");
  p = valid_problem();
  p.w = reinterpret_cast<const void*>(uintptr_t{0x20004});
  expect_error(p, StatusCode::kInvalidArgument, "w: must be 16-byte aligned");
  p = valid_problem();
  p.a_row_stride = 132;  // 264 bytes of bf16: not a multiple of 16
  expect_error(p, StatusCode::kInvalidArgument, "a_row_stride");
  p = valid_problem();
  p.w_row_stride = 120;  // less than K
  expect_error(p, StatusCode::kInvalidArgument, "w_row_stride");
  p = valid_problem();
  p.d_row_stride = 63;
  expect_error(p, StatusCode::kInvalidArgument, "d_row_stride");
  p = valid_problem();
  p.w_scale = nullptr;
  expect_error(p, StatusCode::kInvalidArgument, "w_scale: null");
  p = valid_problem();
  p.a_scale = reinterpret_cast<const float*>(uintptr_t{0x50000});
  expect_error(p, StatusCode::kInvalidArgument, "a_scale: must be null for bf16 activations");
  p = valid_problem();
  p.a_dtype = DType::kE4M3;  // W8A8 without activation scales
  expect_error(p, StatusCode::kInvalidArgument, "a_scale: null");
  p = valid_problem();
  p.a_dtype = p.w_dtype = DType::kI8;
  p.a_scale = reinterpret_cast<const float*>(uintptr_t{0x50000});
  EXPECT_TRUE(cuda_decode_gemm_can_implement(p).ok());
  p.k = kMaxInt8SegmentK + 16 - kMaxInt8SegmentK % 16;
  expect_error(p, StatusCode::kUnsupported, "kMaxInt8SegmentK");
  p.a_dtype = DType::kBF16;  // W8A16 INT8 has no INT32 accumulator
  p.a_scale = nullptr;
  EXPECT_TRUE(cuda_decode_gemm_can_implement(p).ok());
}

TEST(CudaDecodeGemm, PlanRejectsBadConfigs) {
  LLMQ_REQUIRE_GPU();
  DeviceBuffer<uint8_t> a(4 * 128 * 2), w(64 * 128);
  DeviceBuffer<float> s(64);
  DeviceBuffer<uint16_t> d(4 * 64);
  ASSERT_TRUE(a.ok() && w.ok() && s.ok() && d.ok());
  DecodeGemmProblem p = valid_problem();
  p.a = a.get();
  p.w = w.get();
  p.w_scale = s.get();
  p.d = d.get();
  DecodeGemmPlan plan;
  DecodeGemmConfig cfg;
  cfg.split_k = 3;
  EXPECT_EQ(cuda_decode_gemm_plan(p, cfg, &plan).code(), StatusCode::kInvalidArgument);
  cfg = {};
  cfg.tiles_per_cta = -1;
  EXPECT_EQ(cuda_decode_gemm_plan(p, cfg, &plan).code(), StatusCode::kInvalidArgument);
  cfg = {};
  cfg.tiles_per_cta = 8;
  EXPECT_EQ(cuda_decode_gemm_plan(p, cfg, &plan).code(), StatusCode::kInvalidArgument);
  {  // more than 16 tokens (W8A8): two weight tiles a CTA, no other count
    DeviceBuffer<uint8_t> a32(32 * 128);
    DeviceBuffer<float> as(32);
    DeviceBuffer<uint16_t> d32(32 * 64);
    ASSERT_TRUE(a32.ok() && as.ok() && d32.ok());
    DecodeGemmProblem q = p;
    q.m = 32;
    q.a = a32.get();
    q.a_dtype = DType::kE4M3;
    q.a_scale = as.get();
    q.d = d32.get();
    for (int tiles : {1, 3, 4}) {
      cfg = {};
      cfg.tiles_per_cta = tiles;
      EXPECT_EQ(cuda_decode_gemm_plan(q, cfg, &plan).code(), StatusCode::kInvalidArgument) << tiles << " tiles at M=32";
    }
    cfg = {};
    const Status st32 = cuda_decode_gemm_plan(q, cfg, &plan);
    EXPECT_TRUE(st32.ok()) << st32.to_string();
    EXPECT_EQ(plan.tiles_per_cta, 2);
  }
  cfg = {};
  cfg.split_k = 2;
  const Status st = cuda_decode_gemm_plan(p, cfg, &plan);
  if (is_sm90())
    EXPECT_TRUE(st.ok()) << st.to_string();
  else
    EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  EXPECT_EQ(cuda_decode_gemm_plan(p, {}, nullptr).code(), StatusCode::kInvalidArgument);
  // Empty problems are a no-op.
  p.m = 0;
  EXPECT_TRUE(cuda_decode_gemm(p, nullptr).ok());
  CUDA_ASSERT(cudaDeviceSynchronize());
}

// ---------------------------------------------------------------------------------------------
// Realistic shapes, every M

struct ShapeCase {
  int64_t k, n;
  Mode mode;
};

class CudaDecodeGemmShapes : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(CudaDecodeGemmShapes, MatchesQuantizedGemmForEveryM) {
  LLMQ_REQUIRE_GPU();
  const ShapeCase sc = GetParam();
  const Case& c = cached_case(sc.k, sc.n, sc.mode, false, sc.k);
  ASSERT_TRUE(c.ready) << "building the case failed";
  for (int64_t m : {1, 2, 4, 8, 13, 16, 17, 24, 32}) {
    if (m > kDecodeGemmW8A16MaxM && !is_w8a8(c.mode)) continue;
    double worst = 0;
    int64_t differ = 0;
    std::string plan;
    for (int with_bias = 0; with_bias < 2; ++with_bias) {
      const std::string what = c.text() + " M=" + std::to_string(m) + (with_bias ? " bias" : "");
      Outcome o;
      ASSERT_NO_FATAL_FAILURE(run_and_compare(c, m, with_bias != 0, {}, 0, what, &o));
      worst = std::max(worst, o.rel_error);
      differ += o.differ;
      plan = o.plan;
    }
    std::printf("  %s M=%ld: rel err %.2e, %ld of %ld bf16 differ from quantized_gemm; plan %s\n",
                c.text().c_str(), static_cast<long>(m), worst, static_cast<long>(differ),
                static_cast<long>(2 * m * c.n), plan.c_str());
  }
}

std::vector<ShapeCase> shape_cases() {
  std::vector<ShapeCase> v;
  const std::pair<int64_t, int64_t> kn[] = {{64, 16}, {4096, 4096}, {4096, 14336}, {14336, 4096}};
  for (const auto& [k, n] : kn)
    for (Mode mode : kAllModes) v.push_back({k, n, mode});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaDecodeGemmShapes, ::testing::ValuesIn(shape_cases()),
                         [](const ::testing::TestParamInfo<ShapeCase>& info) {
                           return std::string(mode_name(info.param.mode)) + "_K" + std::to_string(info.param.k) +
                                  "_N" + std::to_string(info.param.n);
                         });

// ---------------------------------------------------------------------------------------------
// Plan knobs, tails, strides, per-tensor scales

TEST(CudaDecodeGemm, EveryConfigMatchesTheReference) {
  LLMQ_REQUIRE_GPU();
  std::vector<DecodeGemmConfig> configs;
  for (int split : {1, 2, 4, 8}) {
    if (split > 1 && !is_sm90()) continue;
    DecodeGemmConfig cfg;
    cfg.split_k = split;
    configs.push_back(cfg);
  }
  for (int tiles : {1, 2, 3, 4}) {
    DecodeGemmConfig cfg;
    cfg.tiles_per_cta = tiles;
    configs.push_back(cfg);
  }
  DecodeGemmConfig no_prefetch;
  no_prefetch.l2_prefetch = false;
  configs.push_back(no_prefetch);
  if (is_sm90()) {  // a cluster split with K tails inside every rank, several tiles per CTA
    DecodeGemmConfig cfg;
    cfg.split_k = 4;
    cfg.tiles_per_cta = 4;
    configs.push_back(cfg);
    cfg.split_k = 8;
    cfg.tiles_per_cta = 2;
    configs.push_back(cfg);
  }
  // K = 1040 (not a multiple of 64: the last chunk is a 16-wide tail), N = 200 (25 tiles), and a
  // small N = 19 (a partial tile) with K = 208.
  for (Mode mode : kAllModes) {
    for (const auto& [k, n] : {std::pair<int64_t, int64_t>{1040, 200}, {208, 19}}) {
      const Case& c = cached_case(k, n, mode, false, k);
      ASSERT_TRUE(c.ready) << "building the case failed";
      for (size_t i = 0; i < configs.size(); ++i)
        for (int64_t m : {3, 16, 30}) {
          const DecodeGemmConfig& cfg = configs[i];
          // Past 16 tokens: W8A8 only, with two weight tiles a CTA (or the planner's choice).
          if (m > 16 && (!is_w8a8(mode) || (cfg.tiles_per_cta != 0 && cfg.tiles_per_cta != 2))) continue;
          const std::string what = c.text() + " M=" + std::to_string(m) + " config{split_k=" +
                                   std::to_string(cfg.split_k) + " tiles=" + std::to_string(cfg.tiles_per_cta) +
                                   " prefetch=" + std::to_string(cfg.l2_prefetch) + "}";
          Outcome o;
          ASSERT_NO_FATAL_FAILURE(run_and_compare(c, m, m == 3, cfg, 0, what, &o));
        }
    }
  }
}

TEST(CudaDecodeGemm, StridedActivationsAndOutput) {
  LLMQ_REQUIRE_GPU();
  for (Mode mode : kAllModes) {
    // A rows 1040 + 48 elements apart (16-byte multiples for both widths), D rows 205 apart.
    const Case& c = cached_case(1040, 200, mode, false, 1088);
    ASSERT_TRUE(c.ready) << "building the case failed";
    for (int64_t m : {1, 9, 16, 29}) {
      if (m > kDecodeGemmW8A16MaxM && !is_w8a8(mode)) continue;
      Outcome o;
      ASSERT_NO_FATAL_FAILURE(
          run_and_compare(c, m, true, {}, 205, c.text() + " lda=1088 ldd=205 M=" + std::to_string(m), &o));
    }
  }
}

TEST(CudaDecodeGemm, PerTensorScales) {
  LLMQ_REQUIRE_GPU();
  for (Mode mode : kAllModes) {
    const Case& c = cached_case(1024, 136, mode, true, 1024);
    ASSERT_TRUE(c.ready) << "building the case failed";
    for (int64_t m : {2, 16, 32}) {
      if (m > kDecodeGemmW8A16MaxM && !is_w8a8(mode)) continue;
      Outcome o;
      ASSERT_NO_FATAL_FAILURE(run_and_compare(c, m, false, {}, 0, c.text() + " M=" + std::to_string(m), &o));
    }
  }
}

}  // namespace
}  // namespace llmq
