// The hostile-input suite's harness (issue 21): every case runs the real `llmq` binary as a child
// process on inputs built in a fresh directory, and judges it from outside, the way a user meets
// it. A child is bounded in time (killed with its process group, reported as a hang), in file size
// (RLIMIT_FSIZE; the SIGXFSZ that kills it counts as a crash) and in resident memory (polled while
// it runs and taken from wait4's ru_maxrss; RLIMIT_AS is not used because AddressSanitizer
// reserves terabytes of address space). Every failure message carries a REPRO line with the
// command, and starts with "HOSTILE" and the kind of failure so a run's log can be summarized.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support.hpp"

namespace llmq::hostile {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// A tiny model runs any command in well under a second (a few under ASan): 30 s means stuck.
constexpr double kTimeoutSeconds = 30.0;
// For inputs whose whole danger is blocking or looping (FIFOs, devices, quadratic parses).
constexpr double kShortTimeoutSeconds = 20.0;
// Under AddressSanitizer (the suite runs there in CI) the CLI is several times slower: time limits
// stretch by this factor, still far below what a hang or a quadratic walk takes.
#if defined(__SANITIZE_ADDRESS__)
constexpr double kTimeScale = 3.0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr double kTimeScale = 3.0;
#else
constexpr double kTimeScale = 1.0;
#endif
#else
constexpr double kTimeScale = 1.0;
#endif
// The sanitizer build: a few checks that only repeat a path already taken run once there.
constexpr bool kSanitized = kTimeScale > 1.0;
constexpr int64_t kMaxFileBytes = int64_t{256} << 20;
constexpr int64_t kMaxRssBytes = int64_t{1536} << 20;

struct RunResult {
  std::vector<std::string> args;  // without the binary
  std::string cwd;
  bool exited = false;      // terminated normally (exit status in code)
  int code = -1;
  int signal = 0;           // the signal that ended it (ours too, on a hang or memory kill)
  bool timed_out = false;   // killed by the harness after the time limit
  bool over_memory = false; // killed by the harness once its resident set passed kMaxRssBytes
  int64_t max_rss_bytes = 0;
  double seconds = 0;
  std::string out, err;
  std::string repro() const;  // "REPRO: cd DIR && /path/llmq ARGS" (shell-quoted)
};

// Run the CLI in `cwd` with stdout/stderr captured to files under `log_dir`.
RunResult run_cli(const std::vector<std::string>& args, const std::string& cwd, const std::string& log_dir,
                  double timeout_seconds);

// ---- inputs made once per test process, by llmq itself (lazily: a filtered run makes only what
// ---- its cases use)
enum class Base {
  kHf,         // make-checkpoint --shape tiny --layers 2: config.json + model.safetensors (BF16)
  kSharded,    // the same in 1 MiB shards with model.safetensors.index.json
  kQuantized,  // quantize --scheme fp8-dynamic of kHf
  kMoe,        // make-checkpoint --shape tiny-moe --layers 1 (Mixtral)
  kLlama2c,    // a legacy llama2.c file (float32), written here with seeded weights
  kStats,      // calibrate of kHf (llmq-calibration-v1 JSON)
  kData,       // a token-id file: three lines of seeded ids
  kTokenizer,  // a directory with a byte-level BPE tokenizer.json (512 ids) and tokenizer_config.json
};
const std::string& base_path(Base b);

// ---- what a command must do with an input
enum class Want {
  kRefused,   // exit status 1 or 2, "llmq: ..." naming the words, nothing written or changed
  kSucceeds,  // exit status 0; inputs unchanged
  kNoCrash,   // either of the above (inputs where refusing and accepting are both right)
};

// One case: a fresh directory `w` (the child's working directory, holding every input and
// output) and a log directory beside it.
class Case {
 public:
  Case();
  ~Case();
  Case(const Case&) = delete;
  Case& operator=(const Case&) = delete;

  const std::string& dir() const { return work_; }
  std::string path(const std::string& rel) const { return work_ + "/" + rel; }
  // Copy a base input to `rel` (directories recursively); returns `rel`, for argument lists.
  std::string add(Base b, const std::string& rel);

  // Run and judge. `words`: each must appear in stderr (case-insensitive); "a|b" accepts either.
  RunResult expect(Want want, const std::vector<std::string>& args, const std::vector<std::string>& words = {},
                   double timeout_seconds = kTimeoutSeconds);
  RunResult refused(const std::vector<std::string>& args, const std::vector<std::string>& words,
                    double timeout_seconds = kTimeoutSeconds) {
    return expect(Want::kRefused, args, words, timeout_seconds);
  }
  RunResult succeeds(const std::vector<std::string>& args, double timeout_seconds = kTimeoutSeconds) {
    return expect(Want::kSucceeds, args, {}, timeout_seconds);
  }
  // A path (file or directory) a succeeding command may replace: a previous output of its own.
  void allow_change(const std::string& rel) { may_change_.push_back(rel); }
  // Run without judging (a reference run whose output a case compares).
  RunResult run(const std::vector<std::string>& args, double timeout_seconds = kTimeoutSeconds);

