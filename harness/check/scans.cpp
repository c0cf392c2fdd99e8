#include "harness/check/scans.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>

#include <immintrin.h>

#include "harness/check/compare.h"  // ulp_distance

namespace dc {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Four doubles, as GCC's vector extension (no intrinsics): two SSE2 registers
// on baseline x86-64, one AVX2 register in the clone compiled for it (below).
// A pair of them holds the eight summation lanes of the reference scan.
// Comparisons give per-lane masks (all ones where true). Lane k of an add is the same IEEE operation as the scalar one (no
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
// Eight floats as they are, for tests that need no widening.
using Oct = float __attribute__((vector_size(32)));
[[gnu::always_inline]] inline Oct load8(const float* p) {
  Oct v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline Quad splat(double v) { return Quad{v, v, v, v}; }
[[gnu::always_inline]] inline Quad abs4(const Quad& v) { return (Quad)((Mask)v & ~(Mask)splat(-0.0)); }

// The sum of eight lanes held as lanes 0-3 and 4-7, in one fixed order:
// ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)).
[[gnu::always_inline]] inline double lane_sum(const Quad& lo, const Quad& hi) {
  const Quad t = lo + hi;
  return (t[0] + t[1]) + (t[2] + t[3]);
}

// Whether any (all) lanes of a mask are set: the hot loops' one branch.
// Baseline x86-64 folds the halves first; AVX2 asks in one instruction
// (vptest, vmovmskpd), where moving each lane out to an integer register took
// a fifth of the scan.
struct PortableSimd {
  [[gnu::always_inline]] static inline bool any(const Mask& m) {
    const Mask t = m | __builtin_shufflevector(m, m, 2, 3, 0, 1);
    return (t[0] | t[1]) != 0;
  }
  [[gnu::always_inline]] static inline bool all(const Mask& m) {
    const Mask t = m & __builtin_shufflevector(m, m, 2, 3, 0, 1);
    return (t[0] & t[1]) == -1;
  }
  // Lane k set: bit k.
  [[gnu::always_inline]] static inline unsigned bits(const Mask& m) {
    return static_cast<unsigned>((m[0] & 1) | (m[1] & 2) | (m[2] & 4) | (m[3] & 8));
  }
};
struct Avx2Simd {
  // Not always_inline: the scan's body is inlined into its AVX2 build first.
  [[gnu::target("avx2")]] static inline bool any(const Mask& m) { return !_mm256_testz_si256(m, m); }
  [[gnu::target("avx2")]] static inline bool all(const Mask& m) { return bits(m) == 0xF; }
  [[gnu::target("avx2")]] static inline unsigned bits(const Mask& m) {
    return static_cast<unsigned>(_mm256_movemask_pd(reinterpret_cast<__m256d>(m)));
  }
};

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
// widened to double (exactly) before any arithmetic whose result is kept, so
// the widths give the same results bit for bit; only the equality test of
// float32 against float32 subtracts in float32, where x - ref is 0 (or NaN)
// exactly when it is in double.
template <class Simd, class X, class R>
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
  auto maxima = [&](std::size_t i) {
    const double r = ref[i], err = std::abs(x[i] - r), bound = tol.atol + tol.rtol * std::abs(r);
    // Divisions only for elements that may raise a maximum.
    if (r != 0 && err > max_rel * std::abs(r) * kMargin) max_rel = std::max(max_rel, err / std::abs(r));
    if (i == 0 || err > worst_ratio * bound * kMargin || std::isnan(err)) {
      double ratio = std::isnan(err) ? kInf : bound > 0 ? err / bound : err > 0 ? kInf : 0.0;
      if (ratio > worst_ratio) {
        worst_ratio = ratio;
        worst = i;
      }
    }
  };
  auto bookkeep = [&](std::size_t i) {
    const double r = ref[i], err = std::abs(x[i] - r), bound = tol.atol + tol.rtol * std::abs(r);
    // Fails, NaN included; an infinite error fails even against an infinite
    // bound (an Inf in the reference must not excuse a finite value).
    if (!(err <= bound) || err == kInf) {
      ++fails;
      nan_error = nan_error || std::isnan(err);
    }
    maxima(i);
  };
  // The same for the 16 elements from i, four at a time: failures counted
  // from masks, and maxima() for only the elements that may raise one (by
  // the maxima as they stand at the block's start, which only grow), in
  // order. A block where every element fails (a wrong tensor) costs about
  // one more vector pass, not 16 rounds of branches.
  // Whether any element failed or asked.
  // (Inlined, so that it is compiled for the build it is part of: AVX2 or not.)
  auto bookkeep_block = [&](std::size_t i) __attribute__((always_inline)) {
    const Quad atol = splat(tol.atol), rtol = splat(tol.rtol), inf = splat(kInf), zero = splat(0.0);
    const Quad rel_gate = splat(max_rel * kMargin), worst_gate = splat(worst_ratio * kMargin);
    unsigned ask = i == 0 ? 1u : 0u, failed = 0;
#pragma GCC unroll 4
    for (std::size_t j = 0; j < 16; j += 4) {
      const Quad r = load4(ref + i + j), err = abs4(load4(x + i + j) - r), ar = abs4(r);
      const Quad bound = atol + rtol * ar;
      const Mask nan = err != err;
      failed |= Simd::bits(~(err <= bound) | (err == inf)) << j;
      nan_error = nan_error || Simd::any(nan);
      ask |= Simd::bits(((r != zero) & (err > rel_gate * ar)) | (err > worst_gate * bound) | nan) << j;
    }
    fails += __builtin_popcount(failed);
    const bool any = (failed | ask) != 0;
    for (; ask; ask &= ask - 1) maxima(i + static_cast<std::size_t>(__builtin_ctz(ask)));
    return any;
  };
  // One summation unit at a time (see ChunkPlan), its squares in eight
  // independent lanes so that no add waits long on another: element at + j
  // of a unit starting at `at` in lane j % 8, but those after the unit's last
  // multiple of 4 in lane 0. A unit's sum (lane_sum) goes into the exact sum.
  for (std::size_t at = 0; at < n;) {
    const std::size_t end = at + std::min(n - at, plan.unit_left(first + at));
    const std::size_t end4 = at + (end - at) / 4 * 4;
    const auto before = std::make_tuple(worst_ratio, max_rel, worst, fails, nan_error);
    // Elements equal to their reference (x - ref exactly 0: no NaN, no Inf)
    // move no maximum, failure or error sum (a 0 added to a lane leaves it as
    // it is), and only a chunk's first element can be its worst (ratio 0):
    // only the reference's squares are left. So the unit's leading blocks of
    // 16 that equal their reference get one branch-free compare pass and
    // their squares, in the same lanes as below, and the full scan starts at
    // the first block that differs; the result is bit-identical. A unit
    // equal to its reference throughout ends here.
    Quad r_lo = splat(0.0), r_hi = r_lo;  // lanes 0-3 and 4-7
    // Whether any of the 16 elements from j differs from its reference.
    auto block_differs = [&](std::size_t j) __attribute__((always_inline)) {
      if constexpr (std::is_same_v<X, float> && std::is_same_v<R, float>) {
        // x - ref, rounded to float, is 0 exactly when it is 0 in double (and
        // NaN when it is NaN): the test on eight floats at a time.
        return Simd::any(Mask((load8(x + j) - load8(ref + j) != 0) | (load8(x + j + 8) - load8(ref + j + 8) != 0)));
      } else {
        return Simd::any((load4(x + j) - load4(ref + j) != 0) | (load4(x + j + 4) - load4(ref + j + 4) != 0) |
                         (load4(x + j + 8) - load4(ref + j + 8) != 0) |
                         (load4(x + j + 12) - load4(ref + j + 12) != 0));  // NaN included
      }
    };
    // The reference's squares of the 16 elements from j, in their lanes.
    auto add_reference_squares = [&](std::size_t j) __attribute__((always_inline)) {
      const Quad a = load4(ref + j), b = load4(ref + j + 4), c = load4(ref + j + 8), d = load4(ref + j + 12);
      r_lo += a * a;
      r_hi += b * b;
      r_lo += c * c;
      r_hi += d * d;
    };
    std::size_t i = at;
    for (; i + 16 <= end4 && !block_differs(i); i += 16) add_reference_squares(i);
    if (i > at && at == 0) {  // the chunk's first element is equal: its worst so far, at ratio 0
      worst_ratio = std::max(worst_ratio, 0.0);
      worst = 0;
    }
    bool identical = i + 16 > end4;
    for (std::size_t j = i; identical && j < end; ++j) identical = double(x[j]) - double(ref[j]) == 0;
    if (identical) {
      for (; i < end4; i += 4) ((i - at) % 8 == 0 ? r_lo : r_hi) += load4(ref + i) * load4(ref + i);
      for (; i < end; ++i) r_lo[0] += double(ref[i]) * double(ref[i]);
      if (at == 0) {
        worst_ratio = std::max(worst_ratio, 0.0);
        worst = 0;
      }
      if (!s.ref_sq.add_partial(lane_sum(r_lo, r_hi)))
        for (std::size_t j = at; j < end; ++j) s.ref_sq.add_value(ref[j]);
      at = end;
      continue;
    }
    // Blocks of 16: a branch-free pass takes the sums and max_abs and asks
    // whether any element might fail or raise max_rel or err/tol, against
    // the maxima as they stand at the block's start. They only grow, and only
    // such an element grows them, so a block where none might is one where
    // the bookkeeping would do nothing; only the others get it, in order.
    // The question is one comparison, err <= min(c bound, max_rel |r|) with
    // c = min(1, worst err/tol): every element with a finite error that
    // fails (err > bound), raises err/tol (err > worst bound) or raises
    // max_rel (err > max_rel |r|, r != 0) answers no, and so does a NaN. It
    // may answer no for one that does none of these (a nonzero error at an
    // exact zero of the reference, a negative bound): bookkeeping for
    // nothing, never a miss. An infinite error may answer yes; it makes the
    // unit's sum of squares infinite, and such a unit is scanned again below
    // element by element from the state it started in.
    // After the unit's first block that differs, a block equal to its
    // reference is still worth finding (a few scattered differences leave
    // most blocks equal): one is looked for before each block while they keep
    // turning up, and before every 8th only once two blocks in a row differed
    // (where every element differs, the look costs about 1%).
    constexpr std::size_t kBlock = 16;
    Quad e_lo = splat(0.0), e_hi = e_lo, m4 = splat(max_abs);
    unsigned differing_in_a_row = 1;  // block 0 is the one the loop above stopped at
    bool last_bookkept = false;
    for (std::size_t block = 0; i + kBlock <= end4; i += kBlock, ++block) {
      if (block != 0 && i != 0 && (differing_in_a_row < 2 || block % 8 == 0)) {
        if (!block_differs(i)) {
          add_reference_squares(i);  // an equal block adds 0 to the error lanes and moves no maximum
          differing_in_a_row = 0;
          continue;
        }
        ++differing_in_a_row;
      }
      // After a block that needed its bookkeeping (a wrong tensor: so will
      // this one, most likely), one pass takes the sums and asks whether
      // every element fails and none may raise a maximum. Then the
      // bookkeeping would only count 16 failures, and this pass does it with
      // about half of its operations (vector masks, one test per block). An
      // element that fails by `err > bound` is one the bookkeeping counts (it
      // fails by `!(err <= bound)`); a NaN error, or an infinite one against
      // an infinite bound, is not `err > bound` and sends the block to the
      // bookkeeping, as does any element that might raise max_rel (asked
      // without the bookkeeping's `r != 0`: more often, never less) or
      // err/tol. Bookkeeping a block that needed none changes nothing (no
      // element of it fails or raises a maximum), so the results are the
      // same; a block where nothing failed or asked goes back to the question.
      if (last_bookkept && i != 0) {
        const Quad atol = splat(tol.atol), rtol = splat(tol.rtol);
        const Quad rel_gate = splat(max_rel * kMargin), worst_gate = splat(worst_ratio * kMargin);
        // Block after block while they fail plainly, in a loop of its own
        // whose sums are locals: in the scan's loop GCC kept them on the
        // stack, and the adds waited on stores and loads.
        Quad el = e_lo, eh = e_hi, rl = r_lo, rh = r_hi, most = m4;
        long long plain_blocks = 0;
        bool stopped = false;
        for (;;) {
          // Fails and asks nothing: err > bound, and err <= both gates (one
          // mask, to keep fewer registers live). A NaN gate (an infinite |r|,
          // or an infinite worst err/tol times a zero bound) compares false
          // and sends the block to the bookkeeping.
          Mask plain{-1, -1, -1, -1};
          auto quad = [&](std::size_t at4, Quad& e_lane, Quad& r_lane) __attribute__((always_inline)) {
            const Quad r = load4(ref + at4), err = abs4(load4(x + at4) - r), ar = abs4(r);
            e_lane += err * err;
            r_lane += r * r;
            most = most < err ? err : most;  // a NaN error leaves it unchanged
            const Quad bound = atol + rtol * ar, rel = rel_gate * ar, worst = worst_gate * bound;
            plain &= (err > bound) & (err <= (rel < worst ? rel : worst));
          };
          // Not unrolled: fewer values live at once (unrolled, GCC kept the
          // masks of all four quads and spilled them).
#pragma GCC unroll 1
          for (std::size_t j = 0; j < kBlock; j += 8) {
            quad(i + j, el, rl);
            quad(i + j + 4, eh, rh);
          }
          if (!Simd::all(plain)) {
            stopped = true;
            break;
          }
          ++plain_blocks;
          if (i + 2 * kBlock > end4) break;  // the scan's loop steps past this block
          i += kBlock;
          ++block;
        }
        e_lo = el, e_hi = eh, r_lo = rl, r_hi = rh, m4 = most;
        fails += plain_blocks * static_cast<long long>(kBlock);
        // The block that did not fail plainly (its sums are taken) gets the
        // bookkeeping; after a run of plain ones the next most likely fails too.
        if (stopped) last_bookkept = bookkeep_block(i);
        continue;
      }
      // c as above, below 1 by a margin when below 1 at all, so that c times
      // the bound, rounded, stays below the bound.
      const double c = worst_ratio * kMargin >= 1 ? 1.0 : worst_ratio * kMargin * kMargin;
      const Quad c_atol = splat(c * tol.atol), rel_gate = splat(max_rel * kMargin);
      // Per lane (elements k, k + 4, k + 8, k + 12): the largest error and the
      // smallest |ref|, for the question asked of the block first.
      Quad most = splat(0.0), least = splat(kInf);
      auto four = [&](std::size_t at4, Quad& e_lane, Quad& r_lane) __attribute__((always_inline)) {
        const Quad r = load4(ref + at4), err = abs4(load4(x + at4) - r), ar = abs4(r);
        e_lane += err * err;
        r_lane += r * r;
        most = most < err ? err : most;  // a NaN error leaves it unchanged
        least = ar < least ? ar : least;
      };
      // Not unrolled: fewer values live at once (unrolled, GCC spilled the
      // accumulators to the stack).
#pragma GCC unroll 1
      for (std::size_t j = 0; j < kBlock; j += 8) {
        four(i + j, e_lo, r_lo);
        four(i + j + 4, e_hi, r_hi);
      }
      m4 = m4 < most ? most : m4;
      // The question, of the block as a whole first: no bound is below
      // c atol, and no element's max_rel |r| below max_rel times its lane's
      // smallest |r|, so a lane whose largest error is within both has no
      // element that asks. (A NaN error answers here as if it did not ask;
      // it makes the unit's sum NaN, and the unit is scanned again below.)
      // Only where that fails, element by element.
      const Quad rel_least = rel_gate * least;
      if (i != 0 && Simd::all(most <= (c_atol < rel_least ? c_atol : rel_least))) continue;
      bool quiet_all = false;
      if (i != 0) {
        const Quad c_rtol = splat(c * tol.rtol);
        Mask quiet{-1, -1, -1, -1};
        for (std::size_t j = 0; j < kBlock; j += 4) {
          const Quad r = load4(ref + i + j), err = abs4(load4(x + i + j) - r), ar = abs4(r);
          const Quad bound = c_atol + c_rtol * ar, rel = rel_gate * ar;
          quiet &= err <= (bound < rel ? bound : rel);  // a NaN bound gives rel
        }
        quiet_all = Simd::all(quiet);
      }
      last_bookkept = !quiet_all;
      if (!quiet_all) bookkeep_block(i);
    }
    max_abs = std::max(std::max(m4[0], m4[1]), std::max(m4[2], m4[3]));
    // The unit's last elements, one at a time, in their lanes.
    double e[8], rr[8];
    for (int k = 0; k < 4; ++k) e[k] = e_lo[k], e[k + 4] = e_hi[k], rr[k] = r_lo[k], rr[k + 4] = r_hi[k];
    for (; i < end; ++i) {
      const double r = ref[i], err = std::abs(x[i] - r);
      const std::size_t lane = i < end4 ? (i - at) % 8 : 0;
      e[lane] += err * err;
      rr[lane] += r * r;
      max_abs = std::max(max_abs, err);
      bookkeep(i);
    }
    for (int k = 0; k < 4; ++k) e_lo[k] = e[k], e_hi[k] = e[k + 4], r_lo[k] = rr[k], r_hi[k] = rr[k + 4];
    // A unit whose squares overflowed (values beyond ~1e154) is added again
    // value by value, scaled (see SquareSum): rare, and never on clean data.
    // A NaN or Inf value makes its error, and the unit's sum of squares,
    // non-finite; a finite sum clears the unit of both at no cost.
    const double unit_err_sq = lane_sum(e_lo, e_hi);
    if (!std::isfinite(unit_err_sq)) {
      maybe_nonfinite = true;
      // The question above may have let an infinite error by: every element
      // of the unit is bookkept again, from the state the unit started in.
      std::tie(worst_ratio, max_rel, worst, fails, nan_error) = before;
      for (std::size_t j = at; j < end; ++j) bookkeep(j);
    }
    if (!s.err_sq.add_partial(unit_err_sq))
      for (std::size_t j = at; j < end; ++j) s.err_sq.add_value(std::abs(double(x[j]) - double(ref[j])));
    if (!s.ref_sq.add_partial(lane_sum(r_lo, r_hi)))
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
