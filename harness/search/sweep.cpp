#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "harness/core/error.h"
#include "harness/core/files.h"
#include "harness/search/flag_search.h"
#include "harness/search/launcher.h"
#include "harness/search/trial.h"
#include "harness/search/trial_junit.h"
#include "harness/report/html.h"

namespace dc {

std::vector<Profile> read_profiles(const std::string& path) {
  std::ifstream in(path);
  if (!in) input_error("{}: cannot read the profiles file", path);
  std::vector<Profile> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    line = line.substr(0, line.find('#'));
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto colon = line.find(':');
    if (colon == std::string::npos) input_error("{}:{}: expected 'name: flag flag=value ...'", path, n);
    Profile p;
    std::stringstream name(line.substr(0, colon)), flags(line.substr(colon + 1));
    name >> p.name;
    if (p.name.empty()) input_error("{}:{}: profile without a name", path, n);
    for (std::string f; flags >> f;) p.flags.push_back(f);
    out.push_back(p);
  }
  if (out.empty()) input_error("{}: no profiles", path);
  return out;
}

std::vector<Profile> all_subsets(const FlagSet& flags) {
  if (flags.size() > 12) input_error("--all-subsets over {} flags is {} profiles; give at most 12", flags.size(), 1u << flags.size());
  std::vector<Profile> out;
  for (std::size_t mask = 0; mask < (std::size_t{1} << flags.size()); ++mask) {
    Profile p;
    for (std::size_t i = 0; i < flags.size(); ++i)
      if (mask & (std::size_t{1} << i)) p.flags.push_back(flags[i]);
    p.name = p.flags.empty() ? "baseline" : fmt::format("{}", fmt::join(p.flags, "+"));
    out.push_back(p);
  }
  std::stable_sort(out.begin(), out.end(), [](const Profile& a, const Profile& b) { return a.flags.size() < b.flags.size(); });
  return out;
}

namespace {

double median_of(std::vector<double> t) {
  if (t.empty()) return 0;
  std::sort(t.begin(), t.end());
  return t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
}

struct Row {
  Profile profile;
  std::vector<double> times, run_times, check_times;  // wall; the sharded run's own; the rest
  Verdict verdict = Verdict::pass;
  std::string detail;
  double median() const { return median_of(times); }
  // What profiles are ranked by: the sharded run's own time when every timed
  // run reported it (diffcheck scenarios), else the wall time.
  bool has_run_times() const { return !times.empty() && run_times.size() == times.size(); }
  double rank_time() const { return has_run_times() ? median_of(run_times) : median(); }
};

// The leaderboard as a page: a bar per profile (its ranked time), wrong
// profiles struck through and never starred, the fastest correct starred.
void write_html(const std::string& path, const std::vector<Row>& rows, std::size_t best, bool by_run,
                double base_time) {
  auto ranked = [&](const Row& r) { return by_run ? r.rank_time() : r.median(); };
  double longest = 0;
  for (const auto& r : rows) longest = std::max(longest, ranked(r));
  std::string s = html::page_begin("diffcheck sweep");
  s += fmt::format("<h1>diffcheck sweep {}</h1>\n<div class=\"meta\">{} profiles; bars: {} (median)</div>\n",
                   html::verdict_badge(best != rows.size(), best != rows.size() ? "★ " + rows[best].profile.name
                                                                                  : "no correct profile"),
                   rows.size(), by_run ? "the sharded run's own time" : "wall time");
  s += "<table id=\"leaderboard\"><thead><tr><th class=\"l\">profile</th><th class=\"l\">flags</th>"
       "<th class=\"l\">time</th><th>median s</th><th>&#916; vs baseline</th><th class=\"l\">verdict</th></tr>"
       "</thead><tbody>\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double t = ranked(r);
    const bool wrong = r.verdict != Verdict::pass;
    const int w = longest > 0 ? static_cast<int>(300 * t / longest) : 0;
    s += fmt::format(
        "<tr class=\"{}\" data-profile=\"{}\"><td class=\"l name\">{}{}</td><td class=\"l\">{}</td>"
        "<td class=\"l\"><svg width=\"304\" height=\"14\"><rect class=\"bar\" width=\"{}\" height=\"12\" "
        "fill=\"{}\"><title>{:.3f} s</title></rect></svg></td><td>{:.3f}</td><td>{:+.1f}%</td><td class=\"l v\">{}</td></tr>\n",
        wrong ? "wrong fail" : i == best ? "best" : "pass", html::esc(r.profile.name), html::esc(r.profile.name),
        i == best ? " ★" : "", html::esc(r.profile.flags.empty() ? "-" : join_flags(r.profile.flags)), w,
        wrong ? "#bdbdbd" : i == best ? "#2e7d32" : "#90caf9", t, t,
        base_time > 0 ? 100.0 * (t - base_time) / base_time : 0.0,
        html::esc(wrong ? "WRONG: " + verdict_name(r.verdict) + " " + r.detail : "correct"));
  }
  s += "</tbody></table>\n" + html::page_end();
  write_whole_file(path, s, "HTML report");
}

