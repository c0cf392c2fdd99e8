// The streaming comparator: chunk plans cover every element once, and the
// report does not depend on the chunk size or the thread count, also when the
// first NaN, the worst element and a replica mismatch sit on chunk boundaries.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "harness/check/chunks.h"
#include "harness/check/compare.h"
#include "harness/check/exact_sum.h"

namespace {

using namespace dc;

TEST(ChunkPlan, CoversEveryElementOnceInOrder) {
  for (const Shape& shape : {Shape{7, 5, 3}, Shape{1, 13}, Shape{64}, Shape{2, 1, 9, 4}}) {
    for (std::size_t max : {1, 2, 3, 5, 14, 15, 16, 60, 1000}) {
      ChunkPlan plan(shape, max);
      std::size_t next = 0;
      for (std::size_t i = 0; i < plan.count(); ++i) {
        Slab s = plan.slab(i);
        ASSERT_EQ(plan.first_flat(i), next) << shape_str(shape) << " max " << max << " chunk " << i;
        ASSERT_LE(numel(s.count), max);
        ASSERT_GT(numel(s.count), 0u);
        next += numel(s.count);
      }
      EXPECT_EQ(next, numel(shape)) << shape_str(shape) << " max " << max;
    }
  }
  EXPECT_EQ(ChunkPlan(Shape{}, 5).count(), 1u);      // a scalar
  EXPECT_EQ(ChunkPlan(Shape{3, 0}, 5).count(), 0u);  // zero-size
}

TEST(ChunkPlan, ChunksAreWholeSummationUnits) {
  for (const Shape& shape : {Shape{7, 5, 3}, Shape{1, 13}, Shape{64}, Shape{2, 1, 9, 4}, Shape{3, 5000}}) {
    for (std::size_t unit : {1, 2, 4, 6, 15, 100, 4096}) {
      ChunkPlan units(shape, unit);
      std::set<std::size_t> unit_starts;
      for (std::size_t i = 0; i < units.count(); ++i) unit_starts.insert(units.first_flat(i));
      unit_starts.insert(numel(shape));
      for (std::size_t max : {1, 3, 7, 16, 45, 1000, 100000}) {
        ChunkPlan plan(shape, max, unit);
        std::size_t next = 0;
        for (std::size_t i = 0; i < plan.count(); ++i) {
          SCOPED_TRACE(shape_str(shape) + " unit " + std::to_string(unit) + " max " + std::to_string(max));
          ASSERT_EQ(plan.first_flat(i), next);
          ASSERT_LE(numel(plan.slab(i).count), std::max(max, unit));
          ASSERT_TRUE(unit_starts.count(next)) << "chunk " << i << " starts inside a unit";
          // unit_left walks exactly the unit starts
          for (std::size_t at = next, end = next + numel(plan.slab(i).count); at < end;) {
            at += plan.unit_left(at);
            ASSERT_TRUE(unit_starts.count(at)) << "unit_left from a unit start lands at " << at;
          }
          next += numel(plan.slab(i).count);
        }
        EXPECT_EQ(next, numel(shape));
      }
    }
  }
}

TEST(ExactSum, SameBitsInAnyOrderAndSplit) {
  std::vector<double> xs;
  std::uint64_t state = 12345;
  for (int i = 0; i < 5000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    double u = static_cast<double>(state >> 11) / 9007199254740992.0;
    xs.push_back(std::ldexp(u - 0.3, static_cast<int>(state % 120) - 60));
  }
  ExactSum forward, backward, split;
  for (double x : xs) forward.add(x);
  for (auto it = xs.rbegin(); it != xs.rend(); ++it) backward.add(*it);
  ExactSum parts[7];
  for (std::size_t i = 0; i < xs.size(); ++i) parts[(i * 31) % 7].add(xs[i]);
  for (auto& p : parts) split.add(p);
  EXPECT_EQ(forward.value(), backward.value());
  EXPECT_EQ(forward.value(), split.value());
  long double ld = 0;  // a wider sum agrees to float64 rounding
  for (double x : xs) ld += x;
  EXPECT_NEAR(forward.value(), static_cast<double>(ld), 1e-15 * std::abs(static_cast<double>(ld)) + 1e-300);
}

TEST(SquareSum, HugeFiniteValuesDoNotOverflow) {
  SquareSum s;
  EXPECT_FALSE(s.add_partial(1e300 * 1e300));  // the caller's unit overflowed
  s.add_value(1e300);
  s.add_value(-1e300);
  EXPECT_DOUBLE_EQ(s.rms(2), 1e300);
  SquareSum small;
  EXPECT_TRUE(small.add_partial(4.0));
  EXPECT_DOUBLE_EQ(small.rms(1), 2.0);
  EXPECT_DOUBLE_EQ(SquareSum::sqrt_ratio(s, s), 1.0);
  // sqrt(2e600 / 4): finite though neither sum is (found by tests/fuzz: rel L2 read inf).
  EXPECT_NEAR(SquareSum::sqrt_ratio(s, small) / (1e300 * std::sqrt(0.5)), 1.0, 1e-15);
  EXPECT_NEAR(SquareSum::sqrt_ratio(small, s) * (1e300 * std::sqrt(0.5)), 1.0, 1e-15);
  EXPECT_DOUBLE_EQ(SquareSum::sqrt_ratio(small, SquareSum{}), 2.0);
  // Mixed scales: 1e300^2 + 3^2 is 1e600 to float64 precision; order does not matter.
  SquareSum a, b;
  a.add_value(3.0);
  a.add_value(1e300);
  b.add_value(1e300);
  b.add(small);
  b.add_value(std::sqrt(5.0));
  EXPECT_EQ(a.rms(2), b.rms(2));
  SquareSum nan;
  nan.add_value(std::nan(""));
  EXPECT_TRUE(std::isnan(nan.rms(1)));
}

TEST(ExactSum, CancellationSubnormalsAndSpecials) {
  ExactSum s;
  s.add(1e16);
  s.add(1.0);
  s.add(-1e16);
  EXPECT_EQ(s.value(), 1.0);  // a float64 sum in this order gives 0
  ExactSum tiny;
  tiny.add(4.9406564584124654e-324);
  tiny.add(4.9406564584124654e-324);
  EXPECT_EQ(tiny.value(), 2 * 4.9406564584124654e-324);
  ExactSum neg;
  neg.add(-2.5);
  neg.add(0.5);
  EXPECT_EQ(neg.value(), -2.0);
  ExactSum big;
  big.add(1.7e308);
  big.add(1.7e308);
  big.add(-1.7e308);
  EXPECT_EQ(big.value(), 1.7e308);  // no overflow in between
  ExactSum inf;
  inf.add(std::numeric_limits<double>::infinity());
  EXPECT_EQ(inf.value(), std::numeric_limits<double>::infinity());
  inf.add(std::nan(""));
  EXPECT_TRUE(std::isnan(inf.value()));
  EXPECT_EQ(ExactSum{}.value(), 0.0);
}

TEST(ChunkPlan, GlobalBoxOfALocalChunk) {
  Slab local{{1, 0}, {2, 4}};
  Slab g = to_global(local, {3, 4}, {2, 1});
  EXPECT_EQ(g.start, (Shape{7, 4}));
  EXPECT_EQ(g.count, (Shape{2, 4}));
}

// Mesh dp=2,sp=2,tp=2. Tap "y": spec "-,tp", partial sp, replicated over dp;
// local [23, 9]. Every value is exact in float32 so sums are exact.
struct Fixture {
  Mesh mesh = Mesh::parse("dp=2,sp=2,tp=2");
  ActivationSet set;
  std::shared_ptr<InMemoryData> data = std::make_shared<InMemoryData>();
  Shape local{23, 9}, global{23, 18};

