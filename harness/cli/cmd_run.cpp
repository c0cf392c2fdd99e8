// The default command: every rank of the job runs a scenario, checks it and
// exits 0 (pass), 1 (a finding: mismatch, crash or hang of the code under
// test) or 2 (an input error), ending the whole job when one rank alone fails.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "harness/cli/commands.h"
#include "harness/cli/options.h"
#include "harness/core/comm.h"
#include "harness/core/error.h"
#include "harness/core/interrupt.h"
#include "harness/core/log.h"
#include "harness/core/memory.h"
#include "harness/core/progress.h"
#include "harness/capture/reference_cache.h"
#include "reference/nn.h"

namespace dc::cli {

void RunCommand::add(CLI::App& app) {
  app.add_option("--scenario", run.scenario, "Scenario to run (see 'diffcheck list')");
  app.add_option("--mesh", run.mesh, "Mesh, e.g. dp=4,tp=4 (default: the scenario's mesh for the world size)");
  app.add_option("--dtype", run.dtype, "Compute dtype of the sharded run")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  app.add_option("--seed", run.seed, "Seed of the generated inputs and weights")->capture_default_str();
  app.add_option("--flag", run.flags, "Scenario flag name=value (repeatable; after DIFFCHECK_FLAGS, which holds the same separated by spaces)");
  app.add_option("--inject", run.fault, "Inject a fault by name (see 'diffcheck list')");
  app.add_option("--size", run.size, "Problem size preset of the scenario")->capture_default_str();
  add_pipeline_options(app, run.pipeline);
  app.add_option("-o,--out", run.out, "Run file to write (default results/<scenario>.h5)");
  app.add_option("--store", run.store,
                 "How the run file is written: pwrite (rank 0 lays the file out, every rank writes its rows at their "
                 "offsets, past the page cache with O_DIRECT where the filesystem allows; ranks on one host), mpiio "
                 "(every rank writes its rows, parallel HDF5; needs the output directory shared by all hosts), "
                 "gather (rank 0 writes, the others send their rows over MPI in bounded pieces; for node-local "
                 "directories and small files), auto (when every rank sees the directory and the file is above "
                 "DIFFCHECK_GATHER_MAX_MIB, default 256: pwrite on one host, mpiio on several; else gather)")
      ->check(CLI::IsMember({"auto", "pwrite", "mpiio", "gather"}))
      ->capture_default_str();
  if (const char* t = std::getenv("DIFFCHECK_TIMEOUT")) run.timeout_seconds = std::atof(t);
  app.add_option("--timeout", run.timeout_seconds,
                 "Watchdog: when no rank makes progress (a collective, a tap) for S seconds the run ends as a HANG "
                 "(exit 1) naming the collective each rank is in; 0 disables [default: 300, or DIFFCHECK_TIMEOUT]")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--chaos", run.chaos,
                 "Testing aid: a process fault on one rank: crash@R, hang@R, desync@R (an extra collective) or slow@R "
                 "(3 s of work with progress but no collective: no hang), "
                 "optionally :after=TAP (default: after its first tap) or :during=write|check (once the run file's "
                 "temporary exists / as the check starts)");
  add_report_options(app, run.report, run.tolerances_file);
  app.add_option("--fault-scale", run.fault_scale,
                 "Size of the injected fault, for faults of continuous size (see 'diffcheck list'): 1 the fault as "
                 "named, 0 none, 0.01 a hundredth of it")
      ->capture_default_str();
  app.add_option("--tolerance", run.tolerance,
                 "Where the reference check's tolerances come from: derived (a rule of dtype and reduction depth) or "
                 "calibrated (each tap's noise floor measured within the run: the scenario on one device in the run's "
                 "dtype, --calibration-runs times with inputs perturbed by one rounding; on the run's own inputs, "
                 "so each tap of 64 elements or more is also held to 2x the unperturbed one-device run's rel L2 error, "
                 "and a tap with tokens to 2x its column-mean error, the error averaged over tokens per column, where "
                 "a bias added twice shows; docs/tolerances.md)")
      ->check(CLI::IsMember({"derived", "calibrated"}))
      ->capture_default_str();
  app.add_option("--calibration-runs", run.calibration_runs, "Runs of the noise-floor measurement (--tolerance calibrated)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--reference-cache", run.reference_cache.dir,
                 "Directory of the reference cache: a run whose references (scenario, size, seed, dtype, mesh, flags, "
                 "this build) were computed before reads them from there instead; 'off' disables [default: "
                 "$DIFFCHECK_REFERENCE_CACHE, else results/cache]");
  app.add_option_function<std::string>(
      "--reference-cache-size",
      [this](const std::string& v) { run.reference_cache.max_bytes = parse_size(v, "--reference-cache-size"); },
      "Bound of the reference cache (e.g. 4G; a bare number is MiB): least recently used entries are removed "
      "beyond it [default: 16G]");
  app.add_flag("--no-reference", run.no_reference,
               "Compute no single-rank reference (for a model that fits on no single device, or to save its time): "
               "the run checks only its own taps (NaN/Inf, replicas) and keeps its run file for `diffcheck compare "
               "RUN --against OTHER_RUN`, another mesh's run of the same computation (pipelines need "
               "--reference-mode free)");
  app.add_flag("--profile", run.profile,
               "Print the run's profile after the report: per phase (sharded block, references, write, check) its "
               "seconds, GEMM GFLOP, GFLOP/s and fraction of this machine's GEMM peak (measured on every rank just "
               "before the run), MB/s of the write");

}

