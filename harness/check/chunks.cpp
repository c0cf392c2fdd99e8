#include "harness/check/chunks.h"

#include <algorithm>

namespace dc {

namespace {

// Where a plan with `max_elements` per chunk cuts: the outermost dimension
// whose inner block still fits (if even one innermost row does not fit, the
// innermost dimension), how many of its indices go in a chunk, and the
// elements of one index.
struct Cut {
  std::size_t dim = 0, step = 1, inner = 1;
};

Cut cut(const Shape& shape, std::size_t max_elements) {
  Cut c;
  max_elements = std::max<std::size_t>(max_elements, 1);
  std::size_t inner = numel(shape);
  for (std::size_t d = 0; d < shape.size(); ++d) {
    inner /= shape[d];
    c.dim = d;
    if (inner <= max_elements) break;
  }
  c.inner = inner;
  c.step = std::min(std::max<std::size_t>(1, max_elements / inner), shape[c.dim]);
  return c;
}

}  // namespace

ChunkPlan::ChunkPlan(const Shape& shape, std::size_t max_elements, std::size_t unit_elements)
    : shape_(shape) {
  const std::size_t n = numel(shape);
  unit_row_ = unit_step_ = std::max<std::size_t>(n, 1);
  if (n == 0) return;  // zero-size: nothing to walk
  if (shape.empty()) {  // a scalar
    count_ = 1;
    return;
  }
  const Cut unit = cut(shape, unit_elements);
  unit_row_ = shape[unit.dim] * unit.inner;
  unit_step_ = unit.step * unit.inner;
  Cut c = cut(shape, std::max(max_elements, unit_elements));
  // A larger limit never cuts a deeper dimension; on the same dimension the
  // step becomes a multiple of the unit's (or the whole dimension), so every
  // chunk is a whole number of units.
  if (c.dim == unit.dim && c.step < shape[c.dim]) c.step = std::max(unit.step, c.step / unit.step * unit.step);
  split_dim_ = c.dim;
  step_ = c.step;
  per_row_ = (shape[split_dim_] + step_ - 1) / step_;
  std::size_t rows = 1;
  for (std::size_t d = 0; d < split_dim_; ++d) rows *= shape[d];
  count_ = rows * per_row_;
}

std::size_t ChunkPlan::unit_left(std::size_t flat) const {
  const std::size_t in_row = flat % unit_row_;
  return std::min(unit_step_ - in_row % unit_step_, unit_row_ - in_row);
}

Slab ChunkPlan::slab(std::size_t i) const {
  Slab s{Shape(shape_.size(), 0), shape_};
  if (shape_.empty()) return s;
  std::size_t row = i / per_row_, part = i % per_row_;
  for (std::size_t d = split_dim_; d-- > 0;) {
    s.start[d] = row % shape_[d];
    s.count[d] = 1;
    row /= shape_[d];
  }
  s.start[split_dim_] = part * step_;
  s.count[split_dim_] = std::min(step_, shape_[split_dim_] - s.start[split_dim_]);
  return s;
}

std::size_t ChunkPlan::first_flat(std::size_t i) const {
  if (shape_.empty()) return 0;
  Slab s = slab(i);
  std::size_t f = 0;
  for (std::size_t d = 0; d < shape_.size(); ++d) f = f * shape_[d] + s.start[d];
  return f;
}

Slab to_global(const Slab& local, const Shape& local_shape, const std::vector<std::size_t>& block) {
  Slab g = local;
  for (std::size_t d = 0; d < g.start.size(); ++d) g.start[d] += block[d] * local_shape[d];
  return g;
}

}  // namespace dc
