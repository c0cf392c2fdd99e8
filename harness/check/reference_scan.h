// The reference scan of one chunk: values against their reference under a
// tolerance, in one pass that keeps the failures, the largest errors and the
// error's and the reference's sums of squares. A template of the SIMD flavour
// and of the stored widths, inlined into scans.cpp's baseline and AVX2
// functions (included only there). Every element is widened to double
// (exactly) before any arithmetic whose result is kept, so the widths give the
// same results bit for bit; only the equality test of float32 against float32
// subtracts in float32, where x - ref is 0 (or NaN) exactly when it is in
// double.
#pragma once
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "harness/check/chunks.h"
#include "harness/check/simd_quad.h"
#include "harness/check/tap_plan.h"
#include "harness/check/tap_stats.h"
#include "harness/check/tolerance.h"
#include "harness/core/layout.h"

namespace dc::simd {

#define DC_INLINE [[gnu::always_inline]] inline

template <class Simd, class X, class R>
struct ReferenceScan {
  static constexpr double kMargin = 1 - 1e-12;  // covers the rounding of the products below
  static constexpr std::size_t kBlock = 16;

  const X* x;
  const R* ref;
  const Tolerance& tol;
  // The chunk's results so far.
  double worst_ratio = -1, max_abs = 0, max_rel = 0;
  std::size_t worst = 0;
  long long fails = 0;
  bool nan_error = false, maybe_nonfinite = false;
  // The chunk's squared errors and squared reference values, summed plainly
  // (its owner's rel L2 in the heatmap; the verdict's sums are exact).
  double err_total = 0, ref_total = 0;
  // The current summation unit's eight lanes (0-3 and 4-7) of the error's and
  // the reference's squares, and the largest error per lane.
  Quad e_lo{}, e_hi{}, r_lo{}, r_hi{}, m4{};

  ReferenceScan(const X* x_, const R* ref_, const Tolerance& tol_) : x(x_), ref(ref_), tol(tol_) {}

  // The results a unit may have to be scanned again from (finish_unit).
  // Field by field, not through std::tie: references to the members kept GCC
  // from holding them in registers (the scan took 3-14% longer).
  struct Results {
    double worst_ratio, max_rel;
    std::size_t worst;
    long long fails;
    bool nan_error;
  };
  DC_INLINE Results results() const { return {worst_ratio, max_rel, worst, fails, nan_error}; }
  DC_INLINE void restore(const Results& r) {
    worst_ratio = r.worst_ratio, max_rel = r.max_rel, worst = r.worst, fails = r.fails, nan_error = r.nan_error;
  }

  // The bookkeeping of one element beyond the sums and max_abs: the maxima
  // of the relative error and of err/tol (the first index of the largest).
  DC_INLINE void maxima(std::size_t i) {
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
  }

  // maxima() and failures.
  DC_INLINE void bookkeep(std::size_t i) {
    const double r = ref[i], err = std::abs(x[i] - r), bound = tol.atol + tol.rtol * std::abs(r);
    // Fails, NaN included; an infinite error fails even against an infinite
    // bound (an Inf in the reference must not excuse a finite value).
    if (!(err <= bound) || err == kInf) {
      ++fails;
      nan_error = nan_error || std::isnan(err);
    }
    maxima(i);
  }

  // The same for the 16 elements from i, four at a time: failures counted
  // from masks, and maxima() for only the elements that may raise one (by
  // the maxima as they stand at the block's start, which only grow), in
  // order. A block where every element fails (a wrong tensor) costs about
  // one more vector pass, not 16 rounds of branches. Returns whether any
  // element failed or asked.
  DC_INLINE bool bookkeep_block(std::size_t i) {
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
  }

