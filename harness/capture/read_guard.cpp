#include "harness/capture/read_guard.h"

#include <fmt/format.h>
#include <link.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

namespace dc::h5 {
namespace {

using Clock = std::chrono::steady_clock;

struct Step {
  Clock::time_point start;
  std::string what;
};

// Never destroyed: the monitor thread may outlive static destruction.
struct Registry {
  std::mutex mu;
  std::map<unsigned long long, Step> steps;
  unsigned long long next = 0;
  bool started = false;
  std::atomic<ReadFailureHandler> handler{nullptr};
};

Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

thread_local const char* tls_step = nullptr;  // this thread's innermost step

// Writes all of `s` to stderr with write(2): usable in a signal handler.
void say(const char* s) {
  for (std::size_t n = std::strlen(s); n > 0;) {
    ssize_t w = write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<std::size_t>(w);
  }
}

[[noreturn]] void fail(const char* what, const char* failure, double seconds) {
  if (auto h = registry().handler.load()) h(what, failure, seconds);
  say("diffcheck error: ");
  say(what);
  say(": ");
  say(failure);
  say(" inside HDF5 (a damaged file can make HDF5 1.10 crash or loop forever); giving up");
  if (seconds > 0) say(". On a slow file system, raise DIFFCHECK_READ_STALL (seconds)");
  say("\n");
  _exit(2);
}

void monitor(double limit) {
  Registry& r = registry();
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::string stalled;
    {
      std::lock_guard lock(r.mu);
      const auto now = Clock::now();
      for (const auto& [id, step] : r.steps)
        if (std::chrono::duration<double>(now - step.start).count() > limit) {
          stalled = step.what;
          break;
        }
    }
    if (!stalled.empty()) {
      std::string failure = fmt::format("no progress for {:g} s", limit);
      fail(stalled.c_str(), failure.c_str(), limit);
    }
  }
}

// The executable segments of diffcheck's own program (the first object
// dl_iterate_phdr reports), found once. During a read step, a fault whose
// instruction lies outside them is in HDF5 or a library it called (libc's
// memcpy, zlib): the file's doing. A fault in our own code is a bug of ours.
struct Range {
  std::uintptr_t lo = 0, hi = 0;
};
std::array<Range, 8> own_text{};
std::size_t own_ranges = 0;

void find_own_text() {
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void*) -> int {
        for (int i = 0; i < info->dlpi_phnum && own_ranges < own_text.size(); ++i) {
          const auto& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
          const std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          own_text[own_ranges++] = {lo, lo + ph.p_memsz};
        }
        return 1;  // the program itself only
      },
      nullptr);
}

bool in_own_code(std::uintptr_t pc) {
  for (std::size_t i = 0; i < own_ranges; ++i)
    if (pc >= own_text[i].lo && pc < own_text[i].hi) return true;
  return false;
}

constexpr std::array<int, 4> kSignals{SIGSEGV, SIGBUS, SIGFPE, SIGILL};
std::array<struct sigaction, kSignals.size()> previous{};

const char* signal_failure(int sig) {
  switch (sig) {
    case SIGSEGV: return "crashed (SIGSEGV)";
    case SIGBUS: return "crashed (SIGBUS)";
    case SIGFPE: return "crashed (SIGFPE)";
    default: return "crashed (SIGILL)";
  }
}

void on_fatal_signal(int sig, siginfo_t* info, void* context) {
  std::uintptr_t pc = 0;
#if defined(__x86_64__)
  pc = static_cast<std::uintptr_t>(static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  pc = static_cast<std::uintptr_t>(static_cast<ucontext_t*>(context)->uc_mcontext.pc);
#endif
  if (tls_step && pc != 0 && !in_own_code(pc)) fail(tls_step, signal_failure(sig), 0);
  // Not HDF5's: hand it to whoever handled it before (crash report,
  // sanitizer, or the default action) and let it happen again.
  for (std::size_t i = 0; i < kSignals.size(); ++i) {
    if (kSignals[i] != sig) continue;
    const struct sigaction& old = previous[i];
    if (old.sa_flags & SA_SIGINFO) {
      if (old.sa_sigaction) return old.sa_sigaction(sig, info, context);
    } else if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN && old.sa_handler) {
      return old.sa_handler(sig);
    }
    sigaction(sig, &old, nullptr);
    return;  // the faulting instruction runs again, under the old action
  }
}

void start(double limit) {
  find_own_text();
  for (std::size_t i = 0; i < kSignals.size(); ++i) {
    struct sigaction sa{};
    sa.sa_sigaction = on_fatal_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(kSignals[i], &sa, &previous[i]);
  }
  if (limit > 0) std::thread(monitor, limit).detach();
}

}  // namespace

const char* current_read_step() { return tls_step; }

double stall_limit_seconds() {
  static const double limit = [] {
    const char* v = std::getenv("DIFFCHECK_READ_STALL");
    if (!v || !*v) return 10.0;
    char* end = nullptr;
    double s = std::strtod(v, &end);
    return (*end == 0 && s >= 0) ? s : 10.0;
  }();
  return limit;
}

ReadGuard::ReadGuard(std::string what) : what_(std::move(what)), outer_(tls_step) {
  Registry& r = registry();
  const double limit = stall_limit_seconds();
  {
    std::lock_guard lock(r.mu);
    id_ = r.next++;
    if (!r.started) {
      r.started = true;
      start(limit);
    }
    if (limit > 0) r.steps.emplace(id_, Step{Clock::now(), what_});
  }
  tls_step = what_.c_str();
}

ReadGuard::~ReadGuard() {
  tls_step = outer_;
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.steps.erase(id_);
}

void set_read_failure_handler(ReadFailureHandler handler) { registry().handler = handler; }

}  // namespace dc::h5
