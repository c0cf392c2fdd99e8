// diffcheck: run a scenario under MPI and diff its taps (default), compare
// activation files on disk (`compare`), search meshes and flags (`sweep-mesh`,
// `bisect`, `sweep`), measure tolerances (`calibrate`), or list scenarios
// (`list`). This file builds the command line; cli/cmd_*.cpp do the work.
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <filesystem>

#include "harness/cli/commands.h"
#include "harness/cli/list.h"
#include "harness/cli/options.h"
#include "harness/core/error.h"
#include "harness/core/log.h"
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
      "  diffcheck compare FILE|PREFIX [--reference REF | --against OTHER ... [--exact]]\n"
      "  diffcheck sweep-mesh --scenario unreduced_reshard -n 16 [--inject F]\n"
      "  diffcheck bisect --flags A,B,C (--scenario X -n N [--inject F] | --env XLA_FLAGS -- CMD ...)\n"
      "  diffcheck sweep (--profiles FILE | --all-subsets --flags A,B) (--scenario X -n N | -- CMD ...)\n"
      "  diffcheck calibrate --scenario X -n N [--dtype D] -o FILE   (then --tolerances FILE)\n"
      "  diffcheck list\n\n"
      "Exit status: 0 all checks pass, 1 a check failed, 2 usage or input error.",
      "diffcheck"};
  app.set_version_flag("--version", std::string("diffcheck ") + DIFFCHECK_VERSION_STRING);
  app.require_subcommand(0, 1);

  RunCommand run;
  CompareCommand compare;
  CalibrateCommand calibrate;
  SweepMeshCommand sweep_mesh;
  BisectCommand bisect;
  SweepCommand sweep;
  run.add(app);
  compare.add(app);
  calibrate.add(app);
  sweep_mesh.add(app);
  bisect.add(app);
  sweep.add(app);

  // The trials of sweep-mesh, bisect and sweep share one reference cache
  // (their runs differ mostly in faults and flags): the one of their working
  // directory unless given, passed to every trial through the environment.
  std::string trial_cache;
  for (auto* sub : {sweep_mesh.sub, bisect.sub, sweep.sub})
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
  if (*list || *sweep_mesh.sub || *bisect.sub || *sweep.sub || *compare.sub) dc::ref::set_blas_threads(1);
  if (!trial_cache.empty())
    setenv("DIFFCHECK_REFERENCE_CACHE",
           trial_cache == "off" ? "off" : std::filesystem::absolute(trial_cache).lexically_normal().c_str(), 1);
  if (*list) {
    dc::setup_logging(-1);
    return list_json ? list_scenarios_json() : list_scenarios();
  }
  if (*sweep_mesh.sub) return sweep_mesh.execute();
  if (*bisect.sub) return bisect.execute();
  if (*sweep.sub) return sweep.execute();
  if (*calibrate.sub) return calibrate.execute(&argc, &argv);
  if (*compare.sub) return compare.execute(&argc, &argv);
  return run.execute(&argc, &argv, rank0);
}
