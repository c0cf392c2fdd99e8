#include "harness/check/scans.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>

#include "harness/check/compare.h"  // ulp_distance
#include "harness/check/reference_scan.h"
#include "harness/check/simd_quad.h"

namespace dc {

using namespace simd;

namespace {

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

template <class X, class R>
bool scan_reference_portable_typed(const X* x, const R* ref, std::size_t n, const Tolerance& tol,
                                   const TapPlan& p, const BlockGroup& g, std::size_t first,
                                   const ChunkPlan& plan, TapStats& s) {
  return scan_reference_body<PortableSimd>(x, ref, n, tol, p, g, first, plan, s);
}

// The same code for AVX2 (one 4-lane register where the baseline uses two):
// an x86-64 target attribute, chosen at run time.
template <class X, class R>
[[gnu::target("avx2")]] bool scan_reference_avx2_typed(const X* x, const R* ref, std::size_t n,
                                                       const Tolerance& tol, const TapPlan& p,
                                                       const BlockGroup& g, std::size_t first,
                                                       const ChunkPlan& plan, TapStats& s) {
  return scan_reference_body<Avx2Simd>(x, ref, n, tol, p, g, first, plan, s);
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
