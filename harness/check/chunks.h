// How a tensor is walked in bounded memory: contiguous row-major chunks of at
// most `max_elements` elements, each a hyperslab (a box), so a reader can
// fetch it with one HDF5 selection and a block's chunk maps onto the global
// tensor as a box too. The plan depends only on the shape and the limits.
//
// Sums (rel L2, RMS) are taken per summation unit, the chunks of the plan with
// `unit_elements` as its limit: each chunk of a plan is a whole number of
// units, so the units, and the sums, do not depend on the chunk size.
#pragma once
#include <cstddef>

#include "harness/capture/activations.h"

namespace dc {

class ChunkPlan {
 public:
  // Chunks of at most max(max_elements, one unit) elements.
  ChunkPlan(const Shape& shape, std::size_t max_elements, std::size_t unit_elements = 1);
  std::size_t count() const { return count_; }
  // Chunk `i` as a box in the tensor's coordinates, and its first flat index.
  Slab slab(std::size_t i) const;
  std::size_t first_flat(std::size_t i) const;
  // Elements from flat index `flat` to the end of its summation unit.
  std::size_t unit_left(std::size_t flat) const;

 private:
  Shape shape_;
  std::size_t split_dim_ = 0;  // the dimension chunks cut; dimensions after it are whole
  std::size_t step_ = 1;       // elements of split_dim_ per chunk
  std::size_t per_row_ = 1;    // chunks per index of the dimensions before split_dim_
  std::size_t count_ = 0;
  std::size_t unit_row_ = 1, unit_step_ = 1;  // elements per index of the unit's split dimension
};

// Shifts a box of a local piece to where block `block` places it globally.
Slab to_global(const Slab& local, const Shape& local_shape, const std::vector<std::size_t>& block);

}  // namespace dc
