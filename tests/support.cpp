// Shared test helpers (see support.hpp).
#include "support.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <stdexcept>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

extern char** environ;

namespace llmq::testing {

std::vector<float> outlier_matrix(int64_t rows, int64_t cols, uint64_t seed, float outlier_gain) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<bool> outlier_col(static_cast<size_t>(cols), false);
  for (int64_t c = 0; c < cols; ++c) outlier_col[c] = uniform(rng) < 0.02f || c == cols / 3;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float row_gain = 0.25f + 2.0f * uniform(rng);  // tokens differ in magnitude
    for (int64_t c = 0; c < cols; ++c) {
      float v = normal(rng) * row_gain;
      if (outlier_col[c]) v *= outlier_gain;
      if (uniform(rng) < 0.001f) v *= 25.0f;  // rare spikes: heavy tail
      if (v == 0.0f) v = 1e-3f;
      x[static_cast<size_t>(r * cols + c)] = v;
    }
  }
  return x;
}

std::vector<float> normal_vector(int64_t n, uint64_t seed, float sigma) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) {
    v = normal(rng);
    if (v == 0.0f) v = sigma * 1e-3f;
  }
  return x;
}

TempDir::TempDir(const std::string& prefix) {
  std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  const char* p = ::mkdtemp(buf.data());
  if (p == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
  path_ = p;
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

std::string testdata_dir() {
  if (const char* env = std::getenv("LLMQ_TESTDATA"); env && *env) return env;
#ifdef LLMQ_DEFAULT_TESTDATA
  return LLMQ_DEFAULT_TESTDATA;
#else
  return "../shared/testdata";
#endif
}

std::string test_data_absent(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path, ec);
  if (ec) p = path;
  return "test data absent: " + p.lexically_normal().string();
}

bool read_file(const std::string& path, std::vector<uint8_t>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  // In blocks: test code runs at -O0 under the sanitizers, where a character-at-a-time read of a
  // model file costs seconds.
  out->clear();
  std::vector<char> block(1 << 20);
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    out->insert(out->end(), block.data(), block.data() + in.gcount());
  }
  return true;
}

std::string repro(uint64_t seed, int64_t rows, int64_t cols, const std::string& what) {
  std::ostringstream os;
  os << "REPRO seed=" << seed << " rows=" << rows << " cols=" << cols << " " << what;
  return os.str();
}

int spawn_with_log(const std::string& exe, const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> all = {exe};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? static_cast<int>(pid) : -1;
}

}  // namespace llmq::testing
