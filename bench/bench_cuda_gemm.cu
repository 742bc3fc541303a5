// Benchmark of the cuBLASLt GEMM runner (include/llmq/cuda_gemm.hpp): FP8 E4M3 with per-tensor,
// per-token x per-channel (outer-vector) and 1x128 x 128x128 block scales, against BF16 x BF16 (the
// peer, measured in the same run), all with FP32 accumulation and BF16 output.
//
// Method (CUTLASS style): operands filled on the device with random non-zero values; S >= 4 operand
// sets, each with its own A, B, D and its own device scale tensors, rotated so that the bytes
// touched between two uses of one set exceed 2x the L2 (read from the device); one untimed run per
// set (plan creation, first-touch) plus --warmup runs; then a ~2 ms spin kernel so that the host can
// queue every timed run before the GPU reaches them (the times are then GPU time, not launch gaps),
// and each of --iters >= 30 runs timed on its own by a pair of CUDA events; the median is reported.
// One rotation counter runs through the untimed, warmup and timed launches, so no two consecutive
// launches share a set. The runner's workspace (workspace_size()) is allocated once per problem and
// counted against device memory. TFLOP/s = 2 M N K / median.
//
// Scales (float32, device, random positive values in [0.005, 0.015)), per operand set:
//   fp8_tensor  a: 1 float, b: 1 float
//   fp8_outer   a: per-token [M], b: per-channel [N]
//   fp8_block   a: 1x128 [M, ceil(K/128)], b: 128x128 [ceil(N/128), ceil(K/128)], passed in
//               cuBLASLt's order (ScaleLayout::kCublasLt; cublaslt_scale_count floats, 128x128 with
//               its K stride rounded up to a multiple of 4), as a loader would pack the weights, so
//               the runner's row-major conversion kernel is not timed.
// cuBLASLt's block scaling needs M % 4 == 0: M = 1 runs as M = 4 and says so (note, m_run); its
// TFLOP/s count the M = 4 work, its ratios compare its time with the peers' time at the asked M.
//
// Ratios, all from the same run (a ratio > 1 means the row's mode is faster):
//   vs bf16     bf16 time / this time, every FP8 mode              (speedup_vs_bf16)
//   vs tensor   fp8_tensor time / this time, fp8_outer, fp8_block  (speedup_vs_fp8_tensor): what
//               per-token x per-channel or block scaling costs over one scale per tensor.
// The baselines a requested mode needs (bf16; fp8_tensor for fp8_outer / fp8_block) are measured
// even when --modes leaves them out. 0 in the JSON means "no ratio".
//
// Shapes: 8192^3, and the Llama projections K x N in {4096x4096, 4096x14336, 14336x4096,
// 8192x28672, 8192x8192} at M in {1, 16, 128, 2048, 8192}.
//
// Usage: bench_cuda_gemm [--json PATH] [--iters N>=30] [--warmup N] [--quick]
//                        [--modes bf16,fp8_tensor,fp8_outer,fp8_block] [--shapes MxNxK[,...]]
//                        [--autotune N]   (CudaGemmOptions: the fastest of the heuristic's first N)
//                        [--fp8-fast-accum]  (CudaGemmOptions::fp8_fast_accumulation)
// Prints a table and, with --json, writes one JSON object per line per (shape, mode): bench, device,
// m, n, k, m_run, mode, out, status (ok / unsupported / skipped / error), reason, note, us_median,
// us_min, tflops, speedup_vs_bf16, speedup_vs_fp8_tensor, sets, iters, warmup.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "llmq/cuda_gemm.hpp"
#include "cuda_bench_support.cuh"

