// Delta debugging (Zeller's ddmin): from a passing baseline and a failing full
// set of flags, find a 1-minimal subset that still fails — removing any one of
// its flags makes the run pass. Pure: the predicate runs the trials.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace dc {

enum class Verdict { pass, fail, crashed, timed_out, flaky, error };
std::string verdict_name(Verdict v);

using FlagSet = std::vector<std::string>;
// Runs baseline + subset and says how it went. Only `fail` counts as failing;
// crashes and timeouts are recorded but treated as "not this subset".
using Predicate = std::function<Verdict(const FlagSet& subset)>;

struct DdminResult {
  enum class Status { found, full_set_passes, baseline_fails, flaky } status = Status::found;
  FlagSet minimal;                                 // the 1-minimal failing subset
  std::vector<std::pair<FlagSet, Verdict>> trials;  // in the order they were asked for
  FlagSet flaky_set;                               // the subset that was flaky
};

DdminResult ddmin(const FlagSet& candidates, const Predicate& test);

// Runs `test` k times; mixed pass/fail outcomes are `flaky`.
Predicate repeated(Predicate test, int k);

}  // namespace dc
