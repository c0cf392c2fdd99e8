// `diffcheck calibrate`: each tap's noise floor measured over perturbed
// one-device runs, written as a tolerance file; with -n N it restarts itself
// under the launcher so that the runs are spread over N processes.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include <unistd.h>

#include "harness/capture/reference_cache.h"
#include "harness/cli/commands.h"
#include "harness/cli/options.h"
#include "harness/core/comm.h"
#include "harness/core/error.h"
#include "harness/core/log.h"
#include "harness/search/launcher.h"
#include "harness/search/trial.h"
#include "reference/nn.h"

namespace dc::cli {

void CalibrateCommand::add(CLI::App& app) {
  sub = app.add_subcommand(
      "calibrate",
      "Measure each tap's noise floor (the scenario on one device in the run's dtype, R runs with inputs and "
      "weights perturbed by one rounding, against the float64 reference) and write the tolerances for "
      "run/compare --tolerances FILE");
  sub->add_option("--scenario", options.scenario, "Scenario to calibrate")->required();
  sub->add_option("-n", ranks, "Processes the runs are spread over (started with --mpirun)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--dtype", options.dtype, "Compute dtype")->check(CLI::IsMember({"float32", "bfloat16"}))->capture_default_str();
  sub->add_option("--size", options.size, "Problem size preset")->capture_default_str();
  sub->add_option("--seed", options.seed, "Seed of the generated inputs and weights")->capture_default_str();
  sub->add_option("--flag", options.flags, "Scenario flag name=value (repeatable)");
  add_pipeline_options(*sub, options.pipeline);
  sub->add_option("--runs", options.runs, "Runs: the first as is, the others with perturbed inputs")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("-o,--out", options.out, "Tolerance file to write (JSON)")->required();
  sub->add_option("--mpirun", mpirun, "MPI launcher for -n > 1")->capture_default_str();
  sub->add_option("--reference-cache", options.cache.dir,
                  "Reuse floors measured before for the same request and build, and keep these ('off' disables; "
                  "default: $DIFFCHECK_REFERENCE_CACHE, else results/cache)");
}

int CalibrateCommand::execute(int* argc, char*** argv) {
  if (launcher_size() == 1 && ranks > 1) {
    // Start the processes the runs are spread over: this command again under
    // the launcher, which takes this process's place (its output, its exit).
    std::vector<std::string> words = dc::launcher_argv("", mpirun, ranks);
    words.push_back(dc::self_executable());
    for (int i = 1; i < *argc; ++i) words.push_back((*argv)[i]);
    std::vector<char*> cargv;
    for (auto& w : words) cargv.push_back(w.data());
    cargv.push_back(nullptr);
    execvp(cargv[0], cargv.data());
    std::cerr << fmt::format("diffcheck calibrate: cannot start '{}': {}\n", words[0], std::strerror(errno));
    return dc::kExitError;
  }
  dc::Comm::init(argc, argv);
  int status = dc::kExitError;
  {
    dc::setup_logging(dc::Comm::world().rank());
    if (!std::getenv("OPENBLAS_NUM_THREADS")) dc::ref::set_blas_threads(threads_per_process());
    if (options.cache.dir.empty()) options.cache.dir = dc::default_reference_cache_dir();
    try {
      status = dc::calibrate_scenario(options);
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

}  // namespace dc::cli
