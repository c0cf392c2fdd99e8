#include "harness/capture/tap.h"

#include <algorithm>

#include "harness/core/error.h"
#include "harness/core/progress.h"

namespace dc {

void validate_tap_name(const std::string& name) {
  if (name.empty() || name.front() == '/' || name.back() == '/' ||
      name.find("//") != std::string::npos || name.find('.') == 0)
    fail("tap name '{}' is not a path of non-empty parts separated by '/'", name);
}

TapRecorder::TapRecorder(Mesh mesh, int rank, DType dtype, int reference_rank)
    : mesh_(std::move(mesh)), rank_(rank), dtype_(dtype), reference_rank_(reference_rank) {}

void TapRecorder::tap(const std::string& name, const Tensor& local, TapOptions opts) {
  validate_tap_name(name);
  if (std::any_of(records_.begin(), records_.end(), [&](const auto& r) { return r.name == name; }))
    fail("rank {}: tap '{}' recorded twice", rank_, name);
  if (local.size() != numel(local.shape))
    fail("rank {}: tap '{}' has {} values for shape {}", rank_, name, local.size(),
         shape_str(local.shape));
  try {
    opts.layout.validate(mesh_, local.rank());
  } catch (const InputError& e) {
    fail("rank {}: tap '{}': {}", rank_, name, e.what());
  }
  int order = static_cast<int>(records_.size());
  records_.push_back(TapRecord{name, local, std::move(opts), order});
  progress::recorded_tap(name);
  if (on_tap_) on_tap_(name);
}

void TapRecorder::reference(const std::string& name, const RefTensor& global) {
  if (!is_reference_rank()) return;
  validate_tap_name(name);
  if (!references_.emplace(name, ReferencePart{global.shape, {{0, global}}}).second)
    fail("rank {}: reference of tap '{}' recorded twice", rank_, name);
}

std::vector<std::size_t> TapRecorder::my_reference_rows(std::size_t n) const {
  std::vector<std::size_t> rows;
  const auto world = static_cast<std::size_t>(mesh_.world_size());
  for (std::size_t r = static_cast<std::size_t>(rank_); r < n; r += world) rows.push_back(r);
  return rows;
}

void TapRecorder::reference_rows(const std::string& name, const Shape& global, std::size_t first_row,
                                 const RefTensor& rows) {
  validate_tap_name(name);
  if (global.empty()) fail("rank {}: reference rows of tap '{}': a scalar has no rows", rank_, name);
  Shape want = global;
  want[0] = rows.shape.empty() ? 0 : rows.shape[0];
  if (rows.shape != want || first_row + want[0] > global[0])
    fail("rank {}: reference rows of tap '{}': shape {} at row {} does not fit {}", rank_, name,
         shape_str(rows.shape), first_row, shape_str(global));
  auto [it, fresh] = references_.try_emplace(name, ReferencePart{global, {}});
  if (!fresh && it->second.global != global)
    fail("rank {}: reference of tap '{}' recorded with shapes {} and {}", rank_, name,
         shape_str(it->second.global), shape_str(global));
  auto& blocks = it->second.blocks;
  for (const auto& b : blocks)
    if (first_row < b.first_row + b.rows.shape[0] && b.first_row < first_row + want[0])
      fail("rank {}: reference rows of tap '{}' recorded twice (row {})", rank_, name, first_row);
  auto at = std::find_if(blocks.begin(), blocks.end(), [&](const auto& b) { return b.first_row > first_row; });
  blocks.insert(at, ReferenceRows{first_row, rows});
}

void TapRecorder::reference_row(const std::string& name, std::size_t n, std::size_t row,
                                const RefTensor& item) {
  Shape global = item.shape, one = item.shape;
  global.insert(global.begin(), n);
  one.insert(one.begin(), 1);
  reference_rows(name, global, row, RefTensor(one, item.data));
}

}  // namespace dc
