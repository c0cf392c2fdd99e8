// An activation file in memory, as the comparator sees it: the mesh, every
// tap's per-rank pieces and attributes, and its reference when there is one.
// Produced by store (from a run file or from rank files); the comparator never
// knows which scenario, or which framework, wrote it.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/core/layout.h"
#include "harness/core/mesh.h"
#include "harness/core/tensor.h"

namespace dc {

enum class StoredKind { float16, float32, float64, integer };

std::string stored_kind_name(StoredKind k);

struct TapData {
  std::string name;
  Layout layout;
  std::optional<long> order;  // the `order` attribute
  long visit_index = 0;       // creation order when tracked, else name order
  std::string dtype;          // logical dtype (`dtype` attribute or the stored type)
  StoredKind stored = StoredKind::float32;
  std::optional<double> atol, rtol;
  std::optional<long> reduction_depth;
  Shape local_shape;
  std::vector<std::vector<double>> pieces;  // [world_size][numel(local_shape)]
  std::optional<RefTensor> reference;
};

struct ActivationSet {
  std::string source;  // the file (run file) or prefix (rank files) that was read
  Mesh mesh;
  int world_size = 1;
  std::map<std::string, std::string> info;  // optional root attributes, as text
  std::vector<TapData> taps;                // in comparison order
};

}  // namespace dc
