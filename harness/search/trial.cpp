#include "harness/search/trial.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "harness/core/error.h"

extern char** environ;

namespace dc {

std::string TrialOutcome::describe() const {
  switch (kind) {
    case Kind::exited: return fmt::format("exit {}", exit_code);
    case Kind::crashed: return fmt::format("crashed (signal {}: {})", signal, strsignal(signal));
    case Kind::timed_out: return fmt::format("timed out after {:.0f} s", seconds);
    default: return "not started";
  }
}

std::string self_executable() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

TrialOutcome run_trial(const TrialSpec& spec) {
  if (spec.argv.empty()) fail("trial: empty command");
  char tmpl[] = "/tmp/diffcheck_trial_XXXXXX";
  int out_fd = mkstemp(tmpl);
  if (out_fd < 0) fail("trial: cannot create a temporary output file: {}", std::strerror(errno));
  unlink(tmpl);

  // Build argv/envp before fork: only async-signal-safe calls in the child.
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

  TrialOutcome out;
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid < 0) fail("trial: fork failed: {}", std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(out_fd, 1);
    dup2(out_fd, 2);
    execvpe(argv[0], argv.data(), envp.data());
    dprintf(2, "diffcheck trial: cannot run '%s': %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  int status = 0;
  bool timed_out = false;
  while (true) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) fail("trial: waitpid failed: {}", std::strerror(errno));
    if (!timed_out && elapsed() > spec.timeout_seconds) {
      timed_out = true;
      kill(-pid, SIGTERM);
      std::this_thread::sleep_for(std::chrono::seconds(2));
      kill(-pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(-pid, SIGKILL);  // stragglers of the group (orphaned ranks)
  out.seconds = elapsed();
  if (timed_out) {
    out.kind = TrialOutcome::Kind::timed_out;
  } else if (WIFSIGNALED(status)) {
    out.kind = TrialOutcome::Kind::crashed;
    out.signal = WTERMSIG(status);
  } else {
    out.kind = TrialOutcome::Kind::exited;
    out.exit_code = WEXITSTATUS(status);
  }
  // Keep the tail of the output: enough for a report, bounded for long runs.
  off_t size = lseek(out_fd, 0, SEEK_END);
  off_t start = size > 65536 ? size - 65536 : 0;
  out.output.resize(static_cast<std::size_t>(size - start));
  if (pread(out_fd, out.output.data(), out.output.size(), start) < 0) out.output.clear();
  close(out_fd);
  return out;
}

}  // namespace dc
