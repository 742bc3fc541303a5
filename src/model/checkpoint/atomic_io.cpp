// Durable writes (new temp file, fsync, rename, fsync the directory), the user-named single-file
// output under the output rules, and the shard checksum.
#include "llmq/atomic_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "model/checkpoint/input_file.hpp"

namespace llmq {
namespace {

Status io_error(const std::string& message) { return {StatusCode::kIoError, message}; }

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;
constexpr int64_t kBlockBytes = 32;
constexpr int64_t kCopyChunkBytes = int64_t{8} << 20;

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian host (safetensors.cpp asserts it)
  return v;
}

// Final avalanche so that nearby inputs give unrelated digests.
uint64_t finalize(uint64_t h) {
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime1;
  h ^= h >> 32;
  return h;
}

}  // namespace

Status write_fully(int fd, const void* bytes, int64_t n, const std::string& path) {
  const auto* data = static_cast<const uint8_t*>(bytes);
  while (n > 0) {
    const ssize_t w = ::write(fd, data, static_cast<size_t>(n));
    if (w < 0) {
      if (errno == EINTR) continue;
      return io_error(path + ": write failed: " + std::strerror(errno));
    }
    data += w;
    n -= static_cast<int64_t>(w);
  }
  return {};
}

void Checksum::mix_block(const uint8_t* block) {
  for (int i = 0; i < 4; ++i) lanes_[i] = rotl(lanes_[i] + load_u64(block + 8 * i) * kPrime2, 31) * kPrime1;
}

void Checksum::update(const void* data, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  total_bytes_ += n;
  if (pending_bytes_ > 0) {
    const int64_t take = std::min(n, kBlockBytes - pending_bytes_);
    std::memcpy(pending_ + pending_bytes_, p, static_cast<size_t>(take));
    pending_bytes_ += take;
    p += take;
    n -= take;
    if (pending_bytes_ < kBlockBytes) return;
    mix_block(pending_);
    pending_bytes_ = 0;
  }
  for (; n >= kBlockBytes; p += kBlockBytes, n -= kBlockBytes) mix_block(p);
  std::memcpy(pending_, p, static_cast<size_t>(n));
  pending_bytes_ = n;
}

uint64_t Checksum::digest() const {
  uint64_t h = rotl(lanes_[0], 1) + rotl(lanes_[1], 7) + rotl(lanes_[2], 12) + rotl(lanes_[3], 18);
  h ^= static_cast<uint64_t>(total_bytes_) * kPrime1;  // "ab" + "" differs from "a" + "b\0"
  for (int64_t i = 0; i < pending_bytes_; ++i) h = rotl(h ^ (pending_[i] * kPrime2), 11) * kPrime1;
  return finalize(h);
}

std::string checksum_hex(uint64_t digest) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(digest));
  return text;
}

Status checksum_file(const std::string& path, int64_t* size, uint64_t* digest) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error(path + ": cannot open: " + std::strerror(errno));
  std::vector<uint8_t> buffer(static_cast<size_t>(kCopyChunkBytes));
  Checksum sum;
  int64_t total = 0;
  for (;;) {
    const ssize_t r = ::read(fd, buffer.data(), buffer.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return io_error(path + ": read failed: " + std::strerror(err));
    }
    if (r == 0) break;
    sum.update(buffer.data(), r);
    total += r;
  }
  ::close(fd);
  *size = total;
  *digest = sum.digest();
  return {};
}

std::string parent_directory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

Status fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return io_error(dir + ": cannot open directory: " + std::strerror(errno));
  // Some file systems refuse fsync on a directory (EINVAL): nothing more can be done there, and
  // the data itself was already synced.
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL && err != EROFS) return io_error(dir + ": fsync failed: " + std::strerror(err));
  return {};
}

