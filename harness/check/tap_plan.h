// How the comparator walks one tap: the blocks of the global tensor, who owns
// each, and which ranks' pieces make it (partial-sum leaders and their
// replicas), from the tap's layout and the mesh alone.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "harness/capture/activations.h"
#include "harness/core/mesh.h"

namespace dc {

// The pieces a block of the global tensor is made of: its partial-sum leaders
// (rank order, the order of the float64 sum) and each leader's replicas.
struct BlockGroup {
  int owner = 0;
  std::vector<std::size_t> block;
  std::vector<int> leaders;
  std::vector<std::vector<int>> replicas;  // per leader, without the leader
};

struct TapPlan {
  const TapData* tap = nullptr;
  Shape global;
  std::vector<BlockGroup> groups;
  bool replicated = false;  // some replica group has more than one rank
};

// Coordinates decide everything: a rank is a replica leader when its
// coordinates on the replica axes are 0, a block owner when also those on the
// partial axes are; each is O(axes) per rank.
TapPlan plan_tap(const TapData& t, const Mesh& mesh);

// The replica-group leader of `rank` for tap `t`.
int replica_leader_of(const TapData& t, const Mesh& mesh, int rank);

// Every mesh axis along which some rank of `differing` sits apart from its
// replica leader ("replicas differ across dp").
std::vector<std::string> replica_axes_apart(const TapData& t, const Mesh& mesh, const std::vector<int>& differing);

}  // namespace dc
