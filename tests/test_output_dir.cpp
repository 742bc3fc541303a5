// The pieces of llmq's all-or-nothing output: the checksum --resume trusts, the staging
// directory's lock, its manifest and plan, and the commit that swaps it into place; and the output
// rules (check_output_path): never an input, replace only llmq's own outputs, never through a link.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "llmq/atomic_io.hpp"
#include "llmq/output_dir.hpp"
#include "support.hpp"

namespace llmq {
namespace {

namespace fs = std::filesystem;
using llmq::testing::TempDir;

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng() | 1);  // odd: never zero
  return b;
}

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(Checksum, DigestDependsOnTheBytesNotOnHowTheyAreSplit) {
  const uint64_t seed = 42;
  const std::vector<uint8_t> bytes = random_bytes(1001, seed);
  Checksum whole;
  whole.update(bytes.data(), static_cast<int64_t>(bytes.size()));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    Checksum pieces;
    size_t at = 0;
    while (at < bytes.size()) {
      const size_t n = std::min<size_t>(rng() % 70, bytes.size() - at);
      pieces.update(bytes.data() + at, static_cast<int64_t>(n));
      at += n;
    }
    EXPECT_EQ(pieces.digest(), whole.digest()) << "REPRO seed=" << seed << " trial " << trial;
  }
  // One flipped bit anywhere, or one byte more, changes it.
  for (size_t i : {size_t{0}, size_t{31}, size_t{32}, size_t{1000}}) {
    std::vector<uint8_t> changed = bytes;
    changed[i] ^= 0x10;
    Checksum c;
    c.update(changed.data(), static_cast<int64_t>(changed.size()));
    EXPECT_NE(c.digest(), whole.digest()) << "bit flipped at byte " << i;
  }
  Checksum longer;
  longer.update(bytes.data(), static_cast<int64_t>(bytes.size()));
  longer.update("\0", 1);
  EXPECT_NE(longer.digest(), whole.digest());

  TempDir dir;
  std::ofstream(dir.file("f"), std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), 1001);
  int64_t size = 0;
  uint64_t sum = 0;
  ASSERT_TRUE(checksum_file(dir.file("f"), &size, &sum).ok());
  EXPECT_EQ(size, 1001);
  EXPECT_EQ(sum, whole.digest());
}

Status begin(const std::string& out, const std::string& plan, bool resume, std::unique_ptr<OutputDir>* dir,
             bool overwrite = false) {
  OutputRules rules;
  rules.writer = "test";
  rules.overwrite = overwrite;
  return OutputDir::begin(out, rules, plan, resume, dir);
}

// An output directory holding `file` with `text`, committed by OutputDir (so it carries the marker).
void make_output(const std::string& out, const std::string& file, const std::string& text, bool overwrite = false) {
  std::unique_ptr<OutputDir> d;
  const Status st = begin(out, "p", false, &d, overwrite);
  ASSERT_TRUE(st.ok()) << st.to_string();
  write_file(d->path(file), text);
  const Status c = d->commit();
  ASSERT_TRUE(c.ok()) << c.to_string();
}

bool mentions(const Status& st, const std::string& what) { return st.message().find(what) != std::string::npos; }

TEST(OutputDir, ASecondWriterIsRefusedWhileTheFirstHoldsTheLock) {
  TempDir dir;
  std::unique_ptr<OutputDir> first, second;
  ASSERT_TRUE(begin(dir.file("out"), "p", false, &first).ok());
  const Status st = begin(dir.file("out"), "p", false, &second);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("another llmq process"), std::string::npos) << st.to_string();
  first.reset();  // the lock goes with the writer
  EXPECT_TRUE(begin(dir.file("out"), "p", false, &second).ok());
}