  Fixture() {
    TapData t;
    t.name = "y";
    t.dtype = "float32";
    t.layout = Layout::parse("-,tp", "sp");
    t.local_shape = local;
    t.reference_shape = global;
    t.atol = 1e-3;
    t.rtol = 0;
    std::vector<std::vector<double>> pieces(8);
    std::vector<double> ref(numel(global), 0.0);
    for (int r = 0; r < 8; ++r) {
      auto c = mesh.coords(r);  // dp, sp, tp
      for (std::size_t i = 0; i < numel(local); ++i) {
        double v = static_cast<double>((i * 7 + static_cast<std::size_t>(c[2]) * 3) % 17) / 4 + c[1];
        pieces[r].push_back(v);
        if (c[0] == 0) ref[global_flat_index(local, global, {0, static_cast<std::size_t>(c[2])}, i)] += v;
      }
    }
    data->pieces.push_back(pieces);
    data->references.push_back(ref);
    set.mesh = mesh;
    set.world_size = 8;
    set.source = "memory";
    set.taps.push_back(t);
    set.data = data;
  }
  std::vector<double>& piece(int r) { return data->pieces[0][static_cast<std::size_t>(r)]; }
};

// Bit-identical, NaN included.
void expect_same_number(double a, double b) {
  if (std::isnan(b)) {
    EXPECT_TRUE(std::isnan(a));
  } else {
    EXPECT_EQ(a, b);
  }
}

void expect_same(const TapVerdict& a, const TapVerdict& b, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.nonfinite.nan, b.nonfinite.nan);
  EXPECT_EQ(a.nonfinite.inf, b.nonfinite.inf);
  ASSERT_EQ(a.nonfinite.first_nan.has_value(), b.nonfinite.first_nan.has_value());
  if (a.nonfinite.first_nan) {
    EXPECT_EQ(a.nonfinite.first_nan->rank, b.nonfinite.first_nan->rank);
    EXPECT_EQ(a.nonfinite.first_nan->index, b.nonfinite.first_nan->index);
  }
  EXPECT_EQ(a.nonfinite.ranks, b.nonfinite.ranks);
  EXPECT_EQ(a.ranks.nonfinite, b.ranks.nonfinite);
  ASSERT_EQ(a.ranks.replica_diff.size(), b.ranks.replica_diff.size());
  for (std::size_t r = 0; r < a.ranks.replica_diff.size(); ++r)
    expect_same_number(a.ranks.replica_diff[r], b.ranks.replica_diff[r]);
  ASSERT_EQ(a.ranks.err_over_tol.size(), b.ranks.err_over_tol.size());
  for (std::size_t r = 0; r < a.ranks.err_over_tol.size(); ++r)
    expect_same_number(a.ranks.err_over_tol[r], b.ranks.err_over_tol[r]);
  EXPECT_EQ(a.replica.differing, b.replica.differing);
  EXPECT_EQ(a.replica.max_ulp, b.replica.max_ulp);
  EXPECT_EQ(a.replica.other, b.replica.other);
  EXPECT_EQ(a.replica.index, b.replica.index);
  EXPECT_EQ(a.replica.axes, b.replica.axes);
  EXPECT_EQ(a.reference.n_fail, b.reference.n_fail);
  EXPECT_EQ(a.reference.n_total, b.reference.n_total);
  EXPECT_EQ(a.reference.worst.index, b.reference.worst.index);
  EXPECT_EQ(a.reference.worst_ranks, b.reference.worst_ranks);
  EXPECT_EQ(a.reference.worst_ratio, b.reference.worst_ratio);
  expect_same_number(a.reference.max_rel, b.reference.max_rel);
  expect_same_number(a.reference.max_abs, b.reference.max_abs);
  expect_same_number(a.reference.rel_l2, b.reference.rel_l2);
  expect_same_number(a.reference.tol.atol, b.reference.tol.atol);
  EXPECT_EQ(a.pass(), b.pass());
}

