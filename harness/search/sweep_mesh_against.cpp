// sweep-mesh --no-reference (search/sweep_mesh_against.h).
#include "harness/search/sweep_mesh_against.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness/search/trial.h"

namespace dc {
namespace {

// Row indices of the runs compared (those that left a run file).
std::vector<std::size_t> compared_rows(const std::vector<std::string>& files) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < files.size(); ++i)
    if (!files[i].empty() && std::filesystem::exists(files[i])) out.push_back(i);
  return out;
}

void mark(MeshRow& row, const std::string& tap, const std::string& why) {
  row.against = why;
  if (row.verdict == "FAIL") return;  // its own checks failed first: their tap stays
  row.verdict = "FAIL";
  row.failed = true;
  row.first_tap = tap;
  row.detail = "against the others";
}

// The row's heatmap cells take the comparison's err/tol (a mesh's own run,
// with no reference, has none): a tap the row lacks is added.
void set_ratio(MeshRow& row, const std::string& tap, double ratio) {
  auto it = std::find_if(row.taps.begin(), row.taps.end(), [&](const auto& t) { return t.first == tap; });
  if (it == row.taps.end()) it = row.taps.insert(row.taps.end(), {tap, html::CellState{}});
  it->second.ratio = ratio;
}

// Three or more runs: the consensus the compare's JSON holds.
void read_consensus(const nlohmann::json& consensus, const std::vector<std::size_t>& which,
                    std::vector<MeshRow>& rows) {
  const auto& runs = consensus["runs"];
  for (std::size_t k = 0; k < which.size() && k < runs.size(); ++k) {
    MeshRow& row = rows[which[k]];
    const auto& run = runs[k];
    if (run.contains("taps")) {  // its err/tol against a run of the consensus
      row.against_mesh = rows[which.at(run["against_run"].get<std::size_t>())].mesh;
      for (const auto& t : run["taps"]) set_ratio(row, t["name"].get<std::string>(), report_number(t["err_over_tol"]));
    }
    if (!run.contains("leaves_at")) {
      row.against = consensus["undecided"].get<bool>() ? "no consensus" : "in the consensus";
      continue;
    }
    std::vector<std::string> with;
    for (const auto& r : run["disagrees_with"]) with.push_back(rows[which.at(r.get<std::size_t>())].mesh);
    const std::string named = with.size() <= 2 ? fmt::format("{}", fmt::join(with, " and "))
                                               : fmt::format("{} meshes ({}, {}, ...)", with.size(), with[0], with[1]);
    mark(row, run["leaves_at"]["tap"].get<std::string>(), "LEAVES the consensus: disagrees with " + named);
  }
}

// Two runs, or no consensus: where the runs part, both are marked.
void mark_split(const nlohmann::json& report, const std::vector<std::size_t>& which, std::vector<MeshRow>& rows,
                bool two) {
  const auto& fd = report["first_divergence"];
  if (fd.is_null()) return;
  const std::string tap = fd["tap"].get<std::string>();
  for (std::size_t r : which)
    if (rows[r].against != "in the consensus")
      mark(rows[r], tap, two ? "the two meshes disagree (which is wrong needs a third mesh or a reference)"
                             : "no consensus: the meshes part into groups of equal size");
}

}  // namespace

std::string compare_meshes(const SweepMeshOptions& opts, const std::vector<std::string>& files,
                           const std::string& json_path, std::vector<MeshRow>& rows) {
  const std::vector<std::size_t> which = compared_rows(files);
  if (which.size() < 2)
    return fmt::format("no reference: {} mesh(es) left a run file, too few to compare", which.size());
  TrialSpec t{{self_executable(), "compare", files[which[0]], "--json", json_path}, {}, opts.timeout_seconds};
  for (std::size_t k = 1; k < which.size(); ++k) t.argv.insert(t.argv.end(), {"--against", files[which[k]]});
  std::filesystem::remove(json_path);
  const TrialOutcome out = run_trial(t);
  if (out.kind != TrialOutcome::Kind::exited || out.exit_code == 2 || !std::filesystem::exists(json_path)) {
    const auto last = out.output.find_last_of('\n', out.output.size() > 1 ? out.output.size() - 2 : 0);
    const std::string why = out.output.substr(last == std::string::npos ? 0 : last + 1);
    for (std::size_t r : which) mark(rows[r], "-", "the comparison of the meshes failed: " + why);
    return fmt::format("no reference: the comparison of the {} meshes failed ({}): {}", which.size(), out.describe(),
                       why);
  }
  nlohmann::json j;
  std::ifstream(json_path) >> j;
  const bool consensus = j.contains("consensus");
  if (consensus) {
    read_consensus(j["consensus"], which, rows);
  } else {  // two runs: the pair's figures are both rows'
    for (const auto& t : j["taps"])
      if (t["reference"]["present"].get<bool>())
        for (std::size_t r : which) set_ratio(rows[r], t["name"].get<std::string>(), report_margin(t["reference"]));
    rows[which[0]].against_mesh = rows[which[1]].mesh;
    rows[which[1]].against_mesh = rows[which[0]].mesh;
  }
  if (!consensus || j["consensus"]["undecided"].get<bool>()) mark_split(j, which, rows, !consensus);
  return fmt::format("no reference: the {} meshes that ran compared with each other (diffcheck compare --against; "
                     "each tolerance the sum of both runs' bounds; a smaller batch against the first samples of a "
                     "larger one)",
                     which.size());
}

void hold_to_expectation_against(const SweepMeshOptions& opts, std::vector<MeshRow>& rows) {
  std::size_t reached = 0;
  for (const auto& r : rows) reached += opts.expected(Mesh::parse(r.mesh)).first != "PASS";
  const bool decidable = 2 * (rows.size() - reached) > rows.size();
  for (auto& row : rows) {
    const auto [verdict, tap] = opts.expected(Mesh::parse(row.mesh));
    if (verdict == "CRASHED" || verdict.find('|') != std::string::npos) continue;  // as with a reference
    if (!decidable) {
      row.expected = fmt::format("any (the fault reaches {} of {} meshes: none can be told wrong)", reached,
                                 rows.size());
      row.as_expected = row.verdict == "PASS" || row.verdict == "FAIL";
      continue;
    }
    row.expected = verdict == "PASS" ? "PASS" : fmt::format("FAIL at '{}'", tap);
    row.as_expected = row.verdict == verdict && (verdict == "PASS" || row.first_tap == tap);
  }
}

}  // namespace dc
