// Benchmark of the INT8 GEMM (include/llmq/cuda_int8_gemm.hpp) against cuBLASLt's INT8 GEMM
// (INT32 output, the peer measured in the same run).
//
// Method: operands filled with random int8 codes (never zeros) and positive scales; several
// operand sets rotated so that the bytes touched between two uses of one set exceed 2x the L2;
// warm-up runs, then every run timed on its own by a pair of CUDA events, median reported.
// TOPS = 2 M N K / median time. Shapes: 8192^3, 4096^3 and Llama projections (M in {128, 2048,
// 8192} x (K, N) in {(4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672)}).
//
// Usage: bench_cuda_int8_gemm [--json PATH] [--iters N] [--warmup N]
//                             [--kernels auto,wgmma64,wgmma128,wgmma256,mma_sync,cublaslt]
//                               (also wgmmaMxN: block_m M, block_n N)
//                             [--shapes all|square|llama|MxNxK[,MxNxK...]]
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "llmq/cuda_int8_gemm.hpp"
#include "cuda_bench_support.cuh"

namespace {

struct Shape {
  int64_t m, n, k;
  std::string group;
};

struct Options {
  std::string json_path;
  int iters = 30;
  int warmup = 5;
  std::vector<std::string> kernels = {"auto", "wgmma64", "wgmma128", "wgmma256", "mma_sync", "cublaslt"};
  std::vector<Shape> shapes;  // --shapes (default all)
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Kernel names --kernels takes: auto, mma_sync, cublaslt, wgmma (the tile by the plan), wgmmaN
// (block_n N, block_m by the plan) and wgmmaMxN (block_m M, block_n N).
bool known_kernel(const std::string& k) {
  return k == "auto" || k == "mma_sync" || k == "cublaslt" || k.rfind("wgmma", 0) == 0;
}

// The shapes --shapes names: the groups all, square and llama, or MxNxK[,MxNxK...]; returns why
// a custom shape is not MxNxK, or "".
std::string make_shapes(const std::string& which, std::vector<Shape>* shapes) {
  shapes->clear();
  if (which == "all" || which == "square") {
    shapes->push_back({8192, 8192, 8192, "square"});
    shapes->push_back({4096, 4096, 4096, "square"});
  }
  if (which == "all" || which == "llama") {
    const int64_t kn[4][2] = {{4096, 4096}, {4096, 14336}, {14336, 4096}, {8192, 28672}};
    for (int64_t m : {128, 2048, 8192})
      for (const auto& p : kn) shapes->push_back({m, p[1], p[0], "llama"});
  }
  if (shapes->empty()) {
    for (const std::string& s : split(which, ',')) {
      const std::vector<std::string> d = split(s, 'x');
      if (d.size() != 3) return "'" + s + "' is not MxNxK";
      shapes->push_back({std::atoll(d[0].c_str()), std::atoll(d[1].c_str()), std::atoll(d[2].c_str()), "custom"});
    }
  }
  return {};
}

// The command line into `o` (exits 2 on a bad option or value, 0 after --help).
void parse_args(int argc, char** argv, Options* o) {
  CLI::App app{"bench_cuda_int8_gemm: the INT8 GEMM against cuBLASLt's INT8 GEMM in the same run"};
  llmq::bench::last_value_wins(app);
  app.add_option("--json", o->json_path, "also write the results as one JSON document to PATH")->type_name("PATH");
  app.add_option("--iters", o->iters, "timed runs per problem (at least 1)")->capture_default_str();
  app.add_option("--warmup", o->warmup, "untimed runs first (at least 0)")->capture_default_str();
  app.add_option_function<std::string>(
      "--kernels",
      [o](const std::string& list) {
        o->kernels = split(list, ',');
        for (const std::string& k : o->kernels)
          if (!known_kernel(k)) throw CLI::ValidationError("--kernels", "unknown '" + k + "'");
      },
      "auto,wgmma64,wgmma128,wgmma256,mma_sync,cublaslt (default all); also wgmmaMxN (block_m x block_n)")
      ->type_name("LIST");
  make_shapes("all", &o->shapes);  // the default
  app.add_option_function<std::string>(
      "--shapes",
      [o](const std::string& which) {
        const std::string error = make_shapes(which, &o->shapes);
        if (!error.empty()) throw CLI::ValidationError("--shapes", error);
      },
      "all, square, llama or MxNxK[,MxNxK...] (default all)")
      ->type_name("SHAPES");
  bool quick = false;
  app.add_flag("--quick", quick, "a third of the timed runs (unless --iters is given)");
  llmq::bench::parse_command_line(app, argc, argv);
  if (quick && app.count("--iters") == 0) o->iters = std::max(1, o->iters / 3);
  o->iters = std::max(1, o->iters);
  o->warmup = std::max(0, o->warmup);
}

// Random int8 codes from a hash of the index (never 0), positive scales in [1e-3, 2e-3).
__global__ void fill_codes(int8_t* p, int64_t count, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const int v = static_cast<int>(h % 255u) - 127;  // [-127, 127]
    p[i] = static_cast<int8_t>(v == 0 ? 1 : v);
  }
}
__global__ void fill_scales(float* p, int64_t count, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t h = (static_cast<uint32_t>(i) * 2246822519u) ^ seed;
    p[i] = 1e-3f * (1.0f + static_cast<float>(h % 1000u) / 1000.0f);
  }
}

