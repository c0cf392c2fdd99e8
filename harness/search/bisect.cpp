// `diffcheck bisect`: delta debugging (ddmin) of a failing flag set down to
// a 1-minimal failing subset, each trial a child process with a time limit,
// trials cached; the table, JSON, HTML and JUnit of what was tried.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <iostream>
#include <nlohmann/json.hpp>

#include "harness/core/error.h"
#include "harness/core/files.h"
#include "harness/search/flag_search.h"
#include "harness/search/launcher.h"
#include "harness/search/trial.h"
#include "harness/search/trial_junit.h"
#include "harness/report/html.h"

namespace dc {
namespace {

struct Interrupted {};

std::string set_str(const FlagSet& s) { return s.empty() ? "{}" : fmt::format("{{{}}}", fmt::join(s, ", ")); }

// "crashed", "timed out", "ended in an error", ...: what a set did.
std::string did(Verdict v) {
  switch (v) {
    case Verdict::pass: return "passed";
    case Verdict::fail: return "FAILED";
    case Verdict::error: return "ended in an error";
    case Verdict::flaky: return "was FLAKY";
    default: return verdict_name(v);
  }
}

// One bisection: its trials (cached or run now) and what it reports.
class Bisection {
 public:
  explicit Bisection(const BisectOptions& opts)
      : opts(opts), cache(opts.cache_path), workdir(scratch_directory(opts.target.work_dir, "diffcheck_bisect")) {}

  // A subset's verdict as ddmin counts it (--fail-on makes crashes or
  // time-outs the failure hunted).
  Verdict counted(Verdict v) const {
    if (v == Verdict::crashed && opts.fail_on_crash) return Verdict::fail;
    if (v == Verdict::timed_out && opts.fail_on_timeout) return Verdict::fail;
    return v;
  }

  // The trial of `subset` beyond the baseline: from the cache, or run now.
  Verdict trial(const FlagSet& subset) {
    FlagSet flags = opts.baseline;
    flags.insert(flags.end(), subset.begin(), subset.end());
    const std::string key = TrialCache::key_of(opts.target, flags, opts.repeat);
    if (auto hit = cache.get(key)) {
      ++cached;
      notes.push_back(fmt::format("cached  {}", hit->detail));
      seconds.push_back(0);
      tally[subset] = fmt::format("{} (cached): {}", did(hit->verdict), hit->detail);
      asked.emplace_back(subset, counted(hit->verdict));
      return counted(hit->verdict);
    }
    if (opts.max_trials >= 0 && fresh >= opts.max_trials) throw Interrupted{};
    ++fresh;
    return fresh_trial(subset, flags, key);
  }

  // Every run of the trial; all alike gives that verdict, a mix is flaky.
  Verdict fresh_trial(const FlagSet& subset, const FlagSet& flags, const std::string& key) {
    std::vector<FlagTrialResult> runs;
    for (int k = 0; k < opts.repeat; ++k) {
      runs.push_back(run_flag_trial(opts.target, flags, workdir));
      if (runs.back().verdict == Verdict::interrupted || interrupted()) {
        signalled = true;
        throw Interrupted{};
      }
    }
    FlagTrialResult r = runs.back();
    const auto same = std::count_if(runs.begin(), runs.end(), [&](const auto& x) { return x.verdict == r.verdict; });
    if (same != static_cast<long>(runs.size())) r.verdict = Verdict::flaky;
    tally[subset] = fmt::format("{} in {} of {} runs: {}", did(runs.back().verdict), same, runs.size(), r.detail);
    // Errors and time-outs may be passing trouble (a busy machine, a full
    // disk): they are retried next time, not cached as final.
    if (r.verdict != Verdict::error && r.verdict != Verdict::timed_out) cache.put(key, flags, r);
    notes.push_back(fmt::format("{:.1f} s  {}", r.seconds, r.detail));
    double total = 0;
    for (const auto& run : runs) total += run.seconds;
    seconds.push_back(total);
    if (isatty(2)) std::cerr << fmt::format("bisect: trial {} {} -> {}\n", fresh, set_str(subset), verdict_name(r.verdict));
    asked.emplace_back(subset, counted(r.verdict));
    return counted(r.verdict);
  }

