// An activation file as the comparator sees it: the mesh, every tap's layout,
// shapes and attributes — and a way to stream its data. The values are not
// held here: `ActivationSet::data` reads any hyperslab of any rank's piece, or
// of a tap's reference, on demand, so a checker can walk a tensor far larger
// than memory in bounded chunks. Produced by store (from a run file or from
// rank files) or built in memory (tests, small tools); the comparator never
// knows which scenario, or which framework, wrote it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/core/comm.h"
#include "harness/core/layout.h"
#include "harness/core/mesh.h"
#include "harness/core/tensor.h"

namespace dc {

enum class StoredKind { float16, float32, float64, integer };

std::string stored_kind_name(StoredKind k);

struct TapData;
// The reference's stored kind when it is no wider than the run's dtype
// `run_dtype` (its root attribute; the tap's own where the file has none): a
// model that computes its "reference" in its own dtype (MaxText refuses
// float64, so its reference of a float32 run is float32); else empty. A
// float32 reference of a 16-bit run is wider, its float32 taps (logits cast
// up) included: it measures that run's noise.
std::string narrow_reference(const TapData& t, const std::string& run_dtype);

// A sketch tap (docs/FORMAT.md, "Sketch taps"): each piece is stored as its
// linear sketch [lead..., k+1, width] instead of its values, with exact NaN/Inf
// counts and a hash of its bits. TapData::local_shape is the SKETCHED
// tensor's local shape (tokens, not k+1), so that layouts and reference shapes
// are checked as for any tap; `stored_shape` is the dataset's.
struct SketchPiece {
  long long nan = 0, inf = 0;
  std::string bits_hash;
};
struct SketchInfo {
  std::uint32_t seed = 0;
  std::size_t rows = 0;  // k: Rademacher rows (the dataset's token dimension is k + 1)
  // `sketch_dim`: the token dimension counted from the end (-2 by default;
  // -3 for attention's [..., sequence, heads, head_dim]); every dimension
  // after it is the width.
  int dim = -2;
  std::size_t token_dim(std::size_t ndim) const {
    return static_cast<std::size_t>(static_cast<long long>(ndim) + dim);
  }
  Shape stored_shape;
  std::vector<SketchPiece> pieces;  // per rank
  bool reference_is_sketch = false;  // the reference is the global sketch, not the tensor
  // `sketch_shared`: replica axes whose ranks each sketched a share of the
  // tokens (their sketches add up like partial sums; their hashes are still
  // of the whole piece).
  std::vector<std::string> shared_axes;
};

struct ActivationSet;

struct TapData {
  std::string name;
  Layout layout;
  std::optional<long> order;  // the `order` attribute
  // The `pipeline_stage` attribute: the stage in the order data flows through
  // a schedule's stages, where one rank holds several (interleaved, zero
  // bubble V); the `stage` coordinate says which ranks hold the tap.
  std::optional<long> pipeline_stage;
  long visit_index = 0;       // creation order when tracked, else name order
  std::string dtype;          // logical dtype (`dtype` attribute or the stored type)
  StoredKind stored = StoredKind::float32;
  std::optional<double> atol, rtol;
  std::optional<long> reduction_depth;
  std::optional<long> rounding_steps;      // the `rounding_steps` attribute (>= 1)
  std::optional<double> tolerance_factor;  // the `tolerance_factor` attribute (>= 1)
  // The `reduced` attribute: mesh axes over whose ranks the tap's value was
  // summed, in its own dtype, before it was captured (a hand all-reduce of
  // gradients): each piece rounded on its rank, and the sum again.
  std::vector<std::string> reduced;
  std::string image;                       // the `image` attribute ("nhwc", "nchw", "patches:H,W"), empty if none
  bool per_mesh = false;                   // the `per_mesh` attribute: the tap's values depend on the mesh
  bool complex_parts = false;
  // The `microbatches` attribute: the piece's first dimension holds this many
  // microbatches of a pipeline step laid together in order (0: not said).
  long microbatches = 0;  // the `complex` attribute: a complex tensor's real view (last dimension: re, im)
  // The `microbatch_copies_differ` attribute of each rank that wrote one:
  // (rank, "1,3"). A tap with no batch dimension under microbatches is the
  // same in every microbatch and written once; these microbatches' copies
  // were not microbatch 0's (a finding at this tap).
  std::vector<std::pair<int, std::string>> microbatch_copies_differ;
  Shape local_shape;
  std::optional<Shape> reference_shape;  // the global shape, when the tap has a reference
  // How the reference is stored: float64 unless a model computed its
  // "reference" in its own dtype (MaxText casts to its config's).
  std::optional<StoredKind> reference_stored;
  // A reference whose shape is not the tap's global shape: a finding at this
  // tap (a fault that changes a shape: an all-to-all's dimensions swapped, a
  // gather left out), not an input error. The reference's shape; the tap then
  // has no reference_shape and is not compared element by element.
  std::optional<Shape> mismatched_reference_shape;
  std::optional<SketchInfo> sketch;      // a sketch tap
  // The `streams` attribute (docs/FORMAT.md): the dimension the spec splits
  // holds several streams one after another (diffusers' [text, image] joint
  // sequence), each split over the same ranks, so each rank holds its share
  // of each. Read as one tap per stream, `name[stream]`; empty after that.
  struct Stream {
    std::string name;
    std::size_t length = 0;  // global, along the split dimension
    bool reversed = false;   // `name:length:reversed`: its blocks go to the ranks in reverse order
  };
  std::vector<Stream> streams;
  // Run against run (compare --against): the same tap of the run this one is
  // compared against. Its global values stand where a reference would, and
  // its tolerance adds to this tap's (check/against.h).
  std::shared_ptr<const TapData> against;
  std::shared_ptr<const ActivationSet> against_run;  // the run `against` is a tap of
  std::size_t data_id = 0;               // which tap the data source means (taps get sorted)
};

// A box of a tensor: `count[d]` elements from `start[d]` along each dimension,
// read into a flat buffer in the box's own row-major order.
struct Slab {
  Shape start, count;
};

// A read a checking process will make in the next round: rank `rank`'s piece
// (local coordinates) or, for rank -1, the reference (global coordinates).
struct PlannedRead {
  int reader = 0;
  int rank = -1;
  Slab slab;
};

// A slab's values as stored: in the caller's buffer, or straight in a mapping
// of the file (no copy out of the page cache), which `keep` holds mapped while
// the caller reads them. element_size 4 (float) or 8 (double); 0: not given.
struct StoredSpan {
  const void* data = nullptr;
  std::size_t element_size = 0;
  std::shared_ptr<const void> keep;
};

// Streamed access to tap values, as float64 in row-major order. Implementations
// may be called from several threads at once (they serialize what must be).
class ActivationData {
 public:
  virtual ~ActivationData() = default;
  // Rank `rank`'s piece of tap `t`, restricted to `slab` (local coordinates).
  virtual void read_piece(const TapData& t, int rank, const Slab& slab, double* out) const = 0;
  // The reference of tap `t`, restricted to `slab` (global coordinates).
  virtual void read_reference(const TapData& t, const Slab& slab, double* out) const = 0;
  // The same values as they are stored, when the source can hand them over
  // without converting (a contiguous float32 or float64 dataset of a file):
  // in `buf` (room for the slab as float64 is enough), or where they lie in
  // a mapping of the file; element_size 0 when it cannot, and the caller
  // reads as float64. Float32 data is scanned where it lies: no widening
  // pass, half the memory traffic.
  virtual StoredSpan read_piece_stored(const TapData&, int, const Slab&, void* /*buf*/) const { return {}; }
  virtual StoredSpan read_reference_stored(const TapData&, const Slab&, void* /*buf*/) const { return {}; }