// One operand set: A [M, K], B [N, K], scales, bias, D (sized for INT32 so cuBLASLt can use it).
struct OperandSet {
  int8_t* a = nullptr;
  int8_t* b = nullptr;
  float* scale_a = nullptr;
  float* scale_b = nullptr;
  float* bias = nullptr;
  void* d = nullptr;
};

struct Workspace {
  std::vector<OperandSet> sets;
  void release() {
    for (OperandSet& s : sets) {
      cudaFree(s.a);
      cudaFree(s.b);
      cudaFree(s.scale_a);
      cudaFree(s.scale_b);
      cudaFree(s.bias);
      cudaFree(s.d);
    }
    sets.clear();
  }
};

void make_sets(const Shape& s, int count, Workspace* ws) {
  for (int i = 0; i < count; ++i) {
    OperandSet o;
    BENCH_CHECK(cudaMalloc(&o.a, static_cast<size_t>(s.m * s.k)));
    BENCH_CHECK(cudaMalloc(&o.b, static_cast<size_t>(s.n * s.k)));
    BENCH_CHECK(cudaMalloc(&o.scale_a, static_cast<size_t>(s.m) * sizeof(float)));
    BENCH_CHECK(cudaMalloc(&o.scale_b, static_cast<size_t>(s.n) * sizeof(float)));
    BENCH_CHECK(cudaMalloc(&o.bias, static_cast<size_t>(s.n) * sizeof(float)));
    BENCH_CHECK(cudaMalloc(&o.d, static_cast<size_t>(s.m * s.n) * sizeof(int32_t)));
    const uint32_t seed = 0x9E3779B9u * static_cast<uint32_t>(i + 1);
    fill_codes<<<1024, 256>>>(o.a, s.m * s.k, seed);
    fill_codes<<<1024, 256>>>(o.b, s.n * s.k, seed ^ 0x5bd1e995u);
    fill_scales<<<64, 256>>>(o.scale_a, s.m, seed + 1);
    fill_scales<<<64, 256>>>(o.scale_b, s.n, seed + 2);
    fill_scales<<<64, 256>>>(o.bias, s.n, seed + 3);
    BENCH_CHECK(cudaGetLastError());
    ws->sets.push_back(o);
  }
  BENCH_CHECK(cudaDeviceSynchronize());
}

