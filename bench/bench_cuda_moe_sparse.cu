// The sparse MoE expert GEMM (cuda_moe_grouped_gemm) at the issue's shapes and token counts, with
// the dense path (every token through every expert) and the copy bandwidth in the same run; the
// PyTorch peers (torch._scaled_grouped_mm, torch._grouped_mm, a BF16 per-expert loop) are timed by
// bench/torch_moe_peers.py on the same routing in the same session (scripts/gpu-moe-bench).
//
// Routing: round-robin, token t to experts (t * top_k + s) % E, s < top_k (torch_moe_peers.py uses
// the same), rows expert-major. The FP8 weights rotate through enough sets that the active experts'
// bytes between two uses of one set exceed 2x L2. Per row: time, the active experts' weight bytes
// over time and as a fraction of the measured copy bandwidth (bytes read + written per second,
// cudaMemcpy device to device), TFLOPS over the routed rows.
// Usage: bench_cuda_moe_sparse [--shape mixtral-8x7b|gpt-oss-20b|qwen3-30b-a3b|llama3-8b[-qkv|-o|-gateup|-down]|all]
//                              [--tokens 1,4,...]
//                              [--json FILE] [--quick] [--decode-tiles N] [--commit C]
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cuda_bench_support.cuh"
#include "llmq/cuda_gemm.hpp"
#include "llmq/cuda_moe.hpp"
#include "llmq/gpu_runtime.hpp"

using namespace llmq;
using namespace llmq::bench;

namespace {

struct MoeShape {
  const char* name;
  int64_t experts, top_k, k, n;
};
// The llama3-8b-* shapes are dense: one expert that every token takes, so "grouped" is llmq's
// persistent TMA + wgmma FP8 kernel and "dense" a single cuBLASLt FP8 GEMM at the dense model's
// projection shapes: the yardstick for an FP8 GEMM of llmq's own (docs/engine.md: the GEMMs are
// about half of a serving step).
const MoeShape kShapes[] = {{"mixtral-8x7b", 8, 2, 4096, 14336},    {"gpt-oss-20b", 32, 4, 2880, 2880},
                            {"qwen3-30b-a3b", 128, 8, 2048, 1536},
                            {"llama3-8b-qkv", 1, 1, 4096, 6144},     {"llama3-8b-o", 1, 1, 4096, 4096},
                            {"llama3-8b-gateup", 1, 1, 4096, 28672}, {"llama3-8b-down", 1, 1, 14336, 4096}};

}  // namespace

