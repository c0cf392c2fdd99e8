#include "harness/check/chunks.h"

#include <algorithm>

namespace dc {

ChunkPlan::ChunkPlan(const Shape& shape, std::size_t max_elements) : shape_(shape) {
  const std::size_t n = numel(shape);
  if (n == 0) return;  // zero-size: nothing to walk
  if (shape.empty()) {  // a scalar
    count_ = 1;
    return;
  }
  max_elements = std::max<std::size_t>(max_elements, 1);
  // The outermost dimension whose inner block still fits; if even one
  // innermost row does not fit, cut the innermost dimension.
  std::size_t inner = n;
  split_dim_ = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    inner /= shape[d];  // elements of one index of dimension d
    split_dim_ = d;
    if (inner <= max_elements) break;
  }
  step_ = std::max<std::size_t>(1, max_elements / inner);
  step_ = std::min(step_, shape[split_dim_]);
  per_row_ = (shape[split_dim_] + step_ - 1) / step_;
  std::size_t rows = 1;
  for (std::size_t d = 0; d < split_dim_; ++d) rows *= shape[d];
  count_ = rows * per_row_;
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