// cuBLASLt INT8 x INT8 -> INT32 for D[M, N] = A[M, K] B[N, K]^T. cuBLASLt is column-major, so it
// computes D^T (N x M, ld N) = B_cm^T (N x K) * A_cm (K x M) where A_cm and B_cm are our row-major
// matrices read as column-major K x M and K x N: the "TN" layout its INT8 kernels support.
class CublasLtInt8 {
 public:
  explicit CublasLtInt8(cudaStream_t stream) : stream_(stream) {
    ok_ = cublasLtCreate(&handle_) == CUBLAS_STATUS_SUCCESS &&
          cudaMalloc(&workspace_, kWorkspaceBytes) == cudaSuccess;
  }
  ~CublasLtInt8() {
    clear();
    if (workspace_ != nullptr) cudaFree(workspace_);
    if (handle_ != nullptr) cublasLtDestroy(handle_);
  }
  // Builds descriptors and picks the heuristic's first algorithm; false when none is offered.
  bool prepare(const Shape& s) {
    clear();
    if (!ok_) return false;
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    bool good = cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32I, CUDA_R_32I) == CUBLAS_STATUS_SUCCESS;
    good = good && cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)) ==
                       CUBLAS_STATUS_SUCCESS;
    good = good && cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)) ==
                       CUBLAS_STATUS_SUCCESS;
    good = good && cublasLtMatrixLayoutCreate(&layout_a_, CUDA_R_8I, s.k, s.n, s.k) == CUBLAS_STATUS_SUCCESS;
    good = good && cublasLtMatrixLayoutCreate(&layout_b_, CUDA_R_8I, s.k, s.m, s.k) == CUBLAS_STATUS_SUCCESS;
    good = good && cublasLtMatrixLayoutCreate(&layout_c_, CUDA_R_32I, s.n, s.m, s.n) == CUBLAS_STATUS_SUCCESS;
    good = good && cublasLtMatmulPreferenceCreate(&pref_) == CUBLAS_STATUS_SUCCESS;
    const size_t ws = kWorkspaceBytes;
    good = good && cublasLtMatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                        sizeof(ws)) == CUBLAS_STATUS_SUCCESS;
    int found = 0;
    good = good && cublasLtMatmulAlgoGetHeuristic(handle_, op_, layout_a_, layout_b_, layout_c_, layout_c_, pref_,
                                                  1, &heuristic_, &found) == CUBLAS_STATUS_SUCCESS;
    prepared_ = good && found > 0;
    return prepared_;
  }
  bool run(const OperandSet& o) {
    const int32_t alpha = 1, beta = 0;
    return cublasLtMatmul(handle_, op_, &alpha, o.b, layout_a_, o.a, layout_b_, &beta, o.d, layout_c_, o.d,
                          layout_c_, &heuristic_.algo, workspace_, kWorkspaceBytes,
                          stream_) == CUBLAS_STATUS_SUCCESS;
  }

 private:
  static constexpr size_t kWorkspaceBytes = 32u << 20;
  void clear() {
    if (pref_ != nullptr) cublasLtMatmulPreferenceDestroy(pref_);
    if (layout_a_ != nullptr) cublasLtMatrixLayoutDestroy(layout_a_);
    if (layout_b_ != nullptr) cublasLtMatrixLayoutDestroy(layout_b_);
    if (layout_c_ != nullptr) cublasLtMatrixLayoutDestroy(layout_c_);
    if (op_ != nullptr) cublasLtMatmulDescDestroy(op_);
    pref_ = nullptr;
    layout_a_ = layout_b_ = layout_c_ = nullptr;
    op_ = nullptr;
    prepared_ = false;
  }
  cudaStream_t stream_;
  bool ok_ = false;
  bool prepared_ = false;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t layout_a_ = nullptr, layout_b_ = nullptr, layout_c_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic_{};
};

struct Result {
  Shape shape;
  std::string kernel;
  std::string detail;  // tile / plan
  bool ok = false;
  std::string error;
  double median_us = 0, min_us = 0, max_us = 0, tops = 0;
};

