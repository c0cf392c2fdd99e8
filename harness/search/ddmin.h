// Delta debugging (Zeller's ddmin): from a passing baseline and a failing full
// set of flags, find a 1-minimal subset that still fails — removing any one of
// its flags makes the run pass. Pure: the predicate runs the trials.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace dc {

enum class Verdict { pass, fail, crashed, timed_out, flaky, error, interrupted };
std::string verdict_name(Verdict v);

using FlagSet = std::vector<std::string>;
// Runs baseline + subset and says how it went. Only `fail` counts as failing
// (a caller that hunts crashes maps them to `fail` first). The search needs
// the baseline to pass and the full set to fail; in between, a crash, time-out
// or error is recorded but treated as "not this subset".
using Predicate = std::function<Verdict(const FlagSet& subset)>;

struct DdminResult {
  enum class Status {
    found,
    full_set_passes,      // nothing to bisect
    full_set_not_failing, // the full set crashed, timed out or errored: see full_set
    baseline_not_passing, // the baseline failed, crashed, ...: see baseline
    flaky
  } status = Status::found;
  Verdict baseline = Verdict::pass, full_set = Verdict::fail;  // as far as they were run
  FlagSet minimal;                                 // the 1-minimal failing subset
  std::vector<std::pair<FlagSet, Verdict>> trials;  // in the order they were asked for
  FlagSet flaky_set;                               // the subset that was flaky
};

DdminResult ddmin(const FlagSet& candidates, const Predicate& test);

// Runs `test` k times; mixed pass/fail outcomes are `flaky`.
Predicate repeated(Predicate test, int k);

}  // namespace dc
