// `diffcheck sweep-mesh`: a scenario on every mesh shape N ranks can form,
// each a child run with a time limit, judged against what the injected fault
// is documented to do there (reports: search/sweep_mesh_rows.cpp).
#include "harness/search/sweep_mesh.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "harness/core/error.h"
#include "harness/search/launcher.h"
#include "harness/search/sweep_mesh_against.h"
#include "harness/search/sweep_mesh_command.h"
#include "harness/search/sweep_mesh_rows.h"
#include "harness/search/trial.h"

namespace dc {
namespace {

void factor(int rest, std::size_t axes, std::vector<int>& cur, std::vector<std::vector<int>>& out) {
  if (cur.size() + 1 == axes) {
    cur.push_back(rest);
    out.push_back(cur);
    cur.pop_back();
    return;
  }
  for (int f = 1; f <= rest; ++f)
    if (rest % f == 0) {
      cur.push_back(f);
      factor(rest / f, axes, cur, out);
      cur.pop_back();
    }
}

// --mesh as the user wrote it: axes left out have size 1 ("tp=16" is dp=1,tp=16).
std::vector<std::string> only_meshes(const SweepMeshOptions& opts) {
  const auto& axes = opts.axes;
  std::vector<std::string> only;
  for (const auto& text : opts.only_meshes) {
    const Mesh given = Mesh::parse(text);
    std::vector<Axis> ax;
    for (const auto& a : axes) ax.push_back({a, given.axis_index(a) < 0 ? 1 : given.axis_size(a)});
    for (const auto& a : given.axes())
      if (std::find(axes.begin(), axes.end(), a.name) == axes.end())
        input_error("sweep-mesh: --mesh {}: {} has no axis '{}'; its axes are {}", text,
                    opts.command.empty() ? fmt::format("scenario '{}'", opts.scenario) : "the sweep", a.name,
                    fmt::join(axes, ", "));
    only.push_back(Mesh(ax).str());
  }
  return only;
}

// The meshes to run: every factorization the scenario accepts, or those asked for.
std::vector<Mesh> plan_meshes(const SweepMeshOptions& opts, SkippedMeshes& skipped) {
  const auto& axes = opts.axes;
  const std::vector<std::string> only = only_meshes(opts);
  std::vector<Mesh> plan;
  std::vector<std::string> all;
  for (const auto& sizes : mesh_factorizations(opts.ranks, axes.size())) {
    std::vector<Axis> ax;
    for (std::size_t i = 0; i < axes.size(); ++i) ax.push_back({axes[i], sizes[i]});
    Mesh mesh(ax);
    all.push_back(mesh.str());
    if (!only.empty() && std::find(only.begin(), only.end(), mesh.str()) == only.end())
      continue;
    try {
      opts.check_mesh(mesh);
    } catch (const InputError& e) {
      skipped.emplace_back(mesh.str(), e.what());
      continue;
    }
    plan.push_back(mesh);
  }
  for (const auto& m : only)
    if (std::find(all.begin(), all.end(), m) == all.end())
      input_error("sweep-mesh: --mesh {} is not one of the {} meshes of {} ranks over {} (e.g. {})", m, all.size(),
                  opts.ranks, fmt::join(axes, ","), all.empty() ? "" : all.front());
  return plan;
}

// One mesh's run: a child `diffcheck --scenario` under the launcher.
MeshRow run_mesh(const SweepMeshOptions& opts, const Mesh& mesh, const std::string& out, const std::string& json,
                 const std::string& kept) {
  TrialSpec t{launcher_argv(opts.launcher, opts.mpirun, opts.ranks), {}, opts.timeout_seconds};
  t.argv.insert(t.argv.end(), {self_executable(), "--scenario", opts.scenario, "--mesh", mesh.str(),
                               "--dtype", opts.dtype, "--size", opts.size, "--out", out, "--json", json});
  if (!kept.empty()) t.argv.insert(t.argv.end(), {"--html", kept + ".html"});
  if (!opts.fault.empty()) t.argv.insert(t.argv.end(), {"--inject", opts.fault});
  if (opts.no_reference) t.argv.push_back("--no-reference");
  if (!opts.tolerances_file.empty()) t.argv.insert(t.argv.end(), {"--tolerances", opts.tolerances_file});
  if (!opts.tolerance.empty()) t.argv.insert(t.argv.end(), {"--tolerance", opts.tolerance});
  for (const auto& a : opts.pipeline.args()) t.argv.push_back(a);
  for (const auto& f : opts.flags) t.argv.insert(t.argv.end(), {"--flag", f});
  if (isatty(2)) std::cerr << fmt::format("sweep-mesh: {} ...\r", mesh.str()) << std::flush;
  std::filesystem::remove(json);  // a report left by an earlier sweep is not this run's
  MeshRow row = judge_mesh(mesh.str(), run_trial(t), json);
  if (!opts.no_reference) std::filesystem::remove(out);  // else kept to compare with the other meshes
  if (kept.empty()) std::filesystem::remove(json);
  else row.report_stem = kept;
  return row;
}

// What the mesh's row was expected to be (opts.expected) and whether it is.
void hold_to_expectation(const SweepMeshOptions& opts, const Mesh& mesh, MeshRow& row) {
  // `verdict` may list alternatives ("FAIL|HANG|DESYNC"); a FAIL must be at `tap`.
  const auto [verdict, tap] = opts.expected(mesh);
  std::vector<std::string> allowed;
  for (std::size_t a = 0, b; a <= verdict.size(); a = b + 1) {
    b = verdict.find('|', a);
    if (b == std::string::npos) b = verdict.size();
    allowed.push_back(verdict.substr(a, b - a));
  }
  std::string shown;
  for (const auto& v : allowed) shown += (shown.empty() ? "" : " or ") + (v == "FAIL" ? fmt::format("FAIL at '{}'", tap) : v);
  row.expected = shown;
  const bool listed = std::find(allowed.begin(), allowed.end(), row.verdict) != allowed.end();
  row.as_expected = opts.dry_run || (listed && (row.verdict != "FAIL" || row.first_tap == tap));
}

}  // namespace

std::vector<std::vector<int>> mesh_factorizations(int ranks, std::size_t axes) {
  std::vector<std::vector<int>> out;
  std::vector<int> cur;
  if (ranks >= 1 && axes >= 1) factor(ranks, axes, cur, out);
  return out;
}

std::string mesh_file_stem(const std::string& mesh) {
  std::string out;
  for (char c : mesh) {
    if (c == '=') continue;
    out += c == ',' ? '_' : c;
  }
  return out;
}

int sweep_mesh(const SweepMeshOptions& opts) {
  if (opts.ranks < 1) input_error("sweep-mesh: -n must be at least 1");
  if (opts.axes.empty() || !opts.check_mesh)
    input_error("{}", opts.command.empty() ? fmt::format("sweep-mesh: scenario '{}' gives no mesh axes", opts.scenario)
                                           : std::string("sweep-mesh: a command needs --axes (e.g. --axes dp,tp)"));
  SkippedMeshes skipped;
  const std::vector<Mesh> plan = plan_meshes(opts, skipped);
  if (!opts.reports_dir.empty()) std::filesystem::create_directories(opts.reports_dir);

  // Ctrl-C or SIGTERM: the running trial is ended gracefully (its ranks
  // remove their partial files), the scratch directory goes, the sweep stops.
  if (!opts.dry_run) install_interrupt_handlers();
  const std::filesystem::path dir = opts.dry_run ? std::filesystem::path() : std::filesystem::path(scratch_directory(opts.work_dir, "diffcheck_sweep_mesh"));
  std::vector<MeshRow> rows;
  std::vector<std::string> files;  // each row's run file
  int index = 0;
  for (const Mesh& mesh : plan) {
    if (interrupted()) break;
    const std::string stem = mesh_file_stem(mesh.str());
    const std::string out = (dir / fmt::format("mesh{}.h5", index)).string();
    const std::string kept = opts.reports_dir.empty() ? "" : (std::filesystem::path(opts.reports_dir) / stem).string();
    const std::string json = kept.empty() ? (dir / fmt::format("mesh{}.json", index)).string() : kept + ".json";
    ++index;
    std::string run_file = out;
    MeshRow row = opts.dry_run            ? MeshRow{mesh.str(), "not run", "-", "", 0, false}
                  : opts.command.empty() ? run_mesh(opts, mesh, out, json, kept)
                                         : run_command_mesh(opts, mesh, (dir / stem).string(), json, run_file);
    if (!opts.command.empty() && kept.empty()) std::filesystem::remove(json);
    if (opts.expected) hold_to_expectation(opts, mesh, row);
    rows.push_back(std::move(row));
    files.push_back(run_file);
  }
  std::string note;
  if (opts.no_reference && !opts.dry_run && !interrupted()) {
    note = compare_meshes(opts, files, (dir / "against.json").string(), rows);
    if (opts.expected) hold_to_expectation_against(opts, rows);
  }
  if (!dir.empty()) std::filesystem::remove_all(dir);
  if (interrupted()) {
    std::cout << fmt::format("sweep-mesh: INTERRUPTED after {} of {} meshes; the running trial was ended\n",
                             rows.size() - (rows.empty() ? 0 : 1), plan.size());
    return 2;
  }
  const int failed = print_mesh_table(opts, rows, skipped, note);
  write_mesh_json(opts, rows, skipped);
  if (!opts.html_path.empty()) write_mesh_html(opts.html_path, opts, rows, skipped);
  write_mesh_junit(opts, rows, skipped);
  if (opts.dry_run) return 0;
  return failed || rows.empty() ? 1 : 0;
}

}  // namespace dc
