#include "harness/check/scans.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "harness/check/compare.h"  // ulp_distance

namespace dc {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool same_value(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

}  // namespace

void scan_nonfinite(const double* x, std::size_t n, int rank, std::size_t first, TapStats& s) {
  // x - x is 0 for finite x and NaN otherwise: a branch-free first look, in
  // four independent lanes so the adds do not wait on each other.
  double probe[4] = {0, 0, 0, 0};
  std::size_t i4 = n / 4 * 4;
  for (std::size_t i = 0; i < i4; i += 4)
    for (int k = 0; k < 4; ++k) probe[k] += x[i + k] - x[i + k];
  for (std::size_t i = i4; i < n; ++i) probe[0] += x[i] - x[i];
  if (probe[0] + probe[1] + probe[2] + probe[3] == 0) return;
  long long count = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isfinite(x[i])) continue;
    ++count;
    std::pair<int, std::size_t> at{rank, first + i};
    if (std::isnan(x[i])) {
      ++s.nan;
      if (!s.first_nan || at < *s.first_nan) s.first_nan = at;
    } else {
      ++s.inf;
      if (!s.first_inf || at < *s.first_inf) s.first_inf = at;
    }
  }
  if (count == 0) return;
  s.nonfinite_ranks.push_back(rank);
  s.rank_nonfinite.push_back({rank, static_cast<double>(count)});
}

void scan_replica(const double* a, const double* b, std::size_t n, int leader, int rank,
                  std::size_t first, StoredKind kind, TapStats& s) {
  bool differs = false;
  TapStats::ReplicaWorst w;
  for (std::size_t i = 0; i < n; ++i) {
    if (same_value(a[i], b[i])) continue;
    differs = true;
    double d = std::abs(a[i] - b[i]);
    double key = std::isnan(d) ? kInf : d;
    if (key > w.key) w = {key, rank, leader, first + i, a[i], b[i], d};
    s.max_ulp = std::max(s.max_ulp, ulp_distance(a[i], b[i], kind));
  }
  if (!differs) return;
  s.differing.push_back(rank);
  s.rank_replica_diff.push_back({rank, w.key});
  s.offer_replica(w);
}

void scan_reference(const double* x, const double* ref, std::size_t n, const Tolerance& tol,
                    const TapPlan& p, const BlockGroup& g, std::size_t first, const ChunkPlan& plan,
                    TapStats& s) {
  double worst_ratio = -1, max_abs = 0, max_rel = 0;
  std::size_t worst = 0;
  long long fails = 0;
  bool nan_error = false;
  auto element = [&](std::size_t i, double& e_acc, double& r_acc) {
    const double r = ref[i], err = std::abs(x[i] - r), bound = tol.atol + tol.rtol * std::abs(r);
    e_acc += err * err;
    r_acc += r * r;
    max_abs = std::max(max_abs, err);  // a NaN error leaves it unchanged
    // Divisions only for elements that may raise a maximum (the margin covers
    // the rounding of the product).
    if (r != 0 && err > max_rel * std::abs(r) * (1 - 1e-12))
      max_rel = std::max(max_rel, err / std::abs(r));
    // Fails, NaN included; an infinite error fails even against an infinite
    // bound (an Inf in the reference must not excuse a finite value).
    if (!(err <= bound) || err == kInf) {
      ++fails;
      nan_error = nan_error || std::isnan(err);
    }
    if (i == 0 || err > worst_ratio * bound * (1 - 1e-12) || std::isnan(err)) {
      double ratio = std::isnan(err) ? kInf : bound > 0 ? err / bound : err > 0 ? kInf : 0.0;
      if (ratio > worst_ratio) {
        worst_ratio = ratio;
        worst = i;
      }
    }
  };
  // One summation unit at a time (see ChunkPlan), each in four independent
  // lanes kept in registers so no add waits on another; a unit's sum goes
  // into the exact sum.
  for (std::size_t at = 0; at < n;) {
    const std::size_t end = at + std::min(n - at, plan.unit_left(first + at));
    double e0 = 0, e1 = 0, e2 = 0, e3 = 0, r0 = 0, r1 = 0, r2 = 0, r3 = 0;
    const std::size_t end4 = at + (end - at) / 4 * 4;
    // A unit equal to its reference (every x - ref exactly 0: no NaN, no
    // Inf) moves no maximum, failure or error sum, and only a chunk's first
    // element can be its worst (ratio 0): only the reference's squares are
    // left, summed in the same lanes as below, so the result is bit-identical.
    // One branch-free compare pass instead of the per-element bookkeeping.
    bool identical = true;
    for (std::size_t i = at; i < end; ++i) identical &= (x[i] - ref[i] == 0);
    if (identical) {
      for (std::size_t i = at; i < end4; i += 4) {
        r0 += ref[i] * ref[i];
        r1 += ref[i + 1] * ref[i + 1];
        r2 += ref[i + 2] * ref[i + 2];
        r3 += ref[i + 3] * ref[i + 3];
      }
      for (std::size_t i = end4; i < end; ++i) r0 += ref[i] * ref[i];
      if (at == 0) {
        worst_ratio = std::max(worst_ratio, 0.0);
        worst = 0;
      }
      if (!s.ref_sq.add_partial((r0 + r1) + (r2 + r3)))
        for (std::size_t i = at; i < end; ++i) s.ref_sq.add_value(ref[i]);
      at = end;
      continue;
    }
    for (std::size_t i = at; i < end4; i += 4) {
      element(i, e0, r0);
      element(i + 1, e1, r1);
      element(i + 2, e2, r2);
      element(i + 3, e3, r3);
    }
    for (std::size_t i = end4; i < end; ++i) element(i, e0, r0);
    // A unit whose squares overflowed (values beyond ~1e154) is added again
    // value by value, scaled (see SquareSum): rare, and never on clean data.
    if (!s.err_sq.add_partial((e0 + e1) + (e2 + e3)))
      for (std::size_t i = at; i < end; ++i) s.err_sq.add_value(std::abs(x[i] - ref[i]));
    if (!s.ref_sq.add_partial((r0 + r1) + (r2 + r3)))
      for (std::size_t i = at; i < end; ++i) s.ref_sq.add_value(ref[i]);
    at = end;
  }
  s.n_fail += fails;
  s.any_nan_error = s.any_nan_error || nan_error;
  s.max_abs = std::max(s.max_abs, max_abs);
  s.max_rel = std::max(s.max_rel, max_rel);
  s.n_total += static_cast<long long>(n);
  if (n == 0) return;
  s.owner_err_ratio.push_back({g.owner, worst_ratio});
  // Within a block, local row-major order is global order, so the first worst
  // element of the chunk is also its lowest global index.
  s.offer_reference({worst_ratio,
                     global_flat_index(p.tap->local_shape, p.global, g.block, first + worst),
                     g.owner, x[worst], ref[worst]});
}

}  // namespace dc
