// `diffcheck sweep-mesh`: a scenario on every mesh shape N ranks can form,
// each mesh's verdict held to what the injected fault says it does there.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "harness/cli/commands.h"
#include "harness/cli/options.h"
#include "harness/core/error.h"
#include "harness/core/flags.h"
#include "harness/core/log.h"
#include "harness/run/scenario.h"

namespace dc::cli {

void SweepMeshCommand::add(CLI::App& app) {
  sub = app.add_subcommand("sweep-mesh", "Run a scenario, or any program, on every mesh shape N ranks or devices can form over its axes (each a child run with a time limit); exit 1 if any mesh fails");
  sub->add_option("--scenario", options.scenario, "Scenario to sweep (or a command after --)");
  sub->add_option("-n,--devices", options.ranks, "Number of ranks (a scenario) or devices (a command)")->required()->check(CLI::PositiveNumber);
  // One word, split here: a list option just before -- would take the
  // command's own options for the sweep's.
  sub->add_option("--axes", axes_csv, "A command's mesh axes, in order, e.g. dp,fsdp,sp,tp (a scenario has its own)");
  sub->add_option("command", options.command,
                  "Any program after --, run once per mesh: {mesh} is replaced by the mesh (dp=2,tp=4), {out} by a "
                  "directory of its own for its files. Its verdict: the JSON report diffcheck.compare writes to "
                  "$DIFFCHECK_REPORT_JSON, else its exit status (0 pass, 1 fail). With --no-reference, the rank "
                  "files it writes under {out} are compared with the other meshes'. E.g. sweep-mesh -n 8 --axes "
                  "dp,fsdp,sp,tp -- python3 examples/jax_reshard.py --bug --mesh {mesh} --out {out}");
  sub->add_option("--inject", options.fault, "Fault to inject in every run");
  sub->add_option("--flag", options.flags, "Scenario flag name=value (repeatable)");
  sub->add_option("--dtype", options.dtype, "Compute dtype")->check(CLI::IsMember({"float32", "bfloat16"}))->capture_default_str();
  sub->add_option("--size", options.size, "Problem size preset")->capture_default_str();
  add_pipeline_options(*sub, options.pipeline);
  sub->add_option("--tolerances", options.tolerances_file, "Tolerance file (diffcheck calibrate) for every run");
  sub->add_option("--tolerance", options.tolerance, "derived or calibrated (measured within each run)")
      ->check(CLI::IsMember({"derived", "calibrated"}));
  sub->add_option("--timeout", options.timeout_seconds, "Time limit per mesh, seconds")->capture_default_str();
  sub->add_option("--json", options.json_path, "Also write the table as JSON");
  sub->add_option("--junit", options.junit_path, "Also write a JUnit XML report (one test case per mesh)");
  sub->add_option("--html", options.html_path, "Also write a self-contained HTML page: a mesh x tap heatmap of err/tol");
  sub->add_option("--mpirun", options.mpirun, "MPI launcher")->capture_default_str();
  sub->add_option("--launcher", options.launcher,
                    "Launcher template, {n} = ranks, e.g. 'mpirun --host h1:8,h2:8 -n {n}' or 'srun -n {n}' "
                    "(default: '<--mpirun> -n {n}')");
  sub->add_option("--work-dir", options.work_dir,
                    "Directory for each mesh's run file and report (default: the system's temporary directory); "
                    "when the launcher starts rank 0 on another host, one that host and this one share");
  // One mesh per --mesh: a list option just before -- would take a command's options for the sweep's.
  sub->add_option("--mesh", options.only_meshes, "Run only this mesh (repeatable), written as the sweep lists it, e.g. dp=2,tp=8")
      ->allow_extra_args(false);
  sub->add_option("--reports", options.reports_dir,
                    "Keep each mesh's run report in DIR: <mesh>.json and <mesh>.html (e.g. dp2_tp8.html)");
  sub->add_option("--show-tap", options.show_taps, "Add a column with this tap's worst err/tol on each mesh (repeatable)");
  sub->add_flag("--no-reference", options.no_reference,
                "Compute no reference: each mesh runs with --no-reference (pipelines in --reference-mode free) and "
                "the meshes' runs are compared with each other (diffcheck compare --against); the mesh that leaves "
                "their consensus is named. Meshes of another dp hold another batch: compared on the samples they "
                "share");
  sub->add_flag("--dry-run", options.dry_run, "List the meshes that would run and those the size rules out; run nothing");
}

namespace {

// What a mesh's run must give with `fault` injected: FAIL at its first tap
// where the fault takes effect and its flags are all given, else PASS.
void expect_fault(SweepMeshOptions& sw, const dc::Scenario& s) {
  const auto faults = s.faults();
  auto f = std::find_if(faults.begin(), faults.end(), [&](const dc::FaultSpec& x) { return x.name == sw.fault; });
  if (f == faults.end()) dc::input_error("unknown fault '{}' for scenario '{}' (see 'diffcheck list')", sw.fault, sw.scenario);
  // The fault is inert without its flags: expect failures only when they are all given.
  auto with_needs = sw.flags;
  with_needs.insert(with_needs.end(), f->needs_flags.begin(), f->needs_flags.end());
  const bool armed = dc::FlagValues::resolve(s.flags(), sw.flags, s.name()).str() ==
                     dc::FlagValues::resolve(s.flags(), with_needs, s.name()).str();
  const std::string tap = sw.no_reference && !f->first_tap_across_meshes.empty() ? f->first_tap_across_meshes
                                                                                : f->first_tap;
  sw.expected = [f = *f, armed, size = sw.size, tap](const dc::Mesh& m) -> std::pair<std::string, std::string> {
    if (!armed || !f.takes_effect(m)) return {"PASS", ""};
    if (f.crashes_on && f.crashes_on(m, size)) return {"CRASHED", ""};
    return {f.may_hang ? "FAIL|HANG|DESYNC" : "FAIL", f.first_tap_on ? f.first_tap_on(m) : tap};
  };
}

}  // namespace

int SweepMeshCommand::sweep_command() {
  if (!options.scenario.empty()) dc::input_error("sweep-mesh: give --scenario or a command, not both");
  for (std::size_t a = 0, b; a < axes_csv.size(); a = b + 1) {
    b = axes_csv.find(',', a);
    if (b == std::string::npos) b = axes_csv.size();
    options.axes.push_back(axes_csv.substr(a, b - a));
  }
  if (options.axes.empty()) dc::input_error("sweep-mesh: a command needs its mesh axes: --axes dp,tp (for example)");
  for (const auto& a : options.axes)
    if (!dc::valid_axis_name(a)) dc::input_error("sweep-mesh: --axes: '{}' is not an axis name", a);
  if (!options.fault.empty() || !options.flags.empty() || !options.tolerances_file.empty() || !options.tolerance.empty())
    dc::input_error("sweep-mesh: --inject, --flag, --tolerances and --tolerance are a scenario's; pass the command its own");
  bool has_mesh = false;
  for (const auto& w : options.command) has_mesh = has_mesh || w.find("{mesh}") != std::string::npos;
  if (!has_mesh) dc::input_error("sweep-mesh: the command must receive the mesh: put {{mesh}} in it (e.g. --mesh {{mesh}})");
  const auto slash = options.command.size() > 1 ? options.command[1].find_last_of('/') : std::string::npos;
  options.scenario = options.command.size() > 1 ? options.command[1].substr(slash == std::string::npos ? 0 : slash + 1)
                                                : options.command[0];
  options.check_mesh = [](const dc::Mesh&) {};
  return dc::sweep_mesh(options);
}

int SweepMeshCommand::execute() {
  dc::setup_logging(-1);
  try {
    if (!options.command.empty()) return sweep_command();
    if (options.scenario.empty()) dc::input_error("sweep-mesh: give --scenario NAME or a command after --");
    if (!axes_csv.empty()) dc::input_error("sweep-mesh: --axes is for a command; scenario '{}' has its own", options.scenario);
    const dc::Scenario* s = dc::find_scenario(options.scenario);
    if (!s) dc::input_error("unknown scenario '{}' (see 'diffcheck list')", options.scenario);
    options.axes = s->mesh_axes();
    options.check_mesh = [s, size = options.size](const dc::Mesh& m) { s->check_mesh(m, size); };
    if (!options.fault.empty()) expect_fault(options, *s);
    if (options.no_reference && s->is_pipeline() && options.pipeline.reference_mode != "free") {
      spdlog::info("--no-reference: {} runs in --reference-mode free (forced starts each step from the reference)",
                   s->name());
      options.pipeline.reference_mode = "free";
    }
    return dc::sweep_mesh(options);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return dc::kExitError;
  }
}

}  // namespace dc::cli
