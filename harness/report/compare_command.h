// `diffcheck compare` and the end of a scenario run: read activations from
// disk, check them, print the report.
#pragma once
#include <chrono>
#include <functional>
#include <string>

#include "harness/check/compare.h"

namespace dc {

struct ReportOptions {
  CompareOptions compare;
  std::string json_path;   // empty: no JSON report
  std::string junit_path;  // empty: no JUnit report
  std::string html_path;   // empty: no HTML page
  std::string junit_name;  // the JUnit suite's name; empty: "compare <source>"
  // compare only: --tolerances FILE (a calibration) or --noise-floor SOURCE
  // (a single-device dump of the same taps whose errors set the floors).
  // Neither given, a one-device dump beside the reference is the floor
  // (one_device_beside); --noise-floor off keeps the derived rule.
  std::string tolerances_file;
  std::string noise_floor;
  // A run's phase times (see CompareResult::timings); when given, the check's
  // own time is added as check_s.
  std::vector<std::pair<std::string, double>> timings;
  // A run's: where its references came from (the reference cache or computed;
  // console line and JSON "reference_source"), and its profile (JSON "profile").
  std::string reference_source;
  std::string tolerance_note;  // compare: see CompareResult::tolerance_note
  std::vector<std::pair<std::string, double>> profile;
  // A run's: called on every process once the verdict is known and before
  // anything is reported (collective where the check is); it may complete
  // `timings` and `profile` there (the run file's write, done beside the
  // check). An exception it throws ends the check unreported.
  std::function<void(std::vector<std::pair<std::string, double>>& timings,
                     std::vector<std::pair<std::string, double>>& profile)>
      before_report;
};

// Reads `source` (and `reference`) on every process of `processes` (null:
// this one); all agree on failure (the lowest rank's error is thrown
// everywhere) before any of them starts comparing.
ActivationSet read_everywhere(const std::string& source, const std::string& reference, const Comm* processes,
                              const std::map<std::string, StreamSplit>* split_like = nullptr);

// The prefix of the one-device dump that dct.capture(..., one_device=True)
// writes beside a reference file: REF.h5 (or REF.rank0.h5) -> REF.one_device,
// when REF.one_device.rank0.h5 exists; else empty.
std::string one_device_beside(const std::string& reference);

// Reads `source` (run file, rank file or prefix), checks it, prints the console
// report to stdout (and JSON if asked). Returns 0 or 1; throws InputError for
// unreadable input. Shared by `diffcheck compare` and the end of a run. With
// `opts.compare.processes`, collective over them: every process reads and
// checks its share, all return the same status (or throw the same error), and
// only rank 0 prints.
int compare_and_report(const std::string& source, const std::string& reference,
                       const ReportOptions& opts);

// Run against run: `source` checked with the run `against` (any mesh, any
// layouts) where a reference would be, each tolerance the sum of both runs'
// bounds; `exact`: bitwise. The other run's own checks (NaN/Inf, replicas)
// count too. Returns 0 or 1; throws InputError for runs of different
// computations (check/against.h).
int compare_against_and_report(const std::string& source, const std::string& against, bool exact,
                               const ReportOptions& opts);
// Three or more runs (check/compare_runs.cpp): every pair run against run,
// each run's own checks, the consensus tap by tap and the run that leaves it
// first; the detailed report is that run's against the consensus.
int compare_runs_and_report(const std::vector<std::string>& sources, bool exact, const ReportOptions& opts);
// The same for activations already at hand: a run's taps in its ranks'
// memory (capture/recorded.h; collective over the holders, only rank 0
// prints) or a set read elsewhere. `started` is when the work being reported
// began (JUnit times).
// `computed`: the set's comparison when the caller made it already (run
// against run keeps the pairs' results), else it is made here.
int check_and_report(const ActivationSet& set, const ReportOptions& opts,
                     std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now(),
                     std::optional<CompareResult> computed = std::nullopt);

}  // namespace dc
