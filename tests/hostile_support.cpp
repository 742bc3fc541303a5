// The hostile-input harness (hostile_support.hpp): running the CLI bounded, snapshots of a case
// directory, and the judgement of one run. The inputs themselves: hostile_files.cpp.
#include "hostile_support.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

extern char** environ;

namespace llmq::hostile {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@") ==
                        std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// At most `max` bytes of a file (the child's captured output), and the total size in *size.
std::string read_capped(const std::string& path, size_t max) {
  std::ifstream in(path, std::ios::binary);
  std::string s(max, '\0');
  in.read(&s[0], static_cast<std::streamsize>(max));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

int64_t resident_bytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/statm");
  int64_t total = 0, resident = 0;
  if (!(in >> total >> resident)) return 0;
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGKILL: return "SIGKILL";
    case SIGXFSZ: return "SIGXFSZ (a file passed the 256 MiB limit)";
    case SIGTRAP: return "SIGTRAP";
    default: return "signal";
  }
}

// ---- snapshots: relative path -> what is there (kind, size and a content hash for files). Only
// ---- regular files are ever opened: a FIFO or a device is recorded by kind.
using Snapshot = std::map<std::string, std::string>;

std::string hash_file(const std::string& path) {
  std::vector<uint8_t> bytes;
  (void)llmq::testing::read_file(path, &bytes);  // in blocks (fast at -O0 under the sanitizers)
  const std::string text(bytes.begin(), bytes.end());
  return std::to_string(text.size()) + ":" + std::to_string(std::hash<std::string>{}(text));
}

std::string describe_stat(const struct stat& st) {
  if (S_ISDIR(st.st_mode)) return "dir";
  if (S_ISFIFO(st.st_mode)) return "fifo";
  if (S_ISCHR(st.st_mode)) return "chr";
  if (S_ISBLK(st.st_mode)) return "blk";
  if (S_ISSOCK(st.st_mode)) return "sock";
  return "other";
}

void walk(const std::string& abs, const std::string& rel, int depth, Snapshot* out);

// One entry; symbolic links are recorded with their text and, where they lead to a file or a
// directory, what is there (a planted link's target must come through unchanged too).
void record(const std::string& abs, const std::string& rel, int depth, Snapshot* out) {
  struct stat st {};
  if (::lstat(abs.c_str(), &st) != 0) return;
  if (S_ISLNK(st.st_mode)) {
    char buf[4096];
    const ssize_t n = ::readlink(abs.c_str(), buf, sizeof buf - 1);
    std::string desc = "link->" + std::string(buf, n > 0 ? static_cast<size_t>(n) : 0);
    struct stat target {};
    if (::stat(abs.c_str(), &target) == 0) {
      if (S_ISREG(target.st_mode)) desc += " file:" + hash_file(abs);
      else desc += " " + describe_stat(target);
      if (S_ISDIR(target.st_mode) && depth < 4) walk(abs, rel + "@", depth + 1, out);
    } else {
      desc += " (dangling or a loop)";
    }
    (*out)[rel] = desc;
    return;
  }
  if (S_ISREG(st.st_mode)) {
    (*out)[rel] = "file:" + hash_file(abs);
    return;
  }
  (*out)[rel] = describe_stat(st);
  if (S_ISDIR(st.st_mode) && depth < 16) walk(abs, rel, depth + 1, out);
}

void walk(const std::string& abs, const std::string& rel, int depth, Snapshot* out) {
  std::error_code ec;
  std::vector<std::string> names;
  for (fs::directory_iterator it(abs, ec), end; !ec && it != end; it.increment(ec))
    names.push_back(it->path().filename().string());
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) record(abs + "/" + n, rel.empty() ? n : rel + "/" + n, depth, out);
}

Snapshot snapshot(const std::string& dir) {
  Snapshot s;
  walk(dir, "", 0, &s);
  return s;
}

