#include "harness/core/layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "harness/core/error.h"
#include "harness/core/text.h"

namespace dc {
namespace {

std::vector<std::string> parse_axes(const std::string& entry, const std::string& what) {
  std::vector<std::string> axes;
  for (auto& a : split(entry, '*')) {
    a = trim(a);
    if (!valid_axis_name(a)) input_error("{}: '{}' is not a mesh axis name", what, a);
    axes.push_back(a);
  }
  return axes;
}

}  // namespace

Layout Layout::parse(const std::string& spec, const std::string& partial) {
  Layout l;
  if (!trim(spec).empty()) {
    for (auto& entry : split(spec, ',')) {
      entry = trim(entry);
      if (entry == "-" || entry.empty()) {
        l.spec.emplace_back();
      } else {
        l.spec.push_back(parse_axes(entry, fmt::format("spec '{}'", spec)));
      }
    }
  }
  if (!trim(partial).empty()) l.partial = parse_axes(trim(partial), fmt::format("partial '{}'", partial));
  return l;
}

void Layout::parse_stage(const std::string& stage) {
  const auto eq = stage.find('=');
  const std::string axis = trim(stage.substr(0, eq));
  if (eq == std::string::npos || !valid_axis_name(axis))
    input_error("stage '{}' is not <mesh axis>=<coordinate> (e.g. pp=1)", stage);
  const std::string index = trim(stage.substr(eq + 1));
  std::size_t used = 0;
  long value = -1;
  try {
    value = std::stol(index, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != index.size() || value < 0)
    input_error("stage '{}': '{}' is not a coordinate (an integer >= 0)", stage, index);
  stage_axis = axis;
  stage_index = static_cast<int>(value);
}

std::string Layout::stage_str() const {
  return staged() ? fmt::format("{}={}", stage_axis, stage_index) : std::string();
}

bool Layout::owns(const Mesh& mesh, int rank) const {
  if (!staged()) return true;
  return mesh.coords(rank)[static_cast<std::size_t>(mesh.axis_index(stage_axis))] == stage_index;
}

std::string Layout::spec_str() const {
  std::vector<std::string> entries;
  for (const auto& e : spec) entries.push_back(e.empty() ? "-" : fmt::format("{}", fmt::join(e, "*")));
  return fmt::format("{}", fmt::join(entries, ","));
}

std::string Layout::partial_str() const { return fmt::format("{}", fmt::join(partial, "*")); }

std::string Layout::str() const {
  std::string s = spec.empty() ? "replicated" : spec_str();
  if (!partial.empty()) s += " partial=" + partial_str();
  if (staged()) s += " stage " + stage_str();
  if (reversed_dim >= 0) s += fmt::format(" (dim {} reversed)", reversed_dim);
  // (the block order is of the one dimension it names: the spec says which it splits)
  if (ordered_dim >= 0) s += fmt::format(" (blocks {})", fmt::join(block_order, ","));
  return s;
}

void Layout::validate(const Mesh& mesh, std::size_t ndim) const {
  if (spec.size() > ndim)
    input_error("spec '{}' has {} entries but the tensor has {} dimensions", spec_str(), spec.size(),
                ndim);
  std::set<std::string> seen;
  auto check = [&](const std::string& a, const char* where) {
    if (mesh.axis_index(a) < 0)
      input_error("{} names axis '{}' which is not in mesh {}", where, a, mesh.str());
    if (!seen.insert(a).second)
      input_error("axis '{}' appears more than once across spec '{}' and partial '{}'", a,
                  spec_str(), partial_str());
  };
  for (const auto& e : spec)
    for (const auto& a : e) check(a, "spec");
  for (const auto& a : partial) check(a, "partial");
  if (staged()) {
    check(stage_axis, "stage");
    const int size = mesh.axis_size(stage_axis);
    if (stage_index >= size)
      input_error("stage '{}': axis '{}' has {} coordinates (0 to {})", stage_str(), stage_axis, size, size - 1);
  }
}

std::vector<std::string> Layout::sharded_axes() const {
  std::vector<std::string> out;
  for (const auto& e : spec) out.insert(out.end(), e.begin(), e.end());
  return out;
}

std::vector<std::string> Layout::replica_axes(const Mesh& mesh) const {
  auto used = sharded_axes();
  used.insert(used.end(), partial.begin(), partial.end());
  if (staged()) used.push_back(stage_axis);
  std::vector<std::string> out;
  for (const auto& a : mesh.axes())
    if (std::find(used.begin(), used.end(), a.name) == used.end()) out.push_back(a.name);
  return out;
}

std::size_t Layout::blocks(const Mesh& mesh, std::size_t d) const {
  std::size_t n = 1;
  if (d < spec.size())
    for (const auto& a : spec[d]) n *= static_cast<std::size_t>(mesh.axis_size(a));
  return n;
}

Shape Layout::global_shape(const Mesh& mesh, const Shape& local) const {
  Shape g = local;
  for (std::size_t d = 0; d < spec.size() && d < g.size(); ++d) g[d] *= blocks(mesh, d);
  return g;
}

std::vector<std::size_t> Layout::block_of(const Mesh& mesh, int rank, std::size_t ndim) const {
  std::vector<std::size_t> b(ndim, 0);
  for (std::size_t d = 0; d < spec.size() && d < ndim; ++d) {
    b[d] = static_cast<std::size_t>(mesh.index_in(rank, spec[d]));
    if (static_cast<int>(d) == reversed_dim) b[d] = blocks(mesh, d) - 1 - b[d];
    if (static_cast<int>(d) == ordered_dim) b[d] = block_order.at(b[d]);
  }
  return b;
}

void Layout::parse_block_order(const std::string& text, const Mesh& mesh, std::size_t ndim) {
  const auto colon = text.find(':');
  const std::string form = "'<dimension>:<the global block of each spec block>' (e.g. '1:0,3,1,2')";
  std::size_t used = 0;
  long dim = -1;
  try {
    dim = std::stol(text.substr(0, colon), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (colon == std::string::npos || used != colon || dim < 0 || static_cast<std::size_t>(dim) >= ndim ||
      static_cast<std::size_t>(dim) >= spec.size() || spec[static_cast<std::size_t>(dim)].empty())
    input_error("block_order '{}': expected {} naming a dimension the spec '{}' splits", text, form, spec_str());
  const std::size_t count = blocks(mesh, static_cast<std::size_t>(dim));
  std::vector<std::size_t> order;
  for (const auto& entry : split(text.substr(colon + 1), ',')) {
    const std::string e = trim(entry);
    if (e.empty() || e.size() > 9 || e.find_first_not_of("0123456789") != std::string::npos)
      input_error("block_order '{}': '{}' is not a block index; expected {}", text, e, form);
    order.push_back(std::stoul(e));
  }
  std::vector<bool> seen(count, false);
  for (std::size_t b : order) {
    if (b >= count || seen[b] || order.size() != count)
      input_error("block_order '{}': not a permutation of the {} blocks of dimension {} (spec '{}')", text, count,
                  dim, spec_str());
    seen[b] = true;
  }
  ordered_dim = static_cast<int>(dim);
  block_order = std::move(order);
}

std::vector<int> Layout::replica_group(const Mesh& mesh, int rank) const {
  return mesh.group(rank, replica_axes(mesh));
}

int Layout::replica_leader(const Mesh& mesh, int rank) const {
  return replica_group(mesh, rank).front();
}

std::size_t global_flat_index(const Shape& local, const Shape& global,
                              const std::vector<std::size_t>& block, std::size_t local_flat) {
  std::size_t g = 0;
  std::size_t rem = local_flat;
  std::size_t local_stride = numel(local);
  for (std::size_t d = 0; d < local.size(); ++d) {
    local_stride /= local[d];
    std::size_t i = rem / local_stride;
    rem %= local_stride;
    g = g * global[d] + block[d] * local[d] + i;
  }
  return g;
}

std::vector<double> reassemble(const Layout& layout, const Mesh& mesh, const Shape& local,
                               const std::function<const double*(int)>& piece) {
  Shape global = layout.global_shape(mesh, local);
  std::vector<double> out(numel(global), 0.0);
  const std::size_t n = numel(local);
  // Leaders are exactly the ranks whose replica coordinates are all 0; visiting
  // them in rank order fixes the summation order over the partial axes.
  for (int r = 0; r < mesh.world_size(); ++r) {
    if (!layout.owns(mesh, r) || layout.replica_leader(mesh, r) != r) continue;
    const double* src = piece(r);
    auto block = layout.block_of(mesh, r, local.size());
    if (local.empty()) {
      out[0] += src[0];
      continue;
    }
    // Copy contiguous rows of the innermost dimension.
    const std::size_t row = local.back();
    for (std::size_t i = 0; i < n; i += row) {
      std::size_t g = global_flat_index(local, global, block, i);
      for (std::size_t j = 0; j < row; ++j) out[g + j] += src[i + j];
    }
  }
  return out;
}

}  // namespace dc
