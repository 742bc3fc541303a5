// The dense MoE path against its per-expert forms, in one run: every token through every expert
// (the FP8 MoE note's dense compute), Mixtral-8x7B's first expert GEMM (8 experts, 4096 -> 14336)
// by default. Variants:
//   fp8 per-expert  one cuBLASLt FP8 GEMM per expert, per-token x per-channel scales in the epilogue
//   fp8 dense       ONE strided-batched FP8 GEMM (activations shared, unit scales, BF16 out) +
//                   cuda_moe_post_scale in place
//   bf16 per-expert one cuBLASLt BF16 GEMM per expert (the peer)
// Usage: bench_cuda_moe [--experts E --k K --n N --tokens 1,16,... --json FILE --commit C]
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cuda_bench_support.cuh"
#include "llmq/cuda_gemm.hpp"
#include "llmq/cuda_moe.hpp"

using namespace llmq;
using namespace llmq::bench;

int main(int argc, char** argv) {
  int64_t experts = 8, k = 4096, n = 14336;
  std::vector<int64_t> tokens_list = {1, 16, 64, 512, 4096};
  std::string json_path, commit = "unknown";
  CLI::App app{"bench_cuda_moe: the dense MoE path (every token through every expert) against its per-expert forms"};
  last_value_wins(app);
  app.add_option("--experts", experts, "experts")->capture_default_str()->check(at_least(1, "an expert at least"));
  app.add_option("--k", k, "K, the hidden size")->capture_default_str()->check(at_least(1, "a dimension"));
  app.add_option("--n", n, "N, the expert width")->capture_default_str()->check(at_least(1, "a dimension"));
  comma_list(app.add_option("--tokens", tokens_list, "token counts, comma-separated")->capture_default_str())
      ->check(at_least(1, "a token at least"));
  app.add_option("--json", json_path, "also write one JSON object per line per token count to FILE")
      ->type_name("FILE");
  app.add_option("--commit", commit, "the commit recorded in the JSON lines")->envname("LLMQ_COMMIT")
      ->capture_default_str()
      ->type_name("COMMIT");
  bool quick = false;
  app.add_flag("--quick", quick, "token counts 1, 64 and 512 only (unless --tokens is given)");
  parse_command_line(app, argc, argv);
  if (quick && app.count("--tokens") == 0) tokens_list = {1, 64, 512};
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int64_t max_t = *std::max_element(tokens_list.begin(), tokens_list.end());
  DeviceMem w8(static_cast<size_t>(experts * n * k)), w16(static_cast<size_t>(experts * n * k * 2));
  DeviceMem x8(static_cast<size_t>(max_t * k)), x16(static_cast<size_t>(max_t * k * 2));
  DeviceMem xs(static_cast<size_t>(max_t * 4)), ws(static_cast<size_t>(experts * n * 4)), ones(static_cast<size_t>(experts * 4));
  DeviceMem y(static_cast<size_t>(experts * max_t * n * 2));
  fill_e4m3<<<grid_for(experts * n * k), 256>>>(w8.as<uint8_t>(), experts * n * k, 1);
  fill_bf16<<<grid_for(experts * n * k), 256>>>(w16.as<__nv_bfloat16>(), experts * n * k, 2);
  fill_e4m3<<<grid_for(max_t * k), 256>>>(x8.as<uint8_t>(), max_t * k, 3);
  fill_bf16<<<grid_for(max_t * k), 256>>>(x16.as<__nv_bfloat16>(), max_t * k, 4);
  fill_scales<<<grid_for(max_t), 256>>>(xs.as<float>(), max_t, 5);
  fill_scales<<<grid_for(experts * n), 256>>>(ws.as<float>(), experts * n, 6);
  BENCH_CHECK(cudaDeviceSynchronize());

  std::unique_ptr<CudaGemmRunner> runner;
  BENCH_CHECK(CudaGemmRunner::create(0, &runner));
  DeviceMem workspace(static_cast<size_t>(kCublasLtWorkspaceBytes + (16 << 20)));
  const int64_t ws_bytes = kCublasLtWorkspaceBytes + (16 << 20);

  std::ofstream json;
  if (!json_path.empty()) json.open(json_path);
  std::printf("%s: %lld experts, K %lld, N %lld (every token through every expert)\n", prop.name,
              static_cast<long long>(experts), static_cast<long long>(k), static_cast<long long>(n));
  std::printf("%7s | %14s | %14s | %14s | %8s | %8s\n", "tokens", "fp8 per-expert", "fp8 dense", "bf16 per-expert",
              "dense/pe", "dense/bf16");
  for (const int64_t t : tokens_list) {
    auto per_expert = [&](bool fp8) {
      for (int64_t e = 0; e < experts; ++e) {
        CudaGemmProblem p;
        p.m = t;
        p.n = n;
        p.k = k;
        if (fp8) {
          p.a = {x8.p, DType::kE4M3, 0, 0, GemmScaleMode::kOuterVector, ScaleLayout::kRowMajor, xs.as<float>()};
          p.b = {w8.as<uint8_t>() + e * n * k, DType::kE4M3, 0, 0, GemmScaleMode::kOuterVector, ScaleLayout::kRowMajor,
                 ws.as<float>() + e * n};
        } else {
          p.a = {x16.p, DType::kBF16};
          p.b = {w16.as<__nv_bfloat16>() + e * n * k, DType::kBF16};
        }
        p.d = y.as<__nv_bfloat16>() + e * t * n;
        BENCH_CHECK(runner->run(p, workspace.p, ws_bytes, nullptr));
      }
    };
    auto dense = [&]() {
      CudaGemmProblem p;
      p.m = t;
      p.n = n;
      p.k = k;
      p.batch = experts;
      p.a = {x8.p, DType::kE4M3};
      p.a.shared_across_batch = true;
      p.b = {w8.p, DType::kE4M3};
      p.d = y.p;
      BENCH_CHECK(runner->run(p, workspace.p, ws_bytes, nullptr));
      MoePostScale ps;
      ps.experts = experts;
      ps.tokens = t;
      ps.n_cols = n;
      ps.y = y.p;
      ps.y_dtype = DType::kBF16;
      ps.token_scales = xs.as<float>();
      ps.expert_scales = ws.as<float>();
      ps.per_channel = true;
      ps.out = y.p;
      BENCH_CHECK(cuda_moe_post_scale(ps, nullptr));
    };
    const double pe8 = queued_median_us([&] { per_expert(true); });
    const double d8 = queued_median_us(dense);
    const double pe16 = queued_median_us([&] { per_expert(false); });
    std::printf("%7lld | %11.1f us | %11.1f us | %12.1f us | %7.2fx | %7.2fx\n", static_cast<long long>(t), pe8, d8,
                pe16, pe8 / d8, pe16 / d8);
    if (json.is_open())
      json << nlohmann::json{{"bench", "moe_dense"}, {"device", prop.name}, {"experts", experts}, {"k", k},
                             {"n", n}, {"tokens", t}, {"fp8_per_expert_us", pe8}, {"fp8_dense_us", d8},
                             {"bf16_per_expert_us", pe16},
                             {"commit", commit}}
                  .dump()
           << "\n";
  }
  return 0;
}