TEST(OutputDir, CommitReplacesAnOutputOnlyWhenAskedAndLeavesNothingBeside) {
  TempDir dir;
  const std::string out = dir.file("out");
  make_output(out, "old.txt", "old");
  EXPECT_TRUE(is_llmq_output_directory(out));
  EXPECT_EQ(names_in(out), (std::vector<std::string>{OutputDir::marker_name(), "old.txt"}));
  std::unique_ptr<OutputDir> staging;
  const Status refused = begin(out, "p", false, &staging);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(mentions(refused, "--force")) << refused.to_string();
  EXPECT_TRUE(mentions(refused, out)) << refused.to_string();
  EXPECT_EQ(names_in(out), (std::vector<std::string>{OutputDir::marker_name(), "old.txt"}));
  make_output(out, "new.txt", "new", /*overwrite=*/true);
  EXPECT_EQ(names_in(out), (std::vector<std::string>{OutputDir::marker_name(), "new.txt"}));
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"out"});
}

// A directory llmq did not write (no marker), a file, or a link: never replaced, overwrite or not,
// and refused before the staging directory is made.
TEST(OutputDir, OnlyAnLlmqOutputDirectoryIsReplaced) {
  TempDir dir;
  fs::create_directories(dir.file("user"));
  write_file(dir.file("user/notes.txt"), "mine");
  write_file(dir.file("file"), "mine");
  fs::create_directories(dir.file("victim"));
  write_file(dir.file("victim/precious.txt"), "precious");
  make_output(dir.file("ours"), "a.txt", "a");
  fs::create_symlink(dir.file("ours"), dir.file("link-to-ours"));
  fs::create_symlink(dir.file("victim"), dir.file("link-to-victim"));
  // A marker that is not llmq's (another format) does not make a directory llmq's.
  fs::create_directories(dir.file("fake"));
  write_file(dir.file("fake/") + OutputDir::marker_name(), "{\"format\": \"something-else\"}");
  for (const std::string name : {"user", "file", "link-to-ours", "link-to-victim", "fake"}) {
    SCOPED_TRACE(name);
    std::unique_ptr<OutputDir> d;
    const Status st = begin(dir.file(name), "p", false, &d, /*overwrite=*/true);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(mentions(st, dir.file(name))) << st.to_string();
    EXPECT_TRUE(mentions(st, "llmq replaces only its own outputs")) << st.to_string();
    EXPECT_FALSE(fs::exists(dir.file(name) + OutputDir::staging_suffix()));
  }
  EXPECT_EQ(names_in(dir.file("user")), std::vector<std::string>{"notes.txt"});
  EXPECT_EQ(names_in(dir.file("victim")), std::vector<std::string>{"precious.txt"});
  EXPECT_TRUE(fs::is_symlink(dir.file("link-to-victim")));
}

// <out>.llmq-partial planted as a link (a shared /tmp): never followed, its target untouched;
// a real directory there that llmq did not make is refused untouched too.
TEST(OutputDir, AStagingDirectoryLlmqDidNotMakeIsRefusedUntouched) {
  TempDir dir;
  fs::create_directories(dir.file("victim"));
  write_file(dir.file("victim/precious.txt"), "precious");
  write_file(dir.file("victim/") + OutputDir::manifest_name(), "{\"format\": \"llmq-partial-v1\", \"files\": {}}");
  const std::string out = dir.file("out");
  fs::create_directory_symlink(dir.file("victim"), out + OutputDir::staging_suffix());
  for (bool resume : {false, true}) {
    std::unique_ptr<OutputDir> d;
    const Status st = begin(out, "p", resume, &d, true);
    ASSERT_FALSE(st.ok());
    EXPECT_TRUE(mentions(st, out + OutputDir::staging_suffix())) << st.to_string();
    EXPECT_TRUE(mentions(st, "symbolic link")) << st.to_string();
  }
  EXPECT_EQ(names_in(dir.file("victim")), (std::vector<std::string>{OutputDir::manifest_name(), "precious.txt"}));
  EXPECT_TRUE(fs::is_symlink(out + OutputDir::staging_suffix()));

  const std::string out2 = dir.file("out2");
  fs::create_directories(out2 + OutputDir::staging_suffix());
  write_file(out2 + OutputDir::staging_suffix() + "/notes.txt", "mine");
  std::unique_ptr<OutputDir> d;
  const Status st = begin(out2, "p", false, &d);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(mentions(st, out2 + OutputDir::staging_suffix())) << st.to_string();
  EXPECT_EQ(names_in(out2 + OutputDir::staging_suffix()), std::vector<std::string>{"notes.txt"});
  EXPECT_FALSE(fs::exists(out2));
}

