// Nothing lost (issue 21), end to end: every command that writes (quantize, calibrate, logits,
// make-checkpoint) run as a child process against outputs that must not be replaced. Each refusal
// must name the path, exit 1 or 2, leave every byte of the case directory as it was (the input's
// files, a planted link's target), and leave no *.llmq-partial, *.tmp-* or *.llmq-old-* behind;
// the legitimate cases beside them still work (--force over a previous llmq output, a previous
// statistics file, a fresh make-checkpoint). --resume after a killed run: test_quantize_interrupt.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "llmq/atomic_io.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/output_dir.hpp"
#include "llmq/safetensors.hpp"
#include "llmq/synthetic_checkpoint.hpp"
#include "support.hpp"

extern char** environ;

namespace llmq {
namespace {

namespace fs = std::filesystem;
using llmq::testing::TempDir;

constexpr double kTimeoutSeconds = 120;  // a hang (a FIFO read to its end) fails, never blocks CI

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// A synthetic checkpoint of tiny shapes, without llmq's marker: as a user's downloaded model.
void make_user_checkpoint(const std::string& dir, int64_t layers = 2, int64_t shard_bytes = int64_t{4} << 30) {
  SyntheticCheckpointOptions o;
  ASSERT_TRUE(synthetic_model_config("tiny", &o.config).ok());
  o.config.n_layers = layers;
  o.max_shard_bytes = shard_bytes;
  o.seed = 5;
  const Status st = write_synthetic_checkpoint(dir, o);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_TRUE(fs::remove(dir + "/" + OutputDir::marker_name()));
}

// Every entry under `root`, not following links: a file's size and checksum, a link's target, or
// its type. Two equal snapshots mean nothing under root changed.
std::map<std::string, std::string> snapshot(const std::string& root) {
  std::map<std::string, std::string> s;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string rel = it->path().lexically_relative(root).string();  // links not resolved
    const fs::file_status st = it->symlink_status();
    if (fs::is_symlink(st)) {
      s[rel] = "link -> " + fs::read_symlink(it->path()).string();
    } else if (fs::is_regular_file(st)) {
      int64_t size = 0;
      uint64_t sum = 0;
      EXPECT_TRUE(checksum_file(it->path().string(), &size, &sum).ok()) << rel;
      s[rel] = std::to_string(size) + ":" + checksum_hex(sum);
    } else {
      s[rel] = fs::is_directory(st) ? "dir" : "other";
    }
  }
  return s;
}

// Staging and temporaries llmq may have left anywhere under root (planted names excepted).
std::vector<std::string> leftovers(const std::string& root, const std::vector<std::string>& planted = {}) {
  std::vector<std::string> found;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string rel = it->path().lexically_relative(root).string();  // links not resolved
    if (std::find(planted.begin(), planted.end(), rel) != planted.end()) continue;
    if (has(name, OutputDir::staging_suffix()) || has(name, ".tmp-") || has(name, ".llmq-old-")) found.push_back(rel);
  }
  return found;
}

struct Run {
  int rc = -1;  // exit status; -1 killed by a signal, -2 timed out
  std::string output;
};

// The CLI with `args`, stdout and stderr into one log (kept outside the case directory).
Run run_cli(const std::vector<std::string>& args, const std::string& log) {
  const pid_t pid = llmq::testing::spawn_with_log(LLMQ_CLI_PATH, args, log);
  Run r;
  if (pid < 0) return r;
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  for (;;) {
    if (::waitpid(pid, &status, WNOHANG) == pid) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > kTimeoutSeconds) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      r.rc = -2;
      r.output = read_text(log);
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.output = read_text(log);
  return r;
}

std::string joined(const std::vector<std::string>& args) {
  std::string s;
  for (const auto& a : args) s += (s.empty() ? "" : " ") + a;
  return s;
}

// One case: a directory everything lives in, whose every byte is compared around each refusal.
class Case {
 public:
  std::string path(const std::string& rel) const { return root_.file(rel); }
  const std::string& root() const { return root_.path(); }