  // Whether any of the 16 elements from j differs from its reference.
  DC_INLINE bool block_differs(std::size_t j) const {
    if constexpr (std::is_same_v<X, float> && std::is_same_v<R, float>) {
      // x - ref, rounded to float, is 0 exactly when it is 0 in double (and
      // NaN when it is NaN): the test on eight floats at a time.
      return Simd::any(Mask((load8(x + j) - load8(ref + j) != 0) | (load8(x + j + 8) - load8(ref + j + 8) != 0)));
    } else {
      return Simd::any((load4(x + j) - load4(ref + j) != 0) | (load4(x + j + 4) - load4(ref + j + 4) != 0) |
                       (load4(x + j + 8) - load4(ref + j + 8) != 0) |
                       (load4(x + j + 12) - load4(ref + j + 12) != 0));  // NaN included
    }
  }

  // The reference's squares of the 16 elements from j, in their lanes.
  DC_INLINE void add_reference_squares(std::size_t j) {
    const Quad a = load4(ref + j), b = load4(ref + j + 4), c = load4(ref + j + 8), d = load4(ref + j + 12);
    r_lo += a * a;
    r_hi += b * b;
    r_lo += c * c;
    r_hi += d * d;
  }

  // Elements equal to their reference (x - ref exactly 0: no NaN, no Inf)
  // move no maximum, failure or error sum (a 0 added to a lane leaves it as
  // it is), and only a chunk's first element can be its worst (ratio 0):
  // only the reference's squares are left. So the unit's leading blocks of
  // 16 that equal their reference get one branch-free compare pass and their
  // squares, in the same lanes as the full scan, which starts at the first
  // block that differs (returned in `i`); the result is bit-identical.
  // Returns true for a unit equal to its reference throughout, then done.
  DC_INLINE bool skip_equal_blocks(std::size_t at, std::size_t end, std::size_t end4, std::size_t& i, TapStats& s) {
    i = at;
    for (; i + 16 <= end4 && !block_differs(i); i += 16) add_reference_squares(i);
    if (i > at && at == 0) {  // the chunk's first element is equal: its worst so far, at ratio 0
      worst_ratio = std::max(worst_ratio, 0.0);
      worst = 0;
    }
    bool identical = i + 16 > end4;
    for (std::size_t j = i; identical && j < end; ++j) identical = double(x[j]) - double(ref[j]) == 0;
    if (!identical) return false;
    for (; i < end4; i += 4) ((i - at) % 8 == 0 ? r_lo : r_hi) += load4(ref + i) * load4(ref + i);
    for (; i < end; ++i) r_lo[0] += double(ref[i]) * double(ref[i]);
    if (at == 0) {
      worst_ratio = std::max(worst_ratio, 0.0);
      worst = 0;
    }
    ref_total += lane_sum(r_lo, r_hi);
    if (!s.ref_sq.add_partial(lane_sum(r_lo, r_hi)))
      for (std::size_t j = at; j < end; ++j) s.ref_sq.add_value(ref[j]);
    return true;
  }

