// sweep-mesh over any program (search/sweep_mesh_command.h).
#include "harness/search/sweep_mesh_command.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "harness/search/trial.h"

namespace dc {
namespace {

void replace_all(std::string& s, const std::string& what, const std::string& with) {
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + with.size())) s.replace(p, what.size(), with);
}

// The sharded run's rank-0 file under `dir` (not a reference's one-device run).
std::string find_run_file(const std::string& dir) {
  std::error_code ec;
  std::string found;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.ends_with(".rank0.h5") || name.find(".one_device.") != std::string::npos) continue;
    if (found.empty() || e.path().string() < found) found = e.path().string();
  }
  return found;
}

// A command that wrote no JSON report: its exit status says the verdict
// (0 pass, 1 a check failed, 2 its input) and diffcheck's console report,
// when it printed one, the first divergent tap.
void judge_by_status(MeshRow& row, const TrialOutcome& t) {
  if (t.exit_code == 0) {
    row.verdict = "PASS";
    row.failed = false;
    return;
  }
  row.verdict = t.exit_code == 1 ? "FAIL" : "ERROR";
  const std::string needle = "First divergence: tap '";
  if (const auto at = t.output.find(needle); at != std::string::npos) {
    const auto start = at + needle.size();
    row.first_tap = t.output.substr(start, t.output.find('\'', start) - start);
  }
  auto last = t.output.find_last_of('\n', t.output.size() > 1 ? t.output.size() - 2 : 0);
  row.detail = t.output.substr(last == std::string::npos ? 0 : last + 1);
  while (!row.detail.empty() && row.detail.back() == '\n') row.detail.pop_back();
}

}  // namespace

std::vector<std::string> command_for_mesh(const std::vector<std::string>& command, const std::string& mesh,
                                          const std::string& out_dir) {
  std::vector<std::string> argv;
  for (std::string a : command) {
    replace_all(a, "{mesh}", mesh);
    replace_all(a, "{out}", out_dir);
    argv.push_back(a);
  }
  return argv;
}

MeshRow run_command_mesh(const SweepMeshOptions& opts, const Mesh& mesh, const std::string& out_dir,
                         const std::string& json, std::string& run_file) {
  std::filesystem::create_directories(out_dir);
  TrialSpec t{command_for_mesh(opts.command, mesh.str(), out_dir), {{"DIFFCHECK_REPORT_JSON", json}},
              opts.timeout_seconds};
  if (isatty(2)) std::cerr << fmt::format("sweep-mesh: {} ...\r", mesh.str()) << std::flush;
  std::filesystem::remove(json);
  const TrialOutcome outcome = run_trial(t);
  const auto c = outcome.classify();
  const bool ran = c != TrialOutcome::Class::timed_out && c != TrialOutcome::Class::crashed &&
                   c != TrialOutcome::Class::interrupted;
  MeshRow row;
  if (!ran || std::filesystem::exists(json)) {
    row = judge_mesh(mesh.str(), outcome, json);
  } else {
    row = MeshRow{mesh.str(), "", "-", "", outcome.seconds, true};
    judge_by_status(row, outcome);
  }
  run_file = find_run_file(out_dir);
  return row;
}

}  // namespace dc