  // Refused with exit 1 or 2, naming `named`, nothing changed under the case directory, no
  // staging or temporary left.
  void refused(const std::vector<std::string>& args, const std::string& named,
               const std::vector<std::string>& planted = {}) {
    SCOPED_TRACE("REPRO llmq " + joined(args));
    const auto before = snapshot(root());
    const Run r = run_cli(args, logs_.file("log"));
    EXPECT_TRUE(r.rc == 1 || r.rc == 2) << "exit " << r.rc << ": " << r.output;
    EXPECT_TRUE(has(r.output, named)) << "the error does not name " << named << ": " << r.output;
    EXPECT_EQ(snapshot(root()), before) << "a refused command changed something: " << r.output;
    EXPECT_EQ(leftovers(root(), planted), std::vector<std::string>{});
  }
  // Exit 0, no staging or temporary left.
  std::string succeeds(const std::vector<std::string>& args, const std::vector<std::string>& planted = {}) {
    SCOPED_TRACE("REPRO llmq " + joined(args));
    const Run r = run_cli(args, logs_.file("log"));
    EXPECT_EQ(r.rc, 0) << r.output;
    EXPECT_EQ(leftovers(root(), planted), std::vector<std::string>{});
    return r.output;
  }

 private:
  TempDir root_{"llmq-case"};
  TempDir logs_{"llmq-log"};
};

std::vector<std::string> quantize(const std::string& model, const std::string& out, bool force = true) {
  std::vector<std::string> a = {"quantize", "--model", model, "--scheme", "fp8-dynamic", "-o", out};
  if (force) a.push_back("--force");
  return a;
}

std::vector<std::string> calibrate(const std::string& model, const std::string& out) {
  return {"calibrate", "--model", model, "--samples", "1", "--length", "4", "-o", out};
}

std::vector<std::string> logits(const std::string& model, const std::string& out, bool force = true) {
  std::vector<std::string> a = {"logits", "--model", model, "--ids", "1 5 9", "-o", out};
  if (force) a.push_back("--force");
  return a;
}

void victim_dir(Case& c, const std::string& rel) {
  fs::create_directories(c.path(rel));
  write_text(c.path(rel + "/precious.txt"), "the user's own\n");
}

// ---- quantize: the input, inside it, around it

TEST(OutputSafety, QuantizeNeverReplacesItsInputOrWhatHoldsIt) {
  Case c;
  make_user_checkpoint(c.path("m"));
  for (const std::string& out : {c.path("m/model.safetensors"), c.path("m/config.json"), c.path("m"),
                                 c.path("m/."), c.path("m/new"), c.root()})
    c.refused(quantize(c.path("m"), out), out);
}

TEST(OutputSafety, QuantizeNeverReplacesAUserDirectoryFileOrLink) {
  Case c;
  make_user_checkpoint(c.path("m"));
  victim_dir(c, "user");
  write_text(c.path("file"), "mine\n");
  victim_dir(c, "victim");
  ASSERT_EQ(::symlink(c.path("victim").c_str(), c.path("link").c_str()), 0);
  for (const std::string name : {"user", "file", "link"}) {
    c.refused(quantize(c.path("m"), c.path(name)), c.path(name));
    c.refused(quantize(c.path("m"), c.path(name), /*force=*/false), c.path(name));
  }
}

// A planted <out>.llmq-partial (a link into a victim, or a directory llmq did not make): refused,
// untouched, its target's contents kept; with --force and --resume too.
TEST(OutputSafety, QuantizeNeverFollowsAPlantedStagingLink) {
  Case c;
  make_user_checkpoint(c.path("m"));
  victim_dir(c, "victim");
  write_text(c.path("victim/.llmq-progress.json"), "{\"format\": \"llmq-partial-v1\", \"files\": {}}");
  const std::string out = c.path("q"), staging = out + OutputDir::staging_suffix();
  ASSERT_EQ(::symlink(c.path("victim").c_str(), staging.c_str()), 0);
  const std::vector<std::string> planted = {"q.llmq-partial"};
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{}, std::vector<std::string>{"--force"}, std::vector<std::string>{"--resume"}}) {
    std::vector<std::string> args = quantize(c.path("m"), out, false);
    args.insert(args.end(), flags.begin(), flags.end());
    c.refused(args, staging, planted);
  }
  ASSERT_TRUE(fs::is_symlink(staging));
  fs::remove(staging);
  victim_dir(c, "q.llmq-partial");  // a real directory, not llmq's
  c.refused(quantize(c.path("m"), out), staging, planted);
}