  // Distributed sources (a run's taps, still in the memory of the ranks that
  // recorded them) return the processes that hold the values; null for
  // files, which any process can read. The checker then reads only in
  // rounds: stage() is collective over those processes, is given every
  // process's reads of the round, and moves what each needs; afterwards each
  // process reads what was staged for it (or what it holds).
  virtual const Comm* holders() const { return nullptr; }
  virtual void stage(const TapData& t, const std::vector<PlannedRead>& reads) const;
  // The process holding the first element of a slab of the reference: the
  // natural reader of that slab (the data need not move). 0 for files.
  virtual int reference_holder(const TapData& t, const Slab& slab) const;
};

// How a tap with `streams` was read as one tap per stream: the dimension
// they lie along and the streams, in order (the tap's name is the key).
struct StreamSplit {
  std::size_t dim = 0;
  std::vector<TapData::Stream> streams;
};

struct ActivationSet {
  std::string source;  // the file (run file) or prefix (rank files) that was read
  // The taps read as one tap per stream (store_streams.cpp), by name: another
  // set of the same computation (the one-device run a noise floor is measured
  // on) is split the same way.
  std::map<std::string, StreamSplit> stream_splits;
  Mesh mesh;
  int world_size = 1;
  std::map<std::string, std::string> info;  // optional root attributes, as text
  std::vector<TapData> taps;                // in comparison order
  std::shared_ptr<const ActivationData> data;
};

// An optional root attribute of a set (ActivationSet::info), empty when absent.
std::string root_info(const ActivationSet& set, const char* key);

// Whole tensors, for small sets (tests, fixtures): rank's piece, the reference.
std::vector<double> read_whole_piece(const ActivationSet& set, const TapData& t, int rank);
std::vector<double> read_whole_reference(const ActivationSet& set, const TapData& t);

// Data held in memory, for sets built in code. `pieces[data_id][rank]` and
// `references[data_id]` (empty when the tap has none).
class InMemoryData final : public ActivationData {
 public:
  std::vector<std::vector<std::vector<double>>> pieces;
  std::vector<std::vector<double>> references;
  void read_piece(const TapData& t, int rank, const Slab& slab, double* out) const override;
  void read_reference(const TapData& t, const Slab& slab, double* out) const override;
};

}  // namespace dc
