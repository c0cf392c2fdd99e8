// sweep-mesh's rows: one mesh's verdict read from its run's exit and JSON
// report, and the table, JSON, JUnit and HTML the sweep reports them in.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "harness/report/html.h"
#include "harness/search/sweep_mesh.h"
#include "harness/search/trial.h"

namespace dc {

struct MeshRow {
  std::string mesh, verdict, first_tap, detail;
  double seconds = 0;
  bool failed = false;
  std::string expected;      // with a fault: "PASS" or "FAIL at 'tap'"
  bool as_expected = true;
  std::string against;       // --no-reference: where the mesh stands among the others
  std::string against_mesh;  // --no-reference: the mesh whose run its cells' err/tol are measured against
  std::string report_stem;   // with --reports: <dir>/<stem>.json and .html
  std::vector<std::pair<std::string, html::CellState>> taps;  // for the HTML heatmap
};

using SkippedMeshes = std::vector<std::pair<std::string, std::string>>;  // mesh, why

// A number of a JSON report, which writes NaN and the infinities as strings.
double report_number(const nlohmann::json& v);
// A tap's err/tol in a JSON report: the largest of its "reference" ratios
// (element-wise, norm-wise, column means), as ReferenceCheck::margin() is.
double report_margin(const nlohmann::json& reference);

// The row of one mesh's trial: its verdict, first divergent tap and cells.
MeshRow judge_mesh(const std::string& mesh, const TrialOutcome& t, const std::string& json_file);
// The markdown table on stdout; returns the count of failed meshes.
// `note`: a line under the title (how the meshes were judged).
int print_mesh_table(const SweepMeshOptions& opts, const std::vector<MeshRow>& rows, const SkippedMeshes& skipped,
                     const std::string& note = "");
void write_mesh_json(const SweepMeshOptions& opts, const std::vector<MeshRow>& rows, const SkippedMeshes& skipped);
void write_mesh_junit(const SweepMeshOptions& opts, const std::vector<MeshRow>& rows, const SkippedMeshes& skipped);
// The seeds/001 picture (a mesh x tap heatmap of err/tol) as a self-contained page.
void write_mesh_html(const std::string& path, const SweepMeshOptions& opts, const std::vector<MeshRow>& rows,
                     const SkippedMeshes& skipped);

}  // namespace dc