// Old outputs a killed commit leaves are cleared only when they are llmq's: a link or a user's
// directory under that name stays, and so does what the link points to.
TEST(OutputSafety, OldOutputCleanupTouchesOnlyLlmqOutputs) {
  Case c;
  make_user_checkpoint(c.path("m"));
  victim_dir(c, "victim");
  ASSERT_EQ(::symlink(c.path("victim").c_str(), c.path("q.llmq-old-1").c_str()), 0);
  victim_dir(c, "q.llmq-old-2");
  const auto victim = snapshot(c.path("victim")), user = snapshot(c.path("q.llmq-old-2"));
  const std::vector<std::string> planted = {"q.llmq-old-1", "q.llmq-old-2"};
  c.succeeds(quantize(c.path("m"), c.path("q"), false), planted);
  c.succeeds(quantize(c.path("m"), c.path("q")), planted);
  EXPECT_TRUE(fs::is_symlink(c.path("q.llmq-old-1")));
  EXPECT_EQ(snapshot(c.path("victim")), victim);
  EXPECT_EQ(snapshot(c.path("q.llmq-old-2")), user);
}

// The legitimate cases: a fresh output, its refusal without --force, its replacement with it.
TEST(OutputSafety, QuantizeReplacesItsOwnOutputWithForceOnly) {
  Case c;
  make_user_checkpoint(c.path("m"));
  const auto input = snapshot(c.path("m"));
  c.succeeds(quantize(c.path("m"), c.path("q"), false));
  EXPECT_TRUE(is_llmq_output_directory(c.path("q")));
  const std::string marker = read_text(c.path("q/") + OutputDir::marker_name());
  EXPECT_TRUE(has(marker, "llmq-output-v1") && has(marker, "llmq quantize")) << marker;
  const auto first = snapshot(c.path("q"));
  c.refused(quantize(c.path("m"), c.path("q"), false), "--force");
  c.succeeds({"quantize", "--model", c.path("m"), "--scheme", "int8-w8a8", "-o", c.path("q"), "--force"});
  EXPECT_NE(snapshot(c.path("q")), first);
  EXPECT_TRUE(is_llmq_output_directory(c.path("q")));
  EXPECT_EQ(snapshot(c.path("m")), input);
}

TEST(OutputSafety, DryRunWritesNothing) {
  Case c;
  make_user_checkpoint(c.path("m"));
  const auto before = snapshot(c.root());
  const std::string out = c.succeeds({"quantize", "--model", c.path("m"), "-o", c.path("sub/q"), "--dry-run"});
  EXPECT_TRUE(has(out, "would write")) << out;
  EXPECT_EQ(snapshot(c.root()), before);
  // And it says what the real run would refuse.
  c.refused({"quantize", "--model", c.path("m"), "-o", c.path("m/x"), "--dry-run"}, c.path("m/x"));
}

// ---- an input error leaves no staging: before it is made (a FIFO beside the weights, which would
// hang the copy) and after (a NaN in the last shard, with shards before it written).

TEST(OutputSafety, AnInputErrorLeavesNoStaging) {
  Case c;
  make_user_checkpoint(c.path("m"));
  ASSERT_EQ(::mkfifo(c.path("m/tokenizer.json").c_str(), 0644), 0);
  c.refused(quantize(c.path("m"), c.path("q")), c.path("m/tokenizer.json"));
  EXPECT_FALSE(fs::exists(c.path("q")));
  fs::remove(c.path("m/tokenizer.json"));

  make_user_checkpoint(c.path("sharded"), 4, int64_t{1} << 20);
  std::vector<std::string> shards;
  for (const auto& e : fs::directory_iterator(c.path("sharded")))
    if (e.path().extension() == ".safetensors") shards.push_back(e.path().string());
  std::sort(shards.begin(), shards.end());
  ASSERT_GE(shards.size(), 3u);
  std::string bytes = read_text(shards.back());
  SafetensorsHeader header;
  ASSERT_TRUE(parse_safetensors_header(shards.back(), reinterpret_cast<const uint8_t*>(bytes.data()),
                                       static_cast<int64_t>(bytes.size()), &header)
                  .ok());
  const SafetensorsTensorInfo& t = header.tensors.back();
  ASSERT_EQ(t.dtype, DType::kBF16);
  const uint16_t nan = 0x7FC0;
  std::memcpy(&bytes[static_cast<size_t>(header.data_start + t.offset + t.nbytes - 2)], &nan, 2);
  write_text(shards.back(), bytes);
  for (const char* flag : {"--force", "--resume"})
    c.refused({"quantize", "--model", c.path("sharded"), "--scheme", "fp8-dynamic", "-o", c.path("q"), "--shard-mb",
               "1", flag},
              t.name);
  EXPECT_FALSE(fs::exists(c.path("q")));
}

