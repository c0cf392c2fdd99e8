#include "harness/search/trial.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "harness/core/error.h"

extern char** environ;

namespace dc {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;

void on_interrupt(int) { g_interrupted = 1; }

// The trials running now (their top pids): a child of ours that is not one
// of them is an orphan some trial left behind.
std::mutex g_active_mu;
std::set<pid_t> g_active;

// pid -> parent pid of every process, from /proc.
std::map<pid_t, pid_t> parents() {
  std::map<pid_t, pid_t> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end) continue;
    std::ifstream stat(fmt::format("/proc/{}/stat", pid));
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: comm may hold spaces and parentheses.
    auto close = line.rfind(')');
    if (close == std::string::npos || close + 4 > line.size()) continue;
    char state = 0;
    long ppid = 0;
    if (std::sscanf(line.c_str() + close + 2, "%c %ld", &state, &ppid) == 2 && state != 'Z')
      out[static_cast<pid_t>(pid)] = static_cast<pid_t>(ppid);
  }
  closedir(d);
  return out;
}

// `root` and all its living descendants.
std::set<pid_t> tree(pid_t root) {
  auto par = parents();
  std::set<pid_t> out{root};
  bool grew = true;
  while (grew) {
    grew = false;
    for (const auto& [p, pp] : par)
      if (out.count(pp) && out.insert(p).second) grew = true;
  }
  return out;
}

// Our children that are no trial's top process: orphans adopted as subreaper.
std::set<pid_t> adopted_orphans() {
  std::set<pid_t> roots;
  {
    std::lock_guard<std::mutex> lock(g_active_mu);
    for (const auto& [p, pp] : parents())
      if (pp == getpid() && !g_active.count(p)) roots.insert(p);
  }
  std::set<pid_t> all;
  for (pid_t r : roots) all.merge(tree(r));
  return all;
}

void signal_all(const std::set<pid_t>& pids, int sig) {
  for (pid_t p : pids) kill(p, sig);
}

// Reaps those of `pids` that are our (adopted) children, except `keep`: the
// trial's top process, whose status its own loop collects.
void reap(const std::set<pid_t>& pids, pid_t keep = 0) {
  for (pid_t p : pids)
    if (p != keep) waitpid(p, nullptr, WNOHANG);
}

bool any_alive(const std::set<pid_t>& pids) {
  return std::any_of(pids.begin(), pids.end(), [](pid_t p) {
    if (kill(p, 0) != 0) return false;
    std::ifstream stat(fmt::format("/proc/{}/stat", p));
    std::string line;
    std::getline(stat, line);
    auto close = line.rfind(')');
    return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
  });
}