namespace {

// The end of a run that threw: an exit status, or the whole job ended.
int end_after_error(const std::exception& e, int rank) {
  if (const auto* finding = dynamic_cast<const dc::Finding*>(&e)) {
    // A fault of the code under test: exit 1. Raised on every rank alike: one
    // report and a clean end; on this rank alone: the others may wait in a
    // collective, so the job is ended.
    dc::interrupt::verdict_reached();
    dc::interrupt::remove_partial_files();
    if (finding->everywhere()) {
      if (rank == 0) spdlog::error("{}", e.what());
      dc::Comm::finalize();
      return dc::kExitMismatch;
    }
    spdlog::error("{}", e.what());
    std::cerr.flush();
    dc::Comm::abort(dc::kExitMismatch);
  }
  // An input error (raised identically on every rank before any
  // communication) or an error every rank agreed on (a full disk all the
  // writes saw): reported once, a clean end.
  if (dynamic_cast<const dc::InputError*>(&e) || dynamic_cast<const dc::AgreedError*>(&e)) {
    dc::interrupt::verdict_reached();
    dc::interrupt::remove_partial_files();
    if (rank == 0) spdlog::error("{}", e.what());
    dc::Comm::finalize();
    return dc::kExitError;
  }
  // A failure during the run, possibly on this rank alone: the others may be
  // waiting in a collective, so end the whole job rather than hang it.
  dc::interrupt::remove_partial_files();
  spdlog::error("{}", e.what());
  std::cerr.flush();
  dc::Comm::abort(dc::kExitError);
  return dc::kExitError;
}

}  // namespace

int RunCommand::execute(int* argc, char*** argv, int rank0) {
  // Huge pages for the big tensors of a real model size (core/memory.h:
  // re-executes this program once). Not for the small presets: there each of
  // 16 processes clears whole 2 MiB pages for a few MB, and the test suite's
  // 16-rank runs took 15-30% longer (e2e_vae_patch_decode 149 -> 194 s,
  // e2e_usp_attention 229 -> 271 s).
  if (run.size != "default" && run.size != "tiny") dc::exec_with_huge_pages(*argv);
  // Ctrl-C and SIGTERM are handled from the first moment, MPI's start-up included.
  dc::interrupt::install(rank0, rank0 == 0, launcher_size() > 1);
  dc::Comm::init(argc, argv);
  const int rank = rank0;
  dc::setup_logging(rank);
  // BLAS threads: one per rank when ranks outnumber cores, unless the user says.
  if (!std::getenv("OPENBLAS_NUM_THREADS")) {
    unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    int per_rank = std::max(1, static_cast<int>(cores) / std::max(1, launcher_size()));
    dc::ref::set_blas_threads(per_rank);
  }
  if (run.report.compare.threads == 0) run.report.compare.threads = threads_per_process();
  if (run.reference_cache.dir.empty()) run.reference_cache.dir = dc::default_reference_cache_dir();
  run.measure_gemm_peak = [] { return dc::GemmPeak{dc::ref::gemm_rate(false, 0.3), dc::ref::gemm_rate(true, 0.3)}; };
  dc::progress::install_crash_handlers(rank);
  int status = dc::kExitPass;
  try {
    status = dc::run_scenario(run);
  } catch (const std::exception& e) {
    return end_after_error(e, rank);
  }
  dc::Comm::finalize();
  return status;
}

}  // namespace dc::cli