// ---- calibrate

TEST(OutputSafety, CalibrateNeverWritesOverItsInputsOrAnotherFile) {
  Case c;
  make_user_checkpoint(c.path("m"));
  write_text(c.path("notes.json"), "{\"mine\": true}\n");
  write_text(c.path("tokens.txt"), "1 2 3 4 5\n");
  ASSERT_EQ(::symlink(c.path("m/model.safetensors").c_str(), c.path("link.json").c_str()), 0);
  for (const std::string& out : {c.path("m/model.safetensors"), c.path("m/config.json"), c.path("m/stats.json"),
                                 c.path("m"), c.path("notes.json"), c.path("link.json")})
    c.refused(calibrate(c.path("m"), out), out);
  c.refused({"calibrate", "--model", c.path("m"), "--data", c.path("tokens.txt"), "-o", c.path("tokens.txt")},
            c.path("tokens.txt"));
  // The legitimate case: new statistics, then new statistics over them.
  c.succeeds(calibrate(c.path("m"), c.path("s.json")));
  const std::string first = read_text(c.path("s.json"));
  EXPECT_TRUE(has(first, "llmq-calibration-v1"));
  c.succeeds({"calibrate", "--model", c.path("m"), "--data", c.path("tokens.txt"), "-o", c.path("s.json")});
  EXPECT_NE(read_text(c.path("s.json")), first);
}

// ---- logits

TEST(OutputSafety, LogitsNeverWritesOverItsInputsAndReplacesOnlyWithForce) {
  Case c;
  make_user_checkpoint(c.path("m"));
  victim_dir(c, "victim");
  ASSERT_EQ(::symlink(c.path("victim/precious.txt").c_str(), c.path("link.bin").c_str()), 0);
  for (const std::string& out : {c.path("m/model.safetensors"), c.path("m/config.json"), c.path("m/new.bin"),
                                 c.path("m"), c.path("link.bin"), c.path("victim")})
    c.refused(logits(c.path("m"), out), out);
  c.succeeds(logits(c.path("m"), c.path("l.bin"), false));
  EXPECT_EQ(fs::file_size(c.path("l.bin")), 3u * 512u * 4u);  // 3 ids x vocab 512, float32
  c.refused(logits(c.path("m"), c.path("l.bin"), false), "--force");
  c.succeeds({"logits", "--model", c.path("m"), "--ids", "1 7", "-o", c.path("l.bin"), "--force"});
  EXPECT_EQ(fs::file_size(c.path("l.bin")), 2u * 512u * 4u);
}

// ---- make-checkpoint: a new directory only (it has no --force)

TEST(OutputSafety, MakeCheckpointWritesOnlyANewDirectory) {
  Case c;
  victim_dir(c, "user");
  write_text(c.path("file"), "mine\n");
  make_user_checkpoint(c.path("m"));
  for (const std::string name : {"user", "file", "m", "file/ckpt"})
    c.refused({"make-checkpoint", "--shape", "tiny", "--layers", "1", "-o", c.path(name)}, c.path(name));
  c.succeeds({"make-checkpoint", "--shape", "tiny", "--layers", "1", "-o", c.path("ckpt")});
  EXPECT_TRUE(is_llmq_output_directory(c.path("ckpt")));
  c.refused({"make-checkpoint", "--shape", "tiny", "--layers", "1", "-o", c.path("ckpt")}, c.path("ckpt"));
  // Its output is a model quantize reads, and --force replaces an llmq output of any writer.
  c.succeeds(quantize(c.path("ckpt"), c.path("q"), false));
  c.refused(quantize(c.path("m"), c.path("ckpt"), false), "--force");
}

}  // namespace
}  // namespace llmq