bool is_partial_name(const std::string& rel) {
  const std::string name = fs::path(rel).filename().string();
  return name.find(".llmq-partial") != std::string::npos || name.find(".tmp-") != std::string::npos ||
         name.find(".llmq-old-") != std::string::npos;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// "a|b" is satisfied by either.
bool contains_word(const std::string& text, const std::string& alternatives) {
  const std::string t = lower(text);
  std::stringstream in(alternatives);
  std::string w;
  while (std::getline(in, w, '|'))
    if (!w.empty() && t.find(lower(w)) != std::string::npos) return true;
  return false;
}

std::string tail(const std::string& s, size_t n) { return s.size() <= n ? s : "..." + s.substr(s.size() - n); }

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace

// The binary under test: $LLMQ_CLI when set (a build carried to another machine, where the
// build tree's path does not exist), else the one this test was built with.
std::string cli_binary() {
  const char* env = std::getenv("LLMQ_CLI");
  return env != nullptr && *env != '\0' ? env : LLMQ_CLI_PATH;
}

std::string RunResult::repro() const {
  std::string s = "REPRO: cd " + shell_quote(cwd) + " && " + shell_quote(cli_binary());
  for (const auto& a : args) s += " " + shell_quote(a);
  return s;
}

RunResult run_cli(const std::vector<std::string>& args, const std::string& cwd, const std::string& log_dir,
                  double timeout_seconds) {
  RunResult r;
  r.args = args;
  r.cwd = cwd;
  timeout_seconds *= kTimeScale;
  std::vector<std::string> full = {cli_binary()};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(&a[0]);
  argv.push_back(nullptr);
  const std::string out_path = log_dir + "/stdout", err_path = log_dir + "/stderr";
  const auto start = Clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) {
    r.err = "fork failed";
    return r;
  }
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    ::setpgid(0, 0);
    const struct rlimit fsize = {static_cast<rlim_t>(kMaxFileBytes), static_cast<rlim_t>(kMaxFileBytes)};
    ::setrlimit(RLIMIT_FSIZE, &fsize);
    ::signal(SIGXFSZ, SIG_DFL);  // a file past the limit kills the child: counted as a crash
    ::signal(SIGPIPE, SIG_DFL);
    const int in = ::open("/dev/null", O_RDONLY);
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0 || err < 0) ::_exit(126);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    if (::chdir(cwd.c_str()) != 0) ::_exit(126);
    ::execve(argv[0], argv.data(), environ);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: whichever runs first
  int status = 0;
  struct rusage usage {};
  auto sleep_for = std::chrono::microseconds(500);
  for (;;) {
    const pid_t w = ::wait4(pid, &status, WNOHANG, &usage);
    if (w == pid) break;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const int64_t rss = resident_bytes(pid);
    r.max_rss_bytes = std::max(r.max_rss_bytes, rss);
    if (elapsed > timeout_seconds || rss > kMaxRssBytes) {
      (elapsed > timeout_seconds ? r.timed_out : r.over_memory) = true;
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      ::wait4(pid, &status, 0, &usage);
      break;
    }
    std::this_thread::sleep_for(sleep_for);
    sleep_for = std::min(sleep_for * 2, std::chrono::microseconds(10000));
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.max_rss_bytes = std::max(r.max_rss_bytes, static_cast<int64_t>(usage.ru_maxrss) * 1024);
  r.exited = WIFEXITED(status);
  if (r.exited) r.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  r.out = read_capped(out_path, 1 << 20);
  r.err = read_capped(err_path, 1 << 20);
  return r;
}

Case::Case() {
  work_ = root_.file("w");
  logs_ = root_.file("logs");
  fs::create_directories(work_);
  fs::create_directories(logs_);
}

Case::~Case() {
  // LLMQ_HOSTILE_KEEP=1 keeps a failed case's inputs for its REPRO line.
  const char* keep = std::getenv("LLMQ_HOSTILE_KEEP");
  if (keep != nullptr && *keep != '\0' && ::testing::Test::HasFailure()) {
    const std::string kept = root_.path() + "-kept";
    std::error_code ec;
    fs::rename(root_.path(), kept, ec);
    if (!ec) std::fprintf(stderr, "hostile: inputs kept in %s/w\n", kept.c_str());
  }
}

std::string Case::add(Base b, const std::string& rel) {
  const std::string& from = base_path(b);
  const std::string to = path(rel);
  fs::create_directories(fs::path(to).parent_path());
  std::error_code ec;
  if (fs::is_directory(from)) fs::copy(from, to, fs::copy_options::recursive, ec);
  else fs::copy_file(from, to, ec);
  if (ec) ADD_FAILURE() << "HOSTILE setup: copy " << from << " -> " << to << ": " << ec.message();
  return rel;
}

RunResult Case::run(const std::vector<std::string>& args, double timeout_seconds) {
  ++runs_;
  return run_cli(args, work_, logs_, timeout_seconds);
}

