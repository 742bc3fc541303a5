// The pieces of llmq's all-or-nothing output: the checksum --resume trusts, the staging
// directory's lock, its manifest and plan, and the commit that swaps it into place.
#include <gtest/gtest.h>

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

TEST(OutputDir, ASecondWriterIsRefusedWhileTheFirstHoldsTheLock) {
  TempDir dir;
  std::unique_ptr<OutputDir> first, second;
  ASSERT_TRUE(OutputDir::begin(dir.file("out"), "p", false, &first).ok());
  const Status st = OutputDir::begin(dir.file("out"), "p", false, &second);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("another llmq process"), std::string::npos) << st.to_string();
  first.reset();  // the lock goes with the writer
  EXPECT_TRUE(OutputDir::begin(dir.file("out"), "p", false, &second).ok());
}

TEST(OutputDir, CommitReplacesAnOutputOnlyWhenAskedAndLeavesNothingBeside) {
  TempDir dir;
  const std::string out = dir.file("out");
  fs::create_directories(out);
  write_file(out + "/old.txt", "old");
  std::unique_ptr<OutputDir> staging;
  ASSERT_TRUE(OutputDir::begin(out, "p", false, &staging).ok());
  write_file(staging->path("new.txt"), "new");
  const Status refused = staging->commit(false);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("--force"), std::string::npos) << refused.to_string();
  EXPECT_EQ(names_in(out), std::vector<std::string>{"old.txt"});
  ASSERT_TRUE(staging->commit(true).ok());
  staging.reset();
  EXPECT_EQ(names_in(out), std::vector<std::string>{"new.txt"});
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"out"});
}

TEST(OutputDir, ResumeKeepsVerifiedFilesOfTheSamePlanOnly) {
  TempDir dir;
  const std::string out = dir.file("out");
  const std::vector<uint8_t> bytes = random_bytes(300, 7);
  Checksum sum;
  sum.update(bytes.data(), 300);
  {
    std::unique_ptr<OutputDir> run;
    ASSERT_TRUE(OutputDir::begin(out, "plan-a", false, &run).ok());
    std::ofstream(run->path("a.bin"), std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), 300);
    std::ofstream(run->path("b.bin"), std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), 300);
    ASSERT_TRUE(run->mark_complete("a.bin", 300, sum.digest()).ok());
    ASSERT_TRUE(run->mark_complete("b.bin", 300, sum.digest() + 1).ok());  // recorded wrong: redone
    write_file(run->path("partial.tmp-1"), "torn");
  }  // "killed": the staging directory stays
  std::unique_ptr<OutputDir> resumed;
  ASSERT_TRUE(OutputDir::begin(out, "plan-a", true, &resumed).ok());
  EXPECT_TRUE(resumed->reused("a.bin"));
  EXPECT_FALSE(resumed->reused("b.bin"));
  EXPECT_EQ(resumed->reused_count(), 1);
  const std::string staging = resumed->staging();
  EXPECT_EQ(names_in(staging), (std::vector<std::string>{OutputDir::manifest_name(), "a.bin"}));
  resumed.reset();

  std::unique_ptr<OutputDir> other;
  const Status st = OutputDir::begin(out, "plan-b", true, &other);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(staging), std::string::npos) << st.to_string();
  ASSERT_TRUE(OutputDir::begin(out, "plan-b", false, &other).ok());  // without --resume: start over
  EXPECT_EQ(other->reused_count(), 0);
  EXPECT_EQ(names_in(staging), std::vector<std::string>{OutputDir::manifest_name()});
}

}  // namespace
}  // namespace llmq
