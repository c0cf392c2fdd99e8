// sweep-mesh's rows and reports (search/sweep_mesh_rows.h).
#include "harness/search/sweep_mesh_rows.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "harness/check/compare.h"
#include "harness/report/junit.h"
#include "harness/core/files.h"
#include "harness/search/launcher.h"

namespace dc {

double report_number(const nlohmann::json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) return std::strtod(v.get<std::string>().c_str(), nullptr);
  return -1;
}

double report_margin(const nlohmann::json& reference) {
  const auto ratio = [&](const char* key) {
    return reference.contains(key) ? std::optional<double>(report_number(reference[key])) : std::nullopt;
  };
  return largest_ratio(report_number(reference["worst_ratio"]), ratio("l2_ratio"), ratio("column_ratio"));
}

namespace {

html::CellState cell_of(const nlohmann::json& tap) {
  html::CellState c;
  c.nonfinite = tap["nonfinite"]["nan"].get<long long>() + tap["nonfinite"]["inf"].get<long long>();
  if (!tap["replica"]["pass"].get<bool>()) c.replica = report_number(tap["replica"]["max_abs"]);
  if (tap["reference"]["present"].get<bool>()) c.ratio = report_margin(tap["reference"]);
  return c;
}

}  // namespace

MeshRow judge_mesh(const std::string& mesh, const TrialOutcome& t, const std::string& json_file) {
  MeshRow row{mesh, "", "-", "", t.seconds, true};
  const auto c = t.classify();
  if (c == TrialOutcome::Class::timed_out || c == TrialOutcome::Class::crashed ||
      c == TrialOutcome::Class::interrupted) {
    row.verdict = c == TrialOutcome::Class::timed_out ? "TIMED OUT" : c == TrialOutcome::Class::crashed ? "CRASHED" : "INTERRUPTED";
    row.detail = t.describe();
    return row;
  }
  // A finding about the code under test that ends the run before any report
  // (exit 1): an exception or fault (CRASH), ranks stuck (HANG, from the
  // watchdog) or in mismatched collectives (DESYNC).
  if (t.exit_code == 1 && !std::filesystem::exists(json_file)) {
    for (const auto& [needle, verdict] : {std::pair{"CRASH on ", "CRASHED"}, std::pair{"HANG: ", "HANG"},
                                          std::pair{"DESYNC: ", "DESYNC"}}) {
      const auto at = t.output.find(needle);
      if (at == std::string::npos) continue;
      row.verdict = verdict;
      row.detail = t.output.substr(at, t.output.find('\n', at) - at);
      return row;
    }
  }
  if (t.exit_code == 2 || !std::filesystem::exists(json_file)) {
    row.verdict = "ERROR";
    auto last = t.output.find_last_of('\n', t.output.size() > 1 ? t.output.size() - 2 : 0);
    row.detail = t.output.substr(last == std::string::npos ? 0 : last + 1);
    while (!row.detail.empty() && row.detail.back() == '\n') row.detail.pop_back();
    if (t.exit_code != 2) row.detail = missing_report_hint(json_file);
    return row;
  }
  nlohmann::json j;
  std::ifstream(json_file) >> j;
  for (const auto& tap : j["taps"]) row.taps.emplace_back(tap["name"].get<std::string>(), cell_of(tap));
  if (j["pass"].get<bool>()) {
    row.verdict = "PASS";
    row.failed = false;
    return row;
  }
  row.verdict = "FAIL";
  const auto& fd = j["first_divergence"];
  row.first_tap = fd["tap"].get<std::string>();
  row.detail = fmt::format("{}", fmt::join(fd["checks"].get<std::vector<std::string>>(), ","));
  for (const auto& tap : j["taps"])
    if (tap["name"] == fd["tap"] && tap["replica"].contains("worst")) {
      const auto& w = tap["replica"]["worst"];
      row.detail += fmt::format(": replicas differ across {} (max diff {})",
                                fmt::join(w["axes"].get<std::vector<std::string>>(), ", "),
                                tap["replica"]["max_abs"].dump());
    }
  return row;
}

