#include "harness/core/reshard.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>

#include "harness/core/error.h"

namespace dc {
namespace {

using Kind = ReshardStep::Kind;
using Axes = std::vector<std::string>;

Axes entry(const Layout& l, std::size_t d) { return d < l.spec.size() ? l.spec[d] : Axes{}; }

bool contains(const Axes& a, const std::string& x) { return std::find(a.begin(), a.end(), x) != a.end(); }

Axes minus(const Axes& a, const Axes& b) {
  Axes out;
  for (const auto& x : a)
    if (!contains(b, x)) out.push_back(x);
  return out;
}

// Blocks of dimension `dim` of a tensor: view as [outer, dim, inner].
struct DimView {
  std::size_t outer = 1, size = 1, inner = 1;
  DimView(const Shape& s, std::size_t dim) {
    for (std::size_t i = 0; i < dim; ++i) outer *= s[i];
    size = s[dim];
    for (std::size_t i = dim + 1; i < s.size(); ++i) inner *= s[i];
  }
};

// Block `b` of `n` equal blocks along `dim`.
Tensor take_block(const Tensor& x, std::size_t dim, std::size_t b, std::size_t n) {
  DimView v(x.shape, dim);
  if (v.size % n) fail("reshard: dimension {} of size {} does not split into {} blocks", dim, v.size, n);
  const std::size_t len = v.size / n;
  Shape s = x.shape;
  s[dim] = len;
  Tensor y(s);
  for (std::size_t o = 0; o < v.outer; ++o)
    std::copy(x.ptr() + (o * v.size + b * len) * v.inner, x.ptr() + (o * v.size + (b + 1) * len) * v.inner,
              y.ptr() + o * len * v.inner);
  return y;
}

// Members of rank's group over `axes`, and each member's block index in the
// spec order of `axes` (major first), which may differ from mesh order.
struct Group {
  Comm comm;
  std::vector<int> members;
  std::vector<std::size_t> block;  // by group rank
};

Group group_over(const Comm& world, const Mesh& mesh, const Axes& axes) {
  Axes mesh_order;
  for (const auto& a : mesh.axes())
    if (contains(axes, a.name)) mesh_order.push_back(a.name);
  Group g{world.split(mesh, mesh_order), mesh.group(world.rank(), mesh_order), {}};
  for (int r : g.members) g.block.push_back(static_cast<std::size_t>(mesh.index_in(r, axes)));
  return g;
}

std::size_t product(const Mesh& mesh, const Axes& axes) {
  std::size_t n = 1;
  for (const auto& a : axes) n *= static_cast<std::size_t>(mesh.axis_size(a));
  return n;
}

}  // namespace

std::string ReshardStep::str() const {
  std::string a = fmt::format("{}", fmt::join(axes, "*"));
  switch (kind) {
    case Kind::all_reduce: return fmt::format("all_reduce({})", a);
    case Kind::reduce_scatter: return fmt::format("reduce_scatter({}, dim {})", a, dim);
    case Kind::all_gather: return fmt::format("all_gather({}, dim {})", a, dim);
    case Kind::slice: return fmt::format("slice({}, dim {})", a, dim);
    default: return fmt::format("zero_unless_first({})", a);
  }
}

std::string plan_str(const ReshardPlan& plan) {
  std::vector<std::string> s;
  for (const auto& p : plan) s.push_back(p.str());
  return s.empty() ? "(nothing)" : fmt::format("{}", fmt::join(s, " -> "));
}

ReshardPlan plan_reshard_general(const Layout& from, const Layout& to, std::size_t ndim) {
  ReshardPlan plan;
  Axes reduce = minus(from.partial, to.partial);
  if (!reduce.empty()) plan.push_back({Kind::all_reduce, reduce});
  for (std::size_t d = 0; d < ndim; ++d)
    if (entry(from, d) != entry(to, d) && !entry(from, d).empty())
      plan.push_back({Kind::all_gather, entry(from, d), d});
  for (std::size_t d = 0; d < ndim; ++d)
    if (entry(from, d) != entry(to, d) && !entry(to, d).empty())
      plan.push_back({Kind::slice, entry(to, d), d});
  Axes fresh = minus(to.partial, from.partial);
  if (!fresh.empty()) plan.push_back({Kind::zero_unless_first, fresh});
  return plan;
}

ReshardPlan plan_reshard_reduce_scatter(const Layout& from, const Layout& to, std::size_t ndim) {
  // Exactly one dimension changes: unsplit in `from`, split in `to` over axes
  // that are all partial in `from`; every other dimension keeps its split.
  std::size_t changed = ndim, count = 0;
  for (std::size_t d = 0; d < ndim; ++d)
    if (entry(from, d) != entry(to, d)) {
      changed = d;
      ++count;
    }
  if (count != 1 || !entry(from, changed).empty() || !to.partial.empty())
    return plan_reshard_general(from, to, ndim);
  const Axes scatter = entry(to, changed);
  for (const auto& a : scatter)
    if (!contains(from.partial, a)) return plan_reshard_general(from, to, ndim);
  ReshardPlan plan{{Kind::reduce_scatter, scatter, changed}};
  Axes rest = minus(from.partial, scatter);
  if (!rest.empty()) plan.push_back({Kind::all_reduce, rest});
  return plan;
}

Tensor execute_reshard(const Comm& world, const Mesh& mesh, const Tensor& local,
                       const ReshardPlan& plan) {
  Tensor x = local;
  for (const auto& step : plan) {
    switch (step.kind) {
      case Kind::all_reduce: {
        Group g = group_over(world, mesh, step.axes);
        g.comm.all_reduce_sum(std::span<float>(x.data));
        break;
      }
      case Kind::reduce_scatter: {
        Group g = group_over(world, mesh, step.axes);
        const std::size_t n = g.members.size();
        // Send buffer: block for group rank j is the spec-order block g.block[j].
        std::vector<float> send;
        send.reserve(x.size());
        for (std::size_t j = 0; j < n; ++j) {
          Tensor b = take_block(x, step.dim, g.block[j], n);
          send.insert(send.end(), b.data.begin(), b.data.end());
        }
        Shape s = x.shape;
        s[step.dim] /= n;
        x = Tensor(s, g.comm.reduce_scatter_sum(std::span<const float>(send)));
        break;
      }
      case Kind::all_gather: {
        Group g = group_over(world, mesh, step.axes);
        const std::size_t n = g.members.size();
        auto all = g.comm.all_gather(std::span<const float>(x.data));
        DimView v(x.shape, step.dim);
        Shape s = x.shape;
        s[step.dim] *= n;
        Tensor y(s);
        for (std::size_t j = 0; j < n; ++j)  // piece of group rank j goes to block g.block[j]
          for (std::size_t o = 0; o < v.outer; ++o)
            std::copy(all.begin() + j * x.size() + o * v.size * v.inner,
                      all.begin() + j * x.size() + (o + 1) * v.size * v.inner,
                      y.data.begin() + (o * s[step.dim] + g.block[j] * v.size) * v.inner);
        x = std::move(y);
        break;
      }
      case Kind::slice: {
        x = take_block(x, step.dim, static_cast<std::size_t>(mesh.index_in(world.rank(), step.axes)),
                       product(mesh, step.axes));
        break;
      }
      case Kind::zero_unless_first: {
        auto c = mesh.coords(world.rank());
        for (const auto& a : step.axes)
          if (c[mesh.axis_index(a)] != 0) std::fill(x.data.begin(), x.data.end(), 0.0f);
        break;
      }
    }
  }
  return x;
}

template <class T>
BasicTensor<T> block_of_global(const BasicTensor<T>& global, const Layout& layout, const Mesh& mesh,
                               int rank) {
  if (!layout.partial.empty()) fail("block_of_global: layout {} has partial axes", layout.str());
  BasicTensor<T> x = global;
  for (std::size_t d = 0; d < layout.spec.size(); ++d) {
    if (layout.spec[d].empty()) continue;
    const std::size_t n = product(mesh, layout.spec[d]);
    const std::size_t b = static_cast<std::size_t>(mesh.index_in(rank, layout.spec[d]));
    DimView v(x.shape, d);
    const std::size_t len = v.size / n;
    Shape s = x.shape;
    s[d] = len;
    BasicTensor<T> y(s);
    for (std::size_t o = 0; o < v.outer; ++o)
      std::copy(x.ptr() + (o * v.size + b * len) * v.inner, x.ptr() + (o * v.size + (b + 1) * len) * v.inner,
                y.ptr() + o * len * v.inner);
    x = std::move(y);
  }
  return x;
}

template Tensor block_of_global(const Tensor&, const Layout&, const Mesh&, int);
template RefTensor block_of_global(const RefTensor&, const Layout&, const Mesh&, int);

}  // namespace dc
