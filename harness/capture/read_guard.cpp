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
  long long rss_seen = -1;  // the process's RSS when the monitor first saw the step
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
  say(" inside HDF5 (a damaged file can make HDF5 1.10 crash, loop forever or allocate without "
      "end); "
      "giving up");
  if (seconds > 0) say(". On a slow file system, raise DIFFCHECK_READ_STALL (seconds)");
  if (std::strstr(failure, "memory"))
    say(". For files that need it, raise DIFFCHECK_READ_MEMORY (MiB)");
  say("\n");
  _exit(2);
}

long long resident_bytes() {
  long long pages = 0, resident = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%lld %lld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * sysconf(_SC_PAGESIZE);
}

// Twenty times a second: a step older than the limit, or one during which the
// process grew by more than the memory limit (a damaged file can make HDF5
// allocate and fill gigabytes: 8 GB for a 10 KB file was seen), ends the
// process. Steps shorter than 50 ms are never looked at.
void monitor(double limit, long long memory_limit) {
  Registry& r = registry();
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::string what, failure;
    double seconds = 0;
    {
      std::lock_guard lock(r.mu);
      if (r.steps.empty()) continue;
      const auto now = Clock::now();
      const long long rss = resident_bytes();
      for (auto& [id, step] : r.steps) {
        if (limit > 0 && std::chrono::duration<double>(now - step.start).count() > limit) {
          what = step.what;
          failure = fmt::format("no progress for {:g} s", limit);
          seconds = limit;
          break;
        }
        if (step.rss_seen < 0) step.rss_seen = rss;
        if (memory_limit > 0 && rss - step.rss_seen > memory_limit) {
          what = step.what;
          failure = fmt::format("more than {} MiB of memory taken", memory_limit >> 20);
          break;
        }
      }
    }
    if (!what.empty()) fail(what.c_str(), failure.c_str(), seconds);
  }
}

// The executable segments of diffcheck's own program (the first object
// dl_iterate_phdr reports), found once. During a read step, a fault whose
// instruction lies outside them, or in HDF5's part of them (a static HDF5),
// is in HDF5 or a library it called (libc's memcpy, zlib): the file's doing.
// A fault in our own code is a bug of ours.
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

}  // namespace
}  // namespace dc::h5

// HDF5 linked from its static archive lies inside the program's text, between
// these (hdf5_text.ld); without that script they are not defined (weak: null).
extern "C" const char __diffcheck_hdf5_text_start[] __attribute__((weak));
extern "C" const char __diffcheck_hdf5_text_end[] __attribute__((weak));

namespace dc::h5 {
namespace {

bool in_own_code(std::uintptr_t pc) {
  const auto hdf5_lo = reinterpret_cast<std::uintptr_t>(__diffcheck_hdf5_text_start),
             hdf5_hi = reinterpret_cast<std::uintptr_t>(__diffcheck_hdf5_text_end);
  if (hdf5_lo != 0 && pc >= hdf5_lo && pc < hdf5_hi) return false;
  for (std::size_t i = 0; i < own_ranges; ++i)
    if (pc >= own_text[i].lo && pc < own_text[i].hi) return true;
  return false;
}

constexpr std::array<int, 4> kSignals{SIGSEGV, SIGBUS, SIGFPE, SIGILL};
std::array<struct sigaction, kSignals.size()> previous{};

const char* signal_failure(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "crashed (SIGSEGV)";
    case SIGBUS:
      return "crashed (SIGBUS)";
    case SIGFPE:
      return "crashed (SIGFPE)";
    default:
      return "crashed (SIGILL)";
  }
}

// Registered mappings (GuardedMapping): [lo, hi) and the file, in slots a
// signal handler can read without a lock. A slot is taken by setting `file`
// (from null) and freed by clearing `hi` first.
struct MappingSlot {
  std::atomic<std::uintptr_t> lo{0}, hi{0};
  std::atomic<const char*> file{nullptr};
};
constexpr int kMappingSlots = 64;
std::array<MappingSlot, kMappingSlots> mapping_slots;

const char* mapped_file_at(std::uintptr_t addr) {
  for (auto& m : mapping_slots) {
    const char* file = m.file.load();
    if (file && addr >= m.lo.load() && addr < m.hi.load()) return file;
  }
  return nullptr;
}

void on_fatal_signal(int sig, siginfo_t* info, void* context) {
  if (sig == SIGBUS && info) {
    if (const char* file = mapped_file_at(reinterpret_cast<std::uintptr_t>(info->si_addr))) {
      say("diffcheck error: ");
      say(file);
      say(": the file is shorter than when it was opened (cut or rewritten by another program while "
          "being compared); giving up\n");
      _exit(2);
    }
  }
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

long long memory_limit_bytes() {
  const char* v = std::getenv("DIFFCHECK_READ_MEMORY");  // MiB
  if (!v || !*v) return 512LL << 20;
  char* end = nullptr;
  long long mib = std::strtoll(v, &end, 10);
  return (*end == 0 && mib >= 0) ? mib << 20 : 512LL << 20;
}

void start(double limit) {
  find_own_text();
  for (std::size_t i = 0; i < kSignals.size(); ++i) {
    struct sigaction sa {};
    sa.sa_sigaction = on_fatal_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(kSignals[i], &sa, &previous[i]);
  }
  std::thread(monitor, limit, memory_limit_bytes()).detach();
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
    r.steps.emplace(id_, Step{Clock::now(), what_});
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

GuardedMapping::GuardedMapping(const void* start, std::size_t bytes, std::string file) : file_(std::move(file)) {
  {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    if (!r.started) {
      r.started = true;
      dc::h5::start(stall_limit_seconds());
    }
  }
  for (int i = 0; i < kMappingSlots; ++i) {
    MappingSlot& m = mapping_slots[static_cast<std::size_t>(i)];
    const char* none = nullptr;
    // Claimed with an empty range, then the range set: the handler never sees a half-set slot.
    if (!m.file.compare_exchange_strong(none, "")) continue;
    m.hi.store(0);
    m.lo.store(reinterpret_cast<std::uintptr_t>(start));
    m.hi.store(reinterpret_cast<std::uintptr_t>(start) + bytes);
    m.file.store(file_.c_str());
    slot_ = i;
    return;
  }
}

GuardedMapping::~GuardedMapping() {
  if (slot_ < 0) return;
  MappingSlot& m = mapping_slots[static_cast<std::size_t>(slot_)];
  m.hi.store(0);
  m.lo.store(0);
  m.file.store(nullptr);
}

}  // namespace dc::h5
