// One trial = one child process (mpirun ... or the user's own command) with a
// time limit. A crash or a hang is an outcome, never the end of a search. At
// the limit (or on an interrupt) the child's whole process tree is ended: its
// process group and every descendant, also those in process groups of their
// own (MPI ranks) and those orphaned on the way (diffcheck is their subreaper).
#pragma once
#include <map>
#include <string>
#include <vector>

namespace dc {

struct TrialOutcome {
  enum class Kind { exited, crashed, timed_out, interrupted, not_started };
  Kind kind = Kind::not_started;
  int exit_code = -1;  // for `exited`
  int signal = 0;      // for `crashed`
  double seconds = 0;
  std::string output;  // stdout and stderr, interleaved (truncated to the last 64 KiB)
  std::string describe() const;  // "exit 1", "crashed (signal 11)", "timed out after 30 s"

  // What the outcome means for a command judged by its exit status:
  // 0 pass; 126/127 (cannot run: launcher or program missing) error; a
  // signal, an exit of 128 + signal, or mpirun's report of a rank killed by
  // a signal: crashed; any other exit: fail.
  enum class Class { pass, fail, crashed, timed_out, error, interrupted };
  Class classify() const;
  int crash_signal() const;  // the signal behind a `crashed` class, 0 if unknown
};

// Set by SIGINT/SIGTERM once install_interrupt_handlers() ran: the running
// trials end (their trees killed) with Kind::interrupted, and no new one starts.
void install_interrupt_handlers();
bool interrupted();

struct TrialSpec {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;  // added to (or replacing in) the inherited environment
  double timeout_seconds = 600;
};

TrialOutcome run_trial(const TrialSpec& spec);

// The path of the running diffcheck executable (to launch it as a child).
std::string self_executable();

}  // namespace dc