// The sweep's progress line on a terminal: trials done, time elapsed and left.
struct SweepProgress {
  int total = 0;
  std::atomic<int> done{0};
  std::mutex mu;
  const std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  const bool tty = isatty(2);

  void tick() {
    const int d = ++done;
    if (!tty) return;
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(mu);
    std::cerr << fmt::format("\rsweep: trial {} of {}, {:.0f} s elapsed, ~{:.0f} s left   ", d, total, el,
                             el / d * (total - d))
              << std::flush;
  }
};

// One profile's runs, warm-up then timed, in `dir`; its verdict is the first
// wrong one, or flaky when runs disagree.
void run_profile(const SweepOptions& opts, Row& row, const std::string& dir, SweepProgress& progress) {
  bool seen_fail = false, seen_pass = false;
  for (int k = 0; k < opts.warmup + opts.runs && !interrupted(); ++k) {
    FlagTrialResult r = run_flag_trial(opts.target, row.profile.flags, dir);
    if (r.verdict == Verdict::interrupted) break;
    if (k >= opts.warmup) {
      row.times.push_back(r.seconds);
      if (r.run_seconds) row.run_times.push_back(*r.run_seconds);
      if (r.check_seconds) row.check_times.push_back(*r.check_seconds);
    }
    if (r.verdict == Verdict::pass) seen_pass = true;
    else seen_fail = true;
    if (r.verdict != Verdict::pass && (row.verdict == Verdict::pass || row.detail.empty())) {
      row.verdict = r.verdict;
      row.detail = r.detail;
    }
    progress.tick();
  }
  if (seen_fail && seen_pass) row.verdict = Verdict::flaky;
}

// Every profile, -j at a time.
void run_profiles(const SweepOptions& opts, std::vector<Row>& rows, SweepProgress& progress) {
  const std::filesystem::path base = scratch_directory(opts.target.work_dir, "diffcheck_sweep");
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> pool;
  for (int j = 0; j < std::min<int>(opts.jobs, static_cast<int>(rows.size())); ++j)
    pool.emplace_back([&] {
      for (std::size_t i; (i = next++) < rows.size();) {
        rows[i].profile = opts.profiles[i];
        run_profile(opts, rows[i], (base / std::to_string(i)).string(), progress);
      }
    });
  for (auto& t : pool) t.join();
  std::filesystem::remove_all(base);
  if (progress.tty) std::cerr << "\n";
}

// The leaderboard's rows on stdout and in `j`; returns the count of wrong profiles.
template <class Ranked>
int print_leaderboard(const std::vector<Row>& rows, std::size_t best, bool by_run, double base_time, Ranked ranked,
                      nlohmann::json& j) {
  int wrong = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double med = r.median();
    const double delta = base_time > 0 ? 100.0 * (ranked(r) - base_time) / base_time : 0;
    std::string verdict = r.verdict == Verdict::pass ? "correct" : fmt::format("WRONG: {} {}", verdict_name(r.verdict), r.detail);
    if (r.verdict != Verdict::pass) ++wrong;
    const std::string split = by_run ? fmt::format("{:.3f} | {:.3f} | ", median_of(r.run_times), median_of(r.check_times)) : "";
    std::cout << fmt::format("| {}{} | {} | {}{:.2f} | {:.2f} | {:.2f} | {:+.1f}% | {} |\n", r.profile.name,
                             i == best ? " ★" : "", r.profile.flags.empty() ? "-" : join_flags(r.profile.flags), split, med,
                             *std::min_element(r.times.begin(), r.times.end()),
                             *std::max_element(r.times.begin(), r.times.end()), delta, verdict);
    j["profiles"].push_back({{"name", r.profile.name}, {"flags", r.profile.flags}, {"median", med},
                             {"times", r.times}, {"delta_percent", delta}, {"verdict", verdict_name(r.verdict)},
                             {"detail", r.detail}, {"best", i == best}});
    if (r.has_run_times()) {
      j["profiles"].back()["run_median"] = median_of(r.run_times);
      j["profiles"].back()["check_median"] = median_of(r.check_times);
      j["profiles"].back()["run_times"] = r.run_times;
    }
  }
  return wrong;
}

