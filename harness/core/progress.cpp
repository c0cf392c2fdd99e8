#include "harness/core/progress.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>

namespace dc::progress {
namespace {

// One writer (the rank's main thread); readers take what they find: a torn
// read of a description only garbles a message, never a verdict.
struct State {
  std::atomic<long long> collective{0};
  char op[48] = "";
  char group[96] = "";
  char tap[160] = "";
  std::atomic<double> last_change{0};
};
State g_state;
char g_prefix[64] = "diffcheck: ";

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void copy(char* dst, std::size_t cap, const std::string& s) {
  std::size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

// Async-signal-safe output helpers.
void put(const char* s) {
  ssize_t ignored = write(2, s, std::strlen(s));
  (void)ignored;
}
void put_number(long long v) {
  char buf[24];
  int i = 23;
  buf[i] = '\0';
  bool neg = v < 0;
  unsigned long long u = neg ? 0ull - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
  do {
    buf[--i] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u && i > 1);
  if (neg) buf[--i] = '-';
  put(buf + i);
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    default: return "a fatal signal";
  }
}

void say_where() {
  put("; last collective ");
  if (g_state.collective.load() == 0) {
    put("none yet");
  } else {
    put("#");
    put_number(g_state.collective.load());
    put(" ");
    put(g_state.op);
    put(" on '");
    put(g_state.group);
    put("'");
  }
  put("; last tap ");
  if (g_state.tap[0]) {
    put("'");
    put(g_state.tap);
    put("'");
  } else {
    put("none yet");
  }
  put("\n");
}

int g_rank = 0;
char g_hosts[4096] = "";

void on_stop_signal(int) {
  put(g_prefix);
  put("STOPPED by the launcher (SIGTERM) while rank ");
  put_number(g_rank);
  put(" was running: a rank or a whole host was lost (the launcher names it), or the job was cancelled");
  if (g_hosts[0]) {
    put("; ranks by host: ");
    put(g_hosts);
  }
  say_where();
  _exit(1);
}

void on_fatal_signal(int sig) {
  put(g_prefix);
  put("CRASH on rank ");
  put_number(g_rank);
  put(": signal ");
  put_number(sig);
  put(" (");
  put(signal_name(sig));
  put(")");
  say_where();
  _exit(1);  // the launcher sees a failed rank and ends the job
}

void on_terminate() {
  // Not a signal handler: formatting is allowed here.
  std::string what = "an unknown exception";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = fmt::format("exception: {}", x.what());
    } catch (...) {
    }
  }
  put(g_prefix);
  put(fmt::format("CRASH on rank {}: {}", g_rank, what).c_str());
  say_where();
  _exit(1);
}

}  // namespace

long long entered_collective(const char* op, const std::string& group) {
  copy(g_state.op, sizeof g_state.op, op);
  copy(g_state.group, sizeof g_state.group, group);
  g_state.last_change = now();
  return ++g_state.collective;
}

void recorded_tap(const std::string& name) {
  copy(g_state.tap, sizeof g_state.tap, name);
  g_state.last_change = now();
}

Snapshot snapshot() {
  Snapshot s;
  s.collective = g_state.collective.load();
  s.op = g_state.op;
  s.group = g_state.group;
  s.tap = g_state.tap;
  s.last_change = g_state.last_change.load();
  if (s.last_change == 0) s.last_change = g_state.last_change = now();
  return s;
}

void install_crash_handlers(int rank) {
  g_rank = rank;
  auto prefix = fmt::format("diffcheck [rank {}] ", rank);
  copy(g_prefix, sizeof g_prefix, prefix);
  g_state.last_change = now();
  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(sig, &sa, nullptr);
  std::set_terminate(on_terminate);
}

void set_rank_hosts(const std::string& text) { copy(g_hosts, sizeof g_hosts, text); }

void install_stop_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  sigaction(SIGTERM, &sa, nullptr);
}

void disarm_stop_handler() { signal(SIGTERM, SIG_DFL); }

}  // namespace dc::progress
