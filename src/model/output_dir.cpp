// OutputDir: staging directory, progress manifest, lock and the atomic swap into place.
#include "llmq/output_dir.hpp"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "llmq/atomic_io.hpp"

namespace llmq {
namespace {

namespace fs = std::filesystem;

constexpr const char* kManifestFormat = "llmq-partial-v1";
constexpr const char* kOldSuffix = ".llmq-old-";

Status io_error(const std::string& message) { return {StatusCode::kIoError, message}; }

// Remove what a commit killed halfway left: <out>.llmq-old-<pid>, the previous output swapped
// out but not yet deleted. Nobody reads those; a concurrent commit deleting the same one is
// harmless (errors are ignored).
void remove_old_outputs(const fs::path& out) {
  std::error_code ec;
  const std::string prefix = out.filename().string() + kOldSuffix;
  for (fs::directory_iterator it(out.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().rfind(prefix, 0) != 0) continue;
    std::error_code ignore;
    fs::remove_all(it->path(), ignore);
  }
}

// Swap two paths atomically. False (errno set) where the kernel or file system cannot.
bool exchange_paths(const std::string& a, const std::string& b) {
#ifdef RENAME_EXCHANGE
  return ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0;
#else
  errno = ENOSYS;
  return false;
#endif
}

}  // namespace

Status OutputDir::begin(const std::string& out, const std::string& plan, bool resume, std::unique_ptr<OutputDir>* dir) {
  std::unique_ptr<OutputDir> d(new OutputDir());
  d->out_ = out;
  d->staging_ = out + staging_suffix();
  d->plan_ = plan;
  std::error_code ec;
  fs::create_directories(fs::path(out).parent_path(), ec);  // as `mkdir -p`; a failure shows below
  remove_old_outputs(fs::path(out));
  if (::mkdir(d->staging_.c_str(), 0755) != 0 && errno != EEXIST)
    return io_error("--out: cannot create " + d->staging_ + ": " + std::strerror(errno));
  // The lock is on the staging directory itself, so it leaves no file behind and moves with the
  // directory when it is renamed into place.
  d->lock_fd_ = ::open(d->staging_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d->lock_fd_ < 0)
    return io_error("--out: " + d->staging_ + " exists and is not a directory llmq can use: " + std::strerror(errno));
  if (::flock(d->lock_fd_, LOCK_EX | LOCK_NB) != 0)
    return io_error("--out: another llmq process is writing " + out + " (its staging directory " + d->staging_ +
                    " is locked)");
  LLMQ_RETURN_IF_ERROR(d->load_manifest(resume));
  *dir = std::move(d);
  return {};
}

OutputDir::~OutputDir() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

Status OutputDir::load_manifest(bool resume) {
  complete_.clear();
  reusable_.clear();
  std::ifstream in(path(manifest_name()));
  if (in) {
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    // A manifest that does not parse was torn by a crash during its own rename window (it is
    // written atomically, so this should not happen) or edited: trust none of it.
    if (j.is_object() && j.value("format", "") == kManifestFormat && j.contains("files") && j["files"].is_object()) {
      const std::string old_plan = j.value("plan", "");
      if (resume && old_plan != plan_)
        return invalid_argument("--resume: " + staging_ + " holds a run with different inputs or options (plan " +
                                old_plan + ", now " + plan_ + "); rerun without --resume to start over");
      if (resume) {
        for (const auto& [name, e] : j["files"].items()) {
          // Only plain names inside the staging directory; an edited manifest must not make us
          // read (or keep) anything elsewhere.
          if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
              name == manifest_name())
            continue;
          if (!e.is_object() || !e.contains("size") || !e.contains("checksum") || !e["size"].is_number_integer() ||
              !e["checksum"].is_string())
            continue;
          int64_t size = 0;
          uint64_t sum = 0;
          // Verified now, not trusted: a file may have been truncated or altered since.
          if (!checksum_file(path(name), &size, &sum).ok()) continue;
          if (size == e["size"].get<int64_t>() && checksum_hex(sum) == e["checksum"].get<std::string>())
            reusable_[name] = {size, sum};
        }
      }
    }
  }
  // Everything not verified goes: partial files, files of another plan, an old output swapped
  // out by an interrupted commit.
  std::error_code ec;
  for (fs::directory_iterator it(staging_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (reusable_.count(name) != 0) continue;
    std::error_code rm;
    fs::remove_all(it->path(), rm);
    if (rm) return io_error("--out: cannot clear " + it->path().string() + ": " + rm.message());
  }
  if (ec) return io_error("--out: cannot list " + staging_ + ": " + ec.message());
  complete_ = reusable_;
  return write_manifest();
}

Status OutputDir::write_manifest() {
  nlohmann::ordered_json j;
  j["format"] = kManifestFormat;
  j["plan"] = plan_;
  nlohmann::ordered_json files = nlohmann::ordered_json::object();
  for (const auto& [name, e] : complete_) files[name] = {{"size", e.size}, {"checksum", checksum_hex(e.checksum)}};
  j["files"] = std::move(files);
  return write_file_atomic(path(manifest_name()), j.dump(1));
}

Status OutputDir::mark_complete(const std::string& name, int64_t size, uint64_t checksum) {
  complete_[name] = {size, checksum};
  return write_manifest();
}

void OutputDir::abandon() {
  if (committed_) return;
  std::error_code ignore;
  fs::remove_all(staging_, ignore);  // still locked by us, so no other writer is inside
}

Status OutputDir::commit(bool overwrite) {
  if (committed_) return {StatusCode::kInternal, "OutputDir::commit called twice"};
  // The manifest belongs to the staging directory, not to the output.
  if (::unlink(path(manifest_name()).c_str()) != 0 && errno != ENOENT)
    return io_error(path(manifest_name()) + ": cannot remove: " + std::strerror(errno));
  LLMQ_RETURN_IF_ERROR(fsync_directory(staging_));
  const std::string parent = parent_directory(out_);
  struct stat st;
  const bool exists = ::lstat(out_.c_str(), &st) == 0;
  if (exists && !overwrite) return invalid_argument("--out: " + out_ + " exists (pass --force to replace it)");
  if (!exists) {
    if (::rename(staging_.c_str(), out_.c_str()) != 0)
      return io_error("--out: cannot rename " + staging_ + " to " + out_ + ": " + std::strerror(errno));
    committed_ = true;
    return fsync_directory(parent);
  }
  const std::string old = out_ + kOldSuffix + std::to_string(static_cast<long long>(::getpid()));
  if (exchange_paths(staging_, out_)) {
    // <out> is the new output; the old one sits under the staging name until it is renamed
    // aside (a kill here leaves it there, and the next begin() clears it).
    committed_ = true;
    if (::rename(staging_.c_str(), old.c_str()) != 0)
      return io_error("--out: cannot move the old output " + staging_ + " aside: " + std::strerror(errno));
  } else {
    // No atomic exchange here (old kernel, some network file systems): two renames, with a
    // window in which <out> is absent and the old output is <out>.llmq-old-<pid>.
    if (::rename(out_.c_str(), old.c_str()) != 0)
      return io_error("--out: cannot move " + out_ + " aside: " + std::strerror(errno));
    if (::rename(staging_.c_str(), out_.c_str()) != 0) {
      const int err = errno;
      (void)::rename(old.c_str(), out_.c_str());  // put the old output back
      return io_error("--out: cannot rename " + staging_ + " to " + out_ + ": " + std::strerror(err));
    }
    committed_ = true;
  }
  LLMQ_RETURN_IF_ERROR(fsync_directory(parent));
  std::error_code ec;
  fs::remove_all(old, ec);
  if (ec) return io_error("--out: wrote " + out_ + " but could not remove the old output " + old + ": " + ec.message());
  return {};
}

}  // namespace llmq
