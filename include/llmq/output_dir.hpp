// What llmq writes, and what it must never replace.
//
// check_output_path is the one place that decides whether a command may write to a path. Every
// writer goes through it (quantize and make-checkpoint through OutputDir::begin and commit,
// calibrate and logits through write_output_file in atomic_io.hpp), before anything is created:
// - An output is never an input, never inside an input directory and never a directory holding
//   an input (paths compared after resolving symbolic links).
// - An existing output path is replaced only when it is a previous llmq output of its kind, owned
//   by this user, and never through a symbolic link: a directory carrying the marker file llmq
//   writes into every output directory (.llmq-output), a statistics file that reads as llmq's
//   calibration format, or (a raw logits file, which has nothing to recognize it by) a regular file
//   when the user passes --force.
// - Staging never follows a symbolic link: <out>.llmq-partial is created by llmq, and one found
//   there is reused only when it is a real directory of this user holding llmq's progress
//   manifest (an interrupted run); anything else is refused untouched.
//
// An output directory is written as one transaction: everything goes into the staging directory
// beside the destination (<out>.llmq-partial), each file fsynced as it is finished; commit()
// swaps the staging directory into place atomically. At every instant <out> is absent, the
// complete old output or the complete new one, whatever kills the process.
//
// The staging directory also makes long writes resumable: after each file is finished its size
// and checksum go into a progress manifest in the staging directory; a later run with the same
// plan (a fingerprint of inputs and options) and resume on reuses the files that still match,
// and redoes the rest. Without resume a stale staging directory is emptied and reused, so an
// interrupted run never leaves anything a rerun trips on. A lock (flock, released by the kernel
// when the process dies, kill -9 included) keeps two writers out of one staging directory.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "llmq/status.hpp"

namespace llmq {

enum class OutputKind {
  kDirectory,  // quantize, make-checkpoint: staged, then swapped in; carries the .llmq-output marker
  kStatsFile,  // calibrate: replaces only a file that reads as an llmq calibration file
  kRawFile,    // logits: raw float32, nothing to recognize it by; replaces a regular file with --force
  kJsonLines,  // bench / attention-accuracy --json: appended to; only an empty file or one of JSON lines
};

struct OutputRules {
  OutputKind kind = OutputKind::kDirectory;
  std::string option = "--out";  // how the command names the path, for messages
  std::string writer = "llmq";   // recorded in the directory marker ("llmq quantize")
  // Every path the command reads (model file or directory, tokenizer, statistics, data). "" and
  // paths that do not exist are skipped: there is nothing there to lose.
  std::vector<std::string> inputs;
  bool overwrite = false;  // --force: replace a previous output of this kind
};

// May `out` be written under `rules`? OK, or an error naming the path and the reason. Checks the
// staging directory <out>.llmq-partial too for directory outputs. Creates and changes nothing.
Status check_output_path(const std::string& out, const OutputRules& rules);

// `out` as llmq writes it: absolute, normalized, without a trailing slash ("out/" and "out/." are
// "out"; a staging name appended to "out/" would otherwise land inside the output).
std::string normalized_output_path(const std::string& out);

// Is `dir` an output directory llmq wrote: a real directory (not a symbolic link) of this user
// holding a valid marker file? *why (optional) says what it lacks.
bool is_llmq_output_directory(const std::string& dir, std::string* why = nullptr);

class OutputDir {
 public:
  // Check `out` under `rules` (check_output_path), then prepare the staging directory. plan: a
  // fingerprint of everything that decides the bytes written. With resume, files recorded under
  // the same plan and still matching their size and checksum are kept; a staging directory from
  // a different plan is an error (it names the directory) rather than silently discarded work.
  static Status begin(const std::string& out, const OutputRules& rules, const std::string& plan, bool resume,
                      std::unique_ptr<OutputDir>* dir);
  ~OutputDir();  // unlocks; the staging directory stays for a later --resume unless committed
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  const std::string& staging() const { return staging_; }
  std::string path(const std::string& name) const { return staging_ + "/" + name; }
  // Finished by an earlier run under the same plan, and verified at begin().
  bool reused(const std::string& name) const { return reusable_.count(name) != 0; }
  int64_t reused_count() const { return static_cast<int64_t>(reusable_.size()); }
  int64_t completed_count() const { return static_cast<int64_t>(complete_.size()); }
  // Whether this run created the staging directory (false: an interrupted run's was reused).
  bool created() const { return created_; }
  // Record a finished file (already fsynced) in the progress manifest.
  Status mark_complete(const std::string& name, int64_t size, uint64_t checksum);
  // Write the marker and move the staging directory to `out`. An existing `out` is replaced only
  // when it is an llmq output directory and rules.overwrite is set, with one atomic exchange
  // where the file system has one (Linux renameat2).
  Status commit();
  // Remove the staging directory (a failed run whose finished files are of no use).
  void abandon();

  static const char* staging_suffix() { return ".llmq-partial"; }
  static const char* manifest_name() { return ".llmq-progress.json"; }
  static const char* marker_name() { return ".llmq-output"; }

 private:
  OutputDir() = default;
  struct Entry {
    int64_t size = 0;
    uint64_t checksum = 0;
  };
  Status load_manifest(bool resume);
  Status write_manifest();
  // Remove everything in the staging directory but `keep` and the manifest.
  Status remove_entries_but(const std::map<std::string, Entry>& keep);

  std::string out_;
  std::string staging_;
  std::string plan_;
  OutputRules rules_;
  int lock_fd_ = -1;
  bool created_ = false;
  bool committed_ = false;
  std::map<std::string, Entry> complete_;  // the manifest
  std::map<std::string, Entry> reusable_;  // what begin() verified
};

}  // namespace llmq