// What an interrupted llmq run leaves is taken over: its staging directory, and an old output a
// killed commit left at <out>.llmq-old-*. Anything else of those names stays.
TEST(OutputDir, OnlyLlmqLeftoversAreCleared) {
  TempDir dir;
  const std::string out = dir.file("out");
  {  // killed after its first file: staging with a manifest
    std::unique_ptr<OutputDir> killed;
    ASSERT_TRUE(begin(out, "p", false, &killed).ok());
    write_file(killed->path("a.bin"), "a");
  }
  make_output(dir.file("old-template"), "old.txt", "old");
  fs::rename(dir.file("old-template"), out + ".llmq-old-12345");  // llmq's: cleared
  fs::create_directories(out + ".llmq-old-777");                  // the user's: kept
  write_file(out + ".llmq-old-777/notes.txt", "mine");
  fs::create_directories(dir.file("victim"));
  write_file(dir.file("victim/precious.txt"), "precious");
  fs::create_directory_symlink(dir.file("victim"), out + ".llmq-old-888");  // a link: kept
  make_output(out, "new.txt", "new");
  EXPECT_EQ(names_in(out), (std::vector<std::string>{OutputDir::marker_name(), "new.txt"}));
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"out", "out.llmq-old-777", "out.llmq-old-888", "victim"}));
  EXPECT_EQ(names_in(out + ".llmq-old-777"), std::vector<std::string>{"notes.txt"});
  EXPECT_EQ(names_in(dir.file("victim")), std::vector<std::string>{"precious.txt"});
}

TEST(OutputRules, NeverAnInputInsideOneOrAroundOne) {
  TempDir dir;
  const std::string in = dir.file("parent/model");
  fs::create_directories(in);
  write_file(in + "/model.safetensors", "weights");
  write_file(dir.file("stats.json"), "{}");
  fs::create_directory_symlink(in, dir.file("link"));
  OutputRules rules;
  rules.inputs = {in, dir.file("stats.json"), "", "default", dir.file("missing")};
  rules.overwrite = true;
  for (OutputKind kind : {OutputKind::kDirectory, OutputKind::kStatsFile, OutputKind::kRawFile}) {
    rules.kind = kind;
    for (const std::string& out : {in, in + "/", in + "/.", dir.file("parent/../parent/model"), dir.file("link"),
                                   in + "/model.safetensors", in + "/new.json", dir.file("link/new.json"),
                                   dir.file("parent"), dir.path(), dir.file("stats.json")}) {
      SCOPED_TRACE("REPRO out=" + out + " kind=" + std::to_string(static_cast<int>(kind)));
      const Status st = check_output_path(out, rules);
      ASSERT_FALSE(st.ok());
      EXPECT_TRUE(mentions(st, out)) << st.to_string();
      EXPECT_TRUE(mentions(st, "input")) << st.to_string();
    }
    // Beside the input is fine.
    EXPECT_TRUE(check_output_path(dir.file("parent/model-out"), rules).ok());
    EXPECT_TRUE(check_output_path(dir.file("parent/mode"), rules).ok());
  }
  EXPECT_FALSE(check_output_path("", rules).ok());
  EXPECT_FALSE(check_output_path("/", rules).ok());
}

