// Run against run (check/against.h).
#include "harness/check/against.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_set>

#include "harness/check/tap_plan.h"
#include "harness/core/error.h"

namespace dc {
namespace {

// Adds the box `values` (shape `count`) into `out` (shape `outer`) at `offset`.
void add_box(const std::vector<double>& values, const Shape& count, const Shape& offset, const Shape& outer,
             double* out) {
  const std::size_t nd = count.size();
  if (nd == 0) {
    out[0] += values[0];
    return;
  }
  const std::size_t row = count[nd - 1];
  std::vector<std::size_t> at(nd, 0);  // the box's index of the current row (last dimension 0)
  for (std::size_t r = 0, rows = numel(count) / std::max<std::size_t>(row, 1); r < rows; ++r) {
    std::size_t flat = 0;
    for (std::size_t d = 0; d < nd; ++d) flat = flat * outer[d] + offset[d] + at[d];
    for (std::size_t j = 0; j < row; ++j) out[flat + j] += values[r * row + j];
    for (std::size_t d = nd - 1; d-- > 0;) {  // next row: carry from the second-to-last dimension
      if (++at[d] < count[d]) break;
      at[d] = 0;
    }
  }
}

// The data of a matched set: run A's pieces as they are, run B's global
// tensors as the references.
class AgainstData final : public ActivationData {
 public:
  AgainstData(std::shared_ptr<const ActivationData> a, std::shared_ptr<const ActivationSet> b)
      : a_(std::move(a)), b_(std::move(b)) {}
  void read_piece(const TapData& t, int rank, const Slab& slab, double* out) const override {
    a_->read_piece(t, rank, slab, out);
  }
  StoredSpan read_piece_stored(const TapData& t, int rank, const Slab& slab, void* buf) const override {
    return a_->read_piece_stored(t, rank, slab, buf);
  }
  void read_reference(const TapData& t, const Slab& slab, double* out) const override {
    if (!t.against) fail("tap '{}': no tap of the other run to read", t.name);
    read_global(*b_, *t.against, plan_of(*t.against), slab, out);
  }

 private:
  // Each of B's taps planned once, not once per chunk read (chunks are read
  // from several threads).
  const TapPlan& plan_of(const TapData& t) const {
    std::lock_guard<std::mutex> lock(plans_mutex_);
    auto it = plans_.find(&t);
    if (it == plans_.end()) it = plans_.emplace(&t, std::make_unique<TapPlan>(plan_tap(t, b_->mesh))).first;
    return *it->second;
  }