  // After a block that needed its bookkeeping (a wrong tensor: so will this
  // one, most likely), one pass takes the sums and asks whether every element
  // fails and none may raise a maximum. Then the bookkeeping would only count
  // 16 failures, and this pass does it with about half of its operations
  // (vector masks, one test per block). An element that fails by
  // `err > bound` is one the bookkeeping counts (it fails by
  // `!(err <= bound)`); a NaN error, or an infinite one against an infinite
  // bound, is not `err > bound` and sends the block to the bookkeeping, as
  // does any element that might raise max_rel (asked without the
  // bookkeeping's `r != 0`: more often, never less) or err/tol. Bookkeeping a
  // block that needed none changes nothing (no element of it fails or raises
  // a maximum), so the results are the same; a block where nothing failed or
  // asked goes back to the question. Advances `i` and `block` over the blocks
  // that failed plainly; returns whether the block it stopped at got the
  // bookkeeping and needed it.
  DC_INLINE bool plain_failing_blocks(std::size_t& i, std::size_t& block, std::size_t end4) {
    const Quad atol = splat(tol.atol), rtol = splat(tol.rtol);
    const Quad rel_gate = splat(max_rel * kMargin), worst_gate = splat(worst_ratio * kMargin);
    // Block after block while they fail plainly, in a loop of its own whose
    // sums are locals: in the scan's loop GCC kept them on the stack, and the
    // adds waited on stores and loads.
    Quad el = e_lo, eh = e_hi, rl = r_lo, rh = r_hi, most = m4;
    long long plain_blocks = 0;
    bool stopped = false;
    for (;;) {
      // Fails and asks nothing: err > bound, and err <= both gates (one
      // mask, to keep fewer registers live). A NaN gate (an infinite |r|, or
      // an infinite worst err/tol times a zero bound) compares false and
      // sends the block to the bookkeeping.
      Mask plain{-1, -1, -1, -1};
      auto quad = [&](std::size_t at4, Quad& e_lane, Quad& r_lane) __attribute__((always_inline)) {
        const Quad r = load4(ref + at4), err = abs4(load4(x + at4) - r), ar = abs4(r);
        e_lane += err * err;
        r_lane += r * r;
        most = most < err ? err : most;  // a NaN error leaves it unchanged
        const Quad bound = atol + rtol * ar, rel = rel_gate * ar, worst_bound = worst_gate * bound;
        plain &= (err > bound) & (err <= (rel < worst_bound ? rel : worst_bound));
      };
      // Not unrolled: fewer values live at once (unrolled, GCC kept the masks
      // of all four quads and spilled them).
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
    return stopped && bookkeep_block(i);
  }

  // A block's sums, then the question whether any element of it might fail
  // or raise max_rel or err/tol, against the maxima as they stand at the
  // block's start. They only grow, and only such an element grows them, so a
  // block where none might is one where the bookkeeping would do nothing;
  // only the others get it. The question is one comparison,
  // err <= min(c bound, max_rel |r|) with c = min(1, worst err/tol): every
  // element with a finite error that fails (err > bound), raises err/tol
  // (err > worst bound) or raises max_rel (err > max_rel |r|, r != 0) answers
  // no, and so does a NaN. It may answer no for one that does none of these
  // (a nonzero error at an exact zero of the reference, a negative bound):
  // bookkeeping for nothing, never a miss. An infinite error may answer yes;
  // it makes the unit's sum of squares infinite, and such a unit is scanned
  // again element by element (finish_unit). Returns whether the block got
  // the bookkeeping.
  DC_INLINE bool question_block(std::size_t i) {
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
    // The lanes as locals while they are added to (as plain_failing_blocks does).
    Quad el = e_lo, eh = e_hi, rl = r_lo, rh = r_hi;
#pragma GCC unroll 1
    for (std::size_t j = 0; j < kBlock; j += 8) {
      four(i + j, el, rl);
      four(i + j + 4, eh, rh);
    }
    e_lo = el, e_hi = eh, r_lo = rl, r_hi = rh;
    m4 = m4 < most ? most : m4;
    // The question, of the block as a whole first: no bound is below c atol,
    // and no element's max_rel |r| below max_rel times its lane's smallest
    // |r|, so a lane whose largest error is within both has no element that
    // asks. (A NaN error answers here as if it did not ask; it makes the
    // unit's sum NaN, and the unit is scanned again.) Only where that fails,
    // element by element.
    const Quad rel_least = rel_gate * least;
    if (i != 0 && Simd::all(most <= (c_atol < rel_least ? c_atol : rel_least))) return false;
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
    if (!quiet_all) bookkeep_block(i);
    return !quiet_all;
  }

  // The unit's blocks of 16 from `i` (the first that differs) to end4. After
  // the unit's first block that differs, a block equal to its reference is
  // still worth finding (a few scattered differences leave most blocks
  // equal): one is looked for before each block while they keep turning up,
  // and before every 8th only once two blocks in a row differed (where every
  // element differs, the look costs about 1%).
  DC_INLINE void scan_blocks(std::size_t& i, std::size_t end4) {
    unsigned differing_in_a_row = 1;  // block 0 is the one skip_equal_blocks stopped at
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
      last_bookkept = last_bookkept && i != 0 ? plain_failing_blocks(i, block, end4) : question_block(i);
    }
  }