// A scenario's meshes are of MPI ranks, a command's (a JAX program) of devices.
static const char* ranks_word(const SweepMeshOptions& opts) { return opts.command.empty() ? "ranks" : "devices"; }

int print_mesh_table(const SweepMeshOptions& opts, const std::vector<MeshRow>& rows, const SkippedMeshes& skipped,
                     const std::string& note) {
  std::cout << fmt::format("sweep-mesh: {} on {} {}{}{}\n", opts.scenario, opts.ranks, ranks_word(opts),
                           opts.fault.empty() ? "" : ", inject " + opts.fault,
                           opts.flags.empty() ? "" : fmt::format(", flags {}", fmt::join(opts.flags, " ")));
  if (!note.empty()) std::cout << note << "\n";
  const bool expect = static_cast<bool>(opts.expected);
  const bool against = opts.no_reference && !opts.dry_run;
  std::cout << "| mesh | wall s | verdict | first divergent tap | detail |" << (against ? " against the others |" : "")
            << (expect ? " expected |" : "");
  for (const auto& t : opts.show_taps) std::cout << fmt::format(" {} err/tol |", t);
  std::cout << "\n|---|---|---|---|---|" << (against ? "---|" : "") << (expect ? "---|" : "");
  for (std::size_t k = 0; k < opts.show_taps.size(); ++k) std::cout << "---|";
  std::cout << "\n";
  int failed = 0, unexpected = 0;
  for (const auto& r : rows) {
    std::cout << fmt::format("| {} | {:.1f} | {} | {} | {} |", r.mesh, r.seconds, r.verdict, r.first_tap, r.detail);
    if (against) std::cout << fmt::format(" {} |", r.against.empty() ? "-" : r.against);
    if (expect) std::cout << fmt::format(" {}{} |", r.expected.empty() ? "-" : r.expected, r.as_expected ? "" : " (NOT MET)");
    for (const auto& t : opts.show_taps) {
      auto it = std::find_if(r.taps.begin(), r.taps.end(), [&](const auto& x) { return x.first == t; });
      std::cout << (it == r.taps.end() ? std::string(" - |") : fmt::format(" {} |", html::num(it->second.ratio)));
    }
    std::cout << "\n";
    failed += r.failed;
    unexpected += !r.as_expected;
  }
  for (const auto& [m, why] : skipped) {
    std::cout << fmt::format("| {} | - | skipped | - | {} |{}{}", m, why, against ? " - |" : "", expect ? " - |" : "");
    for (std::size_t k = 0; k < opts.show_taps.size(); ++k) std::cout << " - |";
    std::cout << "\n";
  }
  std::cout << fmt::format("{} meshes {}, {} fail, {} skipped by the problem size\n", rows.size(),
                           opts.dry_run ? "planned" : "run", failed, skipped.size());
  if (expect && !opts.dry_run)
    std::cout << (unexpected ? fmt::format("fault {}: {} of {} meshes NOT as documented (see 'expected')\n",
                                           opts.fault, unexpected, rows.size())
                             : fmt::format("fault {}: every mesh as documented\n", opts.fault));
  return failed;
}

