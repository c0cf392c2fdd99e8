#include "harness/core/interrupt.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <ctime>

#include "harness/core/progress.h"
#include "harness/core/signal_safe.h"

namespace dc::interrupt {
namespace {

using signal_safe::put;
using signal_safe::put_number;

constexpr int kSlots = 8;
struct Slot {
  std::atomic<bool> used{false};
  char path[PATH_MAX] = "";
};

struct State {
  int rank = 0;
  bool reporter = false;
  std::atomic<bool> verdict{false};
  std::atomic<bool> stopping{false};
  std::atomic<const char*> phase{"starting (MPI start-up)"};
  char prefix[64] = "diffcheck: ";
  char hosts[4096] = "";
  Slot slots[kSlots];
  char watch_dir[PATH_MAX] = "";
  bool linger = false;
};
State g;

using signal_safe::copy;

// Every entry of dir but `keep` (none if null; no subdirectories are made
// there), with getdents64: opendir/readdir may allocate.
void empty_directory(const char* dir, const char* keep) {
  const int fd = ::open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  alignas(8) char buf[4096];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
    if (n <= 0) break;
    for (long at = 0; at < n;) {
      // struct linux_dirent64: u64 ino, s64 off, u16 reclen, u8 type, char name[]
      unsigned short reclen;
      std::memcpy(&reclen, buf + at + 16, sizeof reclen);
      const char* name = buf + at + 19;
      const bool dots = name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
      if (!dots && !(keep && std::strcmp(name, keep) == 0)) ::unlinkat(fd, name, 0);
      at += reclen;
    }
  }
  ::close(fd);
}

void remove_all(bool claim_too) {
  for (auto& s : g.slots)
    if (s.used.load() && s.path[0]) ::unlink(s.path);
  if (!g.watch_dir[0]) return;
  empty_directory(g.watch_dir, claim_too ? nullptr : kHangClaimName);
  ::rmdir(g.watch_dir);  // the last rank to get here finds it empty
}

const char* signal_words(int sig) {
  return sig == SIGINT ? "STOPPED by SIGINT (Ctrl-C)" : "STOPPED by the launcher (SIGTERM)";
}

void on_stop(int sig) {
  g.stopping.store(true);  // this rank's watchdog says nothing from now on
  if (g.reporter && !g.verdict.load()) {
    put(g.prefix);
    put(signal_words(sig));
    put(" while ");
    put(g.phase.load());
    put(sig == SIGINT ? ": the run was interrupted"
                      : ": the job was interrupted (Ctrl-C at mpirun) or cancelled (a batch time limit), or a "
                        "rank or host was lost (the launcher names it)");
    put("; partial files removed, exit ");
    put_number(exit_status(sig));
    if (g.hosts[0]) {
      put("; ranks by host: ");
      put(g.hosts);
    }
    progress::write_where();
  }
  // OpenMPI's mpirun (4.1) sends every rank SIGTERM, but SIGKILLs the rest as
  // soon as one has exited: a rank that went at once would take the others'
  // handlers (rank 0's line, their removals) with it. Measured on 16 ranks on
  // 2 cores: 9-15 of 16 handlers ran when each exited at once, 16 of 16 when
  // each waited 0.3 s. While ranks wait, the hang claim stays: a rank not yet
  // signalled whose watchdog looks now must not find it gone and report a hang
  // another rank has reported (seen in CI at 16 ranks).
  if (g.linger) {
    remove_all(false);
    struct timespec wait {0, 500'000'000};
    while (nanosleep(&wait, &wait) != 0) {
    }
  }
  remove_all(true);
  _exit(exit_status(sig));
}

}  // namespace

void install(int rank, bool reporter, bool linger) {
  g.rank = rank;
  g.reporter = reporter;
  g.linger = linger;
  copy(g.prefix, sizeof g.prefix, fmt::format("diffcheck [rank {}] ", rank));
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGINT);  // one signal's handler at a time
  sigaddset(&sa.sa_mask, SIGTERM);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

void set_phase(const char* phase) { g.phase.store(phase); }

void set_rank_hosts(const std::string& text) { copy(g.hosts, sizeof g.hosts, text); }

int remove_when_stopped(const std::string& path) {
  for (int i = 0; i < kSlots; ++i) {
    auto& s = g.slots[i];
    if (s.used.load()) continue;
    copy(s.path, sizeof s.path, path);
    s.used.store(true);
    return i;
  }
  return -1;  // full: a stop leaves this one (never the case with the run's few files)
}

void forget(int slot) {
  if (slot >= 0 && slot < kSlots) g.slots[slot].used.store(false);
}

void remove_directory_when_stopped(const std::string& dir) {
  copy(g.watch_dir, sizeof g.watch_dir, dir);
}

void verdict_reached() { g.verdict.store(true); }

bool stopping() { return g.stopping.load(); }

void remove_partial_files(bool claim_too) { remove_all(claim_too); }

}  // namespace dc::interrupt
