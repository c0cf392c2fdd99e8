// Comparator verdicts on hand-built activation sets.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include "harness/check/compare.h"
#include "harness/report/report.h"
#include "harness/core/progress.h"

namespace {

using namespace dc;

// A tap with its values held in the test: pieces per rank, optional reference.
struct Tap : TapData {
  std::vector<std::vector<double>> pieces;
  std::optional<RefTensor> reference;
};

// A tap on mesh dp=2,tp=2 with spec "-,tp": pieces of local shape [2,2].
Tap sharded_tap(const std::string& name, long order) {
  Tap t;
  t.name = name;
  t.order = order;
  t.dtype = "float32";
  t.layout = Layout::parse("-,tp", "");
  t.local_shape = {2, 2};
  Mesh m = Mesh::parse("dp=2,tp=2");
  for (int r = 0; r < 4; ++r) {
    int tp = m.coords(r)[1];
    std::vector<double> p;
    for (int i = 0; i < 4; ++i) p.push_back(1.0 + 10 * tp + i);
    t.pieces.push_back(p);
  }
  // global [2,4]: row i, col j -> 1 + 10*(j/2) + 2i + j%2
  RefTensor ref({2, 4});
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) ref.data[i * 4 + j] = 1.0 + 10 * (j / 2) + 2 * i + j % 2;
  t.reference = ref;
  return t;
}

ActivationSet set_of(std::vector<Tap> taps) {
  ActivationSet s;
  s.mesh = Mesh::parse("dp=2,tp=2");
  s.world_size = 4;
  s.source = "test";
  auto data = std::make_shared<InMemoryData>();
  for (auto& t : taps) {
    TapData meta = t;
    meta.data_id = data->pieces.size();
    if (t.reference) meta.reference_shape = t.reference->shape;
    data->pieces.push_back(t.pieces);
    data->references.push_back(t.reference ? t.reference->data : std::vector<double>{});
    s.taps.push_back(meta);
  }
  s.data = data;
  return s;
}

TEST(Compare, CleanSetPasses) {
  auto res = compare(set_of({sharded_tap("a", 0), sharded_tap("b", 1)}), {});
  EXPECT_TRUE(res.pass());
  EXPECT_TRUE(res.taps[0].replica.applies);
  EXPECT_TRUE(res.taps[0].reference.present);
  EXPECT_EQ(res.taps[0].reference.max_abs, 0.0);
}

TEST(Compare, CheckingIsProgressForTheWatchdog) {
  // A run's rank 0 may check the run file alone while the other ranks wait
  // for its verdict: its checking must show as progress (core/progress.h).
  const double before = progress::snapshot().last_change;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto res = compare(set_of({sharded_tap("a", 0)}), {});
  EXPECT_TRUE(res.pass());
  EXPECT_GT(progress::snapshot().last_change, before + 0.015);
}

TEST(Compare, NaNAndInfAreCountedWithFirstRankAndIndex) {
  auto t = sharded_tap("a", 0);
  t.pieces[3][2] = std::nan("");
  t.pieces[1][1] = std::numeric_limits<double>::infinity();
  auto res = compare(set_of({t}), {});
  const auto& nf = res.taps[0].nonfinite;
  EXPECT_EQ(nf.nan, 1);
  EXPECT_EQ(nf.inf, 1);
  ASSERT_TRUE(nf.first_nan);
  EXPECT_EQ(nf.first_nan->rank, 3);
  EXPECT_EQ(nf.first_nan->index, (std::vector<std::size_t>{1, 0}));
  EXPECT_EQ(nf.first_inf->rank, 1);
  EXPECT_EQ(nf.ranks, (std::vector<int>{1, 3}));
  EXPECT_FALSE(res.pass());
}