namespace {

using llmq::CudaGemmProblem;
using llmq::CudaGemmRunner;
using llmq::DType;
using llmq::GemmScaleMode;
using llmq::Status;

using llmq::bench::DeviceMem;
using llmq::bench::fill_bf16;
using llmq::bench::fill_e4m3;
using llmq::bench::fill_scales;
using llmq::bench::grid_for;
using llmq::bench::spin;

// ---- configuration

enum class Mode { kBf16, kFp8Tensor, kFp8Outer, kFp8Block };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kBf16: return "bf16";
    case Mode::kFp8Tensor: return "fp8_tensor";
    case Mode::kFp8Outer: return "fp8_outer";
    case Mode::kFp8Block: return "fp8_block";
  }
  return "?";
}

struct Shape {
  int64_t m, n, k;
};

struct Options {
  std::string json_path;
  int iters = 50;
  int warmup = 5;
  int autotune = 1;  // CudaGemmOptions::autotune_candidates
  bool fp8_fast_accum = false;  // CudaGemmOptions::fp8_fast_accumulation
  std::vector<Mode> modes = {Mode::kBf16, Mode::kFp8Tensor, Mode::kFp8Outer, Mode::kFp8Block};
  std::vector<Shape> shapes;
};

std::vector<Shape> default_shapes(bool quick) {
  std::vector<Shape> s;
  s.push_back({8192, 8192, 8192});
  const std::pair<int64_t, int64_t> kn[] = {
      {4096, 4096}, {4096, 14336}, {14336, 4096}, {8192, 28672}, {8192, 8192}};
  const int64_t ms_full[] = {1, 16, 128, 2048, 8192};
  const int64_t ms_quick[] = {1, 128, 8192};
  for (const auto& [k, n] : kn) {
    if (quick && k != 4096) continue;
    if (quick)
      for (int64_t m : ms_quick) s.push_back({m, n, k});
    else
      for (int64_t m : ms_full) s.push_back({m, n, k});
  }
  return s;
}

// The command line into `o` (exits 2 on a bad option or value, 0 after --help).
void parse(int argc, char** argv, Options* o) {
  CLI::App app{"bench_cuda_gemm: the cuBLASLt FP8 GEMM runner (per-tensor, outer-vector and block scales) "
               "against BF16 in the same run"};
  llmq::bench::last_value_wins(app);
  bool quick = false;
  app.add_option("--json", o->json_path, "also write one JSON object per line per (shape, mode) to PATH")
      ->type_name("PATH");
  app.add_option("--iters", o->iters, "timed runs per problem")
      ->capture_default_str()
      ->check(llmq::bench::at_least(30, "the median needs at least 30 runs"));
  app.add_option("--warmup", o->warmup, "untimed runs after one per operand set")->capture_default_str();
  app.add_option("--autotune", o->autotune, "time cuBLASLt's first N algorithms per shape and keep the fastest")
      ->capture_default_str()
      ->check(CLI::Range(1, 32));
  app.add_flag("--fp8-fast-accum", o->fp8_fast_accum, "FP8 GEMMs with cuBLASLt's FAST_ACCUM (CudaGemmOptions)");
  app.add_flag("--quick", quick, "fewer shapes (K 4096, M in 1, 128, 8192)");
  app.add_option_function<std::string>(
      "--modes",
      [o](const std::string& list) {
        o->modes.clear();
        std::stringstream ss(list);
        std::string t;
        while (std::getline(ss, t, ',')) {
          bool found = false;
          for (Mode m : {Mode::kBf16, Mode::kFp8Tensor, Mode::kFp8Outer, Mode::kFp8Block})
            if (t == mode_name(m)) {
              o->modes.push_back(m);
              found = true;
            }
          if (!found) throw CLI::ValidationError("--modes", "unknown '" + t + "'");
        }
      },
      "modes, comma-separated: bf16,fp8_tensor,fp8_outer,fp8_block (default all)")
      ->type_name("LIST");
  app.add_option_function<std::string>(
      "--shapes",
      [o](const std::string& list) {
        std::stringstream ss(list);
        std::string t;
        while (std::getline(ss, t, ',')) {
          Shape s{};
          if (std::sscanf(t.c_str(), "%ldx%ldx%ld", &s.m, &s.n, &s.k) != 3)
            throw CLI::ValidationError("--shapes", "'" + t + "' is not MxNxK");
          o->shapes.push_back(s);
        }
      },
      "MxNxK[,...] instead of the default shapes")
      ->type_name("MxNxK,...");
  llmq::bench::parse_command_line(app, argc, argv);
  if (o->shapes.empty()) o->shapes = default_shapes(quick);
}