int main(int argc, char** argv) {
  std::string shape_name = "all", json_path, commit = "unknown";
  std::vector<int64_t> tokens_list = {1, 4, 16, 64, 512, 4096};
  int runs = 20;
  bool quick = false;
  int decode_tiles = 0;  // --decode-tiles: the decode kernel's 16-row tiles per CTA (0: the planner's)
  CLI::App app{"bench_cuda_moe_sparse: the sparse MoE expert GEMM (cuda_moe_grouped_gemm) with the dense path"};
  last_value_wins(app);
  app.add_option("--shape", shape_name, "the MoE shape")
      ->check(CLI::IsMember({"mixtral-8x7b", "gpt-oss-20b", "qwen3-30b-a3b", "llama3-8b-qkv", "llama3-8b-o", "llama3-8b-gateup",
                             "llama3-8b-down", "llama3-8b", "all"}))
      ->capture_default_str();
  comma_list(app.add_option("--tokens", tokens_list, "token counts, comma-separated")->capture_default_str())
      ->check(at_least(1, "a token at least"));
  app.add_option("--json", json_path, "also write one JSON object per line per measurement to FILE")
      ->type_name("FILE");
  app.add_flag("--quick", quick, "10 timed runs per measurement instead of 20");
  app.add_option("--decode-tiles", decode_tiles, "the decode kernel's 16-row tiles per CTA (1, 2, 3, 4; 0: the planner's)")
      ->capture_default_str();
  app.add_option("--commit", commit, "the commit recorded in the JSON lines")->envname("LLMQ_COMMIT")
      ->capture_default_str()
      ->type_name("COMMIT");
  parse_command_line(app, argc, argv);
  if (quick) runs = 10;
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  double copy_bps = 0;
  BENCH_CHECK(measure_copy_bandwidth(0, int64_t{1} << 30, &copy_bps));
  std::printf("%s: copy bandwidth %.0f GB/s (read + written)\n", prop.name, copy_bps / 1e9);
  std::ofstream json;
  if (!json_path.empty()) json.open(json_path);
  std::unique_ptr<CudaGemmRunner> runner;
  BENCH_CHECK(CudaGemmRunner::create(0, &runner));
  const int64_t lt_bytes = kCublasLtWorkspaceBytes + (16 << 20);
  DeviceMem lt_workspace(static_cast<size_t>(lt_bytes));

  for (const MoeShape& s : kShapes) {
    const bool dense = std::strncmp(s.name, "llama3-8b", 9) == 0;
    if (shape_name != s.name && !(shape_name == "llama3-8b" && dense) && !(shape_name == "all" && !dense)) continue;
    const int64_t E = s.experts, K = s.k, N = s.n;
    const int64_t max_t = *std::max_element(tokens_list.begin(), tokens_list.end());
    const int64_t max_p = max_t * s.top_k;
    const int64_t w_bytes = E * N * K;
    const int sets = sets_for(w_bytes / E * s.top_k, prop.l2CacheSize, 2);  // one token's experts: the smallest case
    const int n_sets = std::min(sets, 4);
    std::vector<DeviceMem> w, ws, w16;
    for (int i = 0; i < n_sets; ++i) {
      w.emplace_back(static_cast<size_t>(w_bytes));
      ws.emplace_back(static_cast<size_t>(E * N * 4));
      w16.emplace_back(static_cast<size_t>(2 * w_bytes));
      fill_e4m3<<<grid_for(w_bytes), 256>>>(w.back().as<uint8_t>(), w_bytes, 10 + i);
      fill_scales<<<grid_for(E * N), 256>>>(ws.back().as<float>(), E * N, 20 + i);
      fill_bf16<<<grid_for(w_bytes), 256>>>(w16.back().as<__nv_bfloat16>(), w_bytes, 30 + i);
    }
    DeviceMem a(static_cast<size_t>(std::max(max_p, max_t) * K)), as(static_cast<size_t>(max_p * 4));
    DeviceMem a16(static_cast<size_t>(max_p * K * 2));
    fill_bf16<<<grid_for(max_p * K), 256>>>(a16.as<__nv_bfloat16>(), max_p * K, 4);
    DeviceMem y(static_cast<size_t>(std::max(max_p, E * max_t) * N * 2)), off(static_cast<size_t>((E + 1) * 4));
    fill_e4m3<<<grid_for(max_p * K), 256>>>(a.as<uint8_t>(), max_p * K, 3);
    fill_scales<<<grid_for(max_p), 256>>>(as.as<float>(), max_p, 5);
    BENCH_CHECK(cudaDeviceSynchronize());
    std::printf("\n%s: %lld experts, top-%lld, K %lld -> N %lld, %d weight sets\n", s.name,
                static_cast<long long>(E), static_cast<long long>(s.top_k), static_cast<long long>(K),
                static_cast<long long>(N), n_sets);
    std::printf("%6s | %6s | %-7s | %10s | %9s | %7s | %8s\n", "tokens", "active", "kernel", "us", "GB/s w", "of copy",
                "TFLOPS");

    for (const int64_t t : tokens_list) {
      const int64_t P = t * s.top_k;
      std::vector<int32_t> sizes(static_cast<size_t>(E), 0), offsets(static_cast<size_t>(E + 1), 0);
      for (int64_t i = 0; i < P; ++i) ++sizes[static_cast<size_t>(i % E)];  // slot t*top_k+s -> expert (slot % E)
      int64_t active = 0, max_rows = 0;
      for (int64_t e = 0; e < E; ++e) {
        offsets[e + 1] = offsets[e] + sizes[e];
        active += sizes[e] > 0;
        max_rows = std::max<int64_t>(max_rows, sizes[e]);
      }
      BENCH_CHECK(cudaMemcpy(off.p, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice));
      const double active_bytes = static_cast<double>(active) * N * K;
      const double flops = 2.0 * static_cast<double>(P) * N * K;
      auto emit = [&](const char* variant, double us) {
        const bool bf16 = std::strncmp(variant, "bf16", 4) == 0;
        const double gbps = active_bytes * (bf16 ? 2.0 : 1.0) / (us * 1e-6) / 1e9;
        std::printf("%6lld | %6lld | %-7s | %10.1f | %9.0f | %6.1f%% | %8.1f\n", static_cast<long long>(t),
                    static_cast<long long>(active), variant, us, gbps, 100.0 * gbps * 1e9 / copy_bps,
                    flops / (us * 1e-6) / 1e12);
        if (json.is_open())
          json << nlohmann::json{{"bench", "moe_sparse"}, {"device", prop.name}, {"shape", s.name},
                                 {"experts", E}, {"top_k", s.top_k}, {"k", K}, {"n", N}, {"tokens", t},
                                 {"rows", P}, {"active_experts", active}, {"variant", variant}, {"us", us},
                                 {"weight_gbps", gbps}, {"copy_gbps", copy_bps / 1e9},
                                 {"fraction_of_copy", gbps * 1e9 / copy_bps},
                                 {"tflops", flops / (us * 1e-6) / 1e12}, {"weight_sets", n_sets},
                                 {"commit", commit}}
                      .dump()
               << "\n";
      };
      int call = 0;
      auto grouped = [&](MoeGemmKernel kernel, bool bf16 = false, bool fast = false, int64_t block_rows = 0,
                         int64_t block_cols = 0) {
        const int i = call++ % n_sets;
        MoeGroupedGemm g;
        g.rows = P;
        g.experts = E;
        g.n = N;
        g.k = K;
        g.max_rows_per_expert = t;
        g.expert_offsets = off.as<int32_t>();
        g.a = a.p;
        g.a_scale = as.as<float>();
        g.w = w[static_cast<size_t>(i)].p;
        g.w_scale = ws[static_cast<size_t>(i)].as<float>();
        g.d = y.as<uint16_t>();
        g.decode_tiles_per_cta = decode_tiles;
        g.fast_accumulation = fast;
        g.wgmma_block_rows = block_rows;
        g.wgmma_block_cols = block_cols;
        if (bf16) {  // BF16 experts: the baseline FP8 is measured against, same kernels
          g.a = a16.p;
          g.a_dtype = DType::kBF16;
          g.a_scale = nullptr;
          g.w = w16[static_cast<size_t>(i)].p;
          g.w_dtype = DType::kBF16;
          g.w_scale = nullptr;
        }
        BENCH_CHECK(cuda_moe_grouped_gemm(g, nullptr, kernel));
      };
      {
        MoeGroupedGemm probe;
        probe.max_rows_per_expert = t;
        probe.a_dtype = DType::kE4M3;
        const MoeGemmKernel pick = cuda_moe_grouped_gemm_kernel(probe);
        emit(pick == MoeGemmKernel::kWgmma ? "auto=wg" : "auto=dec",
             queued_median_us([&] { grouped(MoeGemmKernel::kAuto); }, runs));
      }
      emit("bf16", queued_median_us([&] { grouped(MoeGemmKernel::kAuto, true); }, runs));
      if (max_rows <= 512) emit("decode", queued_median_us([&] { grouped(MoeGemmKernel::kDecode); }, runs));
      if (prop.major == 9) {
        emit("wgmma", queued_median_us([&] { grouped(MoeGemmKernel::kWgmma); }, runs));
        // The tensor core's own accumulator over all of K (torch_moe_peers.py's *_fast peer).
        emit("wg-fast", queued_median_us([&] { grouped(MoeGemmKernel::kWgmma, false, true); }, runs));
        // Both tile heights (the kernel picks 64 rows where the experts average at most 64).
        emit("wg-r64", queued_median_us([&] { grouped(MoeGemmKernel::kWgmma, false, false, 64); }, runs));
        emit("wg-r128", queued_median_us([&] { grouped(MoeGemmKernel::kWgmma, false, false, 128); }, runs));
        // 128-row tiles of 128 and of 192 columns (per-channel FP8; the kernel takes 192 where the
        // experts average at least 256 rows), promoted and with the tensor core's own accumulator.
        emit("wg-c128", queued_median_us([&] { grouped(MoeGemmKernel::kWgmma, false, false, 128, 128); }, runs));
        emit("wg-c192", queued_median_us([&] { grouped(MoeGemmKernel::kWgmma, false, false, 128, 192); }, runs));
        emit("wg-c192-fast", queued_median_us([&] { grouped(MoeGemmKernel::kWgmma, false, true, 128, 192); }, runs));
      }
      // The dense path: every token through every expert (one strided-batched GEMM + post-scale).
      auto dense = [&] {
        const int i = call++ % n_sets;
        CudaGemmProblem p;
        p.m = t;
        p.n = N;
        p.k = K;
        p.batch = E;
        p.a = {a.p, DType::kE4M3};
        p.a.shared_across_batch = true;
        p.b = {w[static_cast<size_t>(i)].p, DType::kE4M3};
        p.d = y.p;
        BENCH_CHECK(runner->run(p, lt_workspace.p, lt_bytes, nullptr));
        MoePostScale ps;
        ps.experts = E;
        ps.tokens = t;
        ps.n_cols = N;
        ps.y = y.p;
        ps.y_dtype = DType::kBF16;
        ps.token_scales = as.as<float>();
        ps.expert_scales = ws[static_cast<size_t>(i)].as<float>();
        ps.per_channel = true;
        ps.out = y.p;
        BENCH_CHECK(cuda_moe_post_scale(ps, nullptr));
      };
      emit("dense", queued_median_us(dense, runs));
    }
  }
  return 0;
}
