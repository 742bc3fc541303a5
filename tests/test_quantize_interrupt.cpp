// llmq quantize killed with SIGKILL at random moments, as a child process: the output directory
// is always absent, the old output or the complete new one (never a mixture or a torn file), the
// input is never touched, a rerun finishes cleanly, and --resume keeps the shards a killed run
// finished and produces the same bytes as an uninterrupted run.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "llmq/atomic_io.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/output_dir.hpp"
#include "llmq/synthetic_checkpoint.hpp"
#include "support.hpp"

extern char** environ;

namespace llmq {
namespace {

namespace fs = std::filesystem;
using llmq::testing::TempDir;
using Clock = std::chrono::steady_clock;

constexpr int kKills = 3;
constexpr int64_t kShardMb = 1;

// A synthetic checkpoint of `tiny` shapes with enough layers that quantizing it takes a good
// fraction of a second and writes several shards.
void make_input(const std::string& dir) {
  SyntheticCheckpointOptions o;
  ASSERT_TRUE(synthetic_model_config("tiny", &o.config).ok());
  o.config.n_layers = 6;
  o.max_shard_bytes = int64_t{2} << 20;
  o.seed = 11;
  const Status st = write_synthetic_checkpoint(dir, o);
  ASSERT_TRUE(st.ok()) << st.to_string();
}

std::vector<std::string> quantize_args(const std::string& in, const std::string& out, const std::string& scheme) {
  return {"quantize", "--model", in, "--scheme", scheme, "-o", out, "--shard-mb", std::to_string(kShardMb)};
}

// Start the CLI with stdout and stderr into `log`.
pid_t spawn_cli(const std::vector<std::string>& args, const std::string& log) {
  return llmq::testing::spawn_with_log(LLMQ_CLI_PATH, args, log);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Run to the end; the exit code, and what it printed in *output.
int run_cli(const std::vector<std::string>& args, const std::string& log, std::string* output = nullptr) {
  const pid_t pid = spawn_cli(args, log);
  if (pid < 0) return -1;
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (output != nullptr) *output = read_text(log);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// File name -> checksum of every file in a directory; empty when it does not exist.
std::map<std::string, std::string> digest(const std::string& dir) {
  std::map<std::string, std::string> d;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    int64_t size = 0;
    uint64_t sum = 0;
    EXPECT_TRUE(checksum_file(it->path().string(), &size, &sum).ok()) << it->path();
    d[it->path().filename().string()] = std::to_string(size) + ":" + checksum_hex(sum);
  }
  return d;
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// What a killed run may leave beside the output: its staging directory and an old output
// swapped out but not yet deleted; both are cleared by the next run.
bool is_allowed_leftover(const std::string& name, const std::string& out_name) {
  return name == out_name + OutputDir::staging_suffix() || name.rfind(out_name + ".llmq-old-", 0) == 0;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void kill_after(pid_t pid, double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

TEST(QuantizeInterrupt, KillNineLeavesNoOutputOrTheOldOneAndARerunCleansUp) {
  TempDir dir;
  const std::string in = dir.file("in"), ref = dir.file("ref"), out = dir.file("out"), fresh = dir.file("fresh");
  const std::string log = dir.file("log");
  make_input(in);
  const auto input_before = digest(in);

  auto t0 = Clock::now();
  ASSERT_EQ(run_cli(quantize_args(in, ref, "fp8-dynamic"), log), 0) << read_text(log);
  double run_seconds = seconds_since(t0);
  t0 = Clock::now();
  ASSERT_EQ(run_cli(quantize_args(in, out, "int8-w8a8"), log), 0) << read_text(log);  // the old output
  // The kill times are drawn over the faster of the two runs: a first run slowed by a cold cache or
  // a busy machine (ctest -j) would otherwise put every kill after the commit.
  run_seconds = std::min(run_seconds, seconds_since(t0));
  const auto new_digest = digest(ref), old_digest = digest(out);
  ASSERT_GT(new_digest.size(), 3u);  // sharded
  ASSERT_NE(new_digest, old_digest);

  const uint64_t seed = 20261126;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> delay(0.0, 1.1 * run_seconds);
  int saw_old = 0;
  for (int k = 0; k < kKills; ++k) {
    const double d = delay(rng);
    SCOPED_TRACE("REPRO seed=" + std::to_string(seed) + " kill " + std::to_string(k) + " after " +
                 std::to_string(d) + " s of a " + std::to_string(run_seconds) + " s run");
    // Over an existing output (--force), and into a directory that does not exist yet.
    std::vector<std::string> args = quantize_args(in, out, "fp8-dynamic");
    args.push_back("--force");
    kill_after(spawn_cli(args, log), d);
    const auto after = digest(out);
    EXPECT_TRUE(after == old_digest || after == new_digest) << "a torn output: " << after.size() << " files";
    saw_old += after == old_digest;
    kill_after(spawn_cli(quantize_args(in, fresh, "fp8-dynamic"), log), d);
    const auto fresh_after = digest(fresh);
    EXPECT_TRUE(fresh_after.empty() || fresh_after == new_digest) << fresh_after.size() << " files";
    for (const std::string& name : names_in(dir.path()))
      if (name != "in" && name != "ref" && name != "out" && name != "fresh" && name != "log")
        EXPECT_TRUE(is_allowed_leftover(name, "out") || is_allowed_leftover(name, "fresh")) << name;
  }
  EXPECT_GT(saw_old, 0) << "no kill landed before the commit; the test did not test";

  // Reruns finish and leave nothing else behind; the input never changed.
  std::vector<std::string> args = quantize_args(in, out, "fp8-dynamic");
  args.push_back("--force");
  ASSERT_EQ(run_cli(args, log), 0) << read_text(log);
  std::error_code ec;
  fs::remove_all(fresh, ec);
  ASSERT_EQ(run_cli(quantize_args(in, fresh, "fp8-dynamic"), log), 0) << read_text(log);
  EXPECT_EQ(digest(out), new_digest);
  EXPECT_EQ(digest(fresh), new_digest);
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"fresh", "in", "log", "out", "ref"}));
  EXPECT_EQ(digest(in), input_before);
}

// The manifest's finished files, read once the writer is dead.
std::vector<std::string> manifest_files(const std::string& staging) {
  const nlohmann::json j = nlohmann::json::parse(read_text(staging + "/" + OutputDir::manifest_name()), nullptr, false);
  std::vector<std::string> files;
  if (j.is_object() && j.contains("files"))
    for (const auto& item : j["files"].items()) files.push_back(item.key());
  return files;
}

// Start a quantize and kill it once its manifest lists at least `min_files` finished shards.
// False if it finished first.
bool kill_mid_run(const std::vector<std::string>& args, const std::string& staging, size_t min_files,
                  const std::string& log) {
  const pid_t pid = spawn_cli(args, log);
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return false;
    if (manifest_files(staging).size() >= min_files) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return true;
}

ino_t inode_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

TEST(QuantizeInterrupt, ResumeKeepsFinishedShardsAndEqualsAnUninterruptedRun) {
  TempDir dir;
  const std::string in = dir.file("in"), ref = dir.file("ref"), out = dir.file("out"), log = dir.file("log");
  const std::string staging = out + OutputDir::staging_suffix();
  make_input(in);
  ASSERT_EQ(run_cli(quantize_args(in, ref, "fp8-dynamic"), log), 0) << read_text(log);
  const auto reference = digest(ref);

  bool killed = false;
  for (int attempt = 0; attempt < 3 && !killed; ++attempt) {
    std::error_code ec;
    fs::remove_all(out, ec);
    killed = kill_mid_run(quantize_args(in, out, "fp8-dynamic"), staging, 3, log);
  }
  ASSERT_TRUE(killed) << "quantize always finished before it could be killed";
  ASSERT_FALSE(fs::exists(out));
  const std::vector<std::string> finished = manifest_files(staging);
  ASSERT_GE(finished.size(), 3u);
  ASSERT_LT(finished.size(), reference.size() - 2);  // some shards (and config.json) still to write

  // A shard damaged after it was recorded must be redone, not trusted.
  const std::string damaged = staging + "/" + finished.back();
  {
    std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    const char last = static_cast<char>(f.get());
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(~last));
  }
  std::map<std::string, ino_t> kept_inodes;
  for (size_t i = 0; i + 1 < finished.size(); ++i) kept_inodes[finished[i]] = inode_of(staging + "/" + finished[i]);

  // Resuming under other options is refused, naming the staging directory; the work is kept.
  std::string output;
  std::vector<std::string> other = quantize_args(in, out, "int8-w8a8");
  other.push_back("--resume");
  EXPECT_EQ(run_cli(other, log, &output), 2);
  EXPECT_NE(output.find(staging), std::string::npos) << output;
  EXPECT_EQ(manifest_files(staging).size(), finished.size());

  std::vector<std::string> args = quantize_args(in, out, "fp8-dynamic");
  args.push_back("--resume");
  ASSERT_EQ(run_cli(args, log, &output), 0) << output;
  const std::string expect = "resumed: " + std::to_string(finished.size() - 1) + " of ";
  EXPECT_NE(output.find(expect), std::string::npos) << output;
  EXPECT_EQ(digest(out), reference);
  for (const auto& [name, inode] : kept_inodes) EXPECT_EQ(inode_of(out + "/" + name), inode) << name << " was rewritten";
  EXPECT_FALSE(fs::exists(staging));
}

}  // namespace
}  // namespace llmq
