// The streaming comparator: chunk plans cover every element once, and the
// report does not depend on the chunk size or the thread count, also when the
// first NaN, the worst element and a replica mismatch sit on chunk boundaries.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "harness/check/chunks.h"
#include "harness/check/compare.h"

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

// Equal, NaN included; sums of squares to 1e-12 (their partial sums follow the chunks).
void expect_same_number(double a, double b, double rel = 0) {
  if (std::isnan(b)) {
    EXPECT_TRUE(std::isnan(a));
  } else {
    EXPECT_NEAR(a, b, rel * std::abs(b));
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
  expect_same_number(a.reference.rel_l2, b.reference.rel_l2, 1e-12);
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
  const auto v = compare(f.set, o).taps[0];
  EXPECT_EQ(v.reference.n_fail, 2);
  EXPECT_EQ(v.reference.worst.index, (std::vector<std::size_t>{5, 9}));
  EXPECT_EQ(v.reference.worst_ranks, (std::vector<int>{1, 3}));  // the sp partial group
  EXPECT_EQ(v.reference.max_abs, 2.0);
  EXPECT_TRUE(v.replica.differing.empty());
}

TEST(StreamingCompare, BudgetSetsChunkSize) {
  EXPECT_EQ(chunk_elements(std::size_t{64} << 10, 2), 4096u);  // the floor
  EXPECT_EQ(chunk_elements(std::size_t{1} << 20, 2), 8192u);    // half of 1 MiB, 4 buffers x 2 threads
  EXPECT_GT(chunk_elements(std::size_t{128} << 20, 1), chunk_elements(std::size_t{1} << 20, 1));
}

}  // namespace