// ---- one operand set: device buffers for A, B, D and the two scale tensors.

struct OperandSet {
  DeviceMem a, b, d, sa, sb;  // sa / sb: FP8 only
};

struct Result {
  std::string status = "ok";
  std::string reason;
  int64_t m_run = 0;
  double us_median = 0, us_min = 0;
  int sets = 0;
};

GemmScaleMode a_mode(Mode m) {
  return m == Mode::kFp8Outer ? GemmScaleMode::kOuterVector
         : m == Mode::kFp8Block ? GemmScaleMode::kBlock1x128
                                : GemmScaleMode::kTensor;
}
GemmScaleMode b_mode(Mode m) {
  return m == Mode::kFp8Outer ? GemmScaleMode::kOuterVector
         : m == Mode::kFp8Block ? GemmScaleMode::kBlock128x128
                                : GemmScaleMode::kTensor;
}

// A failed Status as a row status: cuBLASLt or the device not offering the problem is
// "unsupported"; anything else (a bad argument is the benchmark's own bug) is "error".
std::string status_name(const Status& st) {
  return st.code() == llmq::StatusCode::kUnsupported ? "unsupported" : "error";
}

// Allocates and fills one operand set (random codes, random positive scales) on `stream`.
OperandSet make_set(int s, bool fp8, int64_t m, int64_t n, int64_t k, int64_t in_bytes, int64_t sa_count,
                    int64_t sb_count, cudaStream_t stream) {
  OperandSet os{DeviceMem(static_cast<size_t>(m * k * in_bytes)),
                DeviceMem(static_cast<size_t>(n * k * in_bytes)), DeviceMem(static_cast<size_t>(m * n * 2)),
                fp8 ? DeviceMem(static_cast<size_t>(sa_count * 4)) : DeviceMem(),
                fp8 ? DeviceMem(static_cast<size_t>(sb_count * 4)) : DeviceMem()};
  const uint64_t seed = static_cast<uint64_t>(s) * 7919 + 17;
  if (fp8) {
    fill_e4m3<<<grid_for(m * k), 256, 0, stream>>>(static_cast<uint8_t*>(os.a.p), m * k, seed);
    fill_e4m3<<<grid_for(n * k), 256, 0, stream>>>(static_cast<uint8_t*>(os.b.p), n * k, seed + 1);
    fill_scales<<<grid_for(sa_count), 256, 0, stream>>>(static_cast<float*>(os.sa.p), sa_count, seed + 2);
    fill_scales<<<grid_for(sb_count), 256, 0, stream>>>(static_cast<float*>(os.sb.p), sb_count, seed + 3);
  } else {
    fill_bf16<<<grid_for(m * k), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(os.a.p), m * k, seed);
    fill_bf16<<<grid_for(n * k), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(os.b.p), n * k, seed + 1);
  }
  BENCH_CHECK(cudaGetLastError());
  return os;
}