void write_mesh_json(const SweepMeshOptions& opts, const std::vector<MeshRow>& rows, const SkippedMeshes& skipped) {
  const bool expect = static_cast<bool>(opts.expected);
  if (!opts.json_path.empty()) {
    nlohmann::json j{{"scenario", opts.scenario}, {"ranks", opts.ranks}, {"fault", opts.fault},
                     {"flags", opts.flags}, {"rows", nlohmann::json::array()}, {"skipped", nlohmann::json::array()}};
    for (const auto& r : rows)
    {
      nlohmann::json row{{"mesh", r.mesh}, {"seconds", r.seconds}, {"verdict", r.verdict},
                         {"first_divergence", r.first_tap}, {"detail", r.detail}};
      if (expect) row["expected"] = r.expected, row["as_expected"] = r.as_expected;
      if (opts.no_reference) row["against"] = r.against;
      for (const auto& t : opts.show_taps)
        for (const auto& [name, c] : r.taps)
          if (name == t) row["err_over_tol"][t] = c.ratio;
      if (!r.report_stem.empty()) row["report"] = {{"json", r.report_stem + ".json"}, {"html", r.report_stem + ".html"}};
      j["rows"].push_back(row);
    }
    for (const auto& [m, why] : skipped) j["skipped"].push_back({{"mesh", m}, {"reason", why}});
    write_whole_file(opts.json_path, j.dump(2) + "\n", "JSON report");
  }
}

void write_mesh_junit(const SweepMeshOptions& opts, const std::vector<MeshRow>& rows, const SkippedMeshes& skipped) {
  if (!opts.junit_path.empty()) {
    JUnitSuite suite;
    suite.name = fmt::format("sweep-mesh {} on {} {}{}", opts.scenario, opts.ranks, ranks_word(opts),
                             opts.fault.empty() ? "" : ", inject " + opts.fault);
    suite.properties = {{"scenario", opts.scenario}, {"ranks", std::to_string(opts.ranks)}, {"dtype", opts.dtype},
                        {"flags", fmt::format("{}", fmt::join(opts.flags, " "))}, {"inject", opts.fault}};
    for (const auto& r : rows) {
      JUnitCase c;
      c.classname = "diffcheck.sweep-mesh." + opts.scenario;
      c.name = r.mesh;
      c.seconds = r.seconds;
      if (r.verdict == "FAIL") {
        c.outcome = JUnitCase::Outcome::failure;
        c.type = "FAIL";
        c.message = fmt::format("first divergent tap '{}': {}", r.first_tap, r.detail);
        c.text = c.message;
      } else if (r.failed) {
        c.outcome = JUnitCase::Outcome::error;
        c.type = r.verdict;
        c.message = r.verdict + (r.detail.empty() ? "" : ": " + r.detail);
        c.text = c.message;
      }
      suite.seconds += c.seconds;
      suite.cases.push_back(std::move(c));
    }
    for (const auto& [m, why] : skipped) {
      JUnitCase c;
      c.classname = "diffcheck.sweep-mesh." + opts.scenario;
      c.name = m;
      c.outcome = JUnitCase::Outcome::skipped;
      c.message = why;
      suite.cases.push_back(std::move(c));
    }
    write_junit(opts.junit_path, {suite});
  }
}