  int run() {
    bool stopped = false;
    try {
      res = ddmin(opts.flags, [this](const FlagSet& s) { return trial(s); });
    } catch (const Interrupted&) {
      stopped = true;
    }
    std::filesystem::remove_all(workdir);
    print_trials();
    nlohmann::json j{{"flags", opts.flags}, {"baseline", opts.baseline}, {"trials", nlohmann::json::array()},
                     {"fresh", fresh}, {"cached", cached}};
    for (const auto& [s, v] : asked) j["trials"].push_back({{"flags", s}, {"outcome", verdict_name(v)}});
    const int status = conclude(stopped, j);
    if (!opts.json_path.empty()) write_whole_file(opts.json_path, j.dump(2) + "\n", "JSON report");
    if (!opts.html_path.empty()) write_html(j);
    if (!opts.junit_path.empty()) write_junit_report(j);
    return status;
  }

 private:
  // The table of trials on stdout.
  void print_trials() const {
    std::cout << fmt::format("bisect: {} over {} flags{}\n",
                             opts.target.external() ? fmt::format("`{}`", fmt::join(opts.target.command, " "))
                                                    : fmt::format("scenario {}{}", opts.target.scenario,
                                                                  opts.target.fault.empty() ? "" : " --inject " + opts.target.fault),
                             opts.flags.size(),
                             opts.baseline.empty() ? "" : ", baseline " + set_str(opts.baseline));
    std::cout << "| # | flags (beyond the baseline) | outcome | detail |\n|---|---|---|---|\n";
    for (std::size_t i = 0; i < asked.size(); ++i)
      std::cout << fmt::format("| {} | {} | {} | {} |\n", i + 1, set_str(asked[i].first),
                               verdict_name(asked[i].second), i < notes.size() ? notes[i] : "");
    if (opts.fail_on_crash || opts.fail_on_timeout)
      std::cout << fmt::format("(counted as FAIL: {}{})\n", opts.fail_on_crash ? "crashes " : "",
                               opts.fail_on_timeout ? "time-outs" : "");
    std::cout << fmt::format("{} trials ({} run now, {} from the cache{})\n", asked.size(), fresh,
                             cached, opts.cache_path.empty() ? "" : ": " + opts.cache_path);
  }

  // The result line on stdout and in the JSON; the exit status.
  int conclude(bool stopped, nlohmann::json& j) {
    int status = 2;
    if (stopped) {
      std::cout << fmt::format("INTERRUPTED after {} new trials ({}); rerun to resume from the cache\n", fresh,
                               signalled ? "signal" : "--max-trials");
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
    } else if (res.status == DdminResult::Status::full_set_not_failing) {
      std::cout << fmt::format("the full set {}; bisection needs a full set that FAILS{}\n", tally[opts.flags],
                               res.full_set == Verdict::crashed || res.full_set == Verdict::timed_out
                                   ? " (to hunt this outcome instead, add --fail-on crash,timeout)"
                                   : "");
      j["result"] = "full_set_not_failing";
      j["full_set"] = verdict_name(res.full_set);
    } else if (res.status == DdminResult::Status::baseline_not_passing) {
      std::cout << fmt::format("the baseline {}; bisection needs a passing baseline\n", tally[FlagSet{}]);
      j["result"] = "baseline_not_passing";
      j["baseline"] = verdict_name(res.baseline);
    } else {
      std::cout << fmt::format("FLAKY: {} gave different outcomes over {} runs; not bisecting noise\n",
                               set_str(res.flaky_set), opts.repeat);
      j["result"] = "flaky";
      j["flaky"] = res.flaky_set;
    }
    return status;
  }

