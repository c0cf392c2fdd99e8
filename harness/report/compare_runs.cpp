// `diffcheck compare RUN --against B --against C ...`: three or more runs of
// one computation and no reference. Every pair is compared run against run
// (check/against.h), every run makes its own checks (NaN/Inf, replicas), and
// the consensus tap by tap (check/consensus.h) names the run that leaves it
// first; its report against a run of the consensus follows.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "harness/check/against.h"
#include "harness/report/compare_command.h"
#include "harness/check/consensus.h"
#include "harness/report/json_number.h"
#include "harness/core/error.h"
#include "harness/core/files.h"

namespace dc {
namespace {

// The taps' order the consensus counts in: the first run's, then taps only
// later runs have.
class TapOrder {
 public:
  explicit TapOrder(const ActivationSet& first) {
    for (const auto& t : first.taps) index_of(t.name);
  }
  std::size_t index_of(const std::string& name) {
    auto it = std::find(names_.begin(), names_.end(), name);
    if (it != names_.end()) return static_cast<std::size_t>(it - names_.begin());
    names_.push_back(name);
    return names_.size() - 1;
  }
  const std::string& name(std::size_t i) const { return names_.at(i); }

 private:
  std::vector<std::string> names_;
};

std::string run_name(const ActivationSet& run) { return fmt::format("{} (mesh {})", run.source, run.mesh.str()); }

std::string names_of(const std::vector<ActivationSet>& runs, const std::vector<std::size_t>& which) {
  std::vector<std::string> out;
  for (std::size_t r : which) out.push_back(run_name(runs[r]));
  return fmt::format("{}", fmt::join(out, " and "));
}

// The consensus as people read it: one line per run, then the verdict.
std::string consensus_text(const std::vector<ActivationSet>& runs, const Consensus& c, const TapOrder& order,
                           const std::vector<std::string>& own_failures) {
  std::string s = fmt::format("diffcheck: run against run, {} runs, no reference (each tolerance the sum of both "
                              "runs' bounds)\n", runs.size());
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const auto& st = c.runs[r];
    s += fmt::format("  run {}  {}  {}{}\n", r, run_name(runs[r]),
                     st.leaves_at ? fmt::format("LEAVES the consensus at tap '{}' (#{})", order.name(*st.leaves_at),
                                                *st.leaves_at)
                                  : c.undecided ? "-" : "in the consensus",
                     own_failures[r].empty() ? "" : "; alone: " + own_failures[r]);
  }
  for (std::size_t r = 0; r < runs.size(); ++r)
    if (c.runs[r].leaves_at)
      s += fmt::format("Odd one out: {} disagrees with {} from tap '{}' (#{})\n", run_name(runs[r]),
                       names_of(runs, c.runs[r].disagrees_with), order.name(*c.runs[r].leaves_at),
                       *c.runs[r].leaves_at);
  if (c.undecided) {
    std::vector<std::string> groups;
    for (const auto& g : c.groups_at_undecided) groups.push_back("{" + names_of(runs, g) + "}");
    s += fmt::format("No consensus from tap '{}': the runs part into {}; which is right needs a reference or "
                     "more runs\n", order.name(*c.first_split), fmt::join(groups, ", "));
  }
  if (!c.first_split) s += "Every pair of runs agrees on every tap they share.\n";
  return s;
}

// The pair whose report is shown: the first run to leave the consensus
// against a run that stays; else the pair that parts first.
std::pair<std::size_t, std::size_t> shown_pair(const Consensus& c, const std::vector<PairVerdict>& pairs) {
  std::optional<std::size_t> odd;
  for (std::size_t r = 0; r < c.runs.size(); ++r)
    if (c.runs[r].leaves_at && (!odd || *c.runs[r].leaves_at < *c.runs[*odd].leaves_at)) odd = r;
  if (odd) return {*odd, c.runs[*odd].disagrees_with.front()};
  std::pair<std::size_t, std::size_t> best{0, 1};
  std::optional<std::size_t> first;
  for (const auto& p : pairs)
    if (p.first_divergence && (!first || *p.first_divergence < *first)) first = p.first_divergence, best = {p.a, p.b};
  return best;
}

// Each matched tap's err/tol (its largest ratio) in one pair's comparison.
using TapMargins = std::vector<std::pair<std::string, double>>;

TapMargins margins_of(const CompareResult& res) {
  TapMargins out;
  for (const auto& t : res.taps)
    if (t.reference.present) out.emplace_back(t.name, t.reference.margin());
  return out;
}

// The run a run's own figures are measured against: for one that leaves the
// consensus, a run of the consensus it disagrees with; for the others,
// another run that stays (else any other run).
std::size_t yardstick_of(const Consensus& c, std::size_t r) {
  if (c.runs[r].leaves_at && !c.runs[r].disagrees_with.empty()) return c.runs[r].disagrees_with.front();
  std::optional<std::size_t> any;
  for (std::size_t s = 0; s < c.runs.size(); ++s) {
    if (s == r) continue;
    if (!c.runs[s].leaves_at) return s;
    if (!any) any = s;
  }
  return any.value_or(r);
}

// `margins[{a, b}]` (a < b): the pair's per-tap err/tol, for each run's row
// of figures (sweep-mesh's heatmap draws them).
nlohmann::json consensus_json(const std::vector<ActivationSet>& runs, const Consensus& c, const TapOrder& order,
                              const std::vector<std::string>& own_failures,
                              const std::map<std::pair<std::size_t, std::size_t>, TapMargins>& margins) {
  nlohmann::json j{{"runs", nlohmann::json::array()}, {"undecided", c.undecided}};
  for (std::size_t r = 0; r < runs.size(); ++r) {
    nlohmann::json run{{"source", runs[r].source}, {"mesh", runs[r].mesh.str()}};
    if (c.runs[r].leaves_at) {
      run["leaves_at"] = {{"tap", order.name(*c.runs[r].leaves_at)}, {"order", *c.runs[r].leaves_at}};
      run["disagrees_with"] = c.runs[r].disagrees_with;
    }
    if (!own_failures[r].empty()) run["own_checks"] = own_failures[r];
    const std::size_t y = yardstick_of(c, r);
    const auto pair = margins.find({std::min(r, y), std::max(r, y)});
    if (pair != margins.end()) {
      run["against_run"] = y;
      run["taps"] = nlohmann::json::array();
      for (const auto& [name, margin] : pair->second)
        run["taps"].push_back({{"name", name}, {"err_over_tol", json_number(margin)}});
    }
    j["runs"].push_back(run);
  }
  return j;
}

}  // namespace

