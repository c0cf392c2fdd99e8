// sweep-mesh --no-reference: the meshes' runs, none with a reference,
// compared with each other (`diffcheck compare RUN --against ...`, a child)
// and the mesh that leaves the consensus named; a row's verdict is then its
// own checks' (NaN/Inf, replicas) and the comparison's.
#pragma once
#include <string>
#include <vector>

#include "harness/search/sweep_mesh_rows.h"

namespace dc {

// `files[i]` is row i's run file ("" where the run left none: a crash, a
// hang). Marks the rows that leave the consensus (or that part where there
// is none) FAIL at that tap. Returns a line for the table's header.
std::string compare_meshes(const SweepMeshOptions& opts, const std::vector<std::string>& files,
                           const std::string& json_path, std::vector<MeshRow>& rows);

// With a fault and no reference, what each row must show: where the meshes
// the fault does not reach are more than half of those compared, a mesh it
// reaches leaves the consensus at its first tap and the others pass; else no
// run can be told wrong, and any verdict of the comparison is as expected.
// Rows expected to crash or hang keep what the sweep expected of them.
void hold_to_expectation_against(const SweepMeshOptions& opts, std::vector<MeshRow>& rows);

}  // namespace dc
