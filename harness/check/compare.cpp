#include "harness/check/compare.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace dc {
namespace {

// Maps a float's bits onto a line where adjacent floats are adjacent integers.
template <class F, class I>
I ordered_bits(F x) {
  I i = std::bit_cast<I>(x);
  return i < 0 ? std::numeric_limits<I>::min() - i : i;
}

bool same_value(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

void check_nonfinite(const TapData& t, NonFinite& nf) {
  for (std::size_t r = 0; r < t.pieces.size(); ++r) {
    bool any = false;
    const auto& p = t.pieces[r];
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (std::isnan(p[i])) {
        ++nf.nan;
        any = true;
        if (!nf.first_nan) nf.first_nan = ElementRef{static_cast<int>(r), unravel(i, t.local_shape)};
      } else if (std::isinf(p[i])) {
        ++nf.inf;
        any = true;
        if (!nf.first_inf) nf.first_inf = ElementRef{static_cast<int>(r), unravel(i, t.local_shape)};
      }
    }
    if (any) nf.ranks.push_back(static_cast<int>(r));
  }
}

void check_replicas(const TapData& t, const Mesh& mesh, long allowed_ulps, ReplicaCheck& rc) {
  double worst_key = -1;
  for (int r = 0; r < mesh.world_size(); ++r) {
    int leader = t.layout.replica_leader(mesh, r);
    if (leader == r) continue;
    rc.applies = true;
    const auto& a = t.pieces[leader];
    const auto& b = t.pieces[r];
    bool differs = false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (same_value(a[i], b[i])) continue;
      differs = true;
      double d = std::abs(a[i] - b[i]);
      long long u = ulp_distance(a[i], b[i], t.stored);
      // Rank NaN-vs-number differences above any finite one.
      double key = std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
      if (key > worst_key) {
        worst_key = key;
        rc.max_abs = d;
        rc.leader = leader;
        rc.other = r;
        rc.index = unravel(i, t.local_shape);
        rc.leader_value = a[i];
        rc.other_value = b[i];
      }
      rc.max_ulp = std::max(rc.max_ulp, u);
    }
    if (differs) rc.differing.push_back(r);
  }
  rc.pass = rc.differing.empty() || rc.max_ulp <= allowed_ulps;
  // Every axis along which some differing rank sits apart from its leader.
  std::vector<bool> apart(mesh.axes().size(), false);
  for (int r : rc.differing) {
    auto a = mesh.coords(t.layout.replica_leader(mesh, r)), b = mesh.coords(r);
    for (std::size_t i = 0; i < a.size(); ++i) apart[i] = apart[i] || a[i] != b[i];
  }
  for (std::size_t i = 0; i < apart.size(); ++i)
    if (apart[i]) rc.axes.push_back(mesh.axes()[i].name);
}

// Ranks (replica leaders) whose block holds global element `g`.
std::vector<int> owners(const TapData& t, const Mesh& mesh, const Shape& global,
                        const std::vector<std::size_t>& g) {
  std::vector<int> out;
  for (int r = 0; r < mesh.world_size(); ++r) {
    if (t.layout.replica_leader(mesh, r) != r) continue;
    auto block = t.layout.block_of(mesh, r, t.local_shape.size());
    bool inside = true;
    for (std::size_t d = 0; d < global.size(); ++d)
      if (g[d] / t.local_shape[d] != block[d]) inside = false;
    if (inside) out.push_back(r);
  }
  return out;
}