TEST(OutputRules, SingleFilesReplaceOnlyTheirOwnKind) {
  TempDir dir;
  const std::string stats = dir.file("stats.json"), notes = dir.file("notes.json"), raw = dir.file("l.bin");
  write_file(stats, "{\"data\": \"x\", \"format\": \"llmq-calibration-v1\", \"linears\": {}}\n");
  write_file(notes, "{\"mine\": true}\n");
  write_file(raw, "0123");
  write_file(dir.file("target.txt"), "precious");
  fs::create_symlink(dir.file("target.txt"), dir.file("link.json"));
  fs::create_directories(dir.file("d"));
  OutputRules s;
  s.kind = OutputKind::kStatsFile;
  s.overwrite = true;
  EXPECT_TRUE(write_output_file(stats, "{\"format\": \"llmq-calibration-v1\"}", s).ok());
  for (const std::string& out : {notes, raw, dir.file("link.json"), dir.file("d")}) {
    const Status st = write_output_file(out, "{}", s);
    ASSERT_FALSE(st.ok()) << out;
    EXPECT_TRUE(mentions(st, out)) << st.to_string();
  }
  // Deep nesting in a file that looks like statistics costs no stack.
  write_file(dir.file("deep.json"), "{\"format\": \"llmq-calibration-v1\", \"x\": " + std::string(200000, '[') +
                                        std::string(200000, ']') + "}");
  EXPECT_TRUE(write_output_file(dir.file("deep.json"), "{}", s).ok());

  OutputRules r;
  r.kind = OutputKind::kRawFile;
  const Status needs_force = write_output_file(raw, "abcd", r);
  ASSERT_FALSE(needs_force.ok());
  EXPECT_TRUE(mentions(needs_force, "--force")) << needs_force.to_string();
  r.overwrite = true;
  EXPECT_TRUE(write_output_file(raw, "abcd", r).ok());
  EXPECT_FALSE(write_output_file(dir.file("link.json"), "abcd", r).ok());
  EXPECT_FALSE(write_output_file(dir.file("d"), "abcd", r).ok());
  std::ifstream t(dir.file("target.txt"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(t), {}), "precious");
  EXPECT_EQ(names_in(dir.file("d")), std::vector<std::string>{});
}

// The temporary is always a new file: one planted under its name (a link to a victim) is neither
// followed nor written; another name is used.
TEST(OutputRules, APlantedTemporaryIsNeverFollowed) {
  TempDir dir;
  write_file(dir.file("victim.txt"), "precious");
  const std::string out = dir.file("l.bin");
  fs::create_symlink(dir.file("victim.txt"), out + ".tmp-" + std::to_string(static_cast<long long>(::getpid())));
  OutputRules r;
  r.kind = OutputKind::kRawFile;
  ASSERT_TRUE(write_output_file(out, "abcd", r).ok());
  std::ifstream v(dir.file("victim.txt")), o(out);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(v), {}), "precious");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(o), {}), "abcd");
  EXPECT_EQ(names_in(dir.path()).size(), 3u);  // victim, the planted link, the output: no temporary left
}

TEST(OutputDir, ResumeKeepsVerifiedFilesOfTheSamePlanOnly) {
  TempDir dir;
  const std::string out = dir.file("out");
  const std::vector<uint8_t> bytes = random_bytes(300, 7);
  Checksum sum;
  sum.update(bytes.data(), 300);
  {
    std::unique_ptr<OutputDir> run;
    ASSERT_TRUE(begin(out, "plan-a", false, &run).ok());
    std::ofstream(run->path("a.bin"), std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), 300);
    std::ofstream(run->path("b.bin"), std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), 300);
    ASSERT_TRUE(run->mark_complete("a.bin", 300, sum.digest()).ok());
    ASSERT_TRUE(run->mark_complete("b.bin", 300, sum.digest() + 1).ok());  // recorded wrong: redone
    write_file(run->path("partial.tmp-1"), "torn");
  }  // "killed": the staging directory stays
  std::unique_ptr<OutputDir> resumed;
  ASSERT_TRUE(begin(out, "plan-a", true, &resumed).ok());
  EXPECT_TRUE(resumed->reused("a.bin"));
  EXPECT_FALSE(resumed->reused("b.bin"));
  EXPECT_EQ(resumed->reused_count(), 1);
  const std::string staging = resumed->staging();
  EXPECT_EQ(names_in(staging), (std::vector<std::string>{OutputDir::manifest_name(), "a.bin"}));
  resumed.reset();

  std::unique_ptr<OutputDir> other;
  const Status st = begin(out, "plan-b", true, &other);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(staging), std::string::npos) << st.to_string();
  ASSERT_TRUE(begin(out, "plan-b", false, &other).ok());  // without --resume: start over
  EXPECT_EQ(other->reused_count(), 0);
  EXPECT_EQ(names_in(staging), std::vector<std::string>{OutputDir::manifest_name()});
}

}  // namespace
}  // namespace llmq
