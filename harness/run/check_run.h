// How a run checks its taps once the run file is written.
#pragma once
#include <chrono>
#include <string>

#include "harness/capture/store.h"
#include "harness/capture/tap.h"
#include "harness/report/compare_command.h"
#include "harness/core/comm.h"

namespace dc {

// Where the check runs:
//  - in_memory: every rank checks the blocks it owns where they are, with
//    only partial sums, differing replicas and reference boxes moving
//    (capture/recorded.h); each tap costs the ranks a few collectives;
//  - rank0_file: rank 0 checks the file it has just written (a gathered,
//    small run file, still in its page cache) on its threads, as `diffcheck
//    compare` would, while the other ranks wait for its verdict. For a run
//    file of many small taps (flux_pipeline: 311 taps, 100 MB) this is
//    several times faster than hundreds of collectives among ranks that
//    share cores.
// Both compare the same set (the file holds what the ranks recorded) with
// the same comparator, so the verdict is the same; a run and a later
// comparison of its file cannot disagree.
enum class CheckPlace { in_memory, rank0_file };

// Collective over `world`: every rank returns the same exit status, or throws
// the same error. Rank 0 prints the report.
int check_run(const Comm& world, const TapRecorder& taps, const RunInfo& info, const std::string& out,
              CheckPlace place, const ReportOptions& report, std::chrono::steady_clock::time_point started);

}  // namespace dc
