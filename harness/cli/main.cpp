// diffcheck: run a scenario under MPI and diff its taps (default), compare
// activation files on disk (`compare`), or list scenarios (`list`).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <cctype>
#include <cstdlib>
#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "harness/core/comm.h"
#include "harness/core/error.h"
#include "harness/core/interrupt.h"
#include "harness/core/progress.h"
#include "harness/core/log.h"
#include "harness/run/run.h"
#include "harness/run/scenario.h"
#include "harness/search/sweep_mesh.h"
#include "harness/search/flag_search.h"
#include "reference/nn.h"

namespace {

// The launcher's rank, known before MPI_Init: lets only rank 0 print usage errors.
int launcher_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return 0;
}

int launcher_size() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return 1;
}

// Cores per process of this host (OpenMPI says how many share it).
int threads_per_process() {
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  int local = 1;
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) local = std::max(1, std::atoi(s));
  else local = launcher_size();
  return std::max(1, static_cast<int>(cores) / local);
}

// "128", "128M", "512MiB", "2G": a size in bytes; a bare number means MiB.
std::size_t parse_size(const std::string& text) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw CLI::ValidationError("--memory-budget", "'" + text + "' is not a size (e.g. 128M, 2G)");
  }
  std::string unit = text.substr(used);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = unit == "" || unit == "M" || unit == "MB" || unit == "MIB" ? 1 << 20
                 : unit == "G" || unit == "GB" || unit == "GIB"             ? double(1 << 30)
                 : unit == "K" || unit == "KB" || unit == "KIB"             ? 1 << 10
                                                                            : -1;
  if (scale < 0 || !(v > 0))
    throw CLI::ValidationError("--memory-budget", "'" + text + "' is not a size (e.g. 128M, 2G)");
  return static_cast<std::size_t>(v * scale);
}

void add_report_options(CLI::App& app, dc::ReportOptions& r) {
  app.add_option_function<std::string>(
         "--memory-budget", [&r](const std::string& v) { r.compare.memory_budget = parse_size(v); },
         "Memory the checker may use, whole process included (e.g. 128M, 2G; a bare number is MiB). "
         "Tensors are streamed in chunks sized to fit [default: 128M]");
  app.add_option("--threads", r.compare.threads, "Threads that check chunks (default: one per core)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--json", r.json_path, "Also write the full report as JSON to FILE");
  app.add_option("--html", r.html_path,
                 "Also write a self-contained HTML page to FILE: verdict, first divergence, heatmap of "
                 "err/tol per tap and rank, tap table");
  app.add_option("--junit", r.junit_path,
                 "Also write a JUnit XML report to FILE (one test case per tap; for CI dashboards)");
  app.add_option("--atol", r.compare.atol, "Absolute tolerance for every tap (overrides the dtype-derived default; a tap's own atol attribute still wins)");
  app.add_option("--rtol", r.compare.rtol, "Relative tolerance for every tap (same precedence as --atol)");
  app.add_option("--replica-ulps", r.compare.replica_ulps, "Allowed ULP distance between replicas (default 0: bitwise)")
      ->check(CLI::NonNegativeNumber);
}

// Machine-readable listing for scripts (sweeps, margins).
int list_scenarios_json() {
  nlohmann::json all = nlohmann::json::array();
  for (const auto* s : dc::all_scenarios()) {
    nlohmann::json j{{"name", s->name()}, {"summary", s->summary()}, {"sizes", s->sizes()}};
    j["flags"] = nlohmann::json::array();
    for (const auto& f : s->flags())
      j["flags"].push_back({{"name", f.name}, {"type", dc::flag_type_name(f.type)},
                            {"default", f.default_value}, {"help", f.help},
                            {"matrix_values", dc::matrix_values(f)}});
    j["faults"] = nlohmann::json::array();
    for (const auto& f : s->faults())
      j["faults"].push_back({{"name", f.name}, {"help", f.help}, {"first_tap", f.first_tap},
                             {"needs_flags", f.needs_flags},
                             {"takes_effect_when", f.takes_effect_when.empty() ? "always" : f.takes_effect_when},
                             {"crashes_when", f.crashes_when}, {"may_hang", f.may_hang}});
    j["default_mesh"] = nlohmann::json::object();
    for (int n : {1, 2, 4, 8, 16}) {
      try {
        j["default_mesh"][std::to_string(n)] = s->default_mesh(n);
      } catch (const dc::Error&) {
      }
    }
    all.push_back(j);
  }
  std::cout << all.dump(2) << "\n";
  return dc::kExitPass;
}