TEST(Compare, ReplicaMismatchNamesRanksAndUlps) {
  auto t = sharded_tap("a", 0);
  // rank 3 = (dp 1, tp 1) replicates rank 1; nudge one value by 2 ulps.
  float v = static_cast<float>(t.pieces[3][1]);
  v = std::nextafter(std::nextafter(v, 100.f), 100.f);
  t.pieces[3][1] = v;
  auto res = compare(set_of({t}), {});
  const auto& rc = res.taps[0].replica;
  EXPECT_FALSE(rc.pass);
  EXPECT_EQ(rc.differing, (std::vector<int>{3}));
  EXPECT_EQ(rc.leader, 1);
  EXPECT_EQ(rc.other, 3);
  EXPECT_EQ(rc.max_ulp, 2);
  EXPECT_EQ(rc.index, (std::vector<std::size_t>{0, 1}));
  // The reference is rebuilt from leaders only, so it still agrees.
  EXPECT_TRUE(res.taps[0].reference.pass);
  CompareOptions loose;
  loose.replica_ulps = 2;
  EXPECT_TRUE(compare(set_of({t}), loose).pass());
}

TEST(Compare, ReferenceMismatchGivesWorstGlobalIndexAndOwner) {
  auto t = sharded_tap("a", 0);
  t.pieces[1][3] += 0.5;  // rank 1 (tp 1): local (1,1) -> global (1,3)
  t.pieces[3][3] += 0.5;  // keep its replica identical
  auto res = compare(set_of({t}), {});
  const auto& ref = res.taps[0].reference;
  EXPECT_TRUE(res.taps[0].replica.pass);
  EXPECT_FALSE(ref.pass);
  EXPECT_EQ(ref.n_fail, 1);
  EXPECT_EQ(ref.worst.index, (std::vector<std::size_t>{1, 3}));
  EXPECT_EQ(ref.worst_ranks, (std::vector<int>{1}));
  EXPECT_DOUBLE_EQ(ref.max_abs, 0.5);
  EXPECT_GT(ref.rel_l2, 0.0);
  // A generous command-line tolerance lets it pass.
  CompareOptions loose;
  loose.atol = 1.0;
  EXPECT_TRUE(compare(set_of({t}), loose).pass());
}

// Found by tests/fuzz (fuzz_reader): a reference of values near 1e250 made
// the sum of squares behind the RMS overflow to inf, so the derived atol was
// inf and a tap far from its reference PASSED.
TEST(Compare, HugeReferenceValuesDoNotMakeTheToleranceInfinite) {
  auto t = sharded_tap("a", 0);
  t.reference->data[5] = 5.5e250;  // global (1,1): rank 0's and 2's element (1,1)
  auto res = compare(set_of({t}), {});
  const auto& ref = res.taps[0].reference;
  EXPECT_FALSE(ref.pass);
  EXPECT_TRUE(std::isfinite(ref.tol.atol)) << ref.tol.atol;
  EXPECT_EQ(ref.n_fail, 1);
  EXPECT_EQ(ref.worst.index, (std::vector<std::size_t>{1, 1}));
  EXPECT_TRUE(std::isfinite(ref.rel_l2)) << ref.rel_l2;
  EXPECT_NEAR(ref.rel_l2, 1.0, 1e-12);  // |x - r| ~ |r| for the one huge element
  // The same tap with its huge value where the reference has it passes.
  auto same = t;
  same.pieces[0][3] = same.pieces[2][3] = 5.5e250;
  EXPECT_TRUE(compare(set_of({same}), {}).pass());
}

TEST(Compare, InfInTheReferenceDoesNotExcuseAFiniteValue) {
  auto t = sharded_tap("a", 0);
  t.reference->data[5] = std::numeric_limits<double>::infinity();
  auto res = compare(set_of({t}), {});
  const auto& ref = res.taps[0].reference;
  EXPECT_FALSE(ref.pass);
  EXPECT_EQ(ref.n_fail, 1);
  EXPECT_TRUE(std::isfinite(ref.tol.atol));
}

