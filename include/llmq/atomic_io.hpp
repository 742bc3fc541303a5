// Durable file writing: a file is either absent, its old self, or complete. Written beside its
// destination, fsynced, renamed into place, and the directory fsynced, so neither a crash nor
// kill -9 leaves a half-written file under the final name. Plus a streaming checksum, which
// --resume uses to tell a finished shard from a torn or altered one. Temporary files are always
// new files (O_CREAT | O_EXCL | O_NOFOLLOW): a file or symbolic link planted under the name is
// never opened, let alone written through.
#pragma once

#include <cstdint>
#include <string>

#include "llmq/output_dir.hpp"
#include "llmq/status.hpp"

namespace llmq {

// A 64-bit checksum over a byte stream (four independent multiply-xor lanes, so it runs at
// memory speed; not cryptographic). The digest depends only on the bytes, not on how they were
// split into update() calls.
class Checksum {
 public:
  void update(const void* data, int64_t n);
  uint64_t digest() const;

 private:
  void mix_block(const uint8_t* block);  // 32 bytes
  uint64_t lanes_[4] = {0x9E3779B97F4A7C15ULL, 0xC2B2AE3D27D4EB4FULL, 0x165667B19E3779F9ULL, 0x27D4EB2F165667C5ULL};
  uint8_t pending_[32] = {};
  int64_t pending_bytes_ = 0;
  int64_t total_bytes_ = 0;
};

std::string checksum_hex(uint64_t digest);  // 16 lowercase hex digits

// Size and checksum of a whole file, read in chunks (never held in memory).
Status checksum_file(const std::string& path, int64_t* size, uint64_t* digest);

// write(2) until all n bytes are written (it may write less, or be interrupted); `path` names the
// file in the error.
Status write_fully(int fd, const void* data, int64_t n, const std::string& path);

// fsync a directory, so the names created, renamed or removed in it survive a crash.
Status fsync_directory(const std::string& dir);

// Write `text` to path: a new temporary file beside it, fsync, rename over path, fsync the
// directory. For paths inside a directory llmq made (staging); a path a user names goes through
// write_output_file.
Status write_file_atomic(const std::string& path, const std::string& text);

// A command's single-file output (calibrate's statistics, logits) written as write_file_atomic
// does, under the output rules (output_dir.hpp: check_output_path decides, before the temporary is
// made and again before the rename): never an input or inside one, and an existing file replaced
// only when it is a previous llmq output of rules.kind.
Status write_output_file(const std::string& path, const std::string& bytes, const OutputRules& rules);

// Copy a regular file's bytes to `to` (a new file: an existing one is an error) and fsync it. The
// caller renames or commits. A FIFO or device as `from` is refused, never read.
Status copy_file_synced(const std::string& from, const std::string& to);

// The directory part of a path ("." for a bare name).
std::string parent_directory(const std::string& path);

}  // namespace llmq