// --steps and --reference-mode, for pipeline scenarios (flux_pipeline).
void add_pipeline_options(CLI::App& app, dc::PipelineOptions& p) {
  app.add_option("--steps", p.steps, "Pipeline scenarios: denoising steps (default: the size's, 28 for flux_pipeline)");
  app.add_option("--reference-mode", p.reference_mode,
                 "Pipeline scenarios: forced (each step starts from the reference's latents, so each is judged on "
                 "its own; the default) or free (the run follows its own trajectory; tolerances grow with the step)")
      ->check(CLI::IsMember({"forced", "free"}))
      ->capture_default_str();
  app.add_option("--tap-blocks", p.tap_blocks,
                 "Pipeline scenarios: which blocks' taps each step records: all, first,last or none (fewer taps "
                 "for long runs of deep models)")
      ->check(CLI::IsMember({"all", "first,last", "none"}))
      ->capture_default_str();
}

// Options that say what one flag trial runs: a scenario or the user's command.
void add_target_options(CLI::App& app, dc::FlagTarget& t, std::string& flags_csv) {
  app.add_option("--flags", flags_csv, "Comma-separated flags (name or name=value for scenarios; whatever the command understands otherwise)");
  app.add_option("--scenario", t.scenario, "Scenario to run for each trial (under mpirun)");
  app.add_option("-n", t.ranks, "Ranks for each scenario trial")->check(CLI::PositiveNumber);
  app.add_option("--inject", t.fault, "Fault injected in every scenario trial");
  app.add_option("--dtype", t.dtype, "Scenario dtype")->check(CLI::IsMember({"float32", "bfloat16"}))->capture_default_str();
  app.add_option("--size", t.size, "Scenario size preset")->capture_default_str();
  add_pipeline_options(app, t.pipeline);
  app.add_option("--env", t.env_var, "External command: pass the flags, joined by spaces, in this environment variable (e.g. XLA_FLAGS, LIBTPU_INIT_ARGS)");
  app.add_option("--check", t.check_file, "External command: activation file it writes; compared after each trial (mismatch = wrong)");
  app.add_option("--timeout", t.timeout_seconds, "Time limit per trial, seconds (a hang is recorded as 'timed out')")->capture_default_str();
  app.add_option("--mpirun", t.mpirun, "MPI launcher for scenario trials")->capture_default_str();
  app.add_option("--launcher", t.launcher,
                 "Launcher template for scenario trials, {n} = ranks, e.g. 'mpirun --host h1:8,h2:8 -n {n}' or "
                 "'srun -n {n}' (default: '<--mpirun> -n {n}')");
  app.add_option("--work-dir", t.work_dir,
                 "Directory for trial files (run files, reports; default: the system's temporary directory). "
                 "When the launcher starts rank 0 on another host, one that host and this one share");
  app.add_option("command", t.command, "External command after --; '{flags}' is replaced by the flags");
}

