// diffcheck sweep-mesh: run a scenario on every mesh shape N ranks can form
// over its axes (that the problem size allows), each as a child mpirun with a
// time limit, and say which shapes fail.
//
// The search subsystem runs scenarios only as child processes, so it does not
// know them: the caller (the CLI, which links the scenarios) says which axes
// the scenario has and which meshes it accepts.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "harness/core/mesh.h"
#include "harness/core/pipeline_options.h"

namespace dc {

struct SweepMeshOptions {
  std::string scenario;
  int ranks = 0;
  std::string fault, dtype = "float32", size = "default";
  PipelineOptions pipeline;
  std::vector<std::string> flags;
  // Tolerances of every run: a file from `diffcheck calibrate` (--tolerances)
  // or "calibrated" within each run (--tolerance); empty: the derived rule.
  std::string tolerances_file, tolerance;
  double timeout_seconds = 600;
  std::string json_path;
  std::string junit_path;  // one test case per mesh
  std::string html_path;   // a mesh x tap heatmap
  std::string mpirun = "mpirun";
  std::string launcher;  // e.g. "mpirun --host h1:8,h2:8 -n {n}"; empty: "<mpirun> -n {n}"
  std::string work_dir;  // trial files; empty: the system's temporary directory
  // Run only these meshes (each must be one of the sweep's); empty: all.
  std::vector<std::string> only_meshes;
  // Keep each mesh's run report (<dir>/<mesh>.json and .html, e.g. dp2_tp8.json),
  // written as soon as that mesh has run.
  std::string reports_dir;
  // Taps whose worst err/tol gets a column of the table (e.g. how a fault's
  // error grows with a mesh axis).
  std::vector<std::string> show_taps;
  // Compute no reference: each mesh runs with --no-reference and the meshes'
  // runs are compared with each other (search/sweep_mesh_against.h); the
  // mesh that leaves their consensus is named.
  bool no_reference = false;
  // List the meshes that would run (and those skipped), run nothing.
  bool dry_run = false;
  // With a fault: what each mesh must show — {"FAIL", first divergent tap},
  // {"CRASHED", ""} or {"PASS", ""} where the fault does not take effect.
  // Rows then say whether they went as expected.
  std::function<std::pair<std::string, std::string>(const Mesh&)> expected;
  // The scenario's mesh axes, in order, and its mesh check: throws InputError
  // (with the reason) for a mesh the scenario or its size cannot run on.
  std::vector<std::string> axes;
  std::function<void(const Mesh&)> check_mesh;
  // Any program instead of a scenario (search/sweep_mesh_command.h): its
  // words, {mesh} and {out} filled in per mesh; `axes` then come from --axes.
  std::vector<std::string> command;
};

// "dp=2,tp=8" -> "dp2_tp8": a mesh as a file name.
std::string mesh_file_stem(const std::string& mesh);

// Every ordered assignment of sizes (>= 1) to `axes` whose product is `ranks`.
std::vector<std::vector<int>> mesh_factorizations(int ranks, std::size_t axes);

// Prints a table to stdout; returns 0 when every mesh passes, 1 otherwise.
int sweep_mesh(const SweepMeshOptions& opts);

}  // namespace dc
