// How a global tensor relates to per-rank pieces (the `spec` and `partial`
// strings of the activation format): which mesh axes split which dimension,
// which axes hold unreduced partial sums, and which are replicas.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "harness/core/mesh.h"
#include "harness/core/tensor.h"

namespace dc {

struct Layout {
  // One entry per leading dimension; each entry lists the mesh axes that split
  // it, major first. Empty entry = not split. Fewer entries than dimensions
  // leaves the trailing dimensions unsplit.
  std::vector<std::vector<std::string>> spec;
  std::vector<std::string> partial;
  // A tap of one pipeline stage (the `stage` attribute, "pp=1"): only the
  // ranks at coordinate `stage_index` of mesh axis `stage_axis` hold pieces of
  // it. That axis is then neither a split, a partial nor a replica axis of the
  // tap: the other stages hold other tensors (or none) under their own names.
  std::string stage_axis;
  int stage_index = -1;
  // The dimension whose blocks go to the ranks in reverse order (rank r of n
  // holds block n-1-r), or -1: a stream read from a tap's `streams` with
  // `:reversed` (torch's head-tail load balancing: each rank holds a chunk of
  // the sequence's head and the mirror chunk of its tail).
  int reversed_dim = -1;
  // The `block_order` attribute ("1:0,3,1,2"): along dimension `ordered_dim`,
  // the ranks of spec block i hold the global block block_order[i] (torch's
  // head-tail chunks split again by sequence parallelism); -1: in order.
  int ordered_dim = -1;
  std::vector<std::size_t> block_order;
  // Parses a `block_order` attribute and checks it against the mesh and the
  // spec: a permutation of that dimension's blocks. Throws InputError.
  void parse_block_order(const std::string& text, const Mesh& mesh, std::size_t ndim);

  // Parses the two strings; syntax errors only (mesh checks are in validate()).
  static Layout parse(const std::string& spec, const std::string& partial);
  static Layout replicated() { return {}; }
  // Parses a `stage` attribute ("pp=1") into stage_axis, stage_index; syntax
  // only (validate() checks it against the mesh).
  void parse_stage(const std::string& stage);
  bool staged() const { return !stage_axis.empty(); }
  std::string stage_str() const;  // "pp=1", empty when not staged
  // Whether `rank` holds a piece: every rank, unless the tap is a stage's.
  bool owns(const Mesh& mesh, int rank) const;

  std::string spec_str() const;
  std::string partial_str() const;
  std::string str() const;  // "spec | partial" for reports (", blocks reversed" where they are)

  // Throws InputError (naming the problem) if an axis is unknown to the mesh,
  // used twice, or the spec has more entries than the tensor has dimensions.
  void validate(const Mesh& mesh, std::size_t ndim) const;

  // Mesh axes that appear in neither spec nor partial (nor as the stage axis).
  std::vector<std::string> replica_axes(const Mesh& mesh) const;
  std::vector<std::string> sharded_axes() const;

  Shape global_shape(const Mesh& mesh, const Shape& local) const;
  // How many blocks dimension d is split into (the product of its spec axes' sizes; 1 if unsplit).
  std::size_t blocks(const Mesh& mesh, std::size_t d) const;
  // Block index of rank along each dimension (0 for unsplit dimensions).
  std::vector<std::size_t> block_of(const Mesh& mesh, int rank, std::size_t ndim) const;
  // Lowest rank holding the same piece as `rank` (its replica-group leader).
  int replica_leader(const Mesh& mesh, int rank) const;
  // The ranks of rank's replica group, in rank order.
  std::vector<int> replica_group(const Mesh& mesh, int rank) const;
};

// Rebuilds the global tensor: one piece per block from the leader of its
// replica group, summed in float64 over the partial axes (in rank order), placed
// at its block. `piece(r)` returns rank r's local data (numel(local) values).
std::vector<double> reassemble(const Layout& layout, const Mesh& mesh, const Shape& local,
                               const std::function<const double*(int)>& piece);

// Global row-major flat index of element `local_flat` of the piece at `block`.
std::size_t global_flat_index(const Shape& local, const Shape& global,
                              const std::vector<std::size_t>& block, std::size_t local_flat);

}  // namespace dc