int list_scenarios() {
  for (const auto* s : dc::all_scenarios()) {
    std::cout << fmt::format("{}\n  {}\n", s->name(), s->summary());
    std::string meshes;
    for (int n : {1, 2, 4, 8, 16}) {
      try {
        meshes += fmt::format("    {:>2} ranks: {}\n", n, s->default_mesh(n));
      } catch (const dc::Error&) {
      }
    }
    std::cout << "  default meshes:\n" << meshes;
    std::string sizes;
    for (const auto& z : s->sizes()) sizes += (sizes.empty() ? "" : ", ") + z;
    std::cout << "  sizes: " << sizes << "\n  flags:\n";
    if (s->flags().empty()) std::cout << "    (none)\n";
    for (const auto& f : s->flags())
      std::cout << fmt::format("    {} ({}, default {}): {}\n", f.name, dc::flag_type_name(f.type),
                               f.default_value, f.help);
    std::cout << "  faults (--inject):\n";
    for (const auto& f : s->faults()) {
      std::cout << fmt::format("    {}: {}\n      first divergent tap '{}'", f.name, f.help, f.first_tap);
      if (!f.takes_effect_when.empty()) std::cout << fmt::format(" when {}", f.takes_effect_when);
      if (!f.crashes_when.empty()) std::cout << fmt::format("; a crash when {}", f.crashes_when);
      if (f.may_hang) std::cout << " (or, ranks having taken different paths, a HANG or DESYNC finding)";
      if (!f.needs_flags.empty()) std::cout << fmt::format("; needs --flag {}", fmt::join(f.needs_flags, " --flag "));
      std::cout << "\n";
    }
    std::cout << "\n";
  }
  return dc::kExitPass;
}

}  // namespace

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
  app.add_option("--out", run.out, "Run file to write (default results/<scenario>.h5)");
  app.add_option("--store", run.store,
                 "How the run file is written: mpiio (every rank writes its rows, parallel HDF5; needs the output "
                 "directory shared by all hosts), gather (rank 0 writes, the others send their rows over MPI in "
                 "bounded pieces; for node-local directories), auto (mpiio when every rank sees the directory, "
                 "else gather)")
      ->check(CLI::IsMember({"auto", "mpiio", "gather"}))
      ->capture_default_str();
  if (const char* t = std::getenv("DIFFCHECK_TIMEOUT")) run.timeout_seconds = std::atof(t);
  app.add_option("--timeout", run.timeout_seconds,
                 "Watchdog: when no rank makes progress (a collective, a tap) for S seconds the run ends as a HANG "
                 "(exit 1) naming the collective each rank is in; 0 disables [default: 300, or DIFFCHECK_TIMEOUT]")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--chaos", run.chaos,
                 "Testing aid: a process fault on one rank: crash@R, hang@R or desync@R (an extra collective), "
                 "optionally :after=TAP (default: after its first tap) or :during=write|check (once the run file's "
                 "temporary exists / as the check starts)");
  add_report_options(app, run.report);

  auto* compare = app.add_subcommand("compare", "Check an activation file (run file, rank file or rank-file prefix) without running anything");
  std::string source, reference;
  dc::ReportOptions cmp;
  compare->add_option("source", source, "Run file, one <prefix>.rank<R>.h5 file, or the prefix")->required();
  compare->add_option("--reference", reference, "Separate file with /reference/<tap> datasets");
  add_report_options(*compare, cmp);

  auto* sweep = app.add_subcommand("sweep-mesh", "Run a scenario on every mesh shape N ranks can form over its axes (each a child mpirun with a time limit); exit 1 if any mesh fails");
  dc::SweepMeshOptions sw;
  sweep->add_option("--scenario", sw.scenario, "Scenario to sweep")->required();
  sweep->add_option("-n", sw.ranks, "Number of ranks")->required()->check(CLI::PositiveNumber);
  sweep->add_option("--inject", sw.fault, "Fault to inject in every run");
  sweep->add_option("--flag", sw.flags, "Scenario flag name=value (repeatable)");
  sweep->add_option("--dtype", sw.dtype, "Compute dtype")->check(CLI::IsMember({"float32", "bfloat16"}))->capture_default_str();
  sweep->add_option("--size", sw.size, "Problem size preset")->capture_default_str();
  add_pipeline_options(*sweep, sw.pipeline);
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

  // Run mode: every rank of the job runs this. Ctrl-C and SIGTERM are
  // handled from the first moment, MPI's start-up included.
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
  } catch (const dc::InputError& e) {
    // Raised identically on every rank before any communication: report once.
    dc::interrupt::verdict_reached();
    dc::interrupt::remove_partial_files();
    if (rank == 0) spdlog::error("{}", e.what());
    dc::Comm::finalize();
    return dc::kExitError;
  } catch (const std::exception& e) {
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
