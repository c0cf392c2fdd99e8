#include "harness/core/progress.h"

#include "harness/core/interrupt.h"
#include "harness/core/signal_safe.h"

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

using signal_safe::copy;
using signal_safe::put;
using signal_safe::put_number;

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
  interrupt::remove_partial_files();
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
  interrupt::remove_partial_files();
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

void working() { g_state.last_change = now(); }

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

void write_where() { say_where(); }

}  // namespace dc::progress
