// The driver behind `diffcheck --scenario`: a scenario run under MPI (every
// rank calls it), ending in the same check and report as `diffcheck compare`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "harness/capture/reference_cache.h"
#include "harness/report/compare_command.h"
#include "harness/core/pipeline_options.h"
#include "harness/run/profile.h"

namespace dc {

struct RunOptions {
  std::string scenario;
  std::string mesh;  // empty: the scenario's default for the world size
  std::string dtype = "float32";
  std::uint64_t seed = 1234;
  std::vector<std::string> flags;  // --flag values, applied after DIFFCHECK_FLAGS
  // (rank 0's command line and DIFFCHECK_FLAGS hold for every rank)
  std::string fault;
  double fault_scale = 1.0;  // --fault-scale, for faults of continuous size
  std::string size = "default";
  // Where the reference check's tolerances come from: "derived" (the rule of
  // check/tolerance.h) or "calibrated" (noise floors measured within the run,
  // run/calibrate.h); a tolerance file (--tolerances) replaces both.
  std::string tolerance = "derived";
  std::string tolerances_file;
  int calibration_runs = 8;
  PipelineOptions pipeline;  // --steps, --reference-mode (pipeline scenarios only)
  std::string out;  // empty: results/<scenario>.h5
  // How the run file is written: "mpiio", "gather" or "auto" (mpiio when
  // every rank sees the output directory).
  std::string store = "auto";
  ReportOptions report;
  // Watchdog: a run in which no rank makes progress (enters a collective or
  // records a tap) for this long ends as a HANG finding; 0 disables.
  double timeout_seconds = 300;
  // Testing aid: a process fault on one rank, "crash@R", "hang@R" or
  // "desync@R" (calls an extra collective), optionally ":after=TAP", or
  // ":during=write|check" (once the run file's temporary exists / as the
  // check starts).
  std::string chaos;
  // Where references are kept between runs (capture/reference_cache.h); the
  // cli fills it (--reference-cache, $DIFFCHECK_REFERENCE_CACHE, results/cache).
  ReferenceCacheSettings reference_cache;
  // --no-reference: compute no references (the model fits on no single
  // device): the run checks only its own taps (NaN/Inf, replicas), and its
  // file is for `diffcheck compare RUN --against OTHER`.
  bool no_reference = false;
  // --profile: print the per-phase profile after the report (it is in the
  // info log always), with this machine's GEMM peak measured by
  // `measure_gemm_peak` (the cli's: BLAS lives in reference/).
  bool profile = false;
  MeasureGemmPeak measure_gemm_peak;
};

// Collective over MPI_COMM_WORLD. Returns the exit status (0 pass, 1 mismatch)
// on every rank; throws InputError (identically on every rank) for bad options
// before anything runs, and Error for failures during the run.
int run_scenario(const RunOptions& opts);

}  // namespace dc