namespace {

// Let `produce` write into the new file `fd` (named `path`), then fsync and close it; on failure
// the file is removed.
template <typename Produce>
Status finish_synced(int fd, const std::string& path, Produce produce) {
  Status st = produce(fd);
  if (st.ok() && ::fsync(fd) != 0) st = io_error(path + ": fsync failed: " + std::strerror(errno));
  if (::close(fd) != 0 && st.ok()) st = io_error(path + ": close failed: " + std::strerror(errno));
  if (!st.ok()) ::unlink(path.c_str());
  return st;
}

// A new file, never an existing one and never through a link: O_EXCL refuses any name that is
// taken (a link included), O_NOFOLLOW says so in as many words.
int create_new_file(const std::string& path) {
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
}

// Create a new temporary file beside `path` (<path>.tmp-<pid>, or with a random tail when a dead
// process of the same pid left that name) and write it through `produce`, synced. *tmp: its name.
template <typename Produce>
Status write_temporary(const std::string& path, std::string* tmp, Produce produce) {
  const std::string base = path + ".tmp-" + std::to_string(static_cast<long long>(::getpid()));
  std::random_device random;
  for (int attempt = 0; attempt < 8; ++attempt) {
    *tmp = attempt == 0 ? base : base + "-" + checksum_hex((uint64_t{random()} << 32) ^ random());
    const int fd = create_new_file(*tmp);
    if (fd >= 0) return finish_synced(fd, *tmp, produce);
    if (errno != EEXIST) return io_error(*tmp + ": cannot create: " + std::strerror(errno));
  }
  return io_error(path + ": cannot create a temporary file beside it (" + base + "-* all taken)");
}

Status rename_into_place(const std::string& tmp, const std::string& path) {
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return io_error(path + ": cannot rename " + tmp + " into place: " + std::strerror(err));
  }
  return fsync_directory(parent_directory(path));
}

}  // namespace

Status write_file_atomic(const std::string& path, const std::string& text) {
  std::string tmp;
  LLMQ_RETURN_IF_ERROR(write_temporary(path, &tmp, [&](int fd) {
    return write_fully(fd, reinterpret_cast<const uint8_t*>(text.data()), static_cast<int64_t>(text.size()), tmp);
  }));
  return rename_into_place(tmp, path);
}

Status write_output_file(const std::string& path, const std::string& bytes, const OutputRules& rules) {
  if (rules.kind == OutputKind::kDirectory)
    return {StatusCode::kInternal, "write_output_file: " + path + " is a directory output (use OutputDir)"};
  LLMQ_RETURN_IF_ERROR(check_output_path(path, rules));
  const std::string dest = normalized_output_path(path);
  std::string tmp;
  LLMQ_RETURN_IF_ERROR(write_temporary(dest, &tmp, [&](int fd) {
    return write_fully(fd, reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<int64_t>(bytes.size()), tmp);
  }));
  // Decided again now: a file may have appeared at the destination while this one was written.
  // (rename acts on the name: a link swapped in after this is replaced, never followed.)
  if (Status st = check_output_path(path, rules); !st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  return rename_into_place(tmp, dest);
}

Status copy_file_synced(const std::string& from, const std::string& to) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; anything but a regular file is refused
  // before a byte is read (a FIFO or /dev/zero would never end).
  int in = -1;
  int64_t size = 0;
  LLMQ_RETURN_IF_ERROR(open_input_file(from, &in, &size));  // says what it is when not a regular file
  const int out = create_new_file(to);
  if (out < 0) {
    const int err = errno;
    ::close(in);
    return io_error(to + ": cannot create: " + std::strerror(err));
  }
  std::vector<uint8_t> buffer(static_cast<size_t>(kCopyChunkBytes));
  const Status result = finish_synced(out, to, [&](int fd) -> Status {
    for (;;) {
      const ssize_t r = ::read(in, buffer.data(), buffer.size());
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return io_error(from + ": read failed: " + std::strerror(errno));
      if (r == 0) return {};
      LLMQ_RETURN_IF_ERROR(write_fully(fd, buffer.data(), r, to));
    }
  });
  ::close(in);
  return result;
}

}  // namespace llmq
