// OutputDir: staging directory, progress manifest, lock and the atomic swap into place; and
// check_output_path, the one decision on what an output may replace.
#include "llmq/output_dir.hpp"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "llmq/atomic_io.hpp"
#include "model/checkpoint/input_file.hpp"

namespace llmq {
namespace {

namespace fs = std::filesystem;

constexpr const char* kManifestFormat = "llmq-partial-v1";
constexpr const char* kMarkerFormat = "llmq-output-v1";
// The "format" member of calibrate's statistics file (calibration_stats.cpp writes and reads it);
// an existing file is replaced by new statistics only when it carries this.
constexpr const char* kCalibrationFormat = "llmq-calibration-v1";
constexpr const char* kOldSuffix = ".llmq-old-";
constexpr int64_t kMaxMarkerBytes = 4096;
constexpr int64_t kMaxManifestBytes = int64_t{64} << 20;
constexpr int64_t kMaxStatsBytes = kMaxSideFileBytes;  // what CalibrationStats::load reads (input_file.hpp)

Status io_error(const std::string& message) { return {StatusCode::kIoError, message}; }
std::string errno_text() { return std::strerror(errno); }

// The whole of a regular file of at most max_bytes, never through a symbolic link and never
// waiting on a FIFO (false otherwise: llmq's own files are none of these).
bool read_regular_file(const std::string& path, int64_t max_bytes, std::string* out) {
  return read_input_file("", path, max_bytes, out, /*follow_links=*/false).ok();
}

// The first `n` bytes (fewer if it is shorter) of a regular file, on the same terms.
bool read_regular_prefix(const std::string& path, int64_t n, std::string* out) {
  int fd = -1;
  int64_t size = 0;
  if (!open_input_file(path, &fd, &size, /*follow_links=*/false).ok()) return false;
  out->assign(static_cast<size_t>(std::min(n, size)), '\0');
  int64_t done = 0;
  while (done < static_cast<int64_t>(out->size())) {
    const ssize_t r = ::read(fd, &(*out)[static_cast<size_t>(done)], out->size() - static_cast<size_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    done += r;
  }
  ::close(fd);
  out->resize(static_cast<size_t>(done));
  return true;
}

// The top-level "format" string of a JSON object, or "" when the text is not one. Only the top
// level is kept (nested values are discarded as they are parsed, and nlohmann's parser keeps its
// own stack), so a deeply nested or huge file costs no call stack and little memory.
std::string json_format_of(const std::string& text) {
  using json = nlohmann::json;
  const json::parser_callback_t top_level_only = [](int depth, json::parse_event_t event, json&) {
    return depth == 0 ||
           (depth == 1 && event != json::parse_event_t::object_start && event != json::parse_event_t::array_start);
  };
  const json j = json::parse(text, top_level_only, /*allow_exceptions=*/false);
  if (!j.is_object()) return "";
  const auto it = j.find("format");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

bool file_has_format(const std::string& path, int64_t max_bytes, const char* format) {
  std::string text;
  if (!read_regular_file(path, max_bytes, &text)) return false;
  // Cheap refusal first (a byte search): most files that are not llmq's never name the format.
  if (text.find(format) == std::string::npos) return false;
  return json_format_of(text) == format;
}

// An absolute path with the symbolic links of its existing part resolved.
fs::path resolved(const fs::path& p) {
  std::error_code ec;
  const fs::path r = fs::weakly_canonical(p, ec);
  return ec ? p.lexically_normal() : r;
}

// Is `inner` `outer` itself or below it (whole components: /a/bc is not below /a/b)?
bool within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i)
    if (i == inner.end() || *i != *o) return false;
  return true;
}

// Never an input, inside one, or around one. Both the path as written (its parent resolved: where
// the new entry is made) and its own resolution (where a link there leads) are compared.
Status check_inputs(const std::string& out, const fs::path& normalized, const OutputRules& rules) {
  const fs::path literal = resolved(normalized.parent_path()) / normalized.filename();
  const fs::path target = resolved(normalized);
  // A Hugging Face cache snapshot is a directory of links to blobs elsewhere: the files an input
  // directory's top-level entries point to are inputs too.
  std::vector<std::string> inputs = rules.inputs;
  for (const std::string& input : rules.inputs) {
    std::error_code ec;
    if (input.empty() || !fs::is_directory(input, ec)) continue;
    int64_t listed = 0;
    for (fs::directory_iterator it(input, ec), end; !ec && it != end && listed < 4096; it.increment(ec), ++listed) {
      std::error_code lec;
      if (it->is_symlink(lec)) inputs.push_back(it->path().string());
    }
  }
  for (const std::string& input : inputs) {
    if (input.empty()) continue;
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(input, ec))) continue;  // nothing there to lose
    const fs::path absolute = fs::absolute(input, ec);
    if (ec) continue;
    const fs::path in = resolved(absolute);
    for (const fs::path& o : {literal, target}) {
      std::error_code eq;
      if (o == in || fs::equivalent(o, in, eq))
        return invalid_argument(rules.option + ": " + out + " is the input " + input + "; llmq never writes over its input");
      if (within(o, in))
        return invalid_argument(rules.option + ": " + out + " is inside the input directory " + input +
                                "; llmq never writes into its input");
      if (within(in, o))
        return invalid_argument(rules.option + ": " + out + " holds the input " + input +
                                "; replacing it would delete the input");
    }
  }
  return {};
}