// The seeds/001 picture: meshes down, taps across, each cell the tap's worst
// err/tol on that mesh (replica mismatches and NaN/Inf in their colours); a
// mesh with no result is a grey row saying why.
void write_mesh_html(const std::string& path, const SweepMeshOptions& opts, const std::vector<MeshRow>& rows,
                     const SkippedMeshes& skipped) {
  std::vector<std::string> taps;
  for (const auto& r : rows)
    for (const auto& [name, c] : r.taps)
      if (std::find(taps.begin(), taps.end(), name) == taps.end()) taps.push_back(name);
  const int cw = 26, ch = 20, left = 170, top = 150;
  const int width = left + static_cast<int>(std::max<std::size_t>(taps.size(), 1)) * cw + 320;
  const int height = top + static_cast<int>(rows.size()) * ch + 10;
  int failed = 0;
  for (const auto& r : rows) failed += r.failed;
  const std::string title = fmt::format("diffcheck sweep-mesh: {} on {} {}{}", opts.scenario, opts.ranks, ranks_word(opts),
                                        opts.fault.empty() ? "" : ", inject " + opts.fault);
  std::string s = html::page_begin(title);
  s += fmt::format("<h1>{} {}</h1>\n<div class=\"meta\">{} meshes run, {} fail, {} skipped by the problem "
                   "size{}</div>\n",
                   html::esc(title), html::verdict_badge(failed == 0 && !rows.empty(), failed ? "FAIL" : "PASS"),
                   rows.size(), failed, skipped.size(),
                   opts.flags.empty() ? "" : fmt::format(" &middot; flags {}", html::esc(fmt::format("{}", fmt::join(opts.flags, " ")))));
  s += "<h2>Worst error over tolerance, per mesh and tap</h2>\n";
  if (opts.no_reference)
    s += "<div class=\"meta\">No reference: each mesh's err/tol is against another mesh's run (one of the "
         "consensus, or the other of two), each tolerance the sum of both runs' bounds</div>\n";
  s += html::legend();
  s += fmt::format("<svg id=\"heatmap\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\">\n", width,
                   height);
  for (std::size_t k = 0; k < taps.size(); ++k)
    s += fmt::format("<text class=\"tap-label\" transform=\"translate({},{}) rotate(-60)\">{}</text>\n",
                     left + static_cast<int>(k) * cw + cw / 2, top - 6, html::esc(taps[k]));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const MeshRow& r = rows[i];
    const int y = top + static_cast<int>(i) * ch;
    s += fmt::format("<text class=\"mesh-label{}\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
                     r.failed ? " first" : "", left - 6, y + ch - 6, html::esc(r.mesh));
    for (std::size_t k = 0; k < taps.size(); ++k) {
      html::CellState c;
      c.error = r.taps.empty();
      bool has = c.error;
      for (const auto& [name, st] : r.taps)
        if (name == taps[k]) c = st, has = true;
      if (!has) continue;  // this mesh records no such tap
      std::string kind;
      const std::string fill = html::fill(c, kind);
      const bool first = r.first_tap == taps[k];
      std::string tip = fmt::format("mesh {}, tap {}", r.mesh, taps[k]);
      if (c.error) tip += "\n" + r.verdict + (r.detail.empty() ? "" : ": " + r.detail);
      else if (c.ratio >= 0 || std::isnan(c.ratio))
        tip += "\nerr/tol " + html::num(c.ratio) + (r.against_mesh.empty() ? "" : " against mesh " + r.against_mesh);
      else
        tip += "\nno reference";
      if (c.replica != 0) tip += "\nreplica difference " + html::num(c.replica);
      if (c.nonfinite) tip += fmt::format("\n{} NaN/Inf", c.nonfinite);
      if (first) tip += "\nfirst divergence of this mesh";
      s += fmt::format("<rect class=\"cell {}{}\" data-mesh=\"{}\" data-tap=\"{}\" x=\"{}\" y=\"{}\" width=\"{}\" "
                       "height=\"{}\" fill=\"{}\"{}><title>{}</title></rect>\n",
                       kind, first ? " first" : "", html::esc(r.mesh), html::esc(taps[k]),
                       left + static_cast<int>(k) * cw, y, cw - 2, ch - 2, fill,
                       first ? " stroke=\"#000\" stroke-width=\"2\"" : "", html::esc(tip));
    }
    s += fmt::format("<text x=\"{}\" y=\"{}\">{} {:.1f} s{}</text>\n",
                     left + static_cast<int>(taps.size()) * cw + 8, y + ch - 6, html::esc(r.verdict), r.seconds,
                     r.first_tap.empty() || r.first_tap == "-" ? "" : " &#8594; " + html::esc(r.first_tap));
  }
  s += "</svg>\n";
  if (!skipped.empty()) {
    s += "<h2>Skipped by the problem size</h2>\n<table id=\"skipped\">";
    for (const auto& [m, why] : skipped)
      s += fmt::format("<tr><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>", html::esc(m), html::esc(why));
    s += "</table>\n";
  }
  s += html::page_end();
  write_whole_file(path, s, "HTML report");
}

}  // namespace dc
