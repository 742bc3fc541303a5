// Shared by the GPU runtime tests (test_cuda_runtime.cu, test_cuda_runtime_moe.cu): tolerances and
// their measured basis, running the same prompt through the GPU runtime and CPU models, and
// comparing logits row by row. Each test program includes it once.
#pragma once

// nvcc (13.0) reports `status = call();` as discarding a [[nodiscard]] value: the value it means is
// the reference operator= returns, not the call's Status, which is kept and checked.
#pragma nv_diag_suppress 2810

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>
#include "cuda_support.hpp"
#include "llmq/calibration.hpp"
#include "llmq/export.hpp"
#include "llmq/safetensors.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/model.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/scheme.hpp"
#include "llmq/transformer.hpp"
#include "support.hpp"

namespace llmq {
namespace {


// GPU activations are BF16 between kernels (8 bits of mantissa: each rounding moves a value by up
// to 2^-9 relative) where the CPU keeps float32; with F32 weights that is the whole difference.
// Measured on the H100 (worst row of 24 prefill + 8 decode rows): stories260K 5e-3..2e-2, the
// seeded default models 1e-2..7e-2 (their RMSNorm gains of 20-50x make a few channels dominate,
// so one rounding there moves the whole row). Bound on relative L2 per row:
constexpr double kFloatLogitRelTolerance = 0.1;
// 8-bit schemes. The GPU quantizes activations from values that went through BF16, so an element
// near an FP8 / INT8 rounding boundary lands on the other code, and each flip moves its product by
// a whole quantization step: on the outlier-heavy default models the GPU and CPU quantized models
// differ by about as much as quantization itself costs (measured worst rows up to 0.5; stories260K
// <= 7e-2). So the tests are (1) the GPU model is as accurate as the CPU reference of the same
// scheme: its RMS relative distance from the float model is at most kSchemeAccuracyFactor times the
// reference's, plus kSchemeAccuracySlack; and (2) no row is garbage: worst relative distance from
// the CPU quantized model below kSchemeGarbageBound (a wrong scale, layout or index gives >= 1).
constexpr double kSchemeAccuracyFactor = 1.3;
constexpr double kSchemeAccuracySlack = 0.03;
constexpr double kSchemeGarbageBound = 0.75;
// The argmax of each row must agree with the CPU's on at least this fraction of rows, for float
// models (rows whose top two logits are closer than the error above can legitimately swap).
constexpr double kMinTop1Agreement = 0.9;
// Batched prefill vs the same sequence alone: only tile boundaries and summation order differ.
constexpr double kBatchRelTolerance = 1e-2;

constexpr int64_t kPromptLength = 24;
constexpr int64_t kDecodeSteps = 8;

std::string models_dir() { return testing::testdata_dir() + "/../models"; }
std::string stories_path() { return models_dir() + "/stories260K.bin"; }
bool have_stories() { return std::ifstream(stories_path(), std::ios::binary).good(); }

// Token ids, whitespace separated (stories260K.greedy128.ids).
std::vector<int32_t> read_ids(const std::string& path) {
  std::ifstream f(path);
  std::vector<int32_t> v;
  int32_t t;
  while (f >> t) v.push_back(t);
  return v;
}

struct Compare {
  double worst_rel = 0.0;
  double sum_sq_rel = 0.0;
  int64_t rows = 0;
  int64_t top1_agree = 0;
  int64_t over_garbage_bound = 0;  // rows further than kSchemeGarbageBound
  double rms_rel() const { return rows == 0 ? 0.0 : std::sqrt(sum_sq_rel / static_cast<double>(rows)); }
};

int64_t argmax(const float* v, int64_t n) { return std::max_element(v, v + n) - v; }

void compare_rows(const std::vector<float>& gpu, const std::vector<float>& cpu, int64_t vocab, Compare* c) {
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t r = 0; r * vocab < gpu.size(); ++r) {
    double num = 0.0, den = 0.0;
    for (int64_t j = 0; j < vocab; ++j) {
      const double g = gpu[r * vocab + j], e = cpu[r * vocab + j];
      ASSERT_TRUE(std::isfinite(g)) << "row " << r << " column " << j << " is " << g;
      num += (g - e) * (g - e);
      den += e * e;
    }
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    c->worst_rel = std::max(c->worst_rel, rel);
    if (rel > kSchemeGarbageBound) ++c->over_garbage_bound;
    c->sum_sq_rel += rel * rel;
    c->top1_agree += argmax(&gpu[r * vocab], vocab) == argmax(&cpu[r * vocab], vocab) ? 1 : 0;
    ++c->rows;
  }
}

std::vector<int32_t> prompt(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)));
  return t;
}

