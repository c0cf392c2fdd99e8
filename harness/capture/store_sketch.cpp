#include "harness/capture/store_sketch.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "harness/capture/h5util.h"
#include "harness/core/error.h"

namespace dc {
namespace {

long long sketch_int(hid_t ds, const char* name, const std::string& where, long long low, long long high) {
  auto v = h5::read_int_attr(ds, name, where);
  if (!v) input_error("{}: sketch tap without attribute '{}'", where, name);
  if (*v < low || *v > high) input_error("{}: attribute '{}' is {}; it must be in [{}, {}]", where, name, *v, low, high);
  return *v;
}

}  // namespace

// A sketch tap's attributes (`sketch` present): the kind, seed and token
// count, checked against the dataset's shape; local_shape becomes the
// sketched tensor's. Per-rank attributes are read by read_sketch_piece.
void read_sketch_attrs(hid_t ds, const std::string& where, const Mesh& mesh, TapData& t) {
  const auto kind = h5::read_string_attr(ds, "sketch", where);
  if (!kind) return;
  if (*kind != "rademacher1")
    input_error("{}: attribute 'sketch' is '{}'; this diffcheck reads 'rademacher1' (docs/FORMAT.md)", where, *kind);
  if (t.stored == StoredKind::integer) input_error("{}: a sketch tap must be stored as float32 or float64", where);
  SketchInfo info;
  const auto ndim = static_cast<long long>(t.local_shape.size());
  if (auto dim = h5::read_int_attr(ds, "sketch_dim", where)) {
    if (*dim > -2 || *dim < -ndim)
      input_error("{}: attribute 'sketch_dim' is {}; the token dimension of a {}-dimensional sketch tap is one of "
                  "-{}..-2 (counted from the end, with a width after it)", where, *dim, ndim, ndim);
    info.dim = static_cast<int>(*dim);
  }
  const std::size_t d = info.token_dim(t.local_shape.size());
  if (t.local_shape.size() < 2 || t.local_shape[d] < 2 || t.local_shape[d] > static_cast<std::size_t>(kMaxSketchRows) + 1)
    input_error("{}: a sketch tap's shape is [lead..., k+1, width...] (k+1 at 'sketch_dim', default -2) with "
                "1 <= k <= {}; found {}", where, kMaxSketchRows, shape_str(t.local_shape));
  if (!t.image.empty()) input_error("{}: a sketch tap cannot be an image (attribute 'image')", where);
  if (t.layout.ordered_dim >= 0)  // its signs follow each piece's first token, which a block order moves
    input_error("{}: a sketch tap has no 'block_order'", where);
  info.seed = static_cast<std::uint32_t>(sketch_int(ds, "sketch_seed", where, 0, 0xFFFFFFFFLL));
  info.rows = t.local_shape[d] - 1;
  info.stored_shape = t.local_shape;
  if (auto shared = h5::read_string_attr(ds, "sketch_shared", where); shared && !shared->empty()) {
    const auto replicas = t.layout.replica_axes(mesh);
    std::size_t at = 0;
    while (at <= shared->size()) {
      const std::size_t end = std::min(shared->find('*', at), shared->size());
      const std::string axis = shared->substr(at, end - at);
      if (std::find(replicas.begin(), replicas.end(), axis) == replicas.end() ||
          std::find(info.shared_axes.begin(), info.shared_axes.end(), axis) != info.shared_axes.end())
        input_error("{}: attribute 'sketch_shared' is '{}'; '{}' is not a replica axis of the tap (mesh {}, layout {})",
                    where, *shared, axis, mesh.str(), t.layout.str());
      info.shared_axes.push_back(axis);
      at = end + 1;
    }
  }
  t.local_shape[d] = static_cast<std::size_t>(sketch_int(ds, "sketch_tokens", where, 1, kMaxSketchSigns));
  t.sketch = std::move(info);
}

// One rank's counts and hash of a sketch tap, and the attributes every rank must share.
void read_sketch_piece(hid_t ds, const std::string& where, const Mesh& mesh, TapData& t, int rank, std::size_t world) {
  const bool here = h5::read_string_attr(ds, "sketch", where).has_value();
  if (here != t.sketch.has_value())
    input_error("{}: {} a sketch tap here but {} on rank 0", where, here ? "is" : "is not", here ? "not" : "is");
  if (!here) return;
  SketchInfo& info = *t.sketch;
  const Shape& local = t.local_shape;
  const auto shared = h5::read_string_attr(ds, "sketch_shared", where).value_or("");
  std::string shared0;
  for (const auto& a : info.shared_axes) shared0 += (shared0.empty() ? "" : "*") + a;
  if (shared != shared0)
    input_error("{}: attribute 'sketch_shared' is '{}', rank 0's is '{}'", where, shared, shared0);
  if (h5::read_int_attr(ds, "sketch_dim", where).value_or(-2) != info.dim)
    input_error("{}: attribute 'sketch_dim' is {}, rank 0's is {}", where,
                h5::read_int_attr(ds, "sketch_dim", where).value_or(-2), info.dim);
  if (sketch_int(ds, "sketch_seed", where, 0, 0xFFFFFFFFLL) != info.seed ||
      sketch_int(ds, "sketch_tokens", where, 1, kMaxSketchSigns) !=
          static_cast<long long>(local[info.token_dim(local.size())]))
    input_error("{}: attributes 'sketch_seed'/'sketch_tokens' differ from rank 0's", where);
  info.pieces.resize(world);
  SketchPiece& p = info.pieces[static_cast<std::size_t>(rank)];
  p.nan = sketch_int(ds, "nan_count", where, 0, std::numeric_limits<long long>::max());
  p.inf = sketch_int(ds, "inf_count", where, 0, std::numeric_limits<long long>::max());
  auto h = h5::read_string_attr(ds, "bits_hash", where);
  if (!h || h->empty() || h->size() > 64) input_error("{}: sketch tap without a 'bits_hash' of 1 to 64 characters", where);
  p.bits_hash = *h;
  if (p.bits_hash == "-")
    for (const auto& axis : t.layout.replica_axes(mesh))
      if (mesh.axis_size(axis) > 1)
        input_error("{}: attribute 'bits_hash' is '-' (none), but the tap's pieces are replicated along '{}', "
                    "where the hashes are compared", where, axis);
}

// A reference stored as the global tensor's sketch: for a sketch tap only,
// with its seed, rows, token dimension and the global token count, shaped
// [lead..., k+1, width...].
void check_reference_sketch(hid_t ds, const std::string& where, const TapData& t, const Shape& s, const Shape& global) {
  if (!t.sketch) input_error("{}: a sketch reference (attribute 'sketch') for a tap stored whole", where);
  const auto kind = h5::read_string_attr(ds, "sketch", where);
  if (*kind != "rademacher1")
    input_error("{}: attribute 'sketch' is '{}'; this diffcheck reads 'rademacher1' (docs/FORMAT.md)", where, *kind);
  const std::size_t d = t.sketch->token_dim(global.size());
  const std::size_t tokens = global[d];
  if (h5::read_int_attr(ds, "sketch_dim", where).value_or(-2) != t.sketch->dim)
    input_error("{}: a sketch reference must have the tap's 'sketch_dim' {} (its token dimension)", where,
                t.sketch->dim);
  if (sketch_int(ds, "sketch_seed", where, 0, 0xFFFFFFFFLL) != t.sketch->seed ||
      sketch_int(ds, "sketch_tokens", where, 1, kMaxSketchSigns) != static_cast<long long>(tokens))
    input_error("{}: a sketch reference must have the tap's seed {} and its {} global tokens", where, t.sketch->seed,
                tokens);
  if (static_cast<long long>(tokens) * static_cast<long long>(t.sketch->rows) > kMaxSketchSigns)
    input_error("{}: {} tokens x {} sketch rows is more than {} signs", where, tokens, t.sketch->rows, kMaxSketchSigns);
  Shape want = global;
  want[d] = t.sketch->rows + 1;
  if (s != want)
    input_error("{}: a sketch reference of shape {}; the tap's global sketch is {}", where, shape_str(s),
                shape_str(want));
}


}  // namespace dc
