// Durable writes (temp file, fsync, rename, fsync the directory) and the shard checksum.
#include "llmq/atomic_io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

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

// Create `tmp`, let `produce` write into its descriptor, fsync and close it; on failure the
// temporary file is removed.
template <typename Produce>
Status write_synced(const std::string& tmp, Produce produce) {
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(tmp + ": cannot create: " + std::strerror(errno));
  Status st = produce(fd);
  if (st.ok() && ::fsync(fd) != 0) st = io_error(tmp + ": fsync failed: " + std::strerror(errno));
  if (::close(fd) != 0 && st.ok()) st = io_error(tmp + ": close failed: " + std::strerror(errno));
  if (!st.ok()) ::unlink(tmp.c_str());
  return st;
}

}  // namespace

Status write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp-" + std::to_string(static_cast<long long>(::getpid()));
  LLMQ_RETURN_IF_ERROR(write_synced(tmp, [&](int fd) {
    return write_fully(fd, reinterpret_cast<const uint8_t*>(text.data()), static_cast<int64_t>(text.size()), tmp);
  }));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return io_error(path + ": cannot rename " + tmp + " into place: " + std::strerror(err));
  }
  return fsync_directory(parent_directory(path));
}

Status copy_file_synced(const std::string& from, const std::string& to) {
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return io_error(from + ": cannot open: " + std::strerror(errno));
  std::vector<uint8_t> buffer(static_cast<size_t>(kCopyChunkBytes));
  const Status st = write_synced(to, [&](int out) -> Status {
    for (;;) {
      const ssize_t r = ::read(in, buffer.data(), buffer.size());
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return io_error(from + ": read failed: " + std::strerror(errno));
      if (r == 0) return {};
      LLMQ_RETURN_IF_ERROR(write_fully(out, buffer.data(), r, to));
    }
  });
  ::close(in);
  return st;
}

}  // namespace llmq
