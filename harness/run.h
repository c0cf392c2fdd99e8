// The drivers behind the CLI: a scenario run under MPI (every rank calls it),
// and the standalone comparison of files on disk.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "harness/compare.h"

namespace dc {

struct ReportOptions {
  CompareOptions compare;
  std::string json_path;  // empty: no JSON report
};

struct RunOptions {
  std::string scenario;
  std::string mesh;  // empty: the scenario's default for the world size
  std::string dtype = "float32";
  std::uint64_t seed = 1234;
  std::vector<std::string> flags;  // --flag values, applied after DIFFCHECK_FLAGS
  std::string fault;
  std::string size = "default";
  std::string out;  // empty: results/<scenario>.h5
  ReportOptions report;
};

// Collective over MPI_COMM_WORLD. Returns the exit status (0 pass, 1 mismatch)
// on every rank; throws InputError (identically on every rank) for bad options
// before anything runs, and Error for failures during the run.
int run_scenario(const RunOptions& opts);

// Reads `source` (run file, rank file or prefix), checks it, prints the console
// report to stdout (and JSON if asked). Returns 0 or 1; throws InputError for
// unreadable input. Shared by `diffcheck compare` and the end of a run.
int compare_and_report(const std::string& source, const std::string& reference,
                       const ReportOptions& opts);

}  // namespace dc
