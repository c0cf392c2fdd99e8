#include "harness/check/scans.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "harness/check/compare.h"  // ulp_distance

namespace dc {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Four doubles, as GCC's vector extension (no intrinsics): two SSE2 registers
// on baseline x86-64, one AVX2 register in the clone compiled for it (below).
// Lane k is summation lane k. Comparisons give per-lane masks (all ones where
// true). Lane k of an add is the same IEEE operation as the scalar one (no
// FMA is enabled, so nothing is contracted), so sums keep their bits on
// either path.
// (Only inlined helpers take and return them: -Wpsabi's note on how 32-byte
// vectors are passed between functions does not apply.)
#pragma GCC diagnostic ignored "-Wpsabi"
using Quad = double __attribute__((vector_size(32)));
using Mask = long long __attribute__((vector_size(32)));

[[gnu::always_inline]] inline Quad load4(const double* p) {
  Quad v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// Four floats widened (exactly): cvtps2pd on baseline x86-64, one vcvtps2pd
// to a ymm register in the AVX2 build.
[[gnu::always_inline]] inline Quad load4(const float* p) { return Quad{p[0], p[1], p[2], p[3]}; }
[[gnu::always_inline]] inline Quad splat(double v) { return Quad{v, v, v, v}; }
[[gnu::always_inline]] inline Quad abs4(const Quad& v) { return (Quad)((Mask)v & ~(Mask)splat(-0.0)); }
[[gnu::always_inline]] inline bool any(const Mask& m) { return ((m[0] | m[1]) | (m[2] | m[3])) != 0; }

bool same_value(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

}  // namespace

namespace {

// x - x is 0 for finite x and NaN otherwise: a branch-free first look, in
// independent lanes so the adds do not wait on each other.
template <class X>
[[gnu::always_inline]] inline bool all_finite_body(const X* x, std::size_t n) {
  Quad a = splat(0.0), b = a;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const Quad u = load4(x + i), v = load4(x + i + 4);
    a += u - u;
    b += v - v;
  }
  double rest = 0;
  for (; i < n; ++i) rest += double(x[i]) - double(x[i]);
  const Quad t = a + b;
  return (t[0] + t[1]) + (t[2] + t[3]) + rest == 0;
}

template <class X>
bool all_finite_portable(const X* x, std::size_t n) { return all_finite_body(x, n); }
template <class X>
[[gnu::target("avx2")]] bool all_finite_avx2(const X* x, std::size_t n) { return all_finite_body(x, n); }

template <class X>
void scan_nonfinite_typed(const X* x, std::size_t n, int rank, std::size_t first, TapStats& s) {
  if (scan_reference_avx2_available() ? all_finite_avx2(x, n) : all_finite_portable(x, n)) return;
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

}  // namespace

void scan_nonfinite(const double* x, std::size_t n, int rank, std::size_t first, TapStats& s) {
  scan_nonfinite_typed(x, n, rank, first, s);
}

void scan_nonfinite(StoredValues x, std::size_t n, int rank, std::size_t first, TapStats& s) {
  if (x.element_size == 4)
    scan_nonfinite_typed(static_cast<const float*>(x.data), n, rank, first, s);
  else
    scan_nonfinite_typed(static_cast<const double*>(x.data), n, rank, first, s);
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

namespace {

// The reference scan, inlined into a baseline and an AVX2 function (below),
// for each stored width of the values and of the reference. Every element is
// widened to double before any arithmetic (exactly), so the widths give the
// same results bit for bit.
template <class X, class R>
[[gnu::always_inline]] inline bool scan_reference_body(const X* x, const R* ref, std::size_t n,
                                                       const Tolerance& tol, const TapPlan& p, const BlockGroup& g,
                                                       std::size_t first, const ChunkPlan& plan, TapStats& s) {
  double worst_ratio = -1, max_abs = 0, max_rel = 0;
  std::size_t worst = 0;
  long long fails = 0;
  bool nan_error = false, maybe_nonfinite = false;
  constexpr double kMargin = 1 - 1e-12;  // covers the rounding of the products below
  // The bookkeeping of one element beyond the sums and max_abs: the maxima
  // of the relative error and of err/tol (the first index of the largest),
  // and failures.
  auto bookkeep = [&](std::size_t i) {
    const double r = ref[i], err = std::abs(x[i] - r), bound = tol.atol + tol.rtol * std::abs(r);
    // Divisions only for elements that may raise a maximum.
    if (r != 0 && err > max_rel * std::abs(r) * kMargin) max_rel = std::max(max_rel, err / std::abs(r));
    // Fails, NaN included; an infinite error fails even against an infinite
    // bound (an Inf in the reference must not excuse a finite value).
    if (!(err <= bound) || err == kInf) {
      ++fails;
      nan_error = nan_error || std::isnan(err);
    }
    if (i == 0 || err > worst_ratio * bound * kMargin || std::isnan(err)) {
      double ratio = std::isnan(err) ? kInf : bound > 0 ? err / bound : err > 0 ? kInf : 0.0;
      if (ratio > worst_ratio) {
        worst_ratio = ratio;
        worst = i;
      }
    }
  };
  // One summation unit at a time (see ChunkPlan), its squares in four
  // independent lanes (element i in lane (i - unit start) % 4) so no add
  // waits on another; a unit's sum goes into the exact sum.
  for (std::size_t at = 0; at < n;) {
    const std::size_t end = at + std::min(n - at, plan.unit_left(first + at));
    double e[4] = {0, 0, 0, 0}, rr[4] = {0, 0, 0, 0};
    const std::size_t end4 = at + (end - at) / 4 * 4;
    // A unit equal to its reference (every x - ref exactly 0: no NaN, no
    // Inf) moves no maximum, failure or error sum, and only a chunk's first
    // element can be its worst (ratio 0): only the reference's squares are
    // left, summed in the same lanes as below, so the result is bit-identical.
    // One branch-free compare pass instead of the per-element bookkeeping.
    // Tested 16 elements at a time, so a unit that differs (as most do when
    // any element does) is left after its first differing block; the
    // reference's squares are summed on the way, for a unit that turns out
    // identical.
    bool identical = true;
    Quad r4 = splat(0.0);
    std::size_t i0 = at;
    for (; i0 + 16 <= end4; i0 += 16) {
      Mask differs{0, 0, 0, 0};  // x - ref != 0, NaN included
      for (std::size_t j = 0; j < 16; j += 4) {
        const Quad a = load4(ref + i0 + j);
        differs |= load4(x + i0 + j) - a != 0;
        r4 += a * a;
      }
      if (any(differs)) {
        identical = false;
        break;
      }
    }
    if (identical) {
      for (std::size_t i = i0; i < end4; i += 4) {
        const Quad a = load4(ref + i);
        identical = identical && !any(load4(x + i) - a != 0);
        r4 += a * a;
      }
      for (std::size_t i = end4; identical && i < end; ++i) identical = double(x[i]) - double(ref[i]) == 0;
    }
    if (identical) {
      rr[0] = r4[0], rr[1] = r4[1], rr[2] = r4[2], rr[3] = r4[3];
      for (std::size_t i = end4; i < end; ++i) rr[0] += double(ref[i]) * double(ref[i]);
      if (at == 0) {
        worst_ratio = std::max(worst_ratio, 0.0);
        worst = 0;
      }
      if (!s.ref_sq.add_partial((rr[0] + rr[1]) + (rr[2] + rr[3])))
        for (std::size_t i = at; i < end; ++i) s.ref_sq.add_value(ref[i]);
      at = end;
      continue;
    }
    // Blocks of 16: a branch-free pass takes the sums and max_abs and asks
    // whether any element might fail or raise max_rel or err/tol, against
    // the maxima as they stand at the block's start. They only grow, and only
    // such an element grows them, so a block where none might is one where
    // the bookkeeping would do nothing; only the others get it, in order.
    constexpr std::size_t kBlock = 16;
    Quad e4 = splat(0.0), m4 = splat(max_abs);
    r4 = splat(0.0);  // the test above summed only part of the unit
    const Quad atol = splat(tol.atol), rtol = splat(tol.rtol), inf = splat(kInf), zero = splat(0.0);
    std::size_t i = at;
    for (; i + kBlock <= end4; i += kBlock) {
      const Quad rel_gate = splat(max_rel * kMargin), worst_gate = splat(worst_ratio * kMargin);
      Mask loud{i == 0 ? -1LL : 0, 0, 0, 0};
      for (std::size_t j = 0; j < kBlock; j += 4) {
        const Quad r = load4(ref + i + j), err = abs4(load4(x + i + j) - r), ar = abs4(r);
        const Quad bound = atol + rtol * ar;
        e4 += err * err;
        r4 += r * r;
        m4 = m4 < err ? err : m4;  // a NaN error leaves it unchanged
        loud |= ~(err <= bound) | (err == inf) | ((r != zero) & (err > rel_gate * ar)) | (err > worst_gate * bound);
      }
      if (any(loud))
        for (std::size_t j = 0; j < kBlock; ++j) bookkeep(i + j);
    }
    e[0] = e4[0], e[1] = e4[1], e[2] = e4[2], e[3] = e4[3];
    rr[0] = r4[0], rr[1] = r4[1], rr[2] = r4[2], rr[3] = r4[3];
    max_abs = std::max(std::max(m4[0], m4[1]), std::max(m4[2], m4[3]));
    auto element = [&](std::size_t idx, double& e_acc, double& r_acc) {
      const double r = ref[idx], err = std::abs(x[idx] - r);
      e_acc += err * err;
      r_acc += r * r;
      max_abs = std::max(max_abs, err);
      bookkeep(idx);
    };
    for (; i < end4; i += 4)
      for (int k = 0; k < 4; ++k) element(i + k, e[k], rr[k]);
    for (; i < end; ++i) element(i, e[0], rr[0]);
    // A unit whose squares overflowed (values beyond ~1e154) is added again
    // value by value, scaled (see SquareSum): rare, and never on clean data.
    // A NaN or Inf value makes its error, and the unit's sum of squares,
    // non-finite; a finite sum clears the unit of both at no cost.
    const double unit_err_sq = (e[0] + e[1]) + (e[2] + e[3]);
    maybe_nonfinite = maybe_nonfinite || !std::isfinite(unit_err_sq);
    if (!s.err_sq.add_partial(unit_err_sq))
      for (std::size_t j = at; j < end; ++j) s.err_sq.add_value(std::abs(double(x[j]) - double(ref[j])));
    if (!s.ref_sq.add_partial((rr[0] + rr[1]) + (rr[2] + rr[3])))
      for (std::size_t j = at; j < end; ++j) s.ref_sq.add_value(ref[j]);
    at = end;
  }
  s.n_fail += fails;
  s.any_nan_error = s.any_nan_error || nan_error;
  s.max_abs = std::max(s.max_abs, max_abs);
  s.max_rel = std::max(s.max_rel, max_rel);
  s.n_total += static_cast<long long>(n);
  if (n == 0) return false;
  s.owner_err_ratio.push_back({g.owner, worst_ratio});
  // Within a block, local row-major order is global order, so the first worst
  // element of the chunk is also its lowest global index.
  s.offer_reference({worst_ratio,
                     global_flat_index(p.tap->local_shape, p.global, g.block, first + worst),
                     g.owner, x[worst], ref[worst]});
  return maybe_nonfinite;
}

}  // namespace

namespace {

template <class X, class R>
bool scan_reference_portable_typed(const X* x, const R* ref, std::size_t n, const Tolerance& tol,
                                   const TapPlan& p, const BlockGroup& g, std::size_t first,
                                   const ChunkPlan& plan, TapStats& s) {
  return scan_reference_body(x, ref, n, tol, p, g, first, plan, s);
}

// The same code for AVX2 (one 4-lane register where the baseline uses two):
// an x86-64 target attribute, chosen at run time.
template <class X, class R>
[[gnu::target("avx2")]] bool scan_reference_avx2_typed(const X* x, const R* ref, std::size_t n,
                                                       const Tolerance& tol, const TapPlan& p,
                                                       const BlockGroup& g, std::size_t first,
                                                       const ChunkPlan& plan, TapStats& s) {
  return scan_reference_body(x, ref, n, tol, p, g, first, plan, s);
}

template <class X, class R>
bool scan_reference_typed(const X* x, const R* ref, std::size_t n, const Tolerance& tol, const TapPlan& p,
                          const BlockGroup& g, std::size_t first, const ChunkPlan& plan, TapStats& s,
                          ScanBuild build) {
  const bool avx2 = build == ScanBuild::avx2 || (build == ScanBuild::best && scan_reference_avx2_available());
  return avx2 ? scan_reference_avx2_typed(x, ref, n, tol, p, g, first, plan, s)
              : scan_reference_portable_typed(x, ref, n, tol, p, g, first, plan, s);
}

template <class X>
bool scan_reference_of(const X* x, StoredValues ref, std::size_t n, const Tolerance& tol, const TapPlan& p,
                       const BlockGroup& g, std::size_t first, const ChunkPlan& plan, TapStats& s,
                       ScanBuild build) {
  if (ref.element_size == 4)
    return scan_reference_typed(x, static_cast<const float*>(ref.data), n, tol, p, g, first, plan, s, build);
  return scan_reference_typed(x, static_cast<const double*>(ref.data), n, tol, p, g, first, plan, s, build);
}

}  // namespace

bool scan_reference(StoredValues x, StoredValues ref, std::size_t n, const Tolerance& tol, const TapPlan& p,
                    const BlockGroup& g, std::size_t first, const ChunkPlan& plan, TapStats& s, ScanBuild build) {
  if (x.element_size == 4)
    return scan_reference_of(static_cast<const float*>(x.data), ref, n, tol, p, g, first, plan, s, build);
  return scan_reference_of(static_cast<const double*>(x.data), ref, n, tol, p, g, first, plan, s, build);
}

void scan_reference_portable(const double* x, const double* ref, std::size_t n, const Tolerance& tol,
                             const TapPlan& p, const BlockGroup& g, std::size_t first, const ChunkPlan& plan,
                             TapStats& s) {
  scan_reference_typed(x, ref, n, tol, p, g, first, plan, s, ScanBuild::portable);
}

void scan_reference_avx2(const double* x, const double* ref, std::size_t n, const Tolerance& tol,
                         const TapPlan& p, const BlockGroup& g, std::size_t first, const ChunkPlan& plan,
                         TapStats& s) {
  scan_reference_typed(x, ref, n, tol, p, g, first, plan, s, ScanBuild::avx2);
}

bool scan_reference_avx2_available() {
  static const bool ok = __builtin_cpu_supports("avx2");
  return ok;
}

void scan_reference(const double* x, const double* ref, std::size_t n, const Tolerance& tol,
                    const TapPlan& p, const BlockGroup& g, std::size_t first, const ChunkPlan& plan,
                    TapStats& s) {
  scan_reference_typed(x, ref, n, tol, p, g, first, plan, s, ScanBuild::best);
}

}  // namespace dc
