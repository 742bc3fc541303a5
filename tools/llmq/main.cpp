// The llmq command line: a thin shell over the library; only the CLI prints and exits.
//   llmq demo                 the main job on the built-in model (scripts/run with no arguments)
//   llmq run / calibrate / quantize / eval / schemes   the model workflow (see --help of each)
//   llmq report               formats, scaling-method round trip, W8A8 GEMM on a seeded tensor
//   llmq formats              the format table
//   llmq convert -f e4m3 X..  encode values and show the codes and what they decode to
// Exit status: 0 done; 2 a wrong option or an input llmq refuses (kInvalidArgument); 1 any other
// failure (unsupported, I/O, device, memory). One rule, in cli::fail().
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>

#include "llmq/device.hpp"
#include "llmq/format.hpp"
#include "llmq/status.hpp"
#include "llmq/version.hpp"
#include "cli_config.hpp"
#include "commands.hpp"
#include "report.hpp"

namespace {

using llmq::cli::fail;

int run_report(const llmq::cli::ReportOptions& options) {
  llmq::cli::Report report;
  if (auto st = llmq::cli::build_report(options, &report); !st.ok()) return fail(st);
  const std::string text = options.json ? llmq::cli::report_json(options, report)
                                        : llmq::cli::report_text(options, report);
  std::fputs(text.c_str(), stdout);
  if (options.json) std::fputs("\n", stdout);
  return 0;
}

int run_convert(const std::string& format_name, const std::vector<double>& values, bool nosat,
                bool stochastic, uint64_t seed) {
  const auto dtype = llmq::parse_dtype(format_name);
  if (!dtype || !(llmq::is_fp8(*dtype) || *dtype == llmq::DType::kBF16 || *dtype == llmq::DType::kF16 ||
                  *dtype == llmq::DType::kI8 || *dtype == llmq::DType::kI4))
    return fail(llmq::invalid_argument("--format: '" + format_name +
                                       "' is not one of e4m3, e4m3_ieee, e5m2, e4m3fnuz, e5m2fnuz, bf16, f16, int8, int4"));
  const llmq::ConvertOptions options{stochastic ? llmq::Rounding::kStochastic : llmq::Rounding::kNearestEven,
                                     nosat ? llmq::Saturation::kNonSaturating : llmq::Saturation::kSatFinite};
  fmt::print("{:>16} | {:>8} | {}\n", "input", "code", std::string(llmq::dtype_name(*dtype)) + " value");
  for (size_t i = 0; i < values.size(); ++i) {
    const float x = static_cast<float>(values[i]);
    const uint32_t bits = stochastic ? llmq::philox_random_u32(seed, i) : 0u;
    if (llmq::format_info(*dtype).is_integer) {
      const int32_t q = llmq::encode_int(x, *dtype, options.rounding, bits);
      fmt::print("{:>16.9g} | {:>8} | {}\n", x, q, q);
    } else {
      const uint32_t code = llmq::encode_float(x, *dtype, options, bits);
      const int width = llmq::format_info(*dtype).bits / 4;
      fmt::print("{:>16.9g} | 0x{:0{}x}{} | {:.9g}\n", x, code, width, std::string(static_cast<size_t>(6 - width), ' '),
                 llmq::decode_float(code, *dtype));
    }
  }
  return 0;
}

// `llmq --version`: what was built and what this machine has.
std::string version_text() {
  std::string text = fmt::format("llmq {} (commit {})\n", llmq::library_version(), llmq::cli::kBuildCommit);
  if (std::string(LLMQ_CUDA_COMPILER).empty()) {
    text += "CUDA: not compiled in (a CPU-only build: --device cpu only)\n";
    return text;
  }
  text += fmt::format("CUDA: compiled with {} for {}\n", LLMQ_CUDA_COMPILER, LLMQ_CUDA_TARGETS);
  llmq::CudaDeviceInfo info;
  if (llmq::Status st = llmq::query_cuda_device(0, &info); !st.ok()) {
    text += "GPU 0: " + st.message() + "\n";
    return text;
  }
  text += fmt::format("GPU 0: {}, compute capability {}.{}, {:.0f} GiB{}\n", info.name, info.major, info.minor,
                      static_cast<double>(info.global_memory_bytes) / (1 << 30),
                      llmq::compute_capability_has_sm90a(info.major, info.minor) ? " (runs the sm_90a kernels)"
                      : info.supports_fp8() ? " (FP8; the portable kernels)"
                                            : " (no FP8: BF16 and INT8 only)");
  return text;
}

// CLI11 ends the version text with a newline of its own.
std::string version_flag_text() {
  std::string text = version_text();
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

}  // namespace

int run_main(int argc, char** argv) {
  CLI::App app{"llmq: quantize large language models to 8 bits (FP8 / INT8), measure what it costs, run them fast.\n"
                "Start with `llmq demo`; every command has --help."};
  app.footer("Exit status: 0 done; 2 a wrong option or an input llmq refuses (the message names it); 1 any other\n"
             "failure (a model feature llmq does not support, a file system, GPU or memory error).");
  app.option_defaults()->always_capture_default();  // --help shows every default
  app.set_version_flag("-V,--version", version_flag_text, "print the version, commit, CUDA build and GPU, then exit");
  app.require_subcommand(0, 1);
  std::vector<llmq::cli::Command> commands;
  llmq::cli::add_demo_command(app, &commands);
  llmq::cli::add_run_command(app, &commands);
  llmq::cli::add_calibrate_command(app, &commands);
  llmq::cli::add_quantize_command(app, &commands);
  llmq::cli::add_attention_command(app, &commands);
  llmq::cli::add_eval_command(app, &commands);
  llmq::cli::add_recipe_command(app, &commands);
  llmq::cli::add_schemes_command(app, &commands);
  llmq::cli::add_logits_command(app, &commands);
  llmq::cli::add_bench_command(app, &commands);
  llmq::cli::add_serve_command(app, &commands);
  llmq::cli::add_chat_command(app, &commands);
  llmq::cli::add_make_checkpoint_command(app, &commands);
  llmq::cli::add_template_command(app, &commands);

  llmq::cli::ReportOptions report_options;
  CLI::App* report = app.add_subcommand("report", "round-trip and GEMM error of every scaling method on a seeded outlier tensor");
  report->add_option("--rows", report_options.rows, "tokens in the seeded tensor")->check(CLI::Range(1, 1 << 20));
  report->add_option("--cols", report_options.cols, "hidden size (K)")->check(CLI::Range(1, 1 << 20));
  report->add_option("--out-features", report_options.out_features, "N of the GEMM table")->check(CLI::Range(1, 1 << 20));
  report->add_option("--seed", report_options.seed, "seed of the synthetic tensors");
  report->add_flag("--json", report_options.json, "print JSON instead of tables");
  CLI::App* formats = app.add_subcommand("formats", "print the table of 8-bit and 4-bit formats");

  CLI::App* convert = app.add_subcommand("convert", "encode values in a format, print codes and decoded values");
  std::string format_name = "e4m3";
  std::vector<double> values;
  bool nosat = false, stochastic = false;
  uint64_t seed = 0;
  convert->add_option("-f,--format", format_name, "e4m3, e4m3_ieee, e5m2, e4m3fnuz, e5m2fnuz, bf16, f16, int8, int4");
  convert->add_option("values", values, "values to convert")->required();
  convert->add_flag("--nosat", nosat, "non-saturating: overflow gives Inf or NaN instead of +-max");
  convert->add_flag("--stochastic", stochastic, "stochastic rounding (Philox, counter = position)");
  convert->add_option("--seed", seed, "stochastic rounding seed");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the message and the --help hint
    return 2;
  }
  for (const auto& c : commands)
    if (*c.app) return c.run();
  if (*formats) {
    std::fputs(llmq::cli::format_table_text().c_str(), stdout);
    return 0;
  }
  if (*convert) return run_convert(format_name, values, nosat, stochastic, seed);
  if (*report) return run_report(report_options);
  std::fputs(app.help().c_str(), stdout);
  return 0;
}

// The one boundary where exceptions stop: whatever escapes a command (std::bad_alloc from an
// allocation the checks let through, a std::filesystem error, a bug) becomes an error message and
// exit status 1, never std::terminate's abort.
int main(int argc, char** argv) {
  // NVLink multicast (NVLS) can take a shared host's GPUs out of service: NCCL never uses it under
  // llmq, whatever the environment says. NCCL reads the switch only from the environment, and the
  // library writes none, so the program sets it before any group is made (tensor_parallel.hpp).
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  try {
    return run_main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fputs("llmq: out of memory\n", stderr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llmq: internal error: %s\n", e.what());
  } catch (...) {
    std::fputs("llmq: internal error: an unknown exception\n", stderr);
  }
  return 1;
}
