// Subsystem search (harness/search/, library diffcheck_search), on check and
// core. Owns work made of many runs: child-process trials with time limits
// (trial.h), delta debugging (ddmin.h), flag trials and their cache
// (flag_trial.h), bisect and sweep (here) and sweep-mesh (sweep_mesh.h). It
// runs scenarios only as child processes, so it does not link them.
//
// diffcheck bisect and diffcheck sweep: which minimal set of flags turns a
// correct run wrong, and which flag profile is fastest among the correct ones.
#pragma once
#include <string>
#include <vector>

#include "harness/search/flag_trial.h"

namespace dc {

struct BisectOptions {
  FlagTarget target;
  FlagSet flags;     // the candidates: the full set fails, the baseline passes
  FlagSet baseline;  // always applied
  int repeat = 1;    // runs per trial; mixed outcomes are reported as flaky
  std::string cache_path;
  long max_trials = -1;  // stop after this many new (uncached) trials; -1: no limit
  std::string json_path;
  std::string junit_path;  // one test case per trial
  std::string html_path;   // the trial table and the minimal set
  // Outcomes counted as the failure being hunted besides a wrong answer
  // (--fail-on crash,timeout): to bisect a crash or a hang.
  bool fail_on_crash = false, fail_on_timeout = false;
};

// Prints the trials and the 1-minimal failing subset. Returns 1 when a failing
// subset was found, 0 when the full set passes, 2 when the baseline does not
// pass, the full set crashed / timed out / errored (unless --fail-on counts
// it), a trial was flaky, or the search was stopped (--max-trials, SIGINT,
// SIGTERM: INTERRUPTED, resumable from the cache).
int bisect(const BisectOptions& opts);

struct Profile {
  std::string name;
  FlagSet flags;
};

// Profiles file: one per line, "name: flag flag=value ..."; '#' starts a comment.
std::vector<Profile> read_profiles(const std::string& path);
std::vector<Profile> all_subsets(const FlagSet& flags);

struct SweepOptions {
  FlagTarget target;
  std::vector<Profile> profiles;  // the first is the baseline for the delta column
  int warmup = 1, runs = 3, jobs = 1;
  std::string json_path;
  std::string junit_path;  // one test case per profile
  std::string html_path;   // the leaderboard with bars
};

// Markdown leaderboard; the fastest CORRECT profile is starred (a wrong profile
// never is). Returns 0 when every profile is correct, 1 otherwise.
int sweep(const SweepOptions& opts);

}  // namespace dc
