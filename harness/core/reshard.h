// Resharding a tensor between two layouts (spec, partial) on the mesh, built
// from the comm collectives. A plan is a list of steps so that a scenario can
// show which collectives a layout change costs, pick between plans, or drop a
// step to model a compiler that forgot one.
#pragma once
#include <string>
#include <vector>

#include "harness/core/comm.h"
#include "harness/core/layout.h"
#include "harness/core/mesh.h"
#include "harness/core/tensor.h"

namespace dc {

struct ReshardStep {
  enum class Kind {
    all_reduce,      // sum over `axes`; they become replica axes
    reduce_scatter,  // sum over `axes` and keep this rank's block of dimension `dim`
    all_gather,      // rebuild dimension `dim`, split over `axes`, on every member
    slice,           // keep this rank's block of dimension `dim` over `axes`
    zero_unless_first,  // keep the value only where the coordinates on `axes` are 0
  };
  Kind kind;
  std::vector<std::string> axes;  // major first, as in a spec entry
  std::size_t dim = 0;
  std::string str() const;
};

using ReshardPlan = std::vector<ReshardStep>;

// Always applicable: reduce the partial axes that go away (all-reduce), gather
// every dimension whose split changes, slice to the target, zero new partials.
ReshardPlan plan_reshard_general(const Layout& from, const Layout& to, std::size_t ndim);

// The cheaper lowering when partial axes move onto one unsplit dimension:
// reduce-scatter over those axes along that dimension, then all-reduce over the
// partial axes that become replicas. Falls back to the general plan otherwise.
ReshardPlan plan_reshard_reduce_scatter(const Layout& from, const Layout& to, std::size_t ndim);

std::string plan_str(const ReshardPlan& plan);

// Runs the plan on this rank's piece (collective over `world`).
Tensor execute_reshard(const Comm& world, const Mesh& mesh, const Tensor& local,
                       const ReshardPlan& plan);

// The piece `rank` holds of a global tensor under a layout without partial axes.
template <class T>
BasicTensor<T> block_of_global(const BasicTensor<T>& global, const Layout& layout, const Mesh& mesh,
                               int rank);

}  // namespace dc
