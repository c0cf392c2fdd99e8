// `diffcheck compare`: check activation files on disk without running
// anything; under mpirun the processes share every tap's chunks and rank 0
// reports.
#include <spdlog/spdlog.h>

#include "harness/cli/commands.h"
#include "harness/cli/options.h"
#include "harness/core/comm.h"
#include "harness/core/error.h"
#include "harness/core/log.h"

namespace dc::cli {

void CompareCommand::add(CLI::App& app) {
  sub = app.add_subcommand("compare", "Check an activation file (run file, rank file or rank-file prefix) without running anything");
  sub->add_option("source", source, "Run file, one <prefix>.rank<R>.h5 file, or the prefix")->required();
  sub->add_option("--reference", reference, "Separate file with /reference/<tap> datasets");
  add_report_options(*sub, report, report.tolerances_file);
  sub->add_option("--noise-floor", report.noise_floor,
                      "A dump of the same taps from a single-device run in the same dtype (file or prefix): each tap's "
                      "error there against the reference is its noise floor, and its tolerance k x that floor "
                      "(FlashAttention's rule; docs/tolerances.md). Not given: REF.one_device.rank0.h5 beside "
                      "--reference REF.h5, where dct.capture(..., one_device=True) writes it, if it is there; "
                      "'off': the derived rule");
}

int CompareCommand::execute(int* argc, char*** argv) {
  if (launcher_size() == 1) {
    dc::setup_logging(-1);
    try {
      return dc::compare_and_report(source, reference, report);
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      return dc::kExitError;
    }
  }
  dc::Comm::init(argc, argv);
  int status = dc::kExitError;
  {
    dc::Comm world = dc::Comm::world();
    dc::setup_logging(world.rank());
    report.compare.processes = &world;
    if (report.compare.threads == 0) report.compare.threads = threads_per_process();
    try {
      status = dc::compare_and_report(source, reference, report);
    } catch (const std::exception& e) {
      // Every process throws the same error: say it once.
      if (world.rank() == 0) spdlog::error("{}", e.what());
    }
  }
  dc::Comm::finalize();
  return status;
}

}  // namespace dc::cli
