// Shared test helpers: seeded inputs with outliers (never zeros), the reference-data folder,
// and a REPRO line for failure messages.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace llmq::testing {

// Gaussian values with a few outlier columns (x outlier_gain) and heavy-tailed spikes, as LLM
// activations have. Seeded; no element is exactly zero.
std::vector<float> outlier_matrix(int64_t rows, int64_t cols, uint64_t seed, float outlier_gain = 40.0f);
// Plain N(0, sigma) values, no zeros.
std::vector<float> normal_vector(int64_t n, uint64_t seed, float sigma = 1.0f);

// A temporary directory under the system temp folder, removed with everything in it when the
// object goes. Throws if it cannot be created: an empty path + "/name" would write at the root.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "llmq");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Start `exe` with `args` (argv[1..]), its stdout and stderr both into the file `log`; the child's
// pid, or -1 when it could not be started. For the tests that run the CLI as a child process.
int spawn_with_log(const std::string& exe, const std::vector<std::string>& args, const std::string& log);

// The folder of reference vectors: $LLMQ_TESTDATA, else the build's default (../shared/testdata).
std::string testdata_dir();
bool read_file(const std::string& path, std::vector<uint8_t>* out);
// The skip message of a test whose data (outside the repository) is absent, "test data absent:
// /work/shared/models/stories260K.bin": one spelling, the path made plain, so that scripts/test
// counts such skips under one reason.
std::string test_data_absent(const std::string& path);

// "REPRO seed=3 rows=19 cols=99 spec=e4m3 per-token absmax dynamic" for failure messages.
std::string repro(uint64_t seed, int64_t rows, int64_t cols, const std::string& what);

}  // namespace llmq::testing