// What exists at `path` (not following a link) may be replaced under `rules`? OK when nothing is
// there.
Status check_existing(const std::string& shown, const std::string& path, const OutputRules& rules) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};
    return io_error(rules.option + ": " + shown + ": cannot inspect: " + errno_text());
  }
  const std::string where = rules.option + ": " + shown;
  const std::string only_own = "; llmq replaces only its own outputs";
  if (S_ISLNK(st.st_mode))
    return invalid_argument(where + " is a symbolic link; llmq never writes through one" + only_own);
  if (st.st_uid != ::geteuid()) return invalid_argument(where + " exists and belongs to another user" + only_own);
  switch (rules.kind) {
    case OutputKind::kDirectory: {
      if (!S_ISDIR(st.st_mode)) return invalid_argument(where + " exists and is not a directory" + only_own);
      std::string why;
      std::error_code ec;
      // An empty directory of this user (mkdir out before quantize -o out) holds nothing to lose.
      if (fs::is_empty(path, ec) && !ec) break;
      if (!is_llmq_output_directory(path, &why))
        return invalid_argument(where + " exists and is not an llmq output directory (" + why + ")" + only_own +
                                " (remove it yourself if it is one an older llmq wrote)");
      break;
    }
    case OutputKind::kStatsFile:
      if (!S_ISREG(st.st_mode)) return invalid_argument(where + " exists and is not a regular file" + only_own);
      if (!file_has_format(path, kMaxStatsBytes, kCalibrationFormat))
        return invalid_argument(where + " exists and is not an llmq calibration file (format " +
                                kCalibrationFormat + ")" + only_own);
      break;
    case OutputKind::kRawFile:
      if (!S_ISREG(st.st_mode)) return invalid_argument(where + " exists and is not a regular file" + only_own);
      break;
    case OutputKind::kJsonLines: {
      // Appended to, not replaced: an empty file, or one whose first line is a JSON object (what
      // llmq's --json writes), never a model file or anything else that would be corrupted.
      if (!S_ISREG(st.st_mode)) return invalid_argument(where + " exists and is not a regular file" + only_own);
      std::string head;
      const int64_t peek = std::min<int64_t>(static_cast<int64_t>(st.st_size), kMaxMarkerBytes * 16);
      if (peek == 0) return {};
      if (!read_regular_prefix(path, peek, &head))
        return invalid_argument(where + ": cannot read it to see whether it holds JSON lines");
      const std::string first = head.substr(0, head.find('\n'));
      nlohmann::json j;
      if (head.find('\n') == std::string::npos || !parse_json_text(where, first, &j).ok() || !j.is_object())
        return invalid_argument(where + " exists and is not a file of JSON lines; llmq appends only to its own");
      return {};
    }
  }
  if (!rules.overwrite) return invalid_argument(where + " exists (pass --force to replace it)");
  return {};
}