TEST(StreamingCompare, CleanTapPasses) {
  Fixture f;
  auto res = compare(f.set, {});
  ASSERT_TRUE(res.pass()) << res.taps[0].reference.n_fail;
  EXPECT_TRUE(res.taps[0].replica.applies);
  EXPECT_EQ(res.taps[0].reference.n_total, 23 * 18);
}

TEST(StreamingCompare, SameReportForEveryChunkSizeAndThreadCount) {
  Fixture f;
  // Chunks of 9 (one row) end at flat 9k-1: put the findings on both sides
  // of the boundary between rows 4 and 5 (flat 44 | 45) and in a partial tap.
  f.piece(6)[45] = std::nan("");              // rank 6 = (dp1, sp1, tp0): first of a chunk
  f.piece(2)[44] = std::nan("");              // rank 2 = (dp0, sp1, tp0): last of a chunk
  f.piece(5)[44] += 0.5;                      // replica (dp1) of rank 1 differs
  f.piece(3)[45] += 2.0;                      // worst reference error (partial sum over sp)
  f.piece(7)[45] += 2.0;                      // its replica agrees
  CompareOptions big;
  big.threads = 1;
  big.chunk_elements = 1 << 20;
  big.sum_unit = 1;
  const TapVerdict want = compare(f.set, big).taps[0];
  EXPECT_EQ(want.nonfinite.nan, 2);
  ASSERT_TRUE(want.nonfinite.first_nan);
  EXPECT_EQ(want.nonfinite.first_nan->rank, 2);
  EXPECT_EQ(want.nonfinite.first_nan->index, (std::vector<std::size_t>{4, 8}));
  EXPECT_EQ(want.replica.differing, (std::vector<int>{5, 6}));  // 6 has a NaN its leader lacks
  EXPECT_EQ(want.replica.axes, (std::vector<std::string>{"dp"}));
  EXPECT_EQ(want.reference.worst.index, (std::vector<std::size_t>{4, 8}));  // the NaN sums in
  EXPECT_EQ(want.reference.n_fail, 2);
  for (std::size_t chunk : {1, 2, 8, 9, 10, 44, 45, 46, 207}) {
    for (int threads : {1, 3}) {
      CompareOptions o;
      o.threads = threads;
      o.chunk_elements = chunk;
      o.sum_unit = 1;
      expect_same(compare(f.set, o).taps[0], want,
                  "chunk " + std::to_string(chunk) + " threads " + std::to_string(threads));
    }
  }
}

