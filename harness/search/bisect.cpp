#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "harness/core/error.h"
#include "harness/search/flag_search.h"

namespace dc {
namespace {

struct Interrupted {};

std::string set_str(const FlagSet& s) { return s.empty() ? "{}" : fmt::format("{{{}}}", fmt::join(s, ", ")); }

}  // namespace

int bisect(const BisectOptions& opts) {
  opts.target.validate();
  if (opts.flags.empty()) input_error("bisect: --flags lists no flags");
  if (opts.repeat < 1) input_error("bisect: --repeat must be >= 1");
  TrialCache cache(opts.cache_path);
  const auto workdir = (std::filesystem::temp_directory_path() / fmt::format("diffcheck_bisect_{}", getpid())).string();
  long fresh = 0, cached = 0;
  std::vector<std::string> notes;  // per trial: cached or not, detail, time

  auto one = [&](const FlagSet& subset) {
    FlagSet flags = opts.baseline;
    flags.insert(flags.end(), subset.begin(), subset.end());
    const std::string key = TrialCache::key_of(opts.target, flags, opts.repeat);
    if (auto hit = cache.get(key)) {
      ++cached;
      notes.push_back(fmt::format("cached  {}", hit->detail));
      return hit->verdict;
    }
    if (opts.max_trials >= 0 && fresh >= opts.max_trials) throw Interrupted{};
    ++fresh;
    FlagTrialResult last;
    Predicate single = [&](const FlagSet&) {
      last = run_flag_trial(opts.target, flags, workdir);
      return last.verdict;
    };
    FlagTrialResult r = last;
    r.verdict = repeated(single, opts.repeat)(subset);
    r.seconds = last.seconds;
    r.detail = last.detail;
    cache.put(key, flags, r);
    notes.push_back(fmt::format("{:.1f} s  {}", r.seconds, r.detail));
    if (isatty(2)) std::cerr << fmt::format("bisect: trial {} {} -> {}\n", fresh, set_str(subset), verdict_name(r.verdict));
    return r.verdict;
  };

  DdminResult res;
  bool interrupted = false;
  try {
    res = ddmin(opts.flags, one);
  } catch (const Interrupted&) {
    interrupted = true;
  }
  std::filesystem::remove_all(workdir);

  std::cout << fmt::format("bisect: {} over {} flags{}\n",
                           opts.target.external() ? fmt::format("`{}`", fmt::join(opts.target.command, " "))
                                                  : fmt::format("scenario {}{}", opts.target.scenario,
                                                                opts.target.fault.empty() ? "" : " --inject " + opts.target.fault),
                           opts.flags.size(),
                           opts.baseline.empty() ? "" : ", baseline " + set_str(opts.baseline));
  std::cout << "| # | flags (beyond the baseline) | outcome | detail |\n|---|---|---|---|\n";
  for (std::size_t i = 0; i < res.trials.size(); ++i)
    std::cout << fmt::format("| {} | {} | {} | {} |\n", i + 1, set_str(res.trials[i].first),
                             verdict_name(res.trials[i].second), i < notes.size() ? notes[i] : "");
  std::cout << fmt::format("{} trials ({} run now, {} from the cache{})\n", res.trials.size(), fresh,
                           cached, opts.cache_path.empty() ? "" : ": " + opts.cache_path);
  int status = 2;
  nlohmann::json j{{"flags", opts.flags}, {"baseline", opts.baseline}, {"trials", nlohmann::json::array()},
                   {"fresh", fresh}, {"cached", cached}};
  for (const auto& [s, v] : res.trials) j["trials"].push_back({{"flags", s}, {"outcome", verdict_name(v)}});
  if (interrupted) {
    std::cout << fmt::format("INTERRUPTED after {} new trials (--max-trials); rerun to resume from the cache\n", fresh);
    j["result"] = "interrupted";
  } else if (res.status == DdminResult::Status::found) {
    std::cout << fmt::format("1-minimal failing set: {}  (each flag alone is needed: removing any one passes)\n",
                             set_str(res.minimal));
    j["result"] = "found";
    j["minimal"] = res.minimal;
    status = 1;
  } else if (res.status == DdminResult::Status::full_set_passes) {
    std::cout << "the full set of flags passes: nothing to bisect\n";
    j["result"] = "full_set_passes";
    status = 0;
  } else if (res.status == DdminResult::Status::baseline_fails) {
    std::cout << "the baseline already fails: bisection needs a passing baseline\n";
    j["result"] = "baseline_fails";
  } else {
    std::cout << fmt::format("FLAKY: {} gave different outcomes over {} runs; not bisecting noise\n",
                             set_str(res.flaky_set), opts.repeat);
    j["result"] = "flaky";
    j["flaky"] = res.flaky_set;
  }
  if (!opts.json_path.empty()) std::ofstream(opts.json_path) << j.dump(2) << "\n";
  return status;
}

}  // namespace dc