  // The unit's last elements one at a time, in their lanes, and its sums into
  // the exact sums. `before`: the results as they stood at the unit's start.
  DC_INLINE void finish_unit(std::size_t at, std::size_t i, std::size_t end, std::size_t end4,
                             const Results& before, TapStats& s) {
    max_abs = std::max(std::max(m4[0], m4[1]), std::max(m4[2], m4[3]));
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
    err_total += unit_err_sq;
    ref_total += lane_sum(r_lo, r_hi);
    if (!std::isfinite(unit_err_sq)) {
      maybe_nonfinite = true;
      // The question may have let an infinite error by: every element of the
      // unit is bookkept again, from the state the unit started in.
      restore(before);
      for (std::size_t j = at; j < end; ++j) bookkeep(j);
    }
    if (!s.err_sq.add_partial(unit_err_sq))
      for (std::size_t j = at; j < end; ++j) s.err_sq.add_value(std::abs(double(x[j]) - double(ref[j])));
    if (!s.ref_sq.add_partial(lane_sum(r_lo, r_hi)))
      for (std::size_t j = at; j < end; ++j) s.ref_sq.add_value(ref[j]);
  }

  // One summation unit (see ChunkPlan), its squares in eight independent
  // lanes so that no add waits long on another: element at + j of a unit
  // starting at `at` in lane j % 8, but those after the unit's last multiple
  // of 4 in lane 0. A unit's sum (lane_sum) goes into the exact sum.
  DC_INLINE void scan_unit(std::size_t at, std::size_t end, TapStats& s) {
    const std::size_t end4 = at + (end - at) / 4 * 4;
    const Results before = results();
    r_lo = splat(0.0), r_hi = r_lo;
    std::size_t i;
    if (skip_equal_blocks(at, end, end4, i, s)) return;
    e_lo = splat(0.0), e_hi = e_lo, m4 = splat(max_abs);
    scan_blocks(i, end4);
    finish_unit(at, i, end, end4, before, s);
  }
};

#undef DC_INLINE

// Scans n values from `first` of the block group's chunk into `s`. Returns
// whether x may hold a NaN or an Inf.
template <class Simd, class X, class R>
[[gnu::always_inline]] inline bool scan_reference_body(const X* x, const R* ref, std::size_t n,
                                                       const Tolerance& tol, const TapPlan& p, const BlockGroup& g,
                                                       std::size_t first, const ChunkPlan& plan, TapStats& s) {
  ReferenceScan<Simd, X, R> scan(x, ref, tol);
  for (std::size_t at = 0; at < n;) {
    const std::size_t end = at + std::min(n - at, plan.unit_left(first + at));
    scan.scan_unit(at, end, s);
    at = end;
  }
  s.n_fail += scan.fails;
  s.any_nan_error = s.any_nan_error || scan.nan_error;
  s.max_abs = std::max(s.max_abs, scan.max_abs);
  s.max_rel = std::max(s.max_rel, scan.max_rel);
  s.n_total += static_cast<long long>(n);
  if (n == 0) return false;
  s.owner_err_ratio.push_back({g.owner, scan.worst_ratio});
  s.owner_err_sq.push_back({g.owner, scan.err_total});
  s.owner_ref_sq.push_back({g.owner, scan.ref_total});
  // Within a block, local row-major order is global order, so the first worst
  // element of the chunk is also its lowest global index.
  s.offer_reference({scan.worst_ratio, global_flat_index(p.tap->local_shape, p.global, g.block, first + scan.worst),
                     g.owner, x[scan.worst], ref[scan.worst]});
  return scan.maybe_nonfinite;
}

}  // namespace dc::simd
