// Bounded input reading (input_file.hpp).
#include "model/checkpoint/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace llmq {
namespace {

Status io_error(std::string message) { return {StatusCode::kIoError, std::move(message)}; }

// What a non-regular file is, for the message.
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

template <typename Json>
Status parse_bounded(const std::string& source, const char* begin, const char* end, Json* out) {
  const int64_t depth = json_nesting_depth(begin, end);
  if (depth > kMaxJsonDepth)
    return invalid_argument(source + ": JSON nested " + std::to_string(depth) + " levels deep; llmq reads at most " +
                            std::to_string(kMaxJsonDepth));
  try {
    *out = Json::parse(begin, end);
  } catch (const std::exception& e) {
    return invalid_argument(source + ": not valid JSON: " + e.what());
  }
  return {};
}

}  // namespace

Status open_input_file(const std::string& path, int* fd, int64_t* size, bool follow_links) {
  if (path.empty()) return invalid_argument("an empty path names no file");
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  const int f = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (follow_links ? 0 : O_NOFOLLOW));
  if (f < 0) return io_error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f, &st) != 0) {
    const int err = errno;
    ::close(f);
    return io_error(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(f);
    return invalid_argument(path + ": is " + file_kind(st.st_mode) + ", not a regular file");
  }
  // Back to blocking reads (a regular file never blocks, but say what we mean).
  const int flags = ::fcntl(f, F_GETFL);
  if (flags >= 0) (void)::fcntl(f, F_SETFL, flags & ~O_NONBLOCK);
  *fd = f;
  *size = static_cast<int64_t>(st.st_size);
  return {};
}

Status read_input_file(const std::string& what, const std::string& path, int64_t max_bytes, std::string* out,
                       bool follow_links) {
  int fd = -1;
  int64_t size = 0;
  if (Status st = open_input_file(path, &fd, &size, follow_links); !st.ok())
    return Status(st.code(), what + ": " + st.message());
  if (size > max_bytes) {
    ::close(fd);
    return invalid_argument(what + ": " + path + " has " + std::to_string(size) + " bytes; llmq reads at most " +
                            std::to_string(max_bytes) + " for it");
  }
  std::string text(static_cast<size_t>(size), '\0');
  int64_t done = 0;
  // Read what fstat promised; a file that grows meanwhile is read as it was (up to max_bytes).
  while (done < size) {
    const ssize_t n = ::read(fd, &text[static_cast<size_t>(done)], static_cast<size_t>(size - done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return io_error(what + ": " + path + ": read failed: " + std::strerror(err));
    }
    if (n == 0) break;  // shrank meanwhile
    done += n;
  }
  ::close(fd);
  text.resize(static_cast<size_t>(done));
  *out = std::move(text);
  return {};
}

bool is_input_file(const std::string& path, std::string* error) {
  if (error) error->clear();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (error && errno != ENOENT) *error = path + ": " + std::strerror(errno);
    return false;
  }
  if (S_ISREG(st.st_mode)) return true;
  if (error) *error = path + ": is " + std::string(file_kind(st.st_mode)) + ", not a regular file";
  return false;
}

bool path_present(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

int64_t json_nesting_depth(const char* begin, const char* end) {
  int64_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char* p = begin; p < end; ++p) {
    const char c = *p;
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
    else if ((c == ']' || c == '}') && depth > 0) --depth;
  }
  return deepest;
}

Status parse_json_text(const std::string& source, const char* begin, const char* end, nlohmann::json* out) {
  return parse_bounded(source, begin, end, out);
}
Status parse_json_text(const std::string& source, const std::string& text, nlohmann::json* out) {
  return parse_bounded(source, text.data(), text.data() + text.size(), out);
}
Status parse_json_text(const std::string& source, const std::string& text, nlohmann::ordered_json* out) {
  return parse_bounded(source, text.data(), text.data() + text.size(), out);
}

}  // namespace llmq