  std::shared_ptr<const ActivationData> a_;
  std::shared_ptr<const ActivationSet> b_;
  mutable std::mutex plans_mutex_;
  mutable std::map<const TapData*, std::unique_ptr<const TapPlan>> plans_;
};

// Shapes equal but in the leading (batch) dimension, where `a`'s is smaller.
bool leading_prefix(const Shape& a, const Shape& b) {
  return !a.empty() && a.size() == b.size() && a[0] < b[0] && std::equal(a.begin() + 1, a.end(), b.begin() + 1);
}

// Refuses two runs of different computations, naming both.
void require_one_computation(const ActivationSet& a, const ActivationSet& b) {
  for (const char* key : {"scenario", "dtype", "size"}) {
    const std::string x = root_info(a, key), y = root_info(b, key);
    if (!x.empty() && !y.empty() && x != y)
      input_error("{} ({} {}) and {} ({} {}) are not runs of one computation: compare runs of the same {}",
                  a.source, key, x, b.source, key, y, key);
  }
}

// Refuses a pair of taps that are not one tensor of one computation.
void require_comparable(const TapData& t, const TapData& other, const ActivationSet& a, const ActivationSet& b) {
  if (!t.dtype.empty() && !other.dtype.empty() && t.dtype != other.dtype)
    input_error("tap '{}' is {} in {} and {} in {}: compare runs of one dtype", t.name, t.dtype, a.source,
                other.dtype, b.source);
  if (t.sketch.has_value() != other.sketch.has_value())
    input_error("tap '{}' is a sketch in {} but whole in {}: sketches compare with sketches (capture both runs "
                "with sketch=True, or both whole)", t.name, t.sketch ? a.source : b.source,
                t.sketch ? b.source : a.source);
  if (t.sketch && (t.sketch->seed != other.sketch->seed || t.sketch->rows != other.sketch->rows ||
                  t.sketch->dim != other.sketch->dim))
    input_error("tap '{}': sketched with seed {}, {} rows over dimension {} in {} but seed {}, {} rows over "
                "dimension {} in {}: sketches compare only when made alike", t.name, t.sketch->seed, t.sketch->rows,
                t.sketch->dim, a.source, other.sketch->seed, other.sketch->rows, other.sketch->dim, b.source);
  const Shape ga = plan_tap(t, a.mesh).global, gb = plan_tap(other, b.mesh).global;
  if (ga == gb) return;
  if (!t.sketch && leading_prefix(ga, gb)) return;  // A's samples are B's first ones
  input_error("tap '{}': global shape [{}] in {} (mesh {}) but [{}] in {} (mesh {}): not one computation{}", t.name,
              fmt::join(ga, ","), a.source, a.mesh.str(), fmt::join(gb, ","), b.source, b.mesh.str(),
              t.sketch ? " (a sketch is of the whole tensor: sketches of batches of other sizes do not compare)"
                       : " (only a batch, the leading dimension, may differ, and then the same way in every tap)");
}

}  // namespace

void add_other_runs_bound(const ActivationSet& set, const TapData& t, const CompareOptions& opts, double rms,
                          Tolerance& tol) {
  if (!t.against || (tol.atol == 0 && tol.rtol == 0)) return;
  ToleranceInputs other = tap_tolerance_inputs(set, *t.against, opts);
  other.reference_rms = rms;
  const Tolerance b = derive_tolerance(other);
  // Element-wise, one element of each run may be off by its whole bound, in
  // opposite directions: the bounds add. Norm-wise (rel L2, column means) the
  // figures are sums over many elements, and the two runs' rounding errors
  // are independent (other reduction orders) or alike (the same roundings),
  // never opposed: ||e_a - e_b||^2 = ||e_a||^2 + ||e_b||^2 - 2 <e_a, e_b>
  // is at most the sum of the squares, so the limits add in quadrature
  // (a bias fault is caught at 1.5x rather than 2x the reference's scale).
  tol.atol += b.atol;
  tol.rtol += b.rtol;
  const auto quadrature = [](double x, double y) { return std::sqrt(x * x + y * y); };
  if (tol.rel_l2_limit && b.rel_l2_limit) *tol.rel_l2_limit = quadrature(*tol.rel_l2_limit, *b.rel_l2_limit);
  else tol.rel_l2_limit.reset();  // a norm-wise limit only where both runs have one
  if (tol.column_mean_limit && b.column_mean_limit)
    *tol.column_mean_limit = quadrature(*tol.column_mean_limit, *b.column_mean_limit);
  else tol.column_mean_limit.reset();
  tol.yardstick = fmt::format("this run {} + the other run {}", tol.yardstick.empty() ? "-" : tol.yardstick,
                              b.yardstick.empty() ? "-" : b.yardstick);
}

void read_global(const ActivationSet& b, const TapData& t, const Slab& slab, double* out) {
  read_global(b, t, plan_tap(t, b.mesh), slab, out);
}

void read_global(const ActivationSet& b, const TapData& t, const TapPlan& p, const Slab& slab, double* out) {
  const std::size_t nd = slab.count.size();
  std::fill_n(out, numel(slab.count), 0.0);
  std::vector<double> piece;
  for (const BlockGroup& g : p.groups) {
    Slab local{Shape(nd), Shape(nd)};
    Shape offset(nd);
    bool meets = true;
    for (std::size_t d = 0; d < nd && meets; ++d) {
      const std::size_t origin = g.block[d] * t.local_shape[d];
      const std::size_t lo = std::max(slab.start[d], origin);
      const std::size_t hi = std::min(slab.start[d] + slab.count[d], origin + t.local_shape[d]);
      meets = lo < hi;
      local.start[d] = meets ? lo - origin : 0;
      local.count[d] = meets ? hi - lo : 0;
      offset[d] = meets ? lo - slab.start[d] : 0;
    }
    if (!meets) continue;
    piece.resize(numel(local.count));
    for (int leader : g.leaders) {
      b.data->read_piece(t, leader, local, piece.data());
      add_box(piece, local.count, offset, slab.count, out);
    }
  }
}

bool batch_larger(const ActivationSet& a, const ActivationSet& b) {
  std::map<std::string, const TapData*> in_b;
  for (const auto& t : b.taps) in_b[t.name] = &t;
  std::string larger, smaller;  // a tap of each direction
  for (const auto& t : a.taps) {
    auto it = in_b.find(t.name);
    if (it == in_b.end() || t.sketch || it->second->sketch || t.per_mesh || it->second->per_mesh) continue;
    const Shape ga = plan_tap(t, a.mesh).global, gb = plan_tap(*it->second, b.mesh).global;
    if (leading_prefix(gb, ga) && larger.empty()) larger = t.name;
    if (leading_prefix(ga, gb) && smaller.empty()) smaller = t.name;
  }
  if (!larger.empty() && !smaller.empty())
    input_error("{} (mesh {}) and {} (mesh {}): tap '{}' has more samples in the first, tap '{}' in the second: not "
                "one computation", a.source, a.mesh.str(), b.source, b.mesh.str(), larger, smaller);
  return !larger.empty();
}

ActivationSet without_references(const ActivationSet& set) {
  ActivationSet out = set;
  for (auto& t : out.taps) t.reference_shape.reset();
  return out;
}

AgainstMatch match_runs(const ActivationSet& a, const ActivationSet& b, const AgainstOptions& options) {
  require_one_computation(a, b);
  auto b_set = std::make_shared<const ActivationSet>(b);
  std::map<std::string, const TapData*> in_b;
  for (const auto& t : b_set->taps) in_b[t.name] = &t;
  AgainstMatch m;
  m.set = a;
  m.set.data = std::make_shared<AgainstData>(a.data, b_set);
  const bool same_mesh = a.mesh.str() == b.mesh.str();
  for (auto& t : m.set.taps) {
    t.reference_shape.reset();
    auto it = in_b.find(t.name);
    if (it == in_b.end()) {
      m.only_in_a.push_back(t.name);
      continue;
    }
    const TapData& other = *it->second;
    if ((t.per_mesh || other.per_mesh) && !same_mesh) {
      m.per_mesh.push_back(t.name);
      continue;
    }
    require_comparable(t, other, a, b);
    t.reference_shape = plan_tap(t, a.mesh).global;
    if (*t.reference_shape != plan_tap(other, b.mesh).global) m.fewer_samples.push_back(t.name);
    t.against = std::shared_ptr<const TapData>(b_set, &other);
    t.against_run = b_set;
    if (options.exact) t.atol = t.rtol = 0.0;
  }
  std::unordered_set<std::string> in_a;  // a lookup, not a scan of A's taps for each of B's
  for (const auto& t : a.taps) in_a.insert(t.name);
  for (const auto& t : b_set->taps)
    if (!in_a.count(t.name)) m.only_in_b.push_back(t.name);
  m.set.info["against"] = b.source;
  m.set.info["against_mesh"] = b.mesh.str();
  return m;
}

std::string AgainstMatch::describe() const {
  const auto& b = set.info.at("against");
  std::string s = fmt::format("no reference: each tap of {} (mesh {}) against the same tap of {} (mesh {}), laid out "
                              "globally; each tolerance is the sum of both runs' bounds",
                              set.source, set.mesh.str(), b, set.info.at("against_mesh"));
  if (!only_in_a.empty()) s += fmt::format("\ntaps only in {} (no comparison): {}", set.source, fmt::join(only_in_a, ", "));
  if (!only_in_b.empty()) s += fmt::format("\ntaps only in {} (not compared): {}", b, fmt::join(only_in_b, ", "));
  if (!fewer_samples.empty())
    s += fmt::format("\n{} holds fewer samples (a smaller batch, the leading dimension) than {}: compared on its own "
                     "samples, the first of the other run's, in {} taps",
                     set.source, b, fewer_samples.size());
  if (!per_mesh.empty())
    s += fmt::format("\ntaps whose values depend on the mesh (per_mesh), not compared across meshes: {}",
                     fmt::join(per_mesh, ", "));
  return s;
}

}  // namespace dc
