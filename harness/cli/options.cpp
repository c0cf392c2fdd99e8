#include "harness/cli/options.h"

#include <cctype>
#include <cstdlib>
#include <thread>

namespace dc::cli {

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

int threads_per_process() {
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  int local = 1;
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) local = std::max(1, std::atoi(s));
  else local = launcher_size();
  return std::max(1, static_cast<int>(cores) / local);
}

std::size_t parse_size(const std::string& text, const std::string& option) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw CLI::ValidationError(option, "'" + text + "' is not a size (e.g. 128M, 2G)");
  }
  std::string unit = text.substr(used);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = unit == "" || unit == "M" || unit == "MB" || unit == "MIB" ? 1 << 20
                 : unit == "G" || unit == "GB" || unit == "GIB"             ? double(1 << 30)
                 : unit == "K" || unit == "KB" || unit == "KIB"             ? 1 << 10
                                                                            : -1;
  if (scale < 0 || !(v > 0))
    throw CLI::ValidationError(option, "'" + text + "' is not a size (e.g. 128M, 2G)");
  return static_cast<std::size_t>(v * scale);
}

void add_report_options(CLI::App& app, dc::ReportOptions& r, std::string& tolerances_file) {
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
  app.add_option("--tolerances", tolerances_file,
                 "Per-tap tolerances measured by 'diffcheck calibrate' (JSON); taps it does not name keep the derived "
                 "rule, with a warning. A file made for another scenario, size or dtype is refused. A run on the "
                 "file's seed, flags and steps also holds each tap of 64 elements or more to 2x the file's unperturbed "
                 "one-device rel L2 error (its own inputs); every tap with tokens is also held to a limit on its column-mean "
                 "error (the error averaged over tokens per column: a bias added on every rank)");
  app.add_option("--atol", r.compare.atol, "Absolute tolerance for every tap (overrides the dtype-derived default; a tap's own atol attribute still wins)");
  app.add_option("--rtol", r.compare.rtol, "Relative tolerance for every tap (same precedence as --atol)");
  app.add_option("--replica-ulps", r.compare.replica_ulps, "Allowed ULP distance between replicas (default 0: bitwise)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--require-reference", r.compare.require_reference,
               "A tap with no reference tap to be compared with, in a run that has a reference, fails (by default it "
               "is reported UNCHECKED and counted apart: never a pass; its non-finite and replica checks still run)");
}

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

}  // namespace dc::cli