  void write_html(const nlohmann::json& j) const {
    const bool found = j["result"] == "found";
    std::string s = html::page_begin("diffcheck bisect");
    s += fmt::format("<h1>diffcheck bisect {}</h1>\n<div class=\"meta\">{} over {} flags{}</div>\n",
                     html::verdict_badge(!found, j["result"].get<std::string>()),
                     html::esc(opts.target.external() ? fmt::format("`{}`", fmt::join(opts.target.command, " "))
                                                      : "scenario " + opts.target.scenario),
                     opts.flags.size(), opts.baseline.empty() ? "" : ", baseline " + html::esc(set_str(opts.baseline)));
    if (found)
      s += fmt::format("<p id=\"minimal\">1-minimal failing set: <b>{}</b> (removing any one of them passes)</p>\n",
                       html::esc(set_str(res.minimal)));
    s += "<table id=\"trials\"><thead><tr><th>#</th><th class=\"l\">flags (beyond the baseline)</th>"
         "<th class=\"l\">outcome</th><th>s</th><th class=\"l\">detail</th></tr></thead><tbody>\n";
    for (std::size_t i = 0; i < asked.size(); ++i) {
      const bool minimal = found && asked[i].first == res.minimal;
      s += fmt::format("<tr class=\"{}{}\"><td>{}</td><td class=\"l\">{}</td><td class=\"l v\">{}</td><td>{:.1f}</td>"
                       "<td class=\"l\">{}</td></tr>\n",
                       asked[i].second == Verdict::pass ? "pass" : "fail", minimal ? " first" : "", i + 1,
                       html::esc(set_str(asked[i].first)), verdict_name(asked[i].second),
                       i < seconds.size() ? seconds[i] : 0.0, html::esc(i < notes.size() ? notes[i] : ""));
    }
    s += "</tbody></table>\n" + html::page_end();
    write_whole_file(opts.html_path, s, "HTML report");
  }

  void write_junit_report(const nlohmann::json& j) const {
    JUnitSuite suite;
    suite.name = fmt::format("bisect {} over {} flags: {}", opts.target.external() ? "command" : opts.target.scenario,
                             opts.flags.size(), j["result"].get<std::string>());
    suite.properties = {{"flags", set_str(opts.flags)}, {"baseline", set_str(opts.baseline)},
                        {"result", j["result"].get<std::string>()}};
    if (j.contains("minimal")) suite.properties.emplace_back("minimal", set_str(res.minimal));
    for (std::size_t i = 0; i < asked.size(); ++i) {
      JUnitCase c = junit_case(asked[i].second, i < notes.size() ? notes[i] : "");
      c.classname = "diffcheck.bisect";
      c.name = fmt::format("trial {}: {}", i + 1, set_str(asked[i].first));
      c.seconds = i < seconds.size() ? seconds[i] : 0;
      suite.seconds += c.seconds;
      suite.cases.push_back(std::move(c));
    }
    write_junit(opts.junit_path, {suite});
  }

  const BisectOptions& opts;
  TrialCache cache;
  const std::string workdir;
  long fresh = 0, cached = 0;
  std::vector<std::string> notes;        // per trial: cached or not, detail, time
  std::vector<double> seconds;           // per trial (0 when cached)
  std::map<FlagSet, std::string> tally;  // per subset: "crashed in 2 of 2 runs: <detail>"
  bool signalled = false;
  std::vector<std::pair<FlagSet, Verdict>> asked;  // every trial so far, also when interrupted
  DdminResult res;
};

}  // namespace

int bisect(const BisectOptions& opts) {
  opts.target.validate();
  if (opts.flags.empty()) input_error("bisect: --flags lists no flags");
  if (opts.repeat < 1) input_error("bisect: --repeat must be >= 1");
  install_interrupt_handlers();
  return Bisection(opts).run();
}

}  // namespace dc
