#include "harness/capture/tap.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <sstream>

#include "harness/core/error.h"
#include "harness/core/progress.h"

namespace dc {

std::map<std::string, std::vector<HeldBox>> all_reference_boxes(const Comm& world, const TapRecorder& taps) {
  std::string mine;  // "name\tstart\tshape" per box
  for (const auto& [name, part] : taps.references())
    for (const auto& b : part.blocks)
      mine += fmt::format("{}\t{}\t{}\n", name, fmt::join(b.start, ","), fmt::join(b.data.shape, ","));
  const auto all = world.all_gather_strings(mine);
  auto dims = [](const std::string& text) {
    Shape out;
    std::stringstream ds(text);
    for (std::string d; std::getline(ds, d, ',');) out.push_back(std::stoull(d));
    return out;
  };
  std::map<std::string, std::vector<HeldBox>> boxes;
  for (std::size_t r = 0; r < all.size(); ++r) {
    std::stringstream ss(all[r]);
    for (std::string line; std::getline(ss, line);) {
      std::vector<std::string> f;
      std::stringstream ls(line);
      for (std::string x; std::getline(ls, x, '\t');) f.push_back(x);
      f.resize(3);
      boxes[f[0]].push_back({static_cast<int>(r), dims(f[1]), dims(f[2])});
    }
  }
  return boxes;
}

void validate_tap_name(const std::string& name) {
  if (name.empty() || name.front() == '/' || name.back() == '/' ||
      name.find("//") != std::string::npos || name.find('.') == 0)
    fail("tap name '{}' is not a path of non-empty parts separated by '/'", name);
}

TapRecorder::TapRecorder(Mesh mesh, int rank, DType dtype, int reference_rank)
    : mesh_(std::move(mesh)), rank_(rank), dtype_(dtype), reference_rank_(reference_rank) {}

void TapRecorder::tap(const std::string& name, Tensor local, TapOptions opts) {
  validate_tap_name(name);
  if (all_recorded_)
    fail("rank {}: tap '{}' recorded after the scenario said every tap was (TapRecorder::all_taps_recorded)", rank_,
         name);
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
  records_.push_back(TapRecord{name, std::move(local), std::move(opts), order});
  progress::recorded_tap(name);
  if (on_tap_) on_tap_(name);
}

void TapRecorder::all_taps_recorded() {
  if (all_recorded_) fail("rank {}: the scenario said twice that every tap was recorded", rank_);
  all_recorded_ = true;
  if (on_all_taps_recorded_) on_all_taps_recorded_();
}

void TapRecorder::reference(const std::string& name, const RefTensor& global) {
  if (!is_reference_rank()) return;
  reference_block(name, global.shape, std::vector<std::size_t>(global.shape.size(), 0), global);
}

std::vector<std::size_t> TapRecorder::my_reference_rows(std::size_t n) const {
  std::vector<std::size_t> rows;
  const auto world = static_cast<std::size_t>(mesh_.world_size());
  for (std::size_t r = static_cast<std::size_t>(rank_); r < n; r += world) rows.push_back(r);
  return rows;
}

void TapRecorder::reference_rows(const std::string& name, const Shape& global, std::size_t first_row,
                                 const RefTensor& rows) {
  if (global.empty()) fail("rank {}: reference rows of tap '{}': a scalar has no rows", rank_, name);
  Shape want = global;
  want[0] = rows.shape.empty() ? 0 : rows.shape[0];
  if (rows.shape != want)
    fail("rank {}: reference rows of tap '{}': shape {} at row {} does not fit {}", rank_, name,
         shape_str(rows.shape), first_row, shape_str(global));
  std::vector<std::size_t> start(global.size(), 0);
  start[0] = first_row;
  reference_block(name, global, std::move(start), rows);
}

void TapRecorder::reference_row(const std::string& name, std::size_t n, std::size_t row,
                                const RefTensor& item) {
  Shape global = item.shape, one = item.shape;
  global.insert(global.begin(), n);
  one.insert(one.begin(), 1);
  reference_rows(name, global, row, RefTensor(one, item.data));
}

void TapRecorder::reference_block(const std::string& name, const Shape& global, std::vector<std::size_t> start,
                                  RefTensor block) {
  validate_tap_name(name);
  if (no_reference_)
    fail("rank {}: reference of tap '{}' computed in a run with --no-reference: the scenario's reference code must "
         "begin with `if (ctx.taps.references_cached()) return;`",
         rank_, name);
  if (references_cached_)
    fail("rank {}: reference of tap '{}' computed although the run's references came from the reference cache: "
         "the scenario's reference code must begin with `if (ctx.taps.references_cached()) return;`",
         rank_, name);
  const auto where = [&] {
    std::string s;
    for (auto x : start) s += fmt::format("{}{}", s.empty() ? "" : ",", x);
    return "[" + s + "]";
  };
  bool fits = block.shape.size() == global.size() && start.size() == global.size() && block.size() == numel(block.shape);
  for (std::size_t k = 0; fits && k < global.size(); ++k) fits = start[k] + block.shape[k] <= global[k];
  if (!fits)
    fail("rank {}: reference block of tap '{}': shape {} at {} does not fit {}", rank_, name,
         shape_str(block.shape), where(), shape_str(global));
  auto [it, fresh] = references_.try_emplace(name, ReferencePart{global, {}});
  if (!fresh && it->second.global != global)
    fail("rank {}: reference of tap '{}' recorded with shapes {} and {}", rank_, name,
         shape_str(it->second.global), shape_str(global));
  auto& blocks = it->second.blocks;
  const auto overlaps = [&](const ReferenceBlock& b) {
    for (std::size_t k = 0; k < global.size(); ++k)
      if (start[k] >= b.start[k] + b.data.shape[k] || b.start[k] >= start[k] + block.shape[k]) return false;
    return numel(block.shape) > 0 && b.data.size() > 0;
  };
  if (global.empty() ? !blocks.empty() : std::any_of(blocks.begin(), blocks.end(), overlaps))
    fail("rank {}: reference of tap '{}' recorded twice (block at {})", rank_, name, where());
  auto at = std::find_if(blocks.begin(), blocks.end(), [&](const auto& b) { return b.start > start; });
  blocks.insert(at, ReferenceBlock{std::move(start), std::move(block)});
}

void TapRecorder::keep_reference_value(const std::string& name, RefTensor value) {
  if (!kept_.try_emplace(name, std::move(value)).second)
    fail("rank {}: reference value '{}' kept twice", rank_, name);
}

const RefTensor& TapRecorder::kept_reference_value(const std::string& name) const {
  auto it = kept_.find(name);
  if (it == kept_.end())
    fail("rank {}: reference value '{}' was never kept (the reference code that computes it must keep it)", rank_,
         name);
  return it->second;
}

}  // namespace dc
