// What bisect and sweep run for one set of flags: a diffcheck scenario under
// mpirun (flags as --flag), or the user's own command (flags in an environment
// variable such as XLA_FLAGS, and/or substituted for a `{flags}` placeholder),
// judged by its exit status and/or a --check file compared as the activation
// format. Results can be cached on disk so an interrupted search resumes.
#pragma once
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "harness/core/pipeline_options.h"
#include "harness/search/ddmin.h"

namespace dc {

struct FlagTarget {
  // A diffcheck scenario...
  std::string scenario;
  int ranks = 0;  // 0: the launcher's default (1)
  std::string fault, dtype = "float32", size = "default", mpirun = "mpirun";
  PipelineOptions pipeline;
  // Launcher template ("mpirun --host h1:8,h2:8 -n {n}", "srun -n {n}");
  // empty: "<mpirun> -n {n}". See search/launcher.h.
  std::string launcher;
  // Where trial files go (search/launcher.h scratch_directory); empty: /tmp.
  std::string work_dir;
  // ...or an external command.
  std::vector<std::string> command;
  std::string env_var;     // flags joined by spaces into this variable
  std::string check_file;  // activation file written by the command, compared after it
  double timeout_seconds = 600;

  bool external() const { return !command.empty(); }
  void validate() const;         // throws InputError
  std::string identity() const;  // everything that makes a trial what it is (cache key)
};

struct FlagTrialResult {
  Verdict verdict = Verdict::error;
  double seconds = 0;   // wall time of the whole trial
  std::string detail;   // first divergent tap, exit status, or the error
  // Scenario trials: the sharded block's own time (slowest rank) and the
  // rest the run spent on references, writing and checking.
  std::optional<double> run_seconds, check_seconds;
};

// `workdir` holds the trial's scratch files (run file, JSON report).
FlagTrialResult run_flag_trial(const FlagTarget& target, const FlagSet& flags, const std::string& workdir);

// One line of JSON per result, keyed by a hash of (target, flags, repeat).
class TrialCache {
 public:
  explicit TrialCache(std::string path);  // empty: no caching
  std::optional<FlagTrialResult> get(const std::string& key) const;
  void put(const std::string& key, const FlagSet& flags, const FlagTrialResult& r);
  static std::string key_of(const FlagTarget& t, const FlagSet& flags, int repeat);

 private:
  std::string path_;
  std::map<std::string, FlagTrialResult> entries_;
  mutable std::mutex mu_;
};

std::string join_flags(const FlagSet& flags);
FlagSet split_list(const std::string& comma_separated);

}  // namespace dc