constexpr std::size_t kKeptPairResults = 66;  // 12 runs

int compare_runs_and_report(const std::vector<std::string>& sources, bool exact, const ReportOptions& opts) {
  const auto started = std::chrono::steady_clock::now();
  std::vector<ActivationSet> runs;
  for (const auto& s : sources) runs.push_back(read_everywhere(s, "", opts.compare.processes));
  TapOrder order(runs.front());
  std::vector<PairVerdict> pairs;
  std::map<std::pair<std::size_t, std::size_t>, TapMargins> margins;
  // Each pair's result, kept for the pair the report shows (chosen once the
  // consensus is known) while there are few pairs; past that it is compared
  // again (one more of hundreds), so what is kept stays bounded.
  const bool keep = runs.size() * (runs.size() - 1) / 2 <= kKeptPairResults;
  std::map<std::pair<std::size_t, std::size_t>, CompareResult> kept;  // by (checked run, against run)
  for (std::size_t a = 0; a < runs.size(); ++a)
    for (std::size_t b = a + 1; b < runs.size(); ++b) {
      const bool flip = batch_larger(runs[a], runs[b]);  // the smaller batch is checked, on its samples
      CompareResult res =
          compare(match_runs(runs[flip ? b : a], runs[flip ? a : b], {.exact = exact}).set, opts.compare);
      PairVerdict p{a, b, {}};
      if (res.first_divergence) p.first_divergence = order.index_of(res.taps[*res.first_divergence].name);
      pairs.push_back(p);
      margins[{a, b}] = margins_of(res);
      if (keep) kept.emplace(std::pair{flip ? b : a, flip ? a : b}, std::move(res));
    }
  std::vector<std::string> own_failures(runs.size());
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const CompareResult own = compare(without_references(runs[r]), opts.compare);
    if (!own.pass())
      own_failures[r] = fmt::format("tap '{}' fails its {} check", own.taps[*own.first_divergence].name,
                                    fmt::join(own.taps[*own.first_divergence].failed_checks(), " and "));
  }
  const Consensus c = find_consensus(runs.size(), pairs);
  const bool rank0 = !opts.compare.processes || opts.compare.processes->rank() == 0;
  if (rank0) std::cout << consensus_text(runs, c, order, own_failures) << "\n" << std::flush;
  auto [shown, with_run] = shown_pair(c, pairs);
  if (batch_larger(runs[shown], runs[with_run])) std::swap(shown, with_run);
  const AgainstMatch m = match_runs(runs[shown], runs[with_run], {.exact = exact});
  ReportOptions with = opts;
  with.reference_source = m.describe();
  // The pair as the loop compared it, when it was kept in this orientation (equal batches: a < b).
  std::optional<CompareResult> computed;
  if (auto it = kept.find({shown, with_run}); it != kept.end()) computed = std::move(it->second);
  kept.clear();
  int status = check_and_report(m.set, with, started, std::move(computed));
  if (!opts.json_path.empty() && rank0) {
    // The pair's report, with the consensus beside it.
    nlohmann::json j;
    std::ifstream(opts.json_path) >> j;
    j["consensus"] = consensus_json(runs, c, order, own_failures, margins);
    j["pass"] = j["pass"].get<bool>() && !c.first_split &&
                std::all_of(own_failures.begin(), own_failures.end(), [](const auto& f) { return f.empty(); });
    write_whole_file(opts.json_path, j.dump(1) + "\n", "JSON report");
  }
  const bool all_agree = !c.first_split;
  const bool all_own = std::all_of(own_failures.begin(), own_failures.end(), [](const auto& f) { return f.empty(); });
  if (!all_agree || !all_own) status = kExitMismatch;
  return status;
}

}  // namespace dc