void write_junit_report(const SweepOptions& opts, const std::vector<Row>& rows, std::size_t best) {
  JUnitSuite suite;
  suite.name = fmt::format("sweep of {} profiles", rows.size());
  if (best != rows.size()) suite.properties.emplace_back("fastest_correct", rows[best].profile.name);
  for (const auto& r : rows) {
    JUnitCase c = junit_case(r.verdict, r.detail);
    c.classname = "diffcheck.sweep";
    c.name = fmt::format("{} ({})", r.profile.name, r.profile.flags.empty() ? "-" : join_flags(r.profile.flags));
    for (double t : r.times) c.seconds += t;
    suite.seconds += c.seconds;
    suite.cases.push_back(std::move(c));
  }
  write_junit(opts.junit_path, {suite});
}

}  // namespace

int sweep(const SweepOptions& opts) {
  opts.target.validate();
  if (opts.profiles.empty()) input_error("sweep: no profiles");
  if (opts.runs < 1 || opts.warmup < 0 || opts.jobs < 1) input_error("sweep: --runs >= 1, --warmup >= 0, -j >= 1");
  install_interrupt_handlers();
  std::vector<Row> rows(opts.profiles.size());
  SweepProgress progress;
  progress.total = (opts.warmup + opts.runs) * static_cast<int>(rows.size());
  run_profiles(opts, rows, progress);
  if (interrupted()) {
    std::cout << fmt::format("sweep: INTERRUPTED after {} of {} trials; the running trial was ended\n",
                             progress.done.load(), progress.total);
    return 2;
  }

  // Deltas and the star use the sharded run's own time when every profile
  // has it, so a few percent between flags is not drowned by the constant
  // cost of references and checking.
  const bool by_run = std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.has_run_times(); });
  auto ranked = [&](const Row& r) { return by_run ? r.rank_time() : r.median(); };
  const double base_time = ranked(rows.front());
  std::size_t best = rows.size();
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i].verdict == Verdict::pass && (best == rows.size() || ranked(rows[i]) < ranked(rows[best]))) best = i;
  std::cout << fmt::format("sweep: {} profiles, {} warm-up + {} timed runs each{}\n", rows.size(), opts.warmup,
                           opts.runs, opts.jobs > 1 ? fmt::format(", {} in parallel (times perturbed)", opts.jobs) : "");
  if (by_run)
    std::cout << "run s: the sharded run alone (slowest rank); check s: references, writing and checking; "
                 "Δ and ★ by run s\n";
  std::cout << (by_run ? "| profile | flags | run s | check s | median s | min s | max s | Δ vs baseline | verdict |\n"
                         "|---|---|---|---|---|---|---|---|---|\n"
                       : "| profile | flags | median s | min s | max s | Δ vs baseline | verdict |\n"
                         "|---|---|---|---|---|---|---|\n");
  nlohmann::json j{{"profiles", nlohmann::json::array()}};
  const int wrong = print_leaderboard(rows, best, by_run, base_time, ranked, j);
  if (best == rows.size()) std::cout << "no profile is correct: nothing is starred\n";
  else std::cout << fmt::format("★ fastest correct: {}\n", rows[best].profile.name);
  if (!opts.json_path.empty()) write_whole_file(opts.json_path, j.dump(2) + "\n", "JSON report");
  if (!opts.html_path.empty()) write_html(opts.html_path, rows, best, by_run, base_time);
  if (!opts.junit_path.empty()) write_junit_report(opts, rows, best);
  return wrong ? 1 : 0;
}

}  // namespace dc
