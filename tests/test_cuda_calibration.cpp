// Calibration on the GPU (issue 27): (a) the per-channel absmax kernel (runtime/channel_absmax.hpp)
// against its host reference on random inputs with outlier channels, NaN/Inf and odd shapes, bit
// for bit; (b) calibrate_on_gpu (BF16 runtime) against the CPU calibrate() on the seeded default
// model and stories260K, within the BF16 bounds stated below. SKIPPED without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "llmq/format.hpp"
#include "runtime/channel_absmax.hpp"
#include "runtime_compare.hpp"

namespace llmq {
namespace {

using testing::DeviceBuffer;

struct KernelCase {
  int64_t rows, k, ld;
  DType dtype;
  bool poison;  // NaN and +-Inf planted at known places
};

// Runs the kernel on `x` (float values; BF16 cases round them to BF16 first, and the reference
// then reads the rounded values) folded into a running max that already holds `start`.
void check_kernel_case(const KernelCase& c, uint64_t seed) {
  const std::string what = testing::repro(seed, c.rows, c.k, std::string("ld=") + std::to_string(c.ld) + " " +
                                                                 dtype_name(c.dtype) + (c.poison ? " poisoned" : ""));
  std::vector<float> x = testing::outlier_matrix(c.rows, c.ld, seed);
  if (c.poison && c.rows > 0) {  // three distinct places in every poisoned case below
    const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity()};
    for (int i = 0; i < 3; ++i) {
      const int64_t r = (i * 7) % c.rows, j = (i * 13) % c.k;  // inside the k read columns
      x[r * c.ld + j] = bad[i];
    }
  }
  if (c.dtype == DType::kBF16)
    for (float& v : x) v = bf16_bits_to_float(float_to_bf16_bits(v));
  // A running max that already holds values: half the channels start above most of their inputs.
  std::vector<float> start(static_cast<size_t>(c.k), 0.0f);
  for (int64_t j = 0; j < c.k; j += 2) start[j] = 1.5f + 0.25f * static_cast<float>(j % 5);

  std::vector<float> want = start;
  int64_t want_bad = 0;
  runtime::channel_absmax_reference(x.data(), c.rows, c.k, c.ld, want.data(), &want_bad);
  if (c.poison && c.rows > 0) EXPECT_EQ(want_bad, 3) << "the reference miscounts planted NaN/Inf; " << what;