// Ends the process tree of `pid`: SIGTERM to the top alone first (mpirun
// then ends its ranks itself, which remove their partial files, and removes
// its session directory: signalled together with its ranks, it was seen to
// leave that directory behind), up to half the grace for it to go; then
// SIGTERM to its group and every descendant, up to `grace` to go, then
// SIGKILL to whatever is left (descendants found on the way included,
// orphans among them).
void end_tree(pid_t pid, std::chrono::milliseconds grace) {
  std::set<pid_t> seen = tree(pid);
  kill(pid, SIGTERM);
  const auto top_until = std::chrono::steady_clock::now() + grace / 2;
  while (std::chrono::steady_clock::now() < top_until && any_alive({pid})) {
    seen.merge(tree(pid));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(-pid, SIGTERM);
  signal_all(seen, SIGTERM);
  const auto until = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < until) {
    seen.merge(tree(pid));
    reap(seen, pid);
    if (!any_alive(seen)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  seen.merge(tree(pid));
  kill(-pid, SIGKILL);
  signal_all(seen, SIGKILL);
}

// Kills and reaps orphans left by trials that are over.
void clean_orphans() {
  for (int round = 0; round < 50; ++round) {
    auto orphans = adopted_orphans();
    if (orphans.empty()) return;
    signal_all(orphans, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    reap(orphans);
  }
}

}  // namespace

void install_interrupt_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

bool interrupted() { return g_interrupted != 0; }

std::string TrialOutcome::describe() const {
  switch (kind) {
    case Kind::exited:
      if (exit_code >= 128 && exit_code < 128 + 65)
        return fmt::format("exit {} (a process killed by signal {}: {})", exit_code, exit_code - 128,
                           strsignal(exit_code - 128));
      if (exit_code == 127) return "exit 127 (command not found)";
      if (exit_code == 126) return "exit 126 (command not executable)";
      return fmt::format("exit {}", exit_code);
    case Kind::crashed: return fmt::format("crashed (signal {}: {})", signal, strsignal(signal));
    case Kind::timed_out: return fmt::format("timed out after {:.0f} s", seconds);
    case Kind::interrupted: return "interrupted";
    default: return "not started";
  }
}

int TrialOutcome::crash_signal() const {
  if (kind == Kind::crashed) return signal;
  if (kind == Kind::exited && exit_code >= 128 && exit_code < 128 + 65) return exit_code - 128;
  // OpenMPI: "mpirun noticed that process rank 3 with PID 123 on node x exited on signal 11 (...)"
  auto at = output.find("exited on signal ");
  if (at != std::string::npos) return std::atoi(output.c_str() + at + 17);
  return 0;
}

TrialOutcome::Class TrialOutcome::classify() const {
  switch (kind) {
    case Kind::timed_out: return Class::timed_out;
    case Kind::interrupted: return Class::interrupted;
    case Kind::crashed: return Class::crashed;
    case Kind::not_started: return Class::error;
    case Kind::exited: break;
  }
  if (exit_code == 0) return Class::pass;
  if (exit_code == 126 || exit_code == 127) return Class::error;
  if (crash_signal() != 0) return Class::crashed;
  return Class::fail;
}

std::string self_executable() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

namespace {

// Starts the trial's command in a process group of its own, its output into
// `out_fd`. argv and envp are built before fork: only async-signal-safe
// calls in the child.
// mpirun, mpiexec or orterun, by the name it is started with.
static bool is_mpi_launcher(const char* path) {
  const char* base = std::strrchr(path, '/');
  base = base ? base + 1 : path;
  return std::strcmp(base, "mpirun") == 0 || std::strcmp(base, "mpiexec") == 0 || std::strcmp(base, "orterun") == 0;
}

pid_t start_trial(const TrialSpec& spec, int out_fd) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (!spec.env.count(kv.substr(0, kv.find('=')))) env_strings.push_back(kv);
  }
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = spec.argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid;
  {
    std::lock_guard<std::mutex> lock(g_active_mu);  // registered before anyone looks for orphans
    pid = fork();
    if (pid < 0) fail("trial: fork failed: {}", std::strerror(errno));
    if (pid == 0) {
      setpgid(0, 0);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      // mpirun with SIGPIPE ignored: OpenMPI 4.1 can write a late signal into its own closed signal
      // pipe as the job ends, and at SIGPIPE's default that kills it after the job passed, which a
      // trial would read as a crash (scripts/studies/mpi_teardown_loop.sh).
      if (is_mpi_launcher(argv[0])) signal(SIGPIPE, SIG_IGN);
      int devnull = open("/dev/null", O_RDONLY);
      dup2(devnull, 0);
      dup2(out_fd, 1);
      dup2(out_fd, 2);
      execvpe(argv[0], argv.data(), envp.data());
      dprintf(2, "diffcheck trial: cannot run '%s': %s\n", argv[0], strerror(errno));
      _exit(127);
    }
    g_active.insert(pid);
  }
  setpgid(pid, pid);
  return pid;
}

// Waits for the trial, ending its whole tree at the time limit or on an
// interrupt; then whatever of the tree outlived its top: its process group,
// and orphans (adopted by us) of this and earlier trials.
TrialOutcome wait_for_trial(pid_t pid, const TrialSpec& spec, std::chrono::steady_clock::time_point t0) {
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  int status = 0;
  bool timed_out = false, stopped = false;
  while (true) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) fail("trial: waitpid failed: {}", std::strerror(errno));
    if (!timed_out && !stopped && (elapsed() > spec.timeout_seconds || interrupted())) {
      (interrupted() ? stopped : timed_out) = true;
      std::set<pid_t> before = tree(pid);
      // mpirun takes about 1.5 s to end its ranks (they remove their partial
      // files first), more on a loaded machine; killed outright, it would
      // leave its session directory.
      end_tree(pid, std::chrono::seconds(10));
      reap(before, pid);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(-pid, SIGKILL);
  {
    std::lock_guard<std::mutex> lock(g_active_mu);
    g_active.erase(pid);
  }
  clean_orphans();
  TrialOutcome out;
  out.seconds = elapsed();
  if (stopped) {
    out.kind = TrialOutcome::Kind::interrupted;
  } else if (timed_out) {
    out.kind = TrialOutcome::Kind::timed_out;
  } else if (WIFSIGNALED(status)) {
    out.kind = TrialOutcome::Kind::crashed;
    out.signal = WTERMSIG(status);
  } else {
    out.kind = TrialOutcome::Kind::exited;
    out.exit_code = WEXITSTATUS(status);
  }
  return out;
}

// The tail of the output: enough for a report, bounded for long runs.
std::string output_tail(int fd) {
  std::string text;
  off_t size = lseek(fd, 0, SEEK_END);
  off_t start = size > 65536 ? size - 65536 : 0;
  text.resize(static_cast<std::size_t>(size - start));
  if (pread(fd, text.data(), text.size(), start) < 0) text.clear();
  return text;
}

}  // namespace

TrialOutcome run_trial(const TrialSpec& spec) {
  if (spec.argv.empty()) fail("trial: empty command");
  // Orphaned descendants of a trial (MPI ranks whose mpirun died) become our
  // children instead of init's, so they can be found and ended.
  static const bool subreaper = prctl(PR_SET_CHILD_SUBREAPER, 1) == 0;
  (void)subreaper;
  if (interrupted()) {
    TrialOutcome out;
    out.kind = TrialOutcome::Kind::interrupted;
    return out;
  }
  char tmpl[] = "/tmp/diffcheck_trial_XXXXXX";
  int out_fd = mkstemp(tmpl);
  if (out_fd < 0) fail("trial: cannot create a temporary output file: {}", std::strerror(errno));
  unlink(tmpl);
  const auto t0 = std::chrono::steady_clock::now();
  TrialOutcome out = wait_for_trial(start_trial(spec, out_fd), spec, t0);
  out.output = output_tail(out_fd);
  close(out_fd);
  return out;
}

}  // namespace dc
