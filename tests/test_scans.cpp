// The reference scan against the plain per-element loop it replaced (kept
// here as the oracle): the same failures, maxima, worst element and sums, to
// the bit, on data with exact matches, small and large errors, NaN, Inf and
// zeros in the reference, at lengths around the 16-element blocks and with
// several summation units; both builds of the scan (baseline, AVX2), and
// values and references stored as float32 or float64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>
#include <limits>
#include <random>

#include "harness/check/scans.h"

namespace dc {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void oracle_scan_reference(const double* x, const double* ref, std::size_t n, const Tolerance& tol,
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
  // One summation unit at a time (see ChunkPlan), each in eight independent
  // lanes: element at + j in lane j % 8, but those after the unit's last
  // multiple of 4 in lane 0; the lanes added as (l0 + l4) + (l1 + l5) and so
  // on, in pairs. A unit's sum goes into the exact sum.
  auto lane_sum = [](const double* l) {
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
  };
  for (std::size_t at = 0; at < n;) {
    const std::size_t end = at + std::min(n - at, plan.unit_left(first + at));
    double e[8] = {}, r[8] = {};
    const std::size_t end4 = at + (end - at) / 4 * 4;
    auto lane = [&](std::size_t i) { return i < end4 ? (i - at) % 8 : 0; };
    // A unit equal to its reference (every x - ref exactly 0: no NaN, no
    // Inf) moves no maximum, failure or error sum, and only a chunk's first
    // element can be its worst (ratio 0): only the reference's squares are
    // left, summed in the same lanes as below, so the result is bit-identical.
    bool identical = true;
    for (std::size_t i = at; i < end; ++i) identical &= (x[i] - ref[i] == 0);
    if (identical) {
      for (std::size_t i = at; i < end; ++i) r[lane(i)] += ref[i] * ref[i];
      if (at == 0) {
        worst_ratio = std::max(worst_ratio, 0.0);
        worst = 0;
      }
      if (!s.ref_sq.add_partial(lane_sum(r)))
        for (std::size_t i = at; i < end; ++i) s.ref_sq.add_value(ref[i]);
      at = end;
      continue;
    }
    for (std::size_t i = at; i < end; ++i) element(i, e[lane(i)], r[lane(i)]);
    // A unit whose squares overflowed (values beyond ~1e154) is added again
    // value by value, scaled (see SquareSum): rare, and never on clean data.
    if (!s.err_sq.add_partial(lane_sum(e)))
      for (std::size_t i = at; i < end; ++i) s.err_sq.add_value(std::abs(x[i] - ref[i]));
    if (!s.ref_sq.add_partial(lane_sum(r)))
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

void expect_same_number(double a, double b, const char* what) {
  if (std::isnan(b))
    EXPECT_TRUE(std::isnan(a)) << what;
  else
    EXPECT_EQ(a, b) << what;
}

struct Case {
  std::vector<double> x, ref;
};

// Mostly equal values, with runs of small errors, a few large ones and specials.
Case make_case(std::size_t n, unsigned seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> u;
  Case c;
  for (std::size_t i = 0; i < n; ++i) {
    double r = normal(rng);
    if (u(rng) < 0.02) r = 0;
    double x = r;
    const double pick = u(rng);
    if (pick < 0.3)
      x = r + 1e-7 * normal(rng);
    else if (pick < 0.32)
      x = r + normal(rng);
    if (specials && u(rng) < 0.01) x = u(rng) < 0.5 ? NAN : (u(rng) < 0.5 ? kInf : -kInf);
    if (specials && u(rng) < 0.005) r = kInf;
    c.x.push_back(x);
    c.ref.push_back(r);
  }
  return c;
}

void expect_same_stats(const TapStats& got, const TapStats& want, std::size_t n) {
  EXPECT_EQ(got.n_fail, want.n_fail);
  EXPECT_EQ(got.n_total, want.n_total);
  EXPECT_EQ(got.any_nan_error, want.any_nan_error);
  expect_same_number(got.max_abs, want.max_abs, "max_abs");
  expect_same_number(got.max_rel, want.max_rel, "max_rel");
  expect_same_number(SquareSum::sqrt_ratio(got.err_sq, got.ref_sq), SquareSum::sqrt_ratio(want.err_sq, want.ref_sq),
                     "error sum");
  expect_same_number(got.ref_sq.rms(n), want.ref_sq.rms(n), "reference sum");
  ASSERT_EQ(got.ref_worst.has_value(), want.ref_worst.has_value());
  if (want.ref_worst) {
    expect_same_number(got.ref_worst->ratio, want.ref_worst->ratio, "worst ratio");
    EXPECT_EQ(got.ref_worst->global_flat, want.ref_worst->global_flat);
    expect_same_number(got.ref_worst->value, want.ref_worst->value, "worst value");
    expect_same_number(got.ref_worst->reference, want.ref_worst->reference, "worst reference");
  }
  ASSERT_EQ(got.owner_err_ratio.size(), want.owner_err_ratio.size());
  for (std::size_t k = 0; k < got.owner_err_ratio.size(); ++k)
    expect_same_number(got.owner_err_ratio[k].value, want.owner_err_ratio[k].value, "owner ratio");
}

std::vector<double> through_float(std::vector<double> v) {
  for (double& d : v) d = static_cast<float>(d);
  return v;
}

std::vector<ScanBuild> builds() {
  std::vector<ScanBuild> b{ScanBuild::best, ScanBuild::portable};
  if (scan_reference_avx2_available()) b.push_back(ScanBuild::avx2);
  return b;
}

using ScanFn = void (*)(const double*, const double*, std::size_t, const Tolerance&, const TapPlan&,
                       const BlockGroup&, std::size_t, const ChunkPlan&, TapStats&);

// Both builds of the scan (baseline and AVX2) where this CPU runs them, and
// the one scan_reference chooses.
std::vector<std::pair<std::string, ScanFn>> kernels() {
  std::vector<std::pair<std::string, ScanFn>> k{{"chosen", scan_reference}, {"portable", scan_reference_portable}};
  if (scan_reference_avx2_available()) k.emplace_back("avx2", scan_reference_avx2);
  return k;
}

TEST(ScanReference, SameAsThePerElementLoop) {
  if (!scan_reference_avx2_available()) std::printf("no AVX2 on this CPU: its build of the scan is not tested\n");
  const Mesh mesh = Mesh::parse("dp=1");
  Tolerance tols[4];
  tols[0].atol = 1e-5;
  tols[1].rtol = 1e-3;
  tols[3].atol = tols[3].rtol = 1e-6;
  for (std::size_t n : {1, 3, 4, 15, 16, 17, 31, 32, 33, 100, 1000, 4099}) {
    for (std::size_t unit : {1, 7, 64, 100000}) {
      for (int variant = 0; variant < 7; ++variant) {
        for (const Tolerance& tol : tols) {
          SCOPED_TRACE(testing::Message() << "n " << n << " unit " << unit << " variant " << variant << " atol "
                                          << tol.atol << " rtol " << tol.rtol);
          Case c = make_case(n, static_cast<unsigned>(n * 31 + unit + variant), variant == 2);
          if (variant == 1) c.x = c.ref;  // identical units
          if (variant >= 3) {
            // Equal runs of every length, broken by one small error (the
            // scan starts over after the equal blocks of a unit); with 4, an
            // infinite error that no bound excludes (the reference infinite,
            // the value finite) and an Inf equal to its reference (NaN error).
            c.ref = make_case(n, static_cast<unsigned>(n + unit), false).ref;
            c.x = c.ref;
            for (std::size_t i = 5, gap = 1; i < n; gap += 7, i += gap) c.x[i] += 1e-3;
            if (variant == 4 && n > 70) {
              c.ref[50] = kInf;
              c.x[50] = 1.0;
              c.ref[69] = c.x[69] = -kInf;
            }
          }
          if (variant >= 5) {
            // A wrong tensor: every element fails (the scan's pass for runs
            // of failing blocks), some at an exact zero of the reference,
            // and every 97th by a growing error, so that max_rel and err/tol
            // rise all along; every 89th passes with its error exactly at its
            // bound. With 6, a NaN, an infinite error no bound excludes, and
            // an Inf equal to its reference.
            std::mt19937_64 rng(n + unit);
            std::normal_distribution<double> normal;
            for (std::size_t i = 0; i < n; ++i) {
              if (i % 53 == 7) c.ref[i] = 0;
              c.x[i] = c.ref[i] + 1.0 + 0.25 * normal(rng);
              if (i % 97 == 40) c.x[i] = c.ref[i] + 10.0 * (1.0 + double(i) / double(n));
              // An error exactly at its bound, which passes (where rtol = 0:
              // x - r = 2 atol - atol = atol, exactly).
              if (i % 89 == 20) c.ref[i] = tol.atol, c.x[i] = 2 * tol.atol;
            }
            if (variant == 6 && n > 300) {
              c.x[130] = NAN;
              c.ref[201] = kInf;
              c.x[201] = 2.0;
              c.ref[260] = c.x[260] = kInf;
            }
          }
          TapData t;
          t.name = "y";
          t.layout = Layout::parse("", "");
          t.local_shape = {n};
          t.reference_shape = Shape{n};
          const TapPlan p = plan_tap(t, mesh);
          const ChunkPlan plan({n}, n, unit);
          for (const auto& [kernel_name, kernel] : kernels()) {
            SCOPED_TRACE(kernel_name);
            const std::size_t first = 0;
            TapStats got, want;
            kernel(c.x.data(), c.ref.data(), n, tol, p, p.groups[0], first, plan, got);
            oracle_scan_reference(c.x.data(), c.ref.data(), n, tol, p, p.groups[0], first, plan, want);
            expect_same_stats(got, want, n);
          }
          // As stored: float32 or float64 values against a float32 or float64
          // reference, each build; the oracle sees the same numbers as doubles.
          for (std::size_t xw : {4, 8}) {
            for (std::size_t rw : {4, 8}) {
              for (ScanBuild build : builds()) {
                SCOPED_TRACE(testing::Message() << "stored widths " << xw << "/" << rw << " build "
                                                << static_cast<int>(build));
                std::vector<double> xd = c.x, rd = c.ref;
                if (xw == 4) xd = through_float(xd);
                if (rw == 4) rd = through_float(rd);
                const std::vector<float> xf(xd.begin(), xd.end()), rf(rd.begin(), rd.end());
                const StoredValues xs{xw == 4 ? static_cast<const void*>(xf.data()) : xd.data(), xw};
                const StoredValues rs{rw == 4 ? static_cast<const void*>(rf.data()) : rd.data(), rw};
                TapStats got, want;
                const bool maybe_nonfinite = scan_reference(xs, rs, n, tol, p, p.groups[0], 0, plan, got, build);
                oracle_scan_reference(xd.data(), rd.data(), n, tol, p, p.groups[0], 0, plan, want);
                expect_same_stats(got, want, n);
                // The non-finite scan is skipped on its word: it must never
                // miss a NaN or an Inf, and should clear finite data.
                const bool has_nonfinite = std::any_of(xd.begin(), xd.end(), [](double v) { return !std::isfinite(v); });
                if (has_nonfinite) {
                  EXPECT_TRUE(maybe_nonfinite);
                }
                if (variant < 2 || variant == 3 || variant == 5) {
                  EXPECT_FALSE(maybe_nonfinite);
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST(ScanNonfinite, FindsEachNanAndInfWherever) {
  // Every position of short and odd lengths (the vector lanes, the blocks
  // of 8, the scalar tail), one value at a time.
  for (std::size_t n : {1, 3, 4, 7, 8, 9, 15, 16, 17, 33}) {
    for (std::size_t at = 0; at < n; ++at) {
      for (double bad : {std::nan(""), kInf, -kInf}) {
        std::vector<double> x(n, 1.5);
        x[at] = bad;
        const std::vector<float> xf(x.begin(), x.end());
        for (std::size_t width : {0, 4, 8}) {  // 0: the float64 entry point
          TapStats s;
          if (width == 0)
            scan_nonfinite(x.data(), n, 3, 100, s);
          else
            scan_nonfinite(StoredValues{width == 4 ? static_cast<const void*>(xf.data()) : x.data(), width}, n, 3,
                           100, s);
          EXPECT_EQ(s.nan + s.inf, 1) << "n " << n << " at " << at << " width " << width;
          const auto& first = std::isnan(bad) ? s.first_nan : s.first_inf;
          ASSERT_TRUE(first.has_value());
          EXPECT_EQ(first->second, 100 + at);
          EXPECT_EQ(first->first, 3);
        }
      }
    }
    TapStats clean;
    std::vector<double> x(n, -2.0);
    x[0] = 1e308;  // large but finite: x - x is 0
    scan_nonfinite(x.data(), n, 0, 0, clean);
    EXPECT_EQ(clean.nan + clean.inf, 0);
    EXPECT_TRUE(clean.nonfinite_ranks.empty());
  }
}

}  // namespace
}  // namespace dc
