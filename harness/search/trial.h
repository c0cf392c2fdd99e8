// One trial = one child process (mpirun ... or the user's own command) with a
// time limit. A crash or a hang is an outcome, never the end of a search: the
// child runs in its own process group, which is killed whole at the limit.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace dc {

struct TrialOutcome {
  enum class Kind { exited, crashed, timed_out, not_started };
  Kind kind = Kind::not_started;
  int exit_code = -1;  // for `exited`
  int signal = 0;      // for `crashed`
  double seconds = 0;
  std::string output;  // stdout and stderr, interleaved (truncated to the last 64 KiB)
  std::string describe() const;  // "exit 1", "crashed (signal 11)", "timed out after 30 s"
};

struct TrialSpec {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;  // added to (or replacing in) the inherited environment
  double timeout_seconds = 600;
};

TrialOutcome run_trial(const TrialSpec& spec);

// The path of the running diffcheck executable (to launch it as a child).
std::string self_executable();

}  // namespace dc