void check_reference(const TapData& t, const Mesh& mesh, const CompareOptions& opts,
                     ReferenceCheck& rc) {
  if (!t.reference) return;
  rc.present = true;
  auto x = reassemble(t.layout, mesh, t.local_shape,
                      [&](int r) { return t.pieces[r].data(); });
  const auto& ref = t.reference->data;
  double sum_sq_ref = 0;
  for (double v : ref) sum_sq_ref += v * v;
  double rms = ref.empty() ? 0.0 : std::sqrt(sum_sq_ref / static_cast<double>(ref.size()));
  rc.tol = derive_tolerance({t.dtype, t.reduction_depth, t.atol, t.rtol, opts.atol, opts.rtol, rms});

  double sum_sq_err = 0, worst_ratio = -1;
  std::size_t worst = 0;
  rc.n_total = static_cast<long long>(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    double err = std::abs(x[i] - ref[i]);
    double bound = rc.tol.atol + rc.tol.rtol * std::abs(ref[i]);
    bool ok = err <= bound;  // false for NaN
    if (!ok) ++rc.n_fail;
    double ratio = std::isnan(err) ? std::numeric_limits<double>::infinity()
                   : bound > 0     ? err / bound
                   : err > 0       ? std::numeric_limits<double>::infinity()
                                   : 0.0;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
    if (std::isnan(err)) {
      rc.max_abs = err;
    } else if (!std::isnan(rc.max_abs)) {
      rc.max_abs = std::max(rc.max_abs, err);
    }
    if (ref[i] != 0 && !std::isnan(err)) rc.max_rel = std::max(rc.max_rel, err / std::abs(ref[i]));
    sum_sq_err += err * err;
  }
  if (std::isnan(rc.max_abs)) rc.max_rel = std::numeric_limits<double>::quiet_NaN();
  rc.rel_l2 = sum_sq_ref > 0 ? std::sqrt(sum_sq_err / sum_sq_ref) : std::sqrt(sum_sq_err);
  Shape global = t.reference->shape;
  rc.worst.index = unravel(worst, global);
  rc.worst_ratio = std::max(0.0, worst_ratio);
  rc.worst_value = x.empty() ? 0 : x[worst];
  rc.worst_reference = ref.empty() ? 0 : ref[worst];
  rc.worst_ranks = owners(t, mesh, global, rc.worst.index);
  rc.worst.rank = rc.worst_ranks.empty() ? -1 : rc.worst_ranks.front();
  rc.pass = rc.n_fail == 0;
}

}  // namespace

long long ulp_distance(double a, double b, StoredKind kind) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<long long>::max();
  switch (kind) {
    case StoredKind::integer: return static_cast<long long>(std::llabs(static_cast<long long>(a - b)));
    case StoredKind::float64: {
      auto ia = ordered_bits<double, std::int64_t>(a), ib = ordered_bits<double, std::int64_t>(b);
      return ia > ib ? ia - ib : ib - ia;  // may wrap for opposite extremes; fine as "huge"
    }
    default: {
      auto ia = static_cast<long long>(ordered_bits<float, std::int32_t>(static_cast<float>(a)));
      auto ib = static_cast<long long>(ordered_bits<float, std::int32_t>(static_cast<float>(b)));
      long long d = std::llabs(ia - ib);
      return kind == StoredKind::float16 ? d >> 13 : d;  // float16 has 13 fewer mantissa bits
    }
  }
}

std::vector<std::string> TapVerdict::failed_checks() const {
  std::vector<std::string> out;
  if (nonfinite.nan || nonfinite.inf) out.push_back("nonfinite");
  if (!replica.pass) out.push_back("replica");
  if (!reference.pass) out.push_back("reference");
  return out;
}

CompareResult compare(const ActivationSet& set, const CompareOptions& opts) {
  CompareResult res;
  for (const auto& t : set.taps) {
    TapVerdict v;
    v.name = t.name;
    v.layout = t.layout.str();
    v.dtype = t.dtype;
    v.local_shape = t.local_shape;
    v.global_shape = t.layout.global_shape(set.mesh, t.local_shape);
    check_nonfinite(t, v.nonfinite);
    check_replicas(t, set.mesh, opts.replica_ulps, v.replica);
    check_reference(t, set.mesh, opts, v.reference);
    if (!v.pass() && !res.first_divergence) res.first_divergence = res.taps.size();
    res.taps.push_back(std::move(v));
  }
  return res;
}

}  // namespace dc