  const size_t n = static_cast<size_t>(std::max<int64_t>(c.rows * c.ld, 1));
  DeviceBuffer<uint16_t> xb(n);
  DeviceBuffer<float> xf(n);
  DeviceBuffer<float> m(static_cast<size_t>(c.k));
  DeviceBuffer<unsigned long long> bad(1);
  ASSERT_TRUE(xb.ok() && xf.ok() && m.ok() && bad.ok()) << what;
  if (c.dtype == DType::kBF16) {
    std::vector<uint16_t> bits(n, 0);
    for (size_t i = 0; i < x.size(); ++i) bits[i] = float_to_bf16_bits(x[i]);
    CUDA_ASSERT(xb.upload(bits));
  } else if (!x.empty()) {
    CUDA_ASSERT(xf.upload(x));
  }
  CUDA_ASSERT(m.upload(start));
  CUDA_ASSERT(bad.fill_bytes(0));
  runtime::ChannelAbsmaxArgs a;
  a.x = c.dtype == DType::kBF16 ? static_cast<const void*>(xb.get()) : static_cast<const void*>(xf.get());
  a.dtype = c.dtype;
  a.rows = c.rows;
  a.k = c.k;
  a.ld = c.ld;
  a.channel_max = m.get();
  a.nonfinite = bad.get();
  const Status st = runtime::channel_absmax(a, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string() << "; " << what;
  CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<float> got;
  std::vector<unsigned long long> got_bad;
  CUDA_ASSERT(m.download(&got));
  CUDA_ASSERT(bad.download(&got_bad));
  EXPECT_EQ(static_cast<int64_t>(got_bad[0]), want_bad) << "non-finite count; " << what;
  int64_t differ = 0;
  for (int64_t j = 0; j < c.k; ++j)
    if (got[j] != want[j] && differ++ < 5)  // max involves no rounding: equal bits
      ADD_FAILURE() << "channel " << j << ": device " << got[j] << ", reference " << want[j] << " (start " << start[j]
                    << "); " << what;
  EXPECT_EQ(differ, 0) << "channels that differ; " << what;
}

TEST(CudaCalibration, ChannelAbsmaxMatchesReference) {
  LLMQ_REQUIRE_GPU();
  const KernelCase cases[] = {
      {1, 1, 1, DType::kBF16, false},      {19, 111, 111, DType::kBF16, false}, {99, 500, 512, DType::kBF16, true},
      {989, 257, 257, DType::kF32, true},  {200, 4096, 4096, DType::kBF16, false}, {64, 255, 256, DType::kF32, false},
      {65, 256, 256, DType::kBF16, true},  {0, 17, 17, DType::kF32, false},
      // More row chunks than the grid launches (4096 x 64 rows): the grid stride walks the rest.
      {4096 * 64 + 3, 3, 3, DType::kBF16, true},
  };
  uint64_t seed = 1;
  for (const KernelCase& c : cases) check_kernel_case(c, seed++);
}

TEST(CudaCalibration, ChannelAbsmaxRefusesBadArguments) {
  runtime::ChannelAbsmaxArgs a;
  float m = 0.0f;
  unsigned long long bad = 0;
  uint16_t x = 0;
  a.x = &x;
  a.channel_max = &m;
  a.nonfinite = &bad;
  a.rows = 1;
  a.k = 1;
  a.ld = 1;
  a.dtype = DType::kI8;
  EXPECT_NE(runtime::channel_absmax(a, nullptr).message().find("dtype"), std::string::npos);
  a.dtype = DType::kBF16;
  a.ld = 0;
  EXPECT_NE(runtime::channel_absmax(a, nullptr).message().find("ld"), std::string::npos);
  a.ld = 1;
  a.rows = -1;
  EXPECT_NE(runtime::channel_absmax(a, nullptr).message().find("rows"), std::string::npos);
  a.rows = 1;
  a.x = nullptr;
  EXPECT_NE(runtime::channel_absmax(a, nullptr).message().find("null"), std::string::npos);
}

// The gather form (rows of a paged K/V cache as a step wrote them): two sequences in table rows 0
// and 1 of a cache of 4-position blocks, their tables out of order; the rows the step names are
// folded (a NaN among them counted), a huge value in a row it does not name is not.
TEST(CudaCalibration, ChannelAbsmaxGathersCacheRowsThroughTheBlockTable) {
  LLMQ_REQUIRE_GPU();
  const int64_t block = 4, blocks = 6, width = 24, k = 20;
  const std::vector<int32_t> table = {3, 1, 0, 5, 2, 4};  // [2 rows, stride 3]
  std::vector<float> cache = testing::outlier_matrix(blocks * block, width, 41);
  for (float& v : cache) v = bf16_bits_to_float(float_to_bf16_bits(v));
  const std::vector<int32_t> slot = {0, 0, 0, 1, 1}, position = {0, 5, 9, 2, 7};
  auto row_of = [&](size_t t) { return table[slot[t] * 3 + position[t] / block] * block + position[t] % block; };
  cache[static_cast<size_t>(row_of(3) * width + 7)] = std::numeric_limits<float>::quiet_NaN();
  cache[static_cast<size_t>(row_of(0) + 1) * width + 2] = 1e30f;  // position 1 of slot 0: not in the step
  std::vector<float> want(static_cast<size_t>(k), 0.0f);
  int64_t want_bad = 0;
  for (size_t t = 0; t < slot.size(); ++t)
    runtime::channel_absmax_reference(cache.data() + row_of(t) * width, 1, k, width, want.data(), &want_bad);
  ASSERT_EQ(want_bad, 1);
  std::vector<uint16_t> bits(cache.size());
  for (size_t i = 0; i < cache.size(); ++i) bits[i] = float_to_bf16_bits(cache[i]);
  DeviceBuffer<uint16_t> xb(bits.size());
  DeviceBuffer<int32_t> tb(table.size()), sb(slot.size()), pb(position.size());
  DeviceBuffer<float> m(static_cast<size_t>(k));
  DeviceBuffer<unsigned long long> bad(1);
  ASSERT_TRUE(xb.ok() && tb.ok() && sb.ok() && pb.ok() && m.ok() && bad.ok());
  CUDA_ASSERT(xb.upload(bits));
  CUDA_ASSERT(tb.upload(table));
  CUDA_ASSERT(sb.upload(slot));
  CUDA_ASSERT(pb.upload(position));
  CUDA_ASSERT(m.fill_bytes(0));
  CUDA_ASSERT(bad.fill_bytes(0));
  runtime::ChannelAbsmaxArgs a;
  a.x = xb.get();
  a.rows = static_cast<int64_t>(slot.size());
  a.k = k;
  a.ld = width;
  a.channel_max = m.get();
  a.nonfinite = bad.get();
  a.position = pb.get();
  a.slot = sb.get();
  a.pages.block_table = tb.get();
  a.pages.table_stride = 3;
  a.pages.block_size = block;
  a.pages.num_blocks = blocks;
  ASSERT_TRUE(runtime::channel_absmax(a, nullptr).ok());
  CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<float> got;
  std::vector<unsigned long long> got_bad;
  CUDA_ASSERT(m.download(&got));
  CUDA_ASSERT(bad.download(&got_bad));
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_bad[0], 1u);
  a.slot = nullptr;
  EXPECT_NE(runtime::channel_absmax(a, nullptr).message().find("position without slot"), std::string::npos);
}

// ---- (b) The GPU runtime's statistics against the CPU's.
//
// Weights: the BF16 runtime holds BF16-rounded weights, and rounding to nearest is monotone and
// symmetric, so its absmax is exactly the BF16 rounding of the CPU's float absmax: compared for
// equality, channel by channel.
// Inputs: the GPU's activations are BF16 between kernels (each rounding moves a value by up to
// 2^-9 relative) and its GEMMs sum in another order, so deeper layers drift; the logits of the same
// models drift by up to 7e-2 relative L2 per row (runtime_compare.hpp, measured on the H100). A max
// over rows is steadier than a row. The bounds (the test prints the worst values; on an H100,
// 2026-11-27: worst tensor 2.7e-2 on the default model, worst channel at 0.85 of its bound on
// stories260K):
constexpr double kTensorAbsmaxRel = 0.05;      // |r_x gpu - r_x cpu| <= this x r_x cpu
constexpr double kChannelAbsmaxRel = 0.05;     // per channel: this x channel cpu ...
constexpr double kChannelAbsmaxSlack = 0.01;   // ... + this x r_x cpu (channels far below the tensor's max)

float bf16_round(float v) { return bf16_bits_to_float(float_to_bf16_bits(v)); }

// channel_scale widens the per-channel bound (an MoE model's later layers: see its test).
void compare_stats(const CalibrationStats& gpu, const CalibrationStats& cpu, const std::string& model,
                   double channel_scale = 1.0) {
  EXPECT_EQ(gpu.tokens, cpu.tokens) << model;
  for (const auto& [name, c] : cpu.linears)
    EXPECT_TRUE(gpu.linears.count(name) == 1) << model << ": the GPU did not record " << name;
  for (const auto& [name, g] : gpu.linears)
    EXPECT_TRUE(cpu.linears.count(name) == 1) << model << ": the GPU recorded " << name << ", the CPU did not";
  double worst_tensor = 0, worst_channel = 0;
  std::string worst_tensor_at, worst_channel_at;
  for (const auto& [name, c] : cpu.linears) {
    const auto it = gpu.linears.find(name);
    if (it == gpu.linears.end()) continue;
    const LinearStats& g = it->second;
    const std::string at = model + " " + name;
    ASSERT_EQ(g.in_features, c.in_features) << at;
    ASSERT_EQ(g.input_channel_absmax.size(), c.input_channel_absmax.size()) << at;
    ASSERT_EQ(g.weight_channel_absmax.size(), c.weight_channel_absmax.size()) << at;
    EXPECT_EQ(g.rows_seen, c.rows_seen) << at << ": rows_seen";
    EXPECT_EQ(g.weight_absmax, static_cast<double>(bf16_round(static_cast<float>(c.weight_absmax))))
        << at << ": weight_absmax, CPU " << c.weight_absmax;
    int64_t weight_differ = 0;
    for (size_t j = 0; j < c.weight_channel_absmax.size(); ++j)
      if (g.weight_channel_absmax[j] != bf16_round(c.weight_channel_absmax[j]) && weight_differ++ < 3)
        ADD_FAILURE() << at << ": weight channel " << j << ": GPU " << g.weight_channel_absmax[j] << ", CPU "
                      << c.weight_channel_absmax[j] << " (BF16 " << bf16_round(c.weight_channel_absmax[j]) << ")";
    EXPECT_EQ(weight_differ, 0) << at << ": weight channels that differ from the BF16-rounded CPU values";

    const double tensor_rel = std::fabs(g.input_absmax - c.input_absmax) / c.input_absmax;
    EXPECT_LE(tensor_rel, kTensorAbsmaxRel) << at << ": input_absmax GPU " << g.input_absmax << ", CPU " << c.input_absmax;
    if (tensor_rel > worst_tensor) worst_tensor = tensor_rel, worst_tensor_at = name;
    int64_t channel_over = 0;
    for (size_t j = 0; j < c.input_channel_absmax.size(); ++j) {
      const double cj = c.input_channel_absmax[j], gj = g.input_channel_absmax[j];
      const double bound = channel_scale * (kChannelAbsmaxRel * cj + kChannelAbsmaxSlack * c.input_absmax);
      const double excess = std::fabs(gj - cj) / bound;  // > 1: out of bounds
      if (excess > worst_channel) worst_channel = excess, worst_channel_at = name + " channel " + std::to_string(j);
      if (excess > 1.0 && channel_over++ < 3)
        ADD_FAILURE() << at << ": input channel " << j << ": GPU " << gj << ", CPU " << cj << " (bound " << bound
                      << ")";
    }
    EXPECT_EQ(channel_over, 0) << at << ": input channels out of bounds";
  }
  std::printf("  %s: %zu linears; worst input_absmax rel %.3e (%s, bound %.2e); worst channel at %.2f of its bound (%s)\n",
              model.c_str(), cpu.linears.size(), worst_tensor, worst_tensor_at.c_str(), kTensorAbsmaxRel, worst_channel,
              worst_channel_at.c_str());
  // The KV cache per layer and KV head: the GPU's cache holds BF16 keys and values computed from
  // BF16 activations, so the same bound as a tensor's input absmax.
  const KvCacheStats &gk = gpu.kv_cache, &ck = cpu.kv_cache;
  ASSERT_FALSE(ck.empty()) << model;
  ASSERT_EQ(gk.layers, ck.layers) << model;
  ASSERT_EQ(gk.kv_heads, ck.kv_heads) << model;
  double worst_kv = 0;
  for (size_t i = 0; i < ck.k_absmax.size(); ++i)
    for (const auto& [g, c, what] : {std::tuple<float, float, const char*>{gk.k_absmax[i], ck.k_absmax[i], "K"},
                                     {gk.v_absmax[i], ck.v_absmax[i], "V"}}) {
      ASSERT_GT(c, 0.0f) << model << " " << what << " " << i;
      const double rel = std::fabs(static_cast<double>(g) - c) / c;
      worst_kv = std::max(worst_kv, rel);
      EXPECT_LE(rel, kTensorAbsmaxRel) << model << ": " << what << " cache absmax of layer " << i / ck.kv_heads << " head "
                                       << i % ck.kv_heads << ": GPU " << g << ", CPU " << c;
    }
  std::printf("  %s: KV cache absmax of %lld layers x %lld heads; worst rel %.3e (bound %.2e)\n", model.c_str(),
              static_cast<long long>(ck.layers), static_cast<long long>(ck.kv_heads), worst_kv, kTensorAbsmaxRel);
}

// Two windows of 24 (the second partial) through a runtime whose steps take 16 tokens, so that
// each window's prefill is two steps and lm_head runs per step: what is observed must not depend
// on how the runtime splits the work.
TEST(CudaCalibration, RuntimeMatchesCpuCalibrate) {
  LLMQ_REQUIRE_GPU();
  std::vector<std::pair<std::string, ModelWeights>> models;
  models.emplace_back("default", make_default_model());
  if (have_stories()) {
    ModelWeights w;
    const Status st = load_llama2c(stories_path(), &w);
    ASSERT_TRUE(st.ok()) << st.to_string();
    models.emplace_back("stories260K", std::move(w));
  } else {
    std::printf("  stories260K: %s\n", testing::test_data_absent(stories_path()).c_str());
  }
  constexpr int64_t kChunk = 24;
  for (auto& [name, w] : models) {
    const std::vector<int32_t> tokens = prompt(40, w.config.vocab_size, 7), more = prompt(30, w.config.vocab_size, 9);
    CalibrationStats cpu, gpu;
    Status cst = calibrate(w, tokens, kChunk, &cpu);
    ASSERT_TRUE(cst.ok()) << name << ": " << cst.to_string();
    cst = calibrate(w, more, kChunk, &cpu);
    ASSERT_TRUE(cst.ok()) << name << ": " << cst.to_string();
    std::unique_ptr<GpuModel> gm;
    Status st = GpuModel::from_float(w, DType::kBF16, 0, &gm);
    ASSERT_TRUE(st.ok()) << name << ": " << st.to_string();
    GpuRuntimeOptions o;
    o.max_context = kChunk;
    o.max_step_tokens = 16;
    o.max_batch = 3;  // the 4 windows go 3 to a prefill, packed into steps of 16 positions
    std::unique_ptr<GpuRuntime> rt;
    st = GpuRuntime::create(*gm, o, &rt);
    ASSERT_TRUE(st.ok()) << name << ": " << st.to_string();
    st = calibrate_on_gpu(*rt, {tokens, more}, kChunk, &gpu);
    ASSERT_TRUE(st.ok()) << name << ": " << st.to_string();
    compare_stats(gpu, cpu, name);
    // A second pass over the same tokens folds into the same statistics: maxima unchanged
    // (the same values again), rows doubled, as calibrate() does when called per sequence.
    CalibrationStats twice = gpu;
    st = calibrate_on_gpu(*rt, {tokens, more}, kChunk, &twice);
    ASSERT_TRUE(st.ok()) << name << ": " << st.to_string();
    for (const auto& [m, l] : gpu.linears) {
      EXPECT_EQ(twice.linears.at(m).rows_seen, 2 * l.rows_seen) << name << " " << m;
      EXPECT_EQ(twice.linears.at(m).input_channel_absmax, l.input_channel_absmax) << name << " " << m << ": not deterministic";
    }
    EXPECT_EQ(twice.kv_cache.k_absmax, gpu.kv_cache.k_absmax) << name << ": KV not deterministic";
    EXPECT_EQ(twice.kv_cache.v_absmax, gpu.kv_cache.v_absmax) << name << ": KV not deterministic";
  }
}

// An MoE model (the seeded default with 4 experts, top-2): every linear outside the experts (the
// router included) and the KV cache within the bounds above; the experts, whose routed rows follow
// the router's BF16 logits (a near-tie may send a token elsewhere than on the CPU): together they
// see every token top_k times, each expert about the CPU's rows, its w1 and w3 the same input, their
// union exactly the router's input (the rows partition the tokens), and its weights exactly the
// BF16 rounding of the CPU's. A token routed elsewhere takes another path through every later
// layer, so per channel the dense bound is doubled here (H100, 2026-11-28: lm_head channel 48 at
// 1.22 of the dense bound; every tensor within 1.4%, the KV cache within 0.7%).
TEST(CudaCalibration, MoeRuntimeMatchesCpuCalibrate) {
  LLMQ_REQUIRE_GPU();
  DefaultModelOptions mo;
  mo.n_experts = 4;
  const ModelWeights w = make_default_model(mo);
  const ModelConfig& c = w.config;
  ASSERT_TRUE(c.is_moe());
  constexpr int64_t kChunk = 24;
  const std::vector<int32_t> tokens = prompt(40, c.vocab_size, 7);
  CalibrationStats cpu, gpu;
  ASSERT_TRUE(calibrate(w, tokens, kChunk, &cpu).ok());
  std::unique_ptr<GpuModel> gm;
  Status st = GpuModel::from_float(w, DType::kBF16, 0, &gm);
  ASSERT_TRUE(st.ok()) << st.to_string();
  GpuRuntimeOptions o;
  o.max_context = kChunk;
  o.max_step_tokens = 16;
  std::unique_ptr<GpuRuntime> rt;
  ASSERT_TRUE(GpuRuntime::create(*gm, o, &rt).ok());
  st = calibrate_on_gpu(*rt, {tokens}, kChunk, &gpu);
  ASSERT_TRUE(st.ok()) << st.to_string();
  auto is_expert = [](const std::string& name) { return name.find(".experts.") != std::string::npos; };
  CalibrationStats gpu_rest = gpu, cpu_rest = cpu;
  for (CalibrationStats* s : {&gpu_rest, &cpu_rest})
    for (auto it = s->linears.begin(); it != s->linears.end();) it = is_expert(it->first) ? s->linears.erase(it) : std::next(it);
  compare_stats(gpu_rest, cpu_rest, "default moe", 2.0);
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LinearId router_id;
    router_id.layer = l;
    router_id.role = LinearRole::kRouter;
    const LinearStats& router = gpu.linears.at(router_id.hf_name(c));
    int64_t gpu_rows = 0, cpu_rows = 0;
    std::vector<float> union_absmax(static_cast<size_t>(c.dim), 0.0f);
    for (int64_t e = 0; e < c.n_experts; ++e) {
      LinearId id;
      id.layer = l;
      id.expert = e;
      id.role = LinearRole::kGate;
      const std::string w1 = id.hf_name(c);
      id.role = LinearRole::kUp;
      const std::string w3 = id.hf_name(c);
      id.role = LinearRole::kDown;
      const std::string w2 = id.hf_name(c);
      const auto g = gpu.linears.find(w1), cp = cpu.linears.find(w1);
      const int64_t gr = g == gpu.linears.end() ? 0 : g->second.rows_seen, cr = cp == cpu.linears.end() ? 0 : cp->second.rows_seen;
      gpu_rows += gr;
      cpu_rows += cr;
      EXPECT_LE(std::abs(gr - cr), std::max<int64_t>(2, cr / 10)) << w1 << ": rows GPU " << gr << ", CPU " << cr;
      if (g == gpu.linears.end()) continue;
      ASSERT_EQ(gpu.linears.count(w3), 1u) << w3;
      ASSERT_EQ(gpu.linears.count(w2), 1u) << w2;
      EXPECT_EQ(gpu.linears.at(w3).input_channel_absmax, g->second.input_channel_absmax) << w3;
      EXPECT_EQ(gpu.linears.at(w2).rows_seen, gr) << w2;
      EXPECT_EQ(gpu.linears.at(w2).in_features, c.hidden_dim) << w2;
      for (int64_t k = 0; k < c.dim; ++k)
        union_absmax[static_cast<size_t>(k)] = std::max(union_absmax[static_cast<size_t>(k)], g->second.input_channel_absmax[static_cast<size_t>(k)]);
      if (cp == cpu.linears.end()) continue;
      for (const std::string& m : {w1, w3, w2}) {
        const LinearStats &gs = gpu.linears.at(m), &cs = cpu.linears.at(m);
        ASSERT_EQ(gs.weight_channel_absmax.size(), cs.weight_channel_absmax.size()) << m;
        for (size_t j = 0; j < cs.weight_channel_absmax.size(); ++j)
          ASSERT_EQ(gs.weight_channel_absmax[j], bf16_round(cs.weight_channel_absmax[j])) << m << " weight channel " << j;
        if (gr == cr)  // the same rows: the input bound of the dense linears
          EXPECT_LE(std::fabs(gs.input_absmax - cs.input_absmax), kTensorAbsmaxRel * cs.input_absmax)
              << m << ": input_absmax GPU " << gs.input_absmax << ", CPU " << cs.input_absmax;
      }
    }
    EXPECT_EQ(gpu_rows, n * c.n_experts_per_token) << "layer " << l;
    EXPECT_EQ(cpu_rows, n * c.n_experts_per_token) << "layer " << l;
    EXPECT_EQ(union_absmax, router.input_channel_absmax) << "layer " << l << ": the experts' rows are the router's";
  }
}