 private:
  llmq::testing::TempDir root_;
  std::string work_, logs_;
  std::vector<std::string> may_change_;
  int runs_ = 0;
};

// ---- files
std::string read_bytes(const std::string& path);
void write_bytes(const std::string& path, const std::string& bytes);
json read_json_file(const std::string& path);
void write_json_file(const std::string& path, const json& j);
// config.json of a model directory, edited in place.
void edit_config(const std::string& model_dir, const std::function<void(json&)>& edit);
// `depth` opening brackets then as many closing ones: JSON nested `depth` deep.
std::string nested_json(int64_t depth, char open = '[');
// Replace `path` (whatever it is) with a FIFO, a symbolic link to /dev/zero, an empty directory,
// or a symbolic link that points at itself through a second one.
enum class Special { kFifo, kDevZero, kDirectory, kSymlinkLoop };
void make_special(const std::string& path, Special kind);
const char* special_name(Special kind);
// The words an error about such a file must contain (alternatives joined by '|'): what it is
// ("not a regular file" alone does not tell a user which of the four they are looking at).
const char* special_words(Special kind);

// ---- safetensors, edited tensor by tensor
struct StTensor {
  std::string name;
  std::string dtype;  // "BF16", "F32", ...
  std::vector<int64_t> shape;
  std::string data;   // raw little-endian bytes
};
struct StFile {
  std::vector<StTensor> tensors;  // in data order
  json metadata;                  // "__metadata__" (null when absent)
  StTensor* find(const std::string& name);
  void erase(const std::string& name);
};
StFile read_safetensors(const std::string& path);
// The header JSON text (tensors in order, data_offsets computed), unpadded.
std::string safetensors_header(const StFile& f);
// Write with the header padded with spaces to a multiple of 8, as the reference writer does.
void write_safetensors(const std::string& path, const StFile& f);
// Write an arbitrary header text (its length prefixed) followed by the tensors' data.
void write_safetensors_raw(const std::string& path, const std::string& header, const std::string& data);
std::string concat_data(const StFile& f);
// Seeded BF16 values ~N(0, sigma) with a few outliers, never zero.
std::string random_bf16(int64_t n, uint64_t seed, float sigma = 0.02f);
uint16_t bf16_bits(float x);
void set_bf16(StTensor* t, int64_t index, uint16_t bits);

// The tensor names of the tiny base checkpoint.
std::string layer_tensor(int layer, const std::string& module);  // ("self_attn.q_proj") -> model.layers.L.self_attn.q_proj.weight

// ---- commands that read a model
enum class Cmd { kRun, kEval, kCalibrate, kLogits, kQuantize };
const char* cmd_name(Cmd c);
// A short run of `c` on `model` (relative to the case directory); outputs go to fresh names.
std::vector<std::string> model_args(Cmd c, const std::string& model);
const std::vector<Cmd>& all_cmds();

// ---- a table of model inputs x commands, each pair one parameterized test
struct ModelCase {
  std::string name;
  Base base = Base::kHf;
  // Edit the copied input; `model` is its absolute path (a directory, or the llama2.c file).
  std::function<void(Case&, const std::string& model)> mutate;
  std::vector<std::string> words;  // what the error must name
  std::vector<Cmd> cmds;
  Want want = Want::kRefused;
  double timeout = kTimeoutSeconds;
  // The command line, when model_args' is not the one (tokenizers, --stats, --data).
  std::function<std::vector<std::string>(Cmd, const std::string& model)> args;
};
struct ModelCaseParam {
  const ModelCase* c = nullptr;
  Cmd cmd = Cmd::kRun;
};
// Every (case, command) pair of a table that lives as long as the program.
std::vector<ModelCaseParam> expand(const std::vector<ModelCase>& table);
void run_model_case(const ModelCaseParam& p);
std::string model_case_name(const ModelCaseParam& p);
// gtest prints parameters with these (by name, not as bytes).
inline void PrintTo(const ModelCaseParam& p, std::ostream* os) { *os << model_case_name(p); }
inline void PrintTo(Cmd c, std::ostream* os) { *os << cmd_name(c); }
// The model's name in the case directory: "m" (a directory) or "model.bin" (llama2.c).
std::string model_rel(Base b);

// A gtest-safe name piece: letters, digits and '_' only.
std::string safe_name(const std::string& s);

}  // namespace llmq::hostile