TEST(Compare, PerRankStatisticsCoverEveryRank) {
  auto a = sharded_tap("a", 0), b = sharded_tap("b", 1), c = sharded_tap("c", 2);
  a.pieces[1][3] += 0.5;  // rank 1 (tp 1) and its dp replica rank 3: the block (tp 1) is off
  a.pieces[3][3] += 0.5;
  b.pieces[2][0] += 1;  // rank 2 differs from its replica leader rank 0
  c.pieces[0][0] = std::nan("");
  c.pieces[0][1] = std::numeric_limits<double>::infinity();
  auto res = compare(set_of({a, b, c}), {});
  const auto& ra = res.taps[0].ranks;
  ASSERT_EQ(ra.err_over_tol.size(), 4u);
  EXPECT_GT(ra.err_over_tol[1], 1.0);
  EXPECT_EQ(ra.err_over_tol[3], ra.err_over_tol[1]);  // replicas share their block's
  EXPECT_LE(ra.err_over_tol[0], 1.0);
  EXPECT_LE(ra.err_over_tol[2], 1.0);
  EXPECT_EQ(ra.nonfinite, (std::vector<long long>{0, 0, 0, 0}));
  const auto& rb = res.taps[1].ranks;
  EXPECT_EQ(rb.replica_diff, (std::vector<double>{0, 0, 1, 0}));
  const auto& rc = res.taps[2].ranks;
  EXPECT_EQ(rc.nonfinite, (std::vector<long long>{2, 0, 0, 0}));
  // Without a reference there is no err/tol per rank.
  auto d = sharded_tap("d", 3);
  d.reference.reset();
  EXPECT_TRUE(compare(set_of({d}), {}).taps[0].ranks.err_over_tol.empty());
}

TEST(Compare, TapAttributeToleranceWinsOverCommandLine) {
  auto t = sharded_tap("a", 0);
  t.pieces[0][0] += 0.5;
  t.pieces[2][0] += 0.5;
  t.atol = 0.0;
  t.rtol = 0.0;
  CompareOptions loose;
  loose.atol = 1.0;
  EXPECT_FALSE(compare(set_of({t}), loose).pass());
}

TEST(Compare, FirstDivergenceFollowsOrder) {
  auto a = sharded_tap("a", 0), b = sharded_tap("b", 1), c = sharded_tap("c", 2);
  c.pieces[0][0] = std::nan("");
  b.pieces[2][0] += 1;  // replica of rank 0 differs
  auto res = compare(set_of({a, b, c}), {});
  ASSERT_TRUE(res.first_divergence);
  EXPECT_EQ(res.taps[*res.first_divergence].name, "b");
  auto text = describe_first_divergence(set_of({a, b, c}), res);
  EXPECT_NE(text.find("tap 'b'"), std::string::npos) << text;
  EXPECT_NE(text.find("replicas DIFFER"), std::string::npos) << text;
}

TEST(Compare, PartialAxesAreSummedBeforeTheReferenceCheck) {
  Tap t;
  t.name = "p";
  t.dtype = "float64";
  t.layout = Layout::parse("", "dp");
  t.local_shape = {2};
  t.pieces = {{1, 2}, {1, 2}, {10, 20}, {10, 20}};  // dp=2,tp=2: tp is a replica axis
  t.reference = RefTensor({2}, std::vector<double>{11, 22});
  auto res = compare(set_of({t}), {});
  EXPECT_TRUE(res.pass());
}

TEST(Report, RankRanges) {
  EXPECT_EQ(rank_ranges({1, 2, 3, 5, 7, 8}), "1-3,5,7-8");
  EXPECT_EQ(rank_ranges({}), "");
}

}  // namespace

// Found by fuzz_reader: float64 replicas at opposite extremes overflowed the
// signed subtraction (undefined behaviour; UBSan in build-sanitize/ fails here).
TEST(UlpDistance, OppositeExtremesAreHugeNotUndefined) {
  const double big = std::numeric_limits<double>::max();
  EXPECT_EQ(dc::ulp_distance(-big, big, dc::StoredKind::float64), std::numeric_limits<long long>::max());
  EXPECT_EQ(dc::ulp_distance(big, -big, dc::StoredKind::float64), std::numeric_limits<long long>::max());
  EXPECT_EQ(dc::ulp_distance(1.0, std::nextafter(1.0, 2.0), dc::StoredKind::float64), 1);
  EXPECT_EQ(dc::ulp_distance(-0.0, 0.0, dc::StoredKind::float64), 0);
}
