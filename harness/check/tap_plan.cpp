#include "harness/check/tap_plan.h"

#include <algorithm>

namespace dc {

TapPlan plan_tap(const TapData& t, const Mesh& mesh) {
  TapPlan p;
  p.tap = &t;
  p.global = t.layout.global_shape(mesh, t.local_shape);
  std::vector<bool> is_replica_axis(mesh.axes().size(), false), is_partial_axis = is_replica_axis;
  for (const auto& a : t.layout.replica_axes(mesh)) {
    is_replica_axis[mesh.axis_index(a)] = true;
    p.replicated = p.replicated || mesh.axis_size(a) > 1;
  }
  for (const auto& a : t.layout.partial) is_partial_axis[mesh.axis_index(a)] = true;
  const auto replica_axes = t.layout.replica_axes(mesh);
  for (int r = 0; r < mesh.world_size(); ++r) {
    if (!t.layout.owns(mesh, r)) continue;  // another pipeline stage's rank
    auto c = mesh.coords(r);
    bool owner = true;
    for (std::size_t i = 0; i < c.size() && owner; ++i)
      owner = c[i] == 0 || (!is_replica_axis[i] && !is_partial_axis[i]);
    if (!owner) continue;
    BlockGroup g;
    g.owner = r;
    g.block = t.layout.block_of(mesh, r, t.local_shape.size());
    g.leaders = mesh.group(r, t.layout.partial);
    for (int l : g.leaders) {
      auto reps = mesh.group(l, replica_axes);
      reps.erase(std::remove(reps.begin(), reps.end(), l), reps.end());
      g.replicas.push_back(std::move(reps));
    }
    p.groups.push_back(std::move(g));
  }
  return p;
}

int replica_leader_of(const TapData& t, const Mesh& mesh, int rank) {
  auto c = mesh.coords(rank);
  for (const auto& a : t.layout.replica_axes(mesh)) c[mesh.axis_index(a)] = 0;
  return mesh.rank_of(c);
}

std::vector<std::string> replica_axes_apart(const TapData& t, const Mesh& mesh, const std::vector<int>& differing) {
  std::vector<bool> apart(mesh.axes().size(), false);
  for (int r : differing) {
    auto a = mesh.coords(replica_leader_of(t, mesh, r)), b = mesh.coords(r);
    for (std::size_t i = 0; i < a.size(); ++i) apart[i] = apart[i] || a[i] != b[i];
  }
  std::vector<std::string> axes;
  for (std::size_t i = 0; i < apart.size(); ++i)
    if (apart[i]) axes.push_back(mesh.axes()[i].name);
  return axes;
}

}  // namespace dc
