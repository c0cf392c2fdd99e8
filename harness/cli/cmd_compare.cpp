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
  sub->add_option("--against", against,
                  "Run against run, with no reference: another run of the same computation (run file, rank file or "
                  "prefix; any mesh and layouts), whose taps laid out globally stand where a reference would; each "
                  "tolerance is the sum of both runs' bounds. For models that fit on no single device, and for "
                  "'did my activations change?' against an earlier run. Repeated (3 to 32 runs in all; every pair is compared, so the time grows with their square): every pair "
                  "is compared, and the run that leaves the consensus first is named, with the tap");
  sub->add_flag("--exact", exact, "With --against: every tap must be equal bit for bit (the same mesh and build: a "
                                  "golden-run regression)");
  add_report_options(*sub, report, report.tolerances_file);
  sub->add_option("--noise-floor", report.noise_floor,
                      "A dump of the same taps from a single-device run in the same dtype (file or prefix): each tap's "
                      "error there against the reference is its noise floor, and its tolerance k x that floor "
                      "(FlashAttention's rule; docs/tolerances.md). Not given: REF.one_device.rank0.h5 beside "
                      "--reference REF.h5, where dct.capture(..., one_device=True) writes it, if it is there; "
                      "'off': the derived rule");
}

// What the command compares: against a reference, or run against run.
int CompareCommand::check() const {
  if (against.empty()) {
    if (exact) dc::input_error("--exact compares run against run: give --against RUN");
    return dc::compare_and_report(source, reference, report);
  }
  if (!reference.empty()) dc::input_error("--reference and --against: give one (a run is checked against a reference or against another run)");
  if (against.size() == 1) return dc::compare_against_and_report(source, against.front(), exact, report);
  if (against.size() > 31) dc::input_error("--against given {} times: at most 31 other runs", against.size());
  std::vector<std::string> runs{source};
  runs.insert(runs.end(), against.begin(), against.end());
  return dc::compare_runs_and_report(runs, exact, report);
}

int CompareCommand::execute(int* argc, char*** argv) {
  if (launcher_size() == 1) {
    dc::setup_logging(-1);
    try {
      return check();
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
      status = check();
    } catch (const std::exception& e) {
      // Every process throws the same error: say it once.
      if (world.rank() == 0) spdlog::error("{}", e.what());
    }
  }
  dc::Comm::finalize();
  return status;
}

}  // namespace dc::cli
