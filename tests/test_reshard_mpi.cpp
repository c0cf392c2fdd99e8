// Reshard between (spec, partial) pairs at the rank count ctest launches,
// checked against the global value: every rank all-gathers the result pieces
// and rebuilds the global tensor with the target layout.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "harness/core/comm.h"
#include "harness/core/reshard.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "tests/mpi_world.h"

using namespace dc;

namespace {
// Meshes of the current world size with axes a, b, c (some of size 1).
std::vector<Mesh> meshes() {
  const int n = world().size();
  std::vector<Mesh> out;
  for (int a = 1; a <= n; ++a)
    for (int b = 1; a * b <= n; ++b)
      if (n % (a * b) == 0) out.push_back(Mesh::parse(fmt::format("a={},b={},c={}", a, b, n / (a * b))));
  return out;
}

// This rank's piece of global G under `l`: its block, and for partial axes a
// share that makes the pieces sum to G (rank-dependent weights).
Tensor make_piece(const RefTensor& g, const Layout& l, const Mesh& mesh, int rank) {
  Layout plain = l;
  plain.partial.clear();
  RefTensor b = block_of_global(g, plain, mesh, rank);
  double share = 1.0;
  if (!l.partial.empty()) {
    const int n = static_cast<int>(mesh.group(rank, l.partial).size());
    const int i = mesh.index_in(rank, l.partial);
    share = 2.0 * (i + 1) / (n * (n + 1.0));  // sums to 1 over the group
  }
  Tensor t(b.shape);
  for (std::size_t k = 0; k < b.size(); ++k) t.data[k] = static_cast<float>(b.data[k] * share);
  return t;
}

void check_pair(const std::string& fs, const std::string& fp, const std::string& ts,
                const std::string& tp, bool reduce_scatter_plan) {
  for (const Mesh& mesh : meshes()) {
    Layout from = Layout::parse(fs, fp), to = Layout::parse(ts, tp);
    const Shape global{12, 6, 4};  // divisible by every axis size up to 4 here
    bool fits = true;
    for (const Layout* l : {&from, &to})
      for (std::size_t d = 0; d < l->spec.size(); ++d) {
        std::size_t n = 1;
        for (const auto& a : l->spec[d]) n *= mesh.axis_size(a);
        if (global[d] % n) fits = false;
      }
    if (!fits) continue;
    RefTensor g = ref::to_ref(ref::generate(5, "g", global, 1.0f));
    Tensor mine = make_piece(g, from, mesh, world().rank());
    auto plan = reduce_scatter_plan ? plan_reshard_reduce_scatter(from, to, 3)
                                    : plan_reshard_general(from, to, 3);
    Tensor out = execute_reshard(world(), mesh, mine, plan);
    auto all = world().all_gather(std::span<const float>(out.data));
    std::vector<std::vector<double>> pieces(world().size());
    for (int r = 0; r < world().size(); ++r)
      pieces[r].assign(all.begin() + r * out.size(), all.begin() + (r + 1) * out.size());
    auto rebuilt = reassemble(to, mesh, out.shape, [&](int r) { return pieces[r].data(); });
    ASSERT_EQ(rebuilt.size(), g.size()) << mesh.str() << " " << plan_str(plan);
    double worst = 0;
    for (std::size_t k = 0; k < g.size(); ++k) worst = std::max(worst, std::abs(rebuilt[k] - g.data[k]));
    EXPECT_LT(worst, 1e-5) << "mesh " << mesh.str() << " from (" << fs << "|" << fp << ") to (" << ts
                           << "|" << tp << ") via " << plan_str(plan);
  }
}
}  // namespace

TEST(Reshard, ShardedToReplicated) { check_pair("a,b,c", "", "", "", false); }
TEST(Reshard, MoveSplitBetweenDims) { check_pair("a*b,-,c", "", "c,b*a,-", "", false); }
TEST(Reshard, PartialToReplicated) { check_pair("", "a*b*c", "", "", false); }
TEST(Reshard, PartialToSharded) { check_pair("-,c", "a*b", "a*b,c", "", false); }
TEST(Reshard, ReplicatedToPartial) { check_pair("a", "", "a", "b*c", false); }
TEST(Reshard, UnreducedToMixedViaReduceScatter) {
  // the unreduced_reshard shape: partial over a*b*c, target splits dim 0 over b*c, a replicated
  check_pair("-,-,c", "a*b", "b,-,c", "", true);
  check_pair("", "a*b*c", "b*c", "", true);
}
TEST(Reshard, PlansAreWhatTheyClaim) {
  auto p = plan_reshard_reduce_scatter(Layout::parse("-,tp", "dp*fsdp*sp"), Layout::parse("fsdp*sp,tp", ""), 2);
  EXPECT_EQ(plan_str(p), "reduce_scatter(fsdp*sp, dim 0) -> all_reduce(dp)");
  auto g = plan_reshard_general(Layout::parse("-,tp", "dp*fsdp*sp"), Layout::parse("fsdp*sp,tp", ""), 2);
  EXPECT_EQ(plan_str(g), "all_reduce(dp*fsdp*sp) -> slice(fsdp*sp, dim 0)");
}
