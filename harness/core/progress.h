// Where this rank is: the last collective it entered (a number counted over
// all communicators, the operation, the axis group) and the last tap it
// recorded. Kept in fixed buffers so that a crash handler can print it with
// async-signal-safe calls, and read by the watchdog (watchdog.h) to say which
// rank a hung job waits for.
#pragma once
#include <string>

namespace dc::progress {

// Called by Comm at the start of every collective; returns its number.
long long entered_collective(const char* op, const std::string& group);
// Called by the tap recorder.
void recorded_tap(const std::string& name);
// Called from any thread while the rank works through a long step with no
// collective or tap in it (checking a run file's chunks): the watchdog sees
// it alive, and the ranks waiting for it do not make a hang.
void working();

struct Snapshot {
  long long collective = 0;  // number of the last collective entered (0: none yet)
  std::string op, group, tap;
  double last_change = 0;  // seconds since the epoch of the last progress
};
Snapshot snapshot();

// One line on stderr (async-signal-safe) and exit status 1 when this rank
// crashes: a fatal signal, or std::terminate (an uncaught exception, abort);
// the run's partial files go first (interrupt::remove_partial_files).
//   diffcheck [rank 3] CRASH on rank 3: signal 11 (SIGSEGV); last collective #12 all_to_all on 'sp'; last tap 'attn/q'
void install_crash_handlers(int rank);

// "; last collective #12 all_to_all on 'sp'; last tap 'attn/q'" and a line
// end, on stderr (async-signal-safe): the end of the CRASH and STOPPED lines.
void write_where();

}  // namespace dc::progress
