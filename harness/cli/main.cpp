// diffcheck: run a scenario under MPI and diff its taps (default), compare
// activation files on disk (`compare`), or list scenarios (`list`).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

#include <unistd.h>
#include <thread>

#include "harness/cli/list.h"
#include "harness/cli/options.h"
#include "harness/core/comm.h"
#include "harness/core/error.h"
#include "harness/core/interrupt.h"
#include "harness/core/progress.h"
#include "harness/core/log.h"
#include "harness/core/memory.h"
#include "harness/run/calibrate.h"
#include "harness/run/run.h"
#include "harness/run/scenario.h"
#include "harness/search/sweep_mesh.h"
#include "harness/search/flag_search.h"
#include "harness/search/launcher.h"
#include "harness/search/trial.h"
#include "reference/nn.h"


using namespace dc::cli;

int main(int argc, char** argv) {
  const int rank0 = launcher_rank();
  CLI::App app{
      "diffcheck: differential testing of sharded model blocks.\n"
      "Runs a scenario sharded over MPI ranks and as a single-rank reference, captures named\n"
      "activations (taps) to HDF5, and reports the first tap that has NaN/Inf, disagrees across\n"
      "replicas, or disagrees with the reference.\n\n"
      "  mpirun -n 16 diffcheck --scenario flux_tp\n"
      "  diffcheck compare FILE|PREFIX [--reference REF]\n"
      "  diffcheck sweep-mesh --scenario unreduced_reshard -n 16 [--inject F]\n"
      "  diffcheck bisect --flags A,B,C (--scenario X -n N [--inject F] | --env XLA_FLAGS -- CMD ...)\n"
      "  diffcheck sweep (--profiles FILE | --all-subsets --flags A,B) (--scenario X -n N | -- CMD ...)\n"
      "  diffcheck calibrate --scenario X -n N [--dtype D] -o FILE   (then --tolerances FILE)\n"
      "  diffcheck list\n\n"
      "Exit status: 0 all checks pass, 1 a check failed, 2 usage or input error.",
      "diffcheck"};
  app.set_version_flag("--version", std::string("diffcheck ") + DIFFCHECK_VERSION_STRING);
  app.require_subcommand(0, 1);

  dc::RunOptions run;
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
      [&run](const std::string& v) { run.reference_cache.max_bytes = parse_size(v, "--reference-cache-size"); },
      "Bound of the reference cache (e.g. 4G; a bare number is MiB): least recently used entries are removed "
      "beyond it [default: 16G]");
  app.add_flag("--profile", run.profile,
               "Print the run's profile after the report: per phase (sharded block, references, write, check) its "
               "seconds, GEMM GFLOP, GFLOP/s and fraction of this machine's GEMM peak (measured on every rank just "
               "before the run), MB/s of the write");

  auto* compare = app.add_subcommand("compare", "Check an activation file (run file, rank file or rank-file prefix) without running anything");
  std::string source, reference;
  dc::ReportOptions cmp;
  compare->add_option("source", source, "Run file, one <prefix>.rank<R>.h5 file, or the prefix")->required();
  compare->add_option("--reference", reference, "Separate file with /reference/<tap> datasets");
  add_report_options(*compare, cmp, cmp.tolerances_file);
  compare->add_option("--noise-floor", cmp.noise_floor,
                      "A dump of the same taps from a single-device run in the same dtype (file or prefix): each tap's "
                      "error there against the reference is its noise floor, and its tolerance k x that floor "
                      "(FlashAttention's rule; docs/tolerances.md). Not given: REF.one_device.rank0.h5 beside "
                      "--reference REF.h5, where dct.capture(..., one_device=True) writes it, if it is there; "
                      "'off': the derived rule");

  auto* cal = app.add_subcommand(
      "calibrate",
      "Measure each tap's noise floor (the scenario on one device in the run's dtype, R runs with inputs and "
      "weights perturbed by one rounding, against the float64 reference) and write the tolerances for "
      "run/compare --tolerances FILE");
  dc::CalibrateOptions co;
  int cal_ranks = 1;
  std::string cal_mpirun = "mpirun";
  cal->add_option("--scenario", co.scenario, "Scenario to calibrate")->required();
  cal->add_option("-n", cal_ranks, "Processes the runs are spread over (started with --mpirun)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cal->add_option("--dtype", co.dtype, "Compute dtype")->check(CLI::IsMember({"float32", "bfloat16"}))->capture_default_str();
  cal->add_option("--size", co.size, "Problem size preset")->capture_default_str();
  cal->add_option("--seed", co.seed, "Seed of the generated inputs and weights")->capture_default_str();
  cal->add_option("--flag", co.flags, "Scenario flag name=value (repeatable)");
  add_pipeline_options(*cal, co.pipeline);
  cal->add_option("--runs", co.runs, "Runs: the first as is, the others with perturbed inputs")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cal->add_option("-o,--out", co.out, "Tolerance file to write (JSON)")->required();
  cal->add_option("--mpirun", cal_mpirun, "MPI launcher for -n > 1")->capture_default_str();
  cal->add_option("--reference-cache", co.cache.dir,
                  "Reuse floors measured before for the same request and build, and keep these ('off' disables; "
                  "default: $DIFFCHECK_REFERENCE_CACHE, else results/cache)");

  auto* sweep = app.add_subcommand("sweep-mesh", "Run a scenario on every mesh shape N ranks can form over its axes (each a child mpirun with a time limit); exit 1 if any mesh fails");
  dc::SweepMeshOptions sw;
  sweep->add_option("--scenario", sw.scenario, "Scenario to sweep")->required();
  sweep->add_option("-n", sw.ranks, "Number of ranks")->required()->check(CLI::PositiveNumber);
  sweep->add_option("--inject", sw.fault, "Fault to inject in every run");
  sweep->add_option("--flag", sw.flags, "Scenario flag name=value (repeatable)");
  sweep->add_option("--dtype", sw.dtype, "Compute dtype")->check(CLI::IsMember({"float32", "bfloat16"}))->capture_default_str();
  sweep->add_option("--size", sw.size, "Problem size preset")->capture_default_str();
  add_pipeline_options(*sweep, sw.pipeline);
  sweep->add_option("--tolerances", sw.tolerances_file, "Tolerance file (diffcheck calibrate) for every run");
  sweep->add_option("--tolerance", sw.tolerance, "derived or calibrated (measured within each run)")
      ->check(CLI::IsMember({"derived", "calibrated"}));
  sweep->add_option("--timeout", sw.timeout_seconds, "Time limit per mesh, seconds")->capture_default_str();
  sweep->add_option("--json", sw.json_path, "Also write the table as JSON");
  sweep->add_option("--junit", sw.junit_path, "Also write a JUnit XML report (one test case per mesh)");
  sweep->add_option("--html", sw.html_path, "Also write a self-contained HTML page: a mesh x tap heatmap of err/tol");
  sweep->add_option("--mpirun", sw.mpirun, "MPI launcher")->capture_default_str();
  sweep->add_option("--launcher", sw.launcher,
                    "Launcher template, {n} = ranks, e.g. 'mpirun --host h1:8,h2:8 -n {n}' or 'srun -n {n}' "
                    "(default: '<--mpirun> -n {n}')");
  sweep->add_option("--work-dir", sw.work_dir,
                    "Directory for each mesh's run file and report (default: the system's temporary directory); "
                    "when the launcher starts rank 0 on another host, one that host and this one share");
  sweep->add_option("--mesh", sw.only_meshes, "Run only this mesh (repeatable), written as the sweep lists it, e.g. dp=2,tp=8");
  sweep->add_option("--reports", sw.reports_dir,
                    "Keep each mesh's run report in DIR: <mesh>.json and <mesh>.html (e.g. dp2_tp8.html)");
  sweep->add_option("--show-tap", sw.show_taps, "Add a column with this tap's worst err/tol on each mesh (repeatable)");
  sweep->add_flag("--dry-run", sw.dry_run, "List the meshes that would run and those the size rules out; run nothing");

  auto* bis = app.add_subcommand("bisect", "Delta-debug a failing flag set down to a 1-minimal failing subset (each trial a child process with a time limit; results cached)");
  dc::BisectOptions bo;
  std::string bis_flags, bis_baseline;
  add_target_options(*bis, bo.target, bis_flags);
  bis->add_option("--baseline", bis_baseline, "Comma-separated flags applied to every trial");
  bis->add_option("--repeat", bo.repeat, "Run each trial K times; mixed outcomes are reported as flaky")->capture_default_str();
  bo.cache_path = "results/bisect-cache.jsonl";
  bis->add_option("--cache", bo.cache_path, "Trial cache (JSON lines); '' disables")->capture_default_str();
  bis->add_option("--max-trials", bo.max_trials, "Stop after this many new trials (resume later from the cache)");
  bis->add_option("--json", bo.json_path, "Also write the result as JSON");
  bis->add_option("--junit", bo.junit_path, "Also write a JUnit XML report (one test case per trial)");
  bis->add_option("--html", bo.html_path, "Also write a self-contained HTML page: the trials and the minimal set");
  std::string fail_on;
  bis->add_option("--fail-on", fail_on,
                  "Also count these outcomes as the failure to hunt: crash, timeout (comma-separated); by default only a "
                  "wrong answer (exit 1 / a failing --check) is, and a full set that crashes or hangs is refused")
      ->check([](const std::string& v) {
        for (const auto& f : dc::split_list(v))
          if (f != "crash" && f != "timeout") return "--fail-on takes crash and/or timeout, not '" + f + "'";
        return std::string();
      });

  auto* swp = app.add_subcommand("sweep", "Time each flag profile (warm-up + timed runs) and check its correctness; markdown leaderboard, fastest correct profile starred");
  dc::SweepOptions so;
  std::string swp_flags, profiles_file;
  bool all_subsets = false;
  add_target_options(*swp, so.target, swp_flags);
  swp->add_option("--profiles", profiles_file, "File of profiles, one per line: 'name: flag flag=value ...'");
  swp->add_flag("--all-subsets", all_subsets, "Every subset of --flags is a profile");
  swp->add_option("--warmup", so.warmup, "Untimed runs per profile")->capture_default_str();
  swp->add_option("--runs", so.runs, "Timed runs per profile")->capture_default_str();
  swp->add_option("-j", so.jobs, "Profiles run in parallel (only when the machine has room: times get perturbed)")->capture_default_str();
  swp->add_option("--json", so.json_path, "Also write the leaderboard as JSON");
  swp->add_option("--junit", so.junit_path, "Also write a JUnit XML report (one test case per profile)");
  swp->add_option("--html", so.html_path, "Also write a self-contained HTML page: the leaderboard with bars");

  // The trials of sweep-mesh, bisect and sweep share one reference cache
  // (their runs differ mostly in faults and flags): the one of their working
  // directory unless given, passed to every trial through the environment.
  std::string trial_cache;
  for (auto* sub : {sweep, bis, swp})
    sub->add_option("--reference-cache", trial_cache,
                    "Reference cache of the trials' runs ('off' disables; default: $DIFFCHECK_REFERENCE_CACHE, else "
                    "results/cache of the working directory)");

  auto* list = app.add_subcommand("list", "List scenarios with their flags, faults and default meshes");
  bool list_json = false;
  list->add_flag("--json", list_json, "Print the list as JSON");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (rank0 != 0) return e.get_exit_code() == 0 ? 0 : dc::kExitError;
    int code = app.exit(e);
    return code == 0 ? 0 : dc::kExitError;
  }

  // Only scenario runs do linear algebra; elsewhere OpenBLAS's idle worker
  // threads would just spin against the checker's own threads.
  if (*list || *sweep || *bis || *swp || *compare) dc::ref::set_blas_threads(1);
  if (!trial_cache.empty())
    setenv("DIFFCHECK_REFERENCE_CACHE",
           trial_cache == "off" ? "off" : std::filesystem::absolute(trial_cache).lexically_normal().c_str(), 1);
  if (*list) {
    dc::setup_logging(-1);
    return list_json ? list_scenarios_json() : list_scenarios();
  }
  if (*sweep) {
    dc::setup_logging(-1);
    try {
      const dc::Scenario* s = dc::find_scenario(sw.scenario);
      if (!s) dc::input_error("unknown scenario '{}' (see 'diffcheck list')", sw.scenario);
      sw.axes = s->mesh_axes();
      sw.check_mesh = [s, size = sw.size](const dc::Mesh& m) { s->check_mesh(m, size); };
      if (!sw.fault.empty()) {
        const auto faults = s->faults();
        auto f = std::find_if(faults.begin(), faults.end(), [&](const dc::FaultSpec& x) { return x.name == sw.fault; });
        if (f == faults.end()) dc::input_error("unknown fault '{}' for scenario '{}' (see 'diffcheck list')", sw.fault, sw.scenario);
        // The fault is inert without its flags: expect failures only when they are all given.
        auto with_needs = sw.flags;
        with_needs.insert(with_needs.end(), f->needs_flags.begin(), f->needs_flags.end());
        const bool armed = dc::FlagValues::resolve(s->flags(), sw.flags, s->name()).str() ==
                           dc::FlagValues::resolve(s->flags(), with_needs, s->name()).str();
        sw.expected = [f = *f, armed, size = sw.size](const dc::Mesh& m) -> std::pair<std::string, std::string> {
          if (!armed || !f.takes_effect(m)) return {"PASS", ""};
          if (f.crashes_on && f.crashes_on(m, size)) return {"CRASHED", ""};
          return {f.may_hang ? "FAIL|HANG|DESYNC" : "FAIL", f.first_tap};
        };
      }
      return dc::sweep_mesh(sw);
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      return dc::kExitError;
    }
  }
  if (*bis || *swp) {
    dc::setup_logging(-1);
    try {
      if (*bis) {
        bo.flags = dc::split_list(bis_flags);
        bo.baseline = dc::split_list(bis_baseline);
        for (const auto& f : dc::split_list(fail_on)) (f == "crash" ? bo.fail_on_crash : bo.fail_on_timeout) = true;
        return dc::bisect(bo);
      }
      if (all_subsets == !profiles_file.empty())
        throw dc::InputError("sweep: give exactly one of --profiles FILE or --all-subsets --flags A,B,...");
      so.profiles = all_subsets ? dc::all_subsets(dc::split_list(swp_flags)) : dc::read_profiles(profiles_file);
      return dc::sweep(so);
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      return dc::kExitError;
    }
  }
  if (*cal && launcher_size() == 1 && cal_ranks > 1) {
    // Start the processes the runs are spread over: this command again under
    // the launcher, which takes this process's place (its output, its exit).
    std::vector<std::string> words = dc::launcher_argv("", cal_mpirun, cal_ranks);
    words.push_back(dc::self_executable());
    for (int i = 1; i < argc; ++i) words.push_back(argv[i]);
    std::vector<char*> cargv;
    for (auto& w : words) cargv.push_back(w.data());
    cargv.push_back(nullptr);
    execvp(cargv[0], cargv.data());
    std::cerr << fmt::format("diffcheck calibrate: cannot start '{}': {}\n", words[0], std::strerror(errno));
    return dc::kExitError;
  }
  if (*cal) {
    dc::Comm::init(&argc, &argv);
    int status = dc::kExitError;
    {
      dc::setup_logging(dc::Comm::world().rank());
      if (!std::getenv("OPENBLAS_NUM_THREADS")) dc::ref::set_blas_threads(threads_per_process());
      if (co.cache.dir.empty()) co.cache.dir = dc::default_reference_cache_dir();
      try {
        status = dc::calibrate_scenario(co);
      } catch (const dc::InputError& e) {
        if (launcher_rank() == 0) spdlog::error("{}", e.what());
      } catch (const std::exception& e) {
        spdlog::error("{}", e.what());
        std::cerr.flush();
        dc::Comm::abort(dc::kExitError);
      }
    }
    dc::Comm::finalize();
    return status;
  }
  if (*compare) {
    if (launcher_size() == 1) {
      dc::setup_logging(-1);
      try {
        return dc::compare_and_report(source, reference, cmp);
      } catch (const std::exception& e) {
        spdlog::error("{}", e.what());
        return dc::kExitError;
      }
    }
    // Under mpirun: the processes share every tap's chunks; rank 0 reports.
    dc::Comm::init(&argc, &argv);
    int status = dc::kExitError;
    {
      dc::Comm world = dc::Comm::world();
      dc::setup_logging(world.rank());
      cmp.compare.processes = &world;
      if (cmp.compare.threads == 0) cmp.compare.threads = threads_per_process();
      try {
        status = dc::compare_and_report(source, reference, cmp);
      } catch (const std::exception& e) {
        // Every process throws the same error: say it once.
        if (world.rank() == 0) spdlog::error("{}", e.what());
      }
    }
    dc::Comm::finalize();
    return status;
  }

  // Run mode: every rank of the job runs this. Huge pages for the big
  // tensors of a real model size (core/memory.h: re-executes this program
  // once). Not for the small presets: there each of 16 processes clears whole
  // 2 MiB pages for a few MB, and the test suite's 16-rank runs took 15-30%
  // longer (e2e_vae_patch_decode 149 -> 194 s, e2e_usp_attention 229 -> 271 s).
  if (run.size != "default" && run.size != "tiny") dc::exec_with_huge_pages(argv);
  // Ctrl-C and SIGTERM are handled from the first moment, MPI's start-up included.
  dc::interrupt::install(rank0, rank0 == 0, launcher_size() > 1);
  dc::Comm::init(&argc, &argv);
  int rank = rank0;
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
  } catch (const dc::Finding& e) {
    // A fault of the code under test: exit 1. Raised on every rank alike: one
    // report and a clean end; on this rank alone: the others may wait in a
    // collective, so the job is ended.
    dc::interrupt::verdict_reached();
    dc::interrupt::remove_partial_files();
    if (e.everywhere()) {
      if (rank == 0) spdlog::error("{}", e.what());
      dc::Comm::finalize();
      return dc::kExitMismatch;
    }
    spdlog::error("{}", e.what());
    std::cerr.flush();
    dc::Comm::abort(dc::kExitMismatch);
  } catch (const std::exception& e) {
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
  }
  dc::Comm::finalize();
  return status;
}