TEST(CudaCalibration, RuntimeRefusesWhatItCannotObserve) {
  LLMQ_REQUIRE_GPU();
  const ModelWeights w = make_default_model();
  std::unique_ptr<GpuModel> gm;
  ASSERT_TRUE(GpuModel::from_float(w, DType::kBF16, 0, &gm).ok());
  GpuRuntimeOptions o;
  o.max_context = 32;
  std::unique_ptr<GpuRuntime> rt;
  ASSERT_TRUE(GpuRuntime::create(*gm, o, &rt).ok());
  CalibrationStats stats;
  EXPECT_NE(rt->end_calibration(&stats).message().find("not calibrating"), std::string::npos);
  ASSERT_TRUE(rt->begin_calibration().ok());
  EXPECT_NE(rt->begin_calibration().message().find("already"), std::string::npos);
  // generate runs eagerly while calibrating (no graph keeps the observer), and is observed.
  std::vector<std::vector<int32_t>> out;
  const Status gen = rt->generate({1}, 3, {}, &out);
  EXPECT_TRUE(gen.ok()) << gen.to_string();
  ASSERT_TRUE(rt->end_calibration(&stats).ok());
  EXPECT_EQ(stats.linears.at("lm_head").rows_seen, 3);  // one row per decode step
  EXPECT_EQ(stats.kv_cache.layers, w.config.n_layers);  // the decode steps' K/V rows too
  ASSERT_EQ(stats.kv_cache.v_absmax.size(), static_cast<size_t>(w.config.n_layers * w.config.n_kv_heads));
  for (float v : stats.kv_cache.v_absmax) EXPECT_GT(v, 0.0f);
  GpuRuntimeOptions e4m3 = o;
  e4m3.kv_cache_dtype = DType::kE4M3;
  std::unique_ptr<GpuRuntime> fp8_kv;
  ASSERT_TRUE(GpuRuntime::create(*gm, e4m3, &fp8_kv).ok());
  EXPECT_NE(fp8_kv->begin_calibration().message().find("BF16 KV cache"), std::string::npos);
  o.skip_stages = "rope";
  std::unique_ptr<GpuRuntime> skipping;
  ASSERT_TRUE(GpuRuntime::create(*gm, o, &skipping).ok());
  EXPECT_NE(skipping->begin_calibration().message().find("skip_stages"), std::string::npos);
  std::unique_ptr<GpuModel> fp8;
  ASSERT_TRUE(GpuModel::synthetic(w.config, "fp8-dynamic", 1, 0, &fp8).ok());
  std::unique_ptr<GpuRuntime> quantized;
  ASSERT_TRUE(GpuRuntime::create(*fp8, GpuRuntimeOptions{}, &quantized).ok());
  const Status q = quantized->begin_calibration();
  EXPECT_NE(q.message().find("BF16 or F32 linears"), std::string::npos) << q.to_string();
}

}  // namespace
}  // namespace llmq
