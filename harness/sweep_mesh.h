// diffcheck sweep-mesh: run a scenario on every mesh shape N ranks can form
// over its axes (that the problem size allows), each as a child mpirun with a
// time limit, and say which shapes fail.
#pragma once
#include <string>
#include <vector>

namespace dc {

struct SweepMeshOptions {
  std::string scenario;
  int ranks = 0;
  std::string fault, dtype = "float32", size = "default";
  std::vector<std::string> flags;
  double timeout_seconds = 600;
  std::string json_path;
  std::string mpirun = "mpirun";
};

// Every ordered assignment of sizes (>= 1) to `axes` whose product is `ranks`.
std::vector<std::vector<int>> mesh_factorizations(int ranks, std::size_t axes);

// Prints a table to stdout; returns 0 when every mesh passes, 1 otherwise.
int sweep_mesh(const SweepMeshOptions& opts);

}  // namespace dc
