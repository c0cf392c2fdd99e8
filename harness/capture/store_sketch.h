// Reading sketch taps' attributes (docs/FORMAT.md, "Sketch taps"), private
// to store: every number a hostile file could make the comparator loop over
// or allocate by is bounded here, and each refusal names file, tap and
// attribute.
#pragma once
#include <hdf5.h>

#include <string>

#include "harness/capture/activations.h"

namespace dc {

// k (rows) <= kMaxSketchRows and, since the comparator regenerates the signs
// of every global token, tokens x k <= kMaxSketchSigns.
inline constexpr long long kMaxSketchRows = 256;
inline constexpr long long kMaxSketchSigns = 1LL << 30;

// A tap's sketch attributes (when it has `sketch`): kind, seed and token
// count against the dataset's shape; local_shape becomes the sketched tensor's.
void read_sketch_attrs(hid_t ds, const std::string& where, const Mesh& mesh, TapData& t);

// One rank's counts and hash, and the attributes every rank must share with rank 0.
// `bits_hash` "-" (none) only for a tap without replicas (nothing compares it).
void read_sketch_piece(hid_t ds, const std::string& where, const Mesh& mesh, TapData& t, int rank, std::size_t world);

// A reference stored as the global sketch: for a sketch tap only, with its
// seed and global token count, shaped [lead..., k+1, width].
void check_reference_sketch(hid_t ds, const std::string& where, const TapData& t, const Shape& stored,
                            const Shape& global);

}  // namespace dc