using llmq::bench::median;

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  parse_args(argc, argv, &opt);
  int device = 0;
  BENCH_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, device));
  std::printf("device: %s (sm_%d%d, %d SMs, L2 %.0f MB)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.l2CacheSize / 1e6);
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CublasLtInt8 cublas(stream);

  std::vector<Result> results;
  for (const Shape& s : opt.shapes) {
    const double set_bytes = static_cast<double>(s.m * s.k + s.n * s.k) + 4.0 * static_cast<double>(s.m * s.n);
    const int sets = std::max(2, static_cast<int>(std::ceil(2.0 * prop.l2CacheSize / set_bytes)) + 1);
    Workspace ws;
    make_sets(s, sets, &ws);
    const double ops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);

    for (const std::string& kname : opt.kernels) {
      Result r;
      r.shape = s;
      r.kernel = kname;
      std::function<bool(const OperandSet&, std::string*)> launch;
      if (kname == "cublaslt") {
        if (!cublas.prepare(s)) {
          r.error = "cuBLASLt offered no INT8 algorithm";
          results.push_back(r);
          continue;
        }
        r.detail = "int32 out";
        launch = [&](const OperandSet& o, std::string* err) {
          if (!cublas.run(o)) {
            *err = "cublasLtMatmul failed";
            return false;
          }
          return true;
        };
      } else {
        llmq::Int8GemmConfig cfg;
        if (kname == "auto") cfg.kernel = llmq::Int8GemmKernel::kAuto;
        else if (kname == "mma_sync") cfg.kernel = llmq::Int8GemmKernel::kMmaSync;
        else {  // wgmma[N] or wgmmaMxN (known_kernel)
          cfg.kernel = llmq::Int8GemmKernel::kWgmma;
          int bm = 0, bn = 0;
          if (std::sscanf(kname.c_str() + 5, "%dx%d", &bm, &bn) == 2) {
            cfg.block_m = bm;
            cfg.block_n = bn;
          } else {
            cfg.block_n = kname.size() > 5 ? std::atoi(kname.c_str() + 5) : 0;
          }
        }
        llmq::Int8GemmPlan plan;
        const llmq::Status st = llmq::cuda_int8_gemm_plan(s.m, s.n, s.k, cfg, &plan);
        if (!st.ok()) {
          r.error = st.to_string();
          results.push_back(r);
          continue;
        }
        r.detail = std::string(llmq::int8_gemm_kernel_name(plan.kernel)) + " " + std::to_string(plan.block_m) +
                   "x" + std::to_string(plan.block_n) + "x" + std::to_string(plan.block_k) + " s" +
                   std::to_string(plan.stages) + " g" + std::to_string(plan.grid);
        launch = [&, cfg](const OperandSet& o, std::string* err) {
          const llmq::Status run_st = llmq::cuda_int8_gemm(o.a, o.b, o.scale_a, o.scale_b, o.bias,
                                                           static_cast<uint16_t*>(o.d), s.m, s.n, s.k, stream, cfg);
          if (!run_st.ok()) *err = run_st.to_string();
          return run_st.ok();
        };
      }

      std::string err;
      bool good = true;
      for (int i = 0; i < opt.warmup && good; ++i) good = launch(ws.sets[i % sets], &err);
      std::vector<cudaEvent_t> start(opt.iters), stop(opt.iters);
      for (int i = 0; i < opt.iters; ++i) {
        BENCH_CHECK(cudaEventCreate(&start[i]));
        BENCH_CHECK(cudaEventCreate(&stop[i]));
      }
      for (int i = 0; i < opt.iters && good; ++i) {
        BENCH_CHECK(cudaEventRecord(start[i], stream));
        good = launch(ws.sets[(i + opt.warmup) % sets], &err);
        BENCH_CHECK(cudaEventRecord(stop[i], stream));
      }
      const cudaError_t sync = cudaStreamSynchronize(stream);
      if (sync != cudaSuccess) {
        std::fprintf(stderr, "%s on M=%lld N=%lld K=%lld: %s (aborting: the context is unusable)\n", kname.c_str(),
                     static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k),
                     cudaGetErrorString(sync));
        return 1;
      }
      if (good) {
        std::vector<float> ms(opt.iters);
        for (int i = 0; i < opt.iters; ++i) BENCH_CHECK(cudaEventElapsedTime(&ms[i], start[i], stop[i]));
        r.ok = true;
        r.median_us = median(ms) * 1e3;
        r.min_us = *std::min_element(ms.begin(), ms.end()) * 1e3;
        r.max_us = *std::max_element(ms.begin(), ms.end()) * 1e3;
        r.tops = ops / (r.median_us * 1e-6) / 1e12;
      } else {
        r.error = err;
      }
      for (int i = 0; i < opt.iters; ++i) {
        cudaEventDestroy(start[i]);
        cudaEventDestroy(stop[i]);
      }
      results.push_back(r);
      if (r.ok)
        std::printf("M=%5lld N=%5lld K=%5lld  %-9s %-32s %9.1f us  %7.1f TOPS  (min %.1f, max %.1f us, %d sets)\n",
                    static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k),
                    kname.c_str(), r.detail.c_str(), r.median_us, r.tops, r.min_us, r.max_us, sets);
      else
        std::printf("M=%5lld N=%5lld K=%5lld  %-9s n/a: %s\n", static_cast<long long>(s.m),
                    static_cast<long long>(s.n), static_cast<long long>(s.k), kname.c_str(), r.error.c_str());
      std::fflush(stdout);
    }
    ws.release();
  }

  // Summary: TOPS per kernel and shape, and each kernel's speed-up over cuBLASLt (geometric mean).
  std::map<std::string, double> cublas_us;
  for (const Result& r : results)
    if (r.ok && r.kernel == "cublaslt")
      cublas_us[std::to_string(r.shape.m) + "x" + std::to_string(r.shape.n) + "x" + std::to_string(r.shape.k)] =
          r.median_us;
  std::printf("\n%-20s", "shape (MxNxK)");
  for (const std::string& k : opt.kernels) std::printf(" %10s", k.c_str());
  std::printf("   (TOPS)\n");
  std::map<std::string, std::pair<double, int>> log_ratio;  // kernel -> (sum log speed-up, count)
  std::vector<std::string> seen;
  for (const Result& r : results) {
    const std::string key = std::to_string(r.shape.m) + "x" + std::to_string(r.shape.n) + "x" + std::to_string(r.shape.k);
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    std::printf("%-20s", key.c_str());
    for (const std::string& k : opt.kernels) {
      const Result* hit = nullptr;
      for (const Result& q : results)
        if (q.kernel == k && q.shape.m == r.shape.m && q.shape.n == r.shape.n && q.shape.k == r.shape.k) hit = &q;
      if (hit != nullptr && hit->ok) {
        std::printf(" %10.1f", hit->tops);
        if (cublas_us.count(key) && k != "cublaslt") {
          log_ratio[k].first += std::log(cublas_us[key] / hit->median_us);
          log_ratio[k].second += 1;
        }
      } else {
        std::printf(" %10s", "n/a");
      }
    }
    std::printf("\n");
  }
  for (const auto& [k, v] : log_ratio)
    std::printf("geomean speed-up of %s over cuBLASLt INT8: %.2fx (%d shapes)\n", k.c_str(),
                std::exp(v.first / v.second), v.second);

  if (!opt.json_path.empty()) {
    nlohmann::json j;
    j["device"] = prop.name;
    j["sm"] = std::to_string(prop.major) + std::to_string(prop.minor);
    j["multiprocessors"] = prop.multiProcessorCount;
    j["iters"] = opt.iters;
    j["warmup"] = opt.warmup;
    j["method"] = "median of per-run CUDA event times; operand sets rotated past 2x L2; TOPS = 2MNK / median";
    for (const Result& r : results) {
      nlohmann::json e;
      e["m"] = r.shape.m;
      e["n"] = r.shape.n;
      e["k"] = r.shape.k;
      e["group"] = r.shape.group;
      e["kernel"] = r.kernel;
      e["detail"] = r.detail;
      e["ok"] = r.ok;
      if (r.ok) {
        e["median_us"] = r.median_us;
        e["min_us"] = r.min_us;
        e["max_us"] = r.max_us;
        e["tops"] = r.tops;
        const std::string key =
            std::to_string(r.shape.m) + "x" + std::to_string(r.shape.n) + "x" + std::to_string(r.shape.k);
        if (cublas_us.count(key)) e["speedup_vs_cublaslt"] = cublas_us[key] / r.median_us;
      } else {
        e["error"] = r.error;
      }
      j["results"].push_back(e);
    }
    std::ofstream out(opt.json_path);
    out << j.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "--json: cannot write %s\n", opt.json_path.c_str());
      return 1;
    }
    std::printf("wrote %s\n", opt.json_path.c_str());
  }
  cudaStreamDestroy(stream);
  return 0;
}