// Logits of a seeded prompt (prefill, every position) and of kDecodeSteps decode steps fed with
// the greedy tokens of `cpu`, from the GPU runtime and from each CPU model in `cpus`.
struct RunLogits {
  std::vector<float> prefill;
  std::vector<std::vector<float>> decode;
};

void run_gpu_and_cpu(const GpuModel& gpu_model, const std::vector<Transformer*>& cpus, RunLogits* gpu,
                     std::vector<RunLogits>* cpu_out, DType kv_cache = DType::kBF16,
                     const std::vector<float>& k_scales = {}, const std::vector<float>& v_scales = {}) {
  const ModelConfig& c = gpu_model.config();
  std::unique_ptr<GpuRuntime> rt;
  GpuRuntimeOptions o;
  o.max_batch = 1;
  o.max_context = 64;
  o.max_step_tokens = 32;
  o.kv_cache_dtype = kv_cache;
  Status st = GpuRuntime::create(gpu_model, o, &rt);
  ASSERT_TRUE(st.ok()) << st.to_string();
  if (!k_scales.empty()) {
    st = rt->set_kv_scales(k_scales, v_scales);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  const std::vector<int32_t> p = prompt(kPromptLength, c.vocab_size, 7);
  st = rt->prefill({p}, true, &gpu->prefill);
  ASSERT_TRUE(st.ok()) << st.to_string();
  cpu_out->assign(cpus.size(), {});
  for (size_t i = 0; i < cpus.size(); ++i) {
    RunLogits& r = (*cpu_out)[i];
    r.prefill.resize(static_cast<size_t>(kPromptLength * c.vocab_size));
    cpus[i]->reset();
    st = cpus[i]->forward(p.data(), kPromptLength, 0, r.prefill.data());
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  const std::vector<float>& lead = (*cpu_out)[0].prefill;
  int32_t next = static_cast<int32_t>(argmax(&lead[(kPromptLength - 1) * c.vocab_size], c.vocab_size));
  for (int64_t s = 0; s < kDecodeSteps; ++s) {
    std::vector<float> g;
    st = rt->decode({next}, &g);
    ASSERT_TRUE(st.ok()) << st.to_string();
    gpu->decode.push_back(g);
    for (size_t i = 0; i < cpus.size(); ++i) {
      std::vector<float> e(static_cast<size_t>(c.vocab_size));
      st = cpus[i]->forward(&next, 1, kPromptLength + s, e.data());
      ASSERT_TRUE(st.ok()) << st.to_string();
      (*cpu_out)[i].decode.push_back(e);
    }
    next = static_cast<int32_t>(argmax((*cpu_out)[0].decode.back().data(), c.vocab_size));
  }
}

Compare compare_runs(const RunLogits& a, const RunLogits& b, int64_t vocab) {
  Compare cmp;
  compare_rows(a.prefill, b.prefill, vocab, &cmp);
  for (size_t s = 0; s < a.decode.size(); ++s) compare_rows(a.decode[s], b.decode[s], vocab, &cmp);
  return cmp;
}

void check_float_model(const GpuModel& gpu_model, Transformer* cpu, const std::string& what,
                       DType kv_cache = DType::kBF16, double tolerance = kFloatLogitRelTolerance,
                       const std::vector<float>& k_scales = {}, const std::vector<float>& v_scales = {}) {
  SCOPED_TRACE("REPRO " + what);
  RunLogits gpu;
  std::vector<RunLogits> cpu_runs;
  run_gpu_and_cpu(gpu_model, {cpu}, &gpu, &cpu_runs, kv_cache, k_scales, v_scales);
  if (::testing::Test::HasFatalFailure()) return;
  const Compare cmp = compare_runs(gpu, cpu_runs[0], gpu_model.config().vocab_size);
  std::printf("  %-36s vs CPU: worst rel %.2e rms rel %.2e top1 %lld/%lld (bound %.2e)\n", what.c_str(), cmp.worst_rel,
              cmp.rms_rel(), static_cast<long long>(cmp.top1_agree), static_cast<long long>(cmp.rows), tolerance);
  EXPECT_LE(cmp.worst_rel, tolerance);
  EXPECT_GE(cmp.top1_agree, kMinTop1Agreement * static_cast<double>(cmp.rows));
}

void check_scheme(const GpuModel& gpu_model, Transformer* cpu_quantized, Transformer* cpu_float, const std::string& what,
                  DType kv_cache = DType::kBF16, const std::vector<float>& k_scales = {},
                  const std::vector<float>& v_scales = {}, double row_bound = kSchemeGarbageBound) {
  SCOPED_TRACE("REPRO " + what);
  RunLogits gpu;
  std::vector<RunLogits> cpu_runs;
  run_gpu_and_cpu(gpu_model, {cpu_quantized, cpu_float}, &gpu, &cpu_runs, kv_cache, k_scales, v_scales);
  if (::testing::Test::HasFatalFailure()) return;
  const int64_t V = gpu_model.config().vocab_size;
  const Compare vs_ref = compare_runs(gpu, cpu_runs[0], V);
  const Compare gpu_cost = compare_runs(gpu, cpu_runs[1], V);
  const Compare ref_cost = compare_runs(cpu_runs[0], cpu_runs[1], V);
  std::printf("  %-36s vs CPU scheme: worst %.2e top1 %lld/%lld | distance from float (rms rel): GPU %.3f, CPU %.3f\n",
              what.c_str(), vs_ref.worst_rel, static_cast<long long>(vs_ref.top1_agree),
              static_cast<long long>(vs_ref.rows), gpu_cost.rms_rel(), ref_cost.rms_rel());
  EXPECT_LE(vs_ref.worst_rel, row_bound);
  EXPECT_LE(gpu_cost.rms_rel(), kSchemeAccuracyFactor * ref_cost.rms_rel() + kSchemeAccuracySlack);
}

// A scheme's quantized model and its GPU copy (fatal failures abort the caller).
void quantize_to_gpu(const ModelWeights& w, const std::string& scheme_name, const CalibrationStats* stats, QuantizedModel* qm,
                     std::unique_ptr<GpuModel>* gm) {
  Scheme scheme;
  ASSERT_TRUE(find_scheme(scheme_name, &scheme).ok()) << scheme_name;
  Status st = quantize_model(w, scheme, stats, {}, qm);
  ASSERT_TRUE(st.ok()) << scheme_name << ": " << st.to_string();
  st = GpuModel::from_quantized(*qm, 0, gm);
  ASSERT_TRUE(st.ok()) << scheme_name << ": " << st.to_string();
}

// A long prefill of an 8-bit model, every position's logits (MoE: more rows per expert than the
// decode-size kernel takes, so the gather + wgmma grouped GEMMs): the GPU against the CPU reference
// of the same quantized model, and both against the float model. Prints one line naming the path.
struct LongPrefill {
  Compare vs_ref, gpu_cost, ref_cost;
};
// fp8_fast_accumulation: GpuRuntimeOptions' (the FP8 GEMMs' and experts' tensor-core accumulation).
void long_prefill(const GpuModel& gm, Transformer* cpu_quantized, Transformer* cpu_float, int64_t n,
                  const std::string& what, LongPrefill* out, bool fp8_fast_accumulation = false) {
  const int64_t V = gm.config().vocab_size;
  GpuRuntimeOptions o;
  o.max_context = 256;
  o.max_step_tokens = 256;
  o.fp8_fast_accumulation = fp8_fast_accumulation;
  std::unique_ptr<GpuRuntime> rt;
  ASSERT_TRUE(GpuRuntime::create(gm, o, &rt).ok());
  const std::vector<int32_t> p = prompt(n, V, 13);
  RunLogits g, q, f;
  const Status st = rt->prefill({p}, true, &g.prefill);
  ASSERT_TRUE(st.ok()) << st.to_string();
  q.prefill.resize(static_cast<size_t>(n * V));
  f.prefill.resize(static_cast<size_t>(n * V));
  cpu_quantized->reset();
  cpu_float->reset();
  ASSERT_TRUE(cpu_quantized->forward(p.data(), n, 0, q.prefill.data()).ok());
  ASSERT_TRUE(cpu_float->forward(p.data(), n, 0, f.prefill.data()).ok());
  out->vs_ref = compare_runs(g, q, V);
  out->gpu_cost = compare_runs(g, f, V);
  out->ref_cost = compare_runs(q, f, V);
  const std::string path = rt->describe_linears(n).back();
  std::printf("  %-36s prefill %lld (%s): vs CPU scheme worst %.2e (%lld rows > %.2f) top1 %lld/%lld | from float: GPU %.3f, CPU %.3f\n",
              what.c_str(), static_cast<long long>(n), path.find("wgmma") != std::string::npos ? "wgmma" : "decode",
              out->vs_ref.worst_rel, static_cast<long long>(out->vs_ref.over_garbage_bound), kSchemeGarbageBound,
              static_cast<long long>(out->vs_ref.top1_agree), static_cast<long long>(out->vs_ref.rows),
              out->gpu_cost.rms_rel(), out->ref_cost.rms_rel());
}

// Logits of every position of one prefill of `tokens` (a fresh runtime, context 32).
std::vector<float> prefill_logits(const GpuModel& gm, const std::vector<int32_t>& tokens) {
  GpuRuntimeOptions o;
  o.max_context = 32;
  std::unique_ptr<GpuRuntime> rt;
  EXPECT_TRUE(GpuRuntime::create(gm, o, &rt).ok());
  std::vector<float> out;
  const Status st = rt->prefill({tokens}, true, &out);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

}  // namespace
}  // namespace llmq
