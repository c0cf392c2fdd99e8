// `diffcheck bisect` and `diffcheck sweep`: flag trials, each a child
// process (a scenario run or the user's command) with a time limit.
#include <spdlog/spdlog.h>

#include "harness/cli/commands.h"
#include "harness/cli/options.h"
#include "harness/core/error.h"
#include "harness/core/flags.h"
#include "harness/core/log.h"
#include "harness/search/flag_trial.h"

namespace dc::cli {

void BisectCommand::add(CLI::App& app) {
  sub = app.add_subcommand("bisect", "Delta-debug a failing flag set down to a 1-minimal failing subset (each trial a child process with a time limit; results cached)");
  add_target_options(*sub, options.target, flags_csv);
  sub->add_option("--baseline", baseline_csv, "Comma-separated flags applied to every trial");
  sub->add_option("--repeat", options.repeat, "Run each trial K times; mixed outcomes are reported as flaky")->capture_default_str();
  options.cache_path = "results/bisect-cache.jsonl";
  sub->add_option("--cache", options.cache_path, "Trial cache (JSON lines); '' disables")->capture_default_str();
  sub->add_option("--max-trials", options.max_trials, "Stop after this many new trials (resume later from the cache)");
  sub->add_option("--json", options.json_path, "Also write the result as JSON");
  sub->add_option("--junit", options.junit_path, "Also write a JUnit XML report (one test case per trial)");
  sub->add_option("--html", options.html_path, "Also write a self-contained HTML page: the trials and the minimal set");
  sub->add_option("--fail-on", fail_on,
                  "Also count these outcomes as the failure to hunt: crash, timeout (comma-separated); by default only a "
                  "wrong answer (exit 1 / a failing --check) is, and a full set that crashes or hangs is refused")
      ->check([](const std::string& v) {
        for (const auto& f : dc::split_list(v))
          if (f != "crash" && f != "timeout") return "--fail-on takes crash and/or timeout, not '" + f + "'";
        return std::string();
      });
}

int BisectCommand::execute() {
  dc::setup_logging(-1);
  try {
    options.flags = dc::split_list(flags_csv);
    options.baseline = dc::split_list(baseline_csv);
    for (const auto& f : dc::split_list(fail_on)) (f == "crash" ? options.fail_on_crash : options.fail_on_timeout) = true;
    return dc::bisect(options);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return dc::kExitError;
  }
}

void SweepCommand::add(CLI::App& app) {
  sub = app.add_subcommand("sweep", "Time each flag profile (warm-up + timed runs) and check its correctness; markdown leaderboard, fastest correct profile starred");
  add_target_options(*sub, options.target, flags_csv);
  sub->add_option("--profiles", profiles_file, "File of profiles, one per line: 'name: flag flag=value ...'");
  sub->add_flag("--all-subsets", all_subsets, "Every subset of --flags is a profile");
  sub->add_option("--warmup", options.warmup, "Untimed runs per profile")->capture_default_str();
  sub->add_option("--runs", options.runs, "Timed runs per profile")->capture_default_str();
  sub->add_option("-j", options.jobs, "Profiles run in parallel (only when the machine has room: times get perturbed)")->capture_default_str();
  sub->add_option("--json", options.json_path, "Also write the leaderboard as JSON");
  sub->add_option("--junit", options.junit_path, "Also write a JUnit XML report (one test case per profile)");
  sub->add_option("--html", options.html_path, "Also write a self-contained HTML page: the leaderboard with bars");
}

int SweepCommand::execute() {
  dc::setup_logging(-1);
  try {
    if (all_subsets == !profiles_file.empty())
      throw dc::InputError("sweep: give exactly one of --profiles FILE or --all-subsets --flags A,B,...");
    options.profiles = all_subsets ? dc::all_subsets(dc::split_list(flags_csv)) : dc::read_profiles(profiles_file);
    return dc::sweep(options);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return dc::kExitError;
  }
}

}  // namespace dc::cli