// A staging directory at `staging` left by llmq: its progress manifest, or an old output an
// interrupted commit swapped there (it has the marker), or nothing but the temporary of a first
// manifest a kill cut short. Anything else was not made by llmq, and nothing in it is touched.
bool is_llmq_staging(const std::string& staging, std::string* why) {
  const std::string manifest = staging + "/" + OutputDir::manifest_name();
  if (file_has_format(manifest, kMaxManifestBytes, kManifestFormat)) return true;
  if (is_llmq_output_directory(staging)) return true;
  const std::string temporary = std::string(OutputDir::manifest_name()) + ".tmp-";
  std::error_code ec;
  for (fs::directory_iterator it(staging, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(temporary, 0) != 0) {
      *why = "it holds " + name + " and no llmq progress manifest";
      return false;
    }
  }
  if (ec) *why = "cannot list it: " + ec.message();
  return !ec;
}

// The staging directory of `out`, if one exists, must be llmq's.
Status check_staging(const std::string& staging, const OutputRules& rules) {
  struct stat st {};
  if (::lstat(staging.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};
    return io_error(rules.option + ": " + staging + ": cannot inspect: " + errno_text());
  }
  const std::string where = rules.option + ": the staging directory " + staging;
  const std::string untouched = "; llmq stages only in a directory it created, and leaves this one untouched";
  if (S_ISLNK(st.st_mode)) return invalid_argument(where + " is a symbolic link" + untouched);
  if (!S_ISDIR(st.st_mode)) return invalid_argument(where + " exists and is not a directory" + untouched);
  if (st.st_uid != ::geteuid()) return invalid_argument(where + " belongs to another user" + untouched);
  std::string why;
  if (!is_llmq_staging(staging, &why)) return invalid_argument(where + " is not an interrupted llmq run's (" + why + ")" + untouched);
  return {};
}

// Remove what a commit killed halfway left: <out>.llmq-old-<pid>, the previous output swapped
// out but not yet deleted. Only llmq output directories (real directories with the marker) go;
// anything else of that name stays. A concurrent commit deleting the same one is harmless.
void remove_old_outputs(const fs::path& out) {
  std::error_code ec;
  const std::string prefix = out.filename().string() + kOldSuffix;
  for (fs::directory_iterator it(out.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().rfind(prefix, 0) != 0) continue;
    if (!is_llmq_output_directory(it->path().string())) continue;
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

std::string marker_text(const std::string& writer) {
  nlohmann::ordered_json j;
  j["format"] = kMarkerFormat;
  j["written_by"] = writer;
  j["note"] = "llmq --force replaces a directory only when it holds this file";
  return j.dump(1) + "\n";
}

}  // namespace

std::string normalized_output_path(const std::string& out) {
  std::error_code ec;
  fs::path p = fs::absolute(out, ec);
  if (ec) p = fs::path(out);
  p = p.lexically_normal();
  if (!p.has_filename() && p != p.root_path()) p = p.parent_path();
  return p.string();
}

bool is_llmq_output_directory(const std::string& dir, std::string* why) {
  std::string ignored;
  std::string& reason = why != nullptr ? *why : ignored;
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    reason = std::string("cannot inspect it: ") + errno_text();
    return false;
  }
  if (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode)) {
    reason = S_ISLNK(st.st_mode) ? "a symbolic link" : "not a directory";
    return false;
  }
  if (st.st_uid != ::geteuid()) {
    reason = "it belongs to another user";
    return false;
  }
  if (!file_has_format(dir + "/" + OutputDir::marker_name(), kMaxMarkerBytes, kMarkerFormat)) {
    reason = std::string("it has no ") + OutputDir::marker_name() + " marker";
    return false;
  }
  return true;
}

Status check_output_path(const std::string& out, const OutputRules& rules) {
  try {
    if (out.empty()) return invalid_argument(rules.option + ": no output path given");
    const fs::path normalized = normalized_output_path(out);
    if (!normalized.has_filename()) return invalid_argument(rules.option + ": " + out + " names no file or directory");
    LLMQ_RETURN_IF_ERROR(check_inputs(out, normalized, rules));
    LLMQ_RETURN_IF_ERROR(check_existing(out, normalized.string(), rules));
    if (rules.kind == OutputKind::kDirectory)
      LLMQ_RETURN_IF_ERROR(check_staging(normalized.string() + OutputDir::staging_suffix(), rules));
    return {};
  } catch (const std::exception& e) {  // std::filesystem and allocation: a Status, never an abort
    return io_error(rules.option + ": " + out + ": " + e.what());
  }
}