Result measure(CudaGemmRunner& runner, cudaStream_t stream, const Shape& shape, Mode mode,
               const Options& opt, int64_t l2_bytes) {
  Result res;
  const bool fp8 = mode != Mode::kBf16;
  int64_t m = shape.m;
  if (mode == Mode::kFp8Block && m % 4 != 0) m = (m + 3) / 4 * 4;  // cuBLASLt block scaling: M % 4
  res.m_run = m;
  const int64_t n = shape.n, k = shape.k;
  const int64_t in_bytes = fp8 ? 1 : 2;
  // Scale floats per operand in the layout the runner reads with ScaleLayout::kCublasLt:
  // tensor 1; outer vector M (a) / N (b); 1x128 M * ceil(K/128); 128x128 ceil(N/128) * L4.
  const int64_t sa_count = fp8 ? llmq::cublaslt_scale_count(a_mode(mode), m, k) : 0;
  const int64_t sb_count = fp8 ? llmq::cublaslt_scale_count(b_mode(mode), n, k) : 0;
  const int64_t set_bytes = (m * k + n * k) * in_bytes + m * n * 2 + (sa_count + sb_count) * 4;

  CudaGemmProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.a.dtype = p.b.dtype = fp8 ? DType::kE4M3 : DType::kBF16;
  if (fp8) {
    p.a.scale_mode = a_mode(mode);
    p.b.scale_mode = b_mode(mode);
    p.a.scale_layout = p.b.scale_layout = llmq::ScaleLayout::kCublasLt;
  }
  p.d_dtype = DType::kBF16;

  // Enough sets that one pass over them moves more than 2x the L2: the S - 1 other sets between two
  // uses of one set hold (S - 1) * set_bytes >= 2 * L2 bytes.
  const int sets = llmq::bench::sets_for(set_bytes, l2_bytes, 4);
  // The runner's workspace (scale scratch for kRowMajor block scales, none here, plus cuBLASLt's
  // 32 MiB); it depends on the modes, layouts and shape, not on the pointers. One for all sets.
  const int64_t workspace_bytes = runner.workspace_size(p);
  size_t free_bytes = 0, total_bytes = 0;
  BENCH_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (static_cast<double>(sets) * static_cast<double>(set_bytes) + static_cast<double>(workspace_bytes) >
      0.85 * static_cast<double>(free_bytes)) {
    res.status = "skipped";
    res.reason = "operand sets do not fit in device memory";
    return res;
  }

  std::vector<OperandSet> sets_mem;
  sets_mem.reserve(static_cast<size_t>(sets));
  auto problem_for = [&](int s) {
    CudaGemmProblem q = p;
    const OperandSet& os = sets_mem[static_cast<size_t>(s)];
    q.a.data = os.a.p;
    q.b.data = os.b.p;
    q.d = os.d.p;
    if (fp8) {
      q.a.scales = static_cast<const float*>(os.sa.p);
      q.b.scales = static_cast<const float*>(os.sb.p);
    }
    return q;
  };

  // The first set, then can_implement on a complete problem (outer-vector and block scales need
  // their device pointers), before the remaining sets are allocated.
  sets_mem.push_back(make_set(0, fp8, m, n, k, in_bytes, sa_count, sb_count, stream));
  const Status can = runner.can_implement(problem_for(0));
  if (!can.ok()) {
    res.status = status_name(can);
    res.reason = can.message();
    return res;
  }
  for (int s = 1; s < sets; ++s)
    sets_mem.push_back(make_set(s, fp8, m, n, k, in_bytes, sa_count, sb_count, stream));
  DeviceMem workspace(static_cast<size_t>(workspace_bytes));
  BENCH_CHECK(cudaStreamSynchronize(stream));
  res.sets = sets;

  int next_set = 0;  // one rotation through every launch below
  auto launch = [&]() -> bool {
    const Status st = runner.run(problem_for(next_set), workspace.p, workspace_bytes, stream);
    next_set = (next_set + 1) % sets;
    if (!st.ok()) {
      res.status = status_name(st);
      res.reason = st.message();
      return false;
    }
    return true;
  };

  for (int s = 0; s < sets; ++s)  // untimed: plan creation, first touch of every set
    if (!launch()) return res;
  for (int i = 0; i < opt.warmup; ++i)
    if (!launch()) return res;
  BENCH_CHECK(cudaStreamSynchronize(stream));
  BENCH_CHECK(cudaGetLastError());

  std::vector<cudaEvent_t> start(static_cast<size_t>(opt.iters)), stop(static_cast<size_t>(opt.iters));
  for (int i = 0; i < opt.iters; ++i) {
    BENCH_CHECK(cudaEventCreate(&start[i]));
    BENCH_CHECK(cudaEventCreate(&stop[i]));
  }
  spin<<<1, 1, 0, stream>>>(2'000'000);
  BENCH_CHECK(cudaGetLastError());
  for (int i = 0; i < opt.iters; ++i) {
    BENCH_CHECK(cudaEventRecord(start[i], stream));
    if (!launch()) break;
    BENCH_CHECK(cudaEventRecord(stop[i], stream));
  }
  BENCH_CHECK(cudaStreamSynchronize(stream));
  BENCH_CHECK(cudaGetLastError());
  std::vector<double> us;
  if (res.status == "ok")
    for (int i = 0; i < opt.iters; ++i) {
      float ms = 0;
      BENCH_CHECK(cudaEventElapsedTime(&ms, start[i], stop[i]));
      us.push_back(1e3 * ms);
    }
  for (int i = 0; i < opt.iters; ++i) {
    BENCH_CHECK(cudaEventDestroy(start[i]));
    BENCH_CHECK(cudaEventDestroy(stop[i]));
  }
  if (us.empty()) return res;
  std::sort(us.begin(), us.end());
  res.us_median = llmq::bench::median_of_sorted(us);
  res.us_min = us.front();
  return res;
}

