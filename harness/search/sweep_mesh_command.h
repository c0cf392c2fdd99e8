// sweep-mesh over any program (`diffcheck sweep-mesh -n 8 --axes dp,tp --
// python3 prog.py --mesh {mesh} --out {out}`): each mesh a child run of the
// command with {mesh} and {out} filled in, judged by its report or its exit
// status. A JAX program sees its N devices in one process; nothing is
// launched under mpirun unless the command does it.
#pragma once
#include <string>

#include "harness/search/sweep_mesh.h"
#include "harness/search/sweep_mesh_rows.h"

namespace dc {

// The run of `opts.command` on one mesh. `out_dir`: the directory given as
// {out}; `json`: where diffcheck.compare (Python) copies its JSON report
// (DIFFCHECK_REPORT_JSON). `run_file` is set to the rank-0 file the command
// wrote under out_dir (for --no-reference), or left empty.
MeshRow run_command_mesh(const SweepMeshOptions& opts, const Mesh& mesh, const std::string& out_dir,
                         const std::string& json, std::string& run_file);

// The words of the command with {mesh} and {out} replaced.
std::vector<std::string> command_for_mesh(const std::vector<std::string>& command, const std::string& mesh,
                                          const std::string& out_dir);

}  // namespace dc