RunResult Case::expect(Want want, const std::vector<std::string>& args, const std::vector<std::string>& words,
                       double timeout_seconds) {
  const Snapshot before = snapshot(work_);
  RunResult r = run(args, timeout_seconds);
  const Snapshot after = snapshot(work_);

  std::vector<std::string> kinds, problems;
  auto problem = [&](const std::string& kind, const std::string& text) {
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
    problems.push_back("  - " + text);
  };
  char buf[160];
  if (r.timed_out) {
    std::snprintf(buf, sizeof buf, "still running after %.0f s: killed (a hang)", timeout_seconds * kTimeScale);
    problem("hang", buf);
  } else if (r.over_memory) {
    std::snprintf(buf, sizeof buf, "resident memory passed %lld MiB: killed", static_cast<long long>(kMaxRssBytes >> 20));
    problem("memory", buf);
  } else if (!r.exited) {
    problem("crash", std::string("killed by ") + signal_name(r.signal) + " (" + std::to_string(r.signal) + ")");
  }
  if (!r.over_memory && r.max_rss_bytes > kMaxRssBytes)
    problem("memory", "peak resident memory " + std::to_string(r.max_rss_bytes >> 20) + " MiB");
  for (const char* marker : {"AddressSanitizer", "LeakSanitizer", "runtime error:", "terminate called"})
    if (r.err.find(marker) != std::string::npos) {
      const size_t at = r.err.find(marker);
      problem(marker[0] == 't' ? "crash" : "sanitizer", first_line(r.err.substr(at > 40 ? at - 40 : 0)));
    }
  const bool accepted = r.exited && r.code == 0;
  if (r.exited) {
    if (want == Want::kRefused && r.code == 0) {
      problem("accepted", "exit status 0: the input was accepted (stdout: " + tail(first_line(r.out), 160) + ")");
    } else if (want == Want::kSucceeds && r.code != 0) {
      problem("refused", "exit status " + std::to_string(r.code) + ": " + tail(first_line(r.err), 300));
    } else if (r.code != 0 && r.code != 1 && r.code != 2) {
      problem("exit-status", "exit status " + std::to_string(r.code) + " (a refusal is 1 or 2)");
    }
  }
  if (r.exited && (r.code == 1 || r.code == 2) && want != Want::kSucceeds) {
    if (r.err.empty()) {
      problem("message", "nothing on stderr");
    } else {
      if (r.err.rfind("llmq: ", 0) != 0) problem("message", "stderr does not start with \"llmq: \"");
      for (const std::string& w : words)
        if (!contains_word(r.err, w)) problem("message", "stderr does not name '" + w + "'");
    }
  }
  auto may_change = [&](const std::string& rel) {
    for (const std::string& p : may_change_)
      if (rel == p || rel.rfind(p + "/", 0) == 0) return accepted;
    return false;
  };
  for (const auto& [rel, desc] : before) {
    if (may_change(rel)) continue;
    const auto it = after.find(rel);
    if (it == after.end()) problem("input-lost", "removed: " + rel + " (" + desc.substr(0, 60) + ")");
    else if (it->second != desc) problem("input-changed", "changed: " + rel + " (" + desc.substr(0, 60) + " -> " + it->second.substr(0, 60) + ")");
  }
  for (const auto& [rel, desc] : after) {
    if (before.count(rel) != 0) continue;
    const std::string parent = fs::path(rel).parent_path().string();
    const bool parent_new = !parent.empty() && before.count(parent) == 0;
    if (is_partial_name(rel)) problem("partial-left", "left behind: " + rel);
    else if (!accepted && !parent_new) problem("wrote", "created " + rel + " though it refused");
  }
  // LLMQ_HOSTILE_VERBOSE=1: every case's outcome, to read what the refusals say.
  if (const char* v = std::getenv("LLMQ_HOSTILE_VERBOSE"); v != nullptr && *v != '\0') {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::fprintf(stderr, "hostile: %s.%s: %s %d: %s\n", info ? info->test_suite_name() : "?", info ? info->name() : "?",
                 r.exited ? "exit" : "signal", r.exited ? r.code : r.signal, tail(first_line(r.err), 240).c_str());
  }
  if (!problems.empty()) {
    std::string joined;
    for (const auto& k : kinds) joined += (joined.empty() ? "" : ",") + k;
    std::string message = "HOSTILE " + joined + "\n" + r.repro() + "\n";
    for (const auto& p : problems) message += p + "\n";
    std::snprintf(buf, sizeof buf, "  (%.2f s, peak RSS %lld MiB; LLMQ_HOSTILE_KEEP=1 keeps the inputs)\n", r.seconds,
                  static_cast<long long>(r.max_rss_bytes >> 20));
    message += buf;
    message += "--- stderr:\n" + tail(r.err, 1500) + "\n--- stdout:\n" + tail(r.out, 300);
    ADD_FAILURE() << message;
  }
  return r;
}


std::string model_rel(Base b) { return b == Base::kLlama2c ? "model.bin" : "m"; }

std::vector<ModelCaseParam> expand(const std::vector<ModelCase>& table) {
  std::vector<ModelCaseParam> out;
  for (const ModelCase& c : table)
    for (Cmd cmd : c.cmds) out.push_back({&c, cmd});
  return out;
}

void run_model_case(const ModelCaseParam& p) {
  Case c;
  const std::string rel = c.add(p.c->base, model_rel(p.c->base));
  if (p.c->mutate) p.c->mutate(c, c.path(rel));
  if (::testing::Test::HasFailure()) return;  // the setup failed: nothing to judge
  const std::vector<std::string> args = p.c->args ? p.c->args(p.cmd, rel) : model_args(p.cmd, rel);
  c.expect(p.c->want, args, p.c->words, p.c->timeout);
}

std::string model_case_name(const ModelCaseParam& p) { return safe_name(p.c->name + "_" + cmd_name(p.cmd)); }

}  // namespace llmq::hostile