// The modes to measure: those asked for, plus the baselines their ratios need, in table order.
std::vector<Mode> modes_to_run(const std::vector<Mode>& asked, std::vector<Mode>* added) {
  bool want[4] = {false, false, false, false};
  for (Mode m : asked) want[static_cast<int>(m)] = true;
  bool need[4] = {want[0], want[1], want[2], want[3]};
  if (want[2] || want[3]) need[static_cast<int>(Mode::kFp8Tensor)] = true;
  if (want[1] || want[2] || want[3]) need[static_cast<int>(Mode::kBf16)] = true;
  std::vector<Mode> run;
  for (Mode m : {Mode::kBf16, Mode::kFp8Tensor, Mode::kFp8Outer, Mode::kFp8Block}) {
    const int i = static_cast<int>(m);
    if (!need[i]) continue;
    run.push_back(m);
    if (!want[i]) added->push_back(m);
  }
  return run;
}

void print_geomean(const char* title, const std::map<Mode, std::vector<double>>& ratios) {
  if (ratios.empty()) return;
  std::printf("%s\n", title);
  for (const auto& [mode, v] : ratios) {
    double log_sum = 0;
    for (double x : v) log_sum += std::log(x);
    std::printf("  %-11s %.3fx over %zu shapes\n", mode_name(mode),
                std::exp(log_sum / static_cast<double>(v.size())), v.size());
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  parse(argc, argv, &opt);
  std::unique_ptr<CudaGemmRunner> runner;
  llmq::CudaGemmOptions gemm_options;
  gemm_options.autotune_candidates = opt.autotune;
  gemm_options.fp8_fast_accumulation = opt.fp8_fast_accum;
  BENCH_CHECK(CudaGemmRunner::create(0, gemm_options, &runner));
  BENCH_CHECK(cudaSetDevice(0));
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  int l2 = 0;
  BENCH_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreate(&stream));
  std::ofstream json;
  if (!opt.json_path.empty()) {
    json.open(opt.json_path);
    if (!json) {
      std::fprintf(stderr, "--json: cannot write %s\n", opt.json_path.c_str());
      return 1;
    }
  }
  std::vector<Mode> added;
  const std::vector<Mode> modes = modes_to_run(opt.modes, &added);
  std::printf("device %s (sm_%d%d, %d SMs, L2 %.0f MB), iters %d, warmup %d\n", prop.name, prop.major,
              prop.minor, prop.multiProcessorCount, l2 / 1e6, opt.iters, opt.warmup);
  for (Mode m : added)
    std::printf("measuring %s too: the ratios of the modes asked for need it (same run)\n", mode_name(m));
  std::printf("%6s %6s %6s  %-11s %10s %9s %8s %9s  %s\n", "M", "N", "K", "mode", "us", "TFLOP/s",
              "vs bf16", "vs tensor", "note");

  std::map<Mode, std::vector<double>> vs_bf16, vs_tensor;
  for (const Shape& s : opt.shapes) {
    double bf16_us = 0, tensor_us = 0;  // this shape's baselines, measured just before
    for (Mode mode : modes) {
      const Result r = measure(*runner, stream, s, mode, opt, l2);
      const bool ok = r.status == "ok" && r.us_median > 0;
      const double flops = 2.0 * static_cast<double>(r.m_run) * static_cast<double>(s.n) * static_cast<double>(s.k);
      const double tflops = ok ? flops / (r.us_median * 1e-6) / 1e12 : 0;
      if (mode == Mode::kBf16 && ok) bf16_us = r.us_median;
      if (mode == Mode::kFp8Tensor && ok) tensor_us = r.us_median;
      const double speedup_bf16 = (ok && mode != Mode::kBf16 && bf16_us > 0) ? bf16_us / r.us_median : 0;
      const bool scaled = mode == Mode::kFp8Outer || mode == Mode::kFp8Block;
      const double speedup_tensor = (ok && scaled && tensor_us > 0) ? tensor_us / r.us_median : 0;
      if (speedup_bf16 > 0) vs_bf16[mode].push_back(speedup_bf16);
      if (speedup_tensor > 0) vs_tensor[mode].push_back(speedup_tensor);

      std::string note;
      if (r.m_run != s.m)
        note = "run as M=" + std::to_string(r.m_run) + " (cuBLASLt block scaling needs M % 4 == 0)";
      std::string text = note;
      if (!ok) text += (text.empty() ? "" : "; ") + r.status + ": " + r.reason;
      char ratio_bf16[32] = "", ratio_tensor[32] = "";
      if (speedup_bf16 > 0) std::snprintf(ratio_bf16, sizeof(ratio_bf16), "%.2fx", speedup_bf16);
      if (speedup_tensor > 0) std::snprintf(ratio_tensor, sizeof(ratio_tensor), "%.2fx", speedup_tensor);
      if (ok)
        std::printf("%6ld %6ld %6ld  %-11s %10.1f %9.1f %8s %9s  %s\n", s.m, s.n, s.k, mode_name(mode),
                    r.us_median, tflops, ratio_bf16, ratio_tensor, text.c_str());
      else
        std::printf("%6ld %6ld %6ld  %-11s %10s %9s %8s %9s  %s\n", s.m, s.n, s.k, mode_name(mode), "-", "-",
                    "", "", text.c_str());
      std::fflush(stdout);
      if (json.is_open()) {
        nlohmann::json j = {{"bench", "cuda_gemm"},
                            {"device", prop.name},
                            {"m", s.m},
                            {"n", s.n},
                            {"k", s.k},
                            {"m_run", r.m_run},
                            {"mode", mode_name(mode)},
                            {"out", "bf16"},
                            {"status", r.status},
                            {"us_median", r.us_median},
                            {"us_min", r.us_min},
                            {"tflops", tflops},
                            {"speedup_vs_bf16", speedup_bf16},
                            {"speedup_vs_fp8_tensor", speedup_tensor},
                            {"sets", r.sets},
                            {"iters", opt.iters},
                            {"warmup", opt.warmup}, {"autotune", opt.autotune}, {"fp8_fast_accum", opt.fp8_fast_accum}};
        if (!r.reason.empty()) j["reason"] = r.reason;
        if (!note.empty()) j["note"] = note;
        json << j.dump() << "\n";
        json.flush();
      }
    }
  }
  std::printf("\n");
  print_geomean("geometric-mean speedup over bf16 (same run):", vs_bf16);
  print_geomean("geometric-mean speedup over fp8_tensor (same run; < 1 is the cost of finer scales):",
                vs_tensor);
  BENCH_CHECK(cudaStreamDestroy(stream));
  return 0;
}
