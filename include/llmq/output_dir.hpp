// An output directory written as one transaction: everything goes into a staging directory
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

#include "llmq/status.hpp"

namespace llmq {

class OutputDir {
 public:
  // Prepare the staging directory for `out`. plan: a fingerprint of everything that decides the
  // bytes written. With resume, files recorded under the same plan and still matching their
  // size and checksum are kept; a staging directory from a different plan is an error (it names
  // the directory) rather than silently discarded work.
  static Status begin(const std::string& out, const std::string& plan, bool resume, std::unique_ptr<OutputDir>* dir);
  ~OutputDir();  // unlocks; the staging directory stays for a later --resume unless committed
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  const std::string& staging() const { return staging_; }
  std::string path(const std::string& name) const { return staging_ + "/" + name; }
  // Finished by an earlier run under the same plan, and verified at begin().
  bool reused(const std::string& name) const { return reusable_.count(name) != 0; }
  int64_t reused_count() const { return static_cast<int64_t>(reusable_.size()); }
  int64_t completed_count() const { return static_cast<int64_t>(complete_.size()); }
  // Record a finished file (already fsynced) in the progress manifest.
  Status mark_complete(const std::string& name, int64_t size, uint64_t checksum);
  // Move the staging directory to `out`, replacing an existing output only when overwrite is
  // set, with one atomic exchange where the file system has one (Linux renameat2).
  Status commit(bool overwrite);
  // Remove the staging directory (a failed run whose finished files are of no use).
  void abandon();

  static const char* staging_suffix() { return ".llmq-partial"; }
  static const char* manifest_name() { return ".llmq-progress.json"; }

 private:
  OutputDir() = default;
  Status load_manifest(bool resume);
  Status write_manifest();

  std::string out_;
  std::string staging_;
  std::string plan_;
  int lock_fd_ = -1;
  bool committed_ = false;
  struct Entry {
    int64_t size = 0;
    uint64_t checksum = 0;
  };
  std::map<std::string, Entry> complete_;  // the manifest
  std::map<std::string, Entry> reusable_;  // what begin() verified
};

}  // namespace llmq