TEST(StreamingCompare, WorstElementAcrossABoundaryWithoutNaN) {
  Fixture f;
  f.piece(3)[45] += 2.0;  // rank 3 = (dp0, sp1, tp1): global (5, 9+0)
  f.piece(7)[45] += 2.0;
  f.piece(1)[44] += 1.0;  // smaller error just before the boundary
  f.piece(5)[44] += 1.0;
  CompareOptions o;
  o.chunk_elements = 45;
  o.sum_unit = 1;
  const auto v = compare(f.set, o).taps[0];
  EXPECT_EQ(v.reference.n_fail, 2);
  EXPECT_EQ(v.reference.worst.index, (std::vector<std::size_t>{5, 9}));
  EXPECT_EQ(v.reference.worst_ranks, (std::vector<int>{1, 3}));  // the sp partial group
  EXPECT_EQ(v.reference.max_abs, 2.0);
  EXPECT_TRUE(v.replica.differing.empty());
}

// Values that are not exact in a few bits, and more elements than a
// summation unit: rel L2 and a derived atol must still be bit-identical.
TEST(StreamingCompare, SumsAreBitIdenticalForEveryChunkingWithTheDefaultUnit) {
  Mesh mesh = Mesh::parse("dp=2,tp=2");
  auto data = std::make_shared<InMemoryData>();
  ActivationSet set;
  set.mesh = mesh;
  set.world_size = 4;
  set.source = "memory";
  set.data = data;
  TapData t;
  t.name = "noisy";
  t.dtype = "float32";
  t.layout = Layout::parse("-,tp", "");
  t.local_shape = {130, 101};  // 13,130 elements a rank, not a multiple of anything
  t.reference_shape = Shape{130, 202};
  std::vector<std::vector<double>> pieces(4);
  std::vector<double> ref(130 * 202);
  std::uint64_t state = 7;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(state >> 11) / 9007199254740992.0 - 0.5;
  };
  for (double& r : ref) r = next() * 3;
  std::vector<double> noisy(ref.size());  // the sharded result: float32, slightly off
  for (std::size_t i = 0; i < ref.size(); ++i) noisy[i] = static_cast<float>(ref[i] + 1e-7 * next());
  for (int rank = 0; rank < 4; ++rank) {  // dp replicas hold the same values
    const std::size_t tp = static_cast<std::size_t>(mesh.coords(rank)[1]);
    for (std::size_t i = 0; i < 130 * 101; ++i)
      pieces[static_cast<std::size_t>(rank)].push_back(
          noisy[global_flat_index(t.local_shape, *t.reference_shape, {0, tp}, i)]);
  }
  data->pieces.push_back(pieces);
  data->references.push_back(ref);
  set.taps.push_back(t);
  CompareOptions base;
  base.threads = 1;
  const TapVerdict want = compare(set, base).taps[0];
  EXPECT_TRUE(want.pass()) << want.reference.n_fail << " fail, tol " << want.reference.tol.atol;
  EXPECT_GT(want.reference.rel_l2, 0);
  for (std::size_t chunk : {4096, 5000, 8192, 13130, 1 << 20}) {
    for (int threads : {1, 2, 3}) {
      CompareOptions o;
      o.threads = threads;
      o.chunk_elements = chunk;
      expect_same(compare(set, o).taps[0], want, "chunk " + std::to_string(chunk) + " threads " + std::to_string(threads));
    }
  }
}

TEST(StreamingCompare, BudgetSetsChunkSize) {
  EXPECT_EQ(chunk_elements(std::size_t{64} << 10, 2), 4096u);  // the floor
  EXPECT_EQ(chunk_elements(std::size_t{1} << 20, 2), 8192u);    // half of 1 MiB, 4 buffers x 2 threads
  EXPECT_GT(chunk_elements(std::size_t{128} << 20, 1), chunk_elements(std::size_t{1} << 20, 1));
}

}  // namespace