Status OutputDir::begin(const std::string& out, const OutputRules& rules, const std::string& plan, bool resume,
                        std::unique_ptr<OutputDir>* dir) {
  OutputRules dir_rules = rules;
  dir_rules.kind = OutputKind::kDirectory;
  LLMQ_RETURN_IF_ERROR(check_output_path(out, dir_rules));
  std::unique_ptr<OutputDir> d(new OutputDir());
  d->out_ = normalized_output_path(out);
  d->staging_ = d->out_ + staging_suffix();
  d->plan_ = plan;
  d->rules_ = dir_rules;
  std::error_code ec;
  fs::create_directories(fs::path(d->out_).parent_path(), ec);  // as `mkdir -p`; a failure shows below
  remove_old_outputs(fs::path(d->out_));
  // mkdir never follows a link; O_NOFOLLOW makes sure the directory locked is the one named.
  if (::mkdir(d->staging_.c_str(), 0755) == 0) d->created_ = true;
  else if (errno != EEXIST) return io_error(rules.option + ": cannot create " + d->staging_ + ": " + errno_text());
  // The lock is on the staging directory itself, so it leaves no file behind and moves with the
  // directory when it is renamed into place.
  d->lock_fd_ = ::open(d->staging_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (d->lock_fd_ < 0)
    return invalid_argument(rules.option + ": the staging directory " + d->staging_ +
                            " is not a directory llmq can use (" + errno_text() +
                            "); llmq never stages through a symbolic link and leaves it untouched");
  if (::flock(d->lock_fd_, LOCK_EX | LOCK_NB) != 0)
    return io_error(rules.option + ": another llmq process is writing " + out + " (its staging directory " +
                    d->staging_ + " is locked)");
  if (!d->created_) {
    // Found, not made: it must be an interrupted llmq run's, and the very directory now locked
    // (not one swapped in after the check).
    LLMQ_RETURN_IF_ERROR(check_staging(d->staging_, dir_rules));
    struct stat held {}, named {};
    if (::fstat(d->lock_fd_, &held) != 0 || ::lstat(d->staging_.c_str(), &named) != 0 ||
        held.st_dev != named.st_dev || held.st_ino != named.st_ino)
      return invalid_argument(rules.option + ": the staging directory " + d->staging_ +
                              " changed while llmq opened it; llmq leaves it untouched");
  }
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
  std::string text;
  if (read_regular_file(path(manifest_name()), kMaxManifestBytes, &text)) {
    nlohmann::json j;
    if (!parse_json_text(path(manifest_name()), text, &j).ok()) j = nullptr;  // bounded depth, no exception
    // A manifest that does not parse was torn by a crash during its own rename window (it is
    // written atomically, so this should not happen) or edited: trust none of it.
    if (j.is_object() && j.value("format", "") == kManifestFormat && j.contains("files") && j["files"].is_object()) {
      const std::string old_plan = j.contains("plan") && j["plan"].is_string() ? j["plan"].get<std::string>() : "";
      if (resume && old_plan != plan_)
        return invalid_argument("--resume: " + staging_ + " holds a run with different inputs or options (plan " +
                                old_plan + ", now " + plan_ + "); rerun without --resume to start over");
      if (resume) {
        for (const auto& [name, e] : j["files"].items()) {
          // Only plain names inside the staging directory; an edited manifest must not make us
          // read (or keep) anything elsewhere.
          if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
              name == manifest_name() || name == marker_name())
            continue;
          if (!e.is_object() || !e.contains("size") || !e.contains("checksum") || !e["size"].is_number_integer() ||
              !e["checksum"].is_string())
            continue;
          struct stat st {};
          if (::lstat(path(name).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
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
  // The new manifest first, then everything not verified goes: partial files, files of another
  // plan, an old output swapped out by an interrupted commit. In that order a run killed while
  // clearing still leaves a directory the next begin() recognizes as llmq's.
  complete_ = reusable_;
  LLMQ_RETURN_IF_ERROR(write_manifest());
  return remove_entries_but(reusable_);
}

Status OutputDir::remove_entries_but(const std::map<std::string, Entry>& keep) {
  // remove_all does not follow links: a link in here goes, not what it points to.
  std::error_code ec;
  for (fs::directory_iterator it(staging_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (keep.count(name) != 0 || name == manifest_name()) continue;
    std::error_code rm;
    fs::remove_all(it->path(), rm);
    if (rm) return io_error(rules_.option + ": cannot clear " + it->path().string() + ": " + rm.message());
  }
  if (ec) return io_error(rules_.option + ": cannot list " + staging_ + ": " + ec.message());
  return {};
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
  // Still locked by us, so no other writer is inside. The manifest goes last: a run killed
  // halfway leaves a directory the next begin() recognizes as llmq's (and empties).
  (void)remove_entries_but({});
  ::unlink(path(manifest_name()).c_str());
  std::error_code ignore;
  fs::remove_all(staging_, ignore);
}

Status OutputDir::commit() {
  if (committed_) return {StatusCode::kInternal, "OutputDir::commit called twice"};
  // <out> once more, now: something may have appeared there since begin(). Only an llmq output
  // directory is replaced, and only with overwrite.
  OutputRules existing = rules_;
  existing.inputs.clear();  // checked at begin(); the paths have not changed
  LLMQ_RETURN_IF_ERROR(check_existing(out_, out_, existing));
  // The marker goes in before the manifest goes out, so that at every instant the staging
  // directory holds one of the two and a run killed here leaves a directory begin() recognizes.
  LLMQ_RETURN_IF_ERROR(write_file_atomic(path(marker_name()), marker_text(rules_.writer)));
  if (::unlink(path(manifest_name()).c_str()) != 0 && errno != ENOENT)
    return io_error(path(manifest_name()) + ": cannot remove: " + errno_text());
  LLMQ_RETURN_IF_ERROR(fsync_directory(staging_));
  const std::string parent = parent_directory(out_);
  struct stat st {};
  const bool exists = ::lstat(out_.c_str(), &st) == 0;
  if (!exists) {
    if (::rename(staging_.c_str(), out_.c_str()) != 0)
      return io_error(rules_.option + ": cannot rename " + staging_ + " to " + out_ + ": " + errno_text());
    committed_ = true;
    return fsync_directory(parent);
  }
  // (Renames act on names and never follow a link: whatever was swapped in at <out> since the
  // check above is what moves aside, and remove_all below removes a link, not its target.)
  const std::string old = out_ + kOldSuffix + std::to_string(static_cast<long long>(::getpid()));
  if (exchange_paths(staging_, out_)) {
    // <out> is the new output; the old one sits under the staging name until it is renamed
    // aside (a kill here leaves it there, and the next begin() clears it).
    committed_ = true;
    if (::rename(staging_.c_str(), old.c_str()) != 0)
      return io_error(rules_.option + ": cannot move the old output " + staging_ + " aside: " + errno_text());
  } else {
    // No atomic exchange here (old kernel, some network file systems): two renames, with a
    // window in which <out> is absent and the old output is <out>.llmq-old-<pid>.
    if (::rename(out_.c_str(), old.c_str()) != 0)
      return io_error(rules_.option + ": cannot move " + out_ + " aside: " + errno_text());
    if (::rename(staging_.c_str(), out_.c_str()) != 0) {
      const int err = errno;
      (void)::rename(old.c_str(), out_.c_str());  // put the old output back
      return io_error(rules_.option + ": cannot rename " + staging_ + " to " + out_ + ": " + std::strerror(err));
    }
    committed_ = true;
  }
  LLMQ_RETURN_IF_ERROR(fsync_directory(parent));
  std::error_code ec;
  fs::remove_all(old, ec);
  if (ec)
    return io_error(rules_.option + ": wrote " + out_ + " but could not remove the old output " + old + ": " +
                    ec.message());
  return {};
}

}  // namespace llmq
