// Run against run (check/against.h): two runs on different meshes compared
// with no reference, the other run's global tensors standing where the
// reference would, each tolerance the sum of both runs' bounds.
#include <gtest/gtest.h>

#include <cmath>

#include "harness/check/against.h"
#include "harness/check/compare.h"
#include "harness/check/sketch_check.h"
#include "harness/core/error.h"

namespace {

using namespace dc;

constexpr std::size_t kRows = 4, kCols = 6;

double global_value(std::size_t i, std::size_t j) { return std::sin(1.0 + 7.0 * i + j) * (1 + i); }

// A run of one tap "y" ([4, 6] globally, float32) on `mesh` with `layout`:
// each rank's piece is cut from the global tensor (split by `partial`
// ranks when the layout has partial sums). `edit` may change a rank's piece.
ActivationSet run_of(const std::string& source, const std::string& mesh_text, const std::string& spec,
                     const std::string& partial, const Shape& local, long depth = 6,
                     const std::function<void(int, std::vector<double>&)>& edit = {}) {
  ActivationSet s;
  s.source = source;
  s.mesh = Mesh::parse(mesh_text);
  s.world_size = s.mesh.world_size();
  TapData t;
  t.name = "y";
  t.dtype = "float32";
  t.layout = Layout::parse(spec, partial);
  t.local_shape = local;
  t.reduction_depth = depth;
  auto data = std::make_shared<InMemoryData>();
  std::vector<std::vector<double>> pieces;
  for (int r = 0; r < s.world_size; ++r) {
    const auto c = s.mesh.coords(r);
    std::size_t row0 = 0, col0 = 0, parts = 1;
    for (std::size_t a = 0; a < s.mesh.axes().size(); ++a) {
      const std::string& axis = s.mesh.axes()[a].name;
      if (spec.rfind(axis + ",", 0) == 0) row0 = c[a] * local[0];
      if (spec.size() > axis.size() && spec.substr(spec.size() - axis.size() - 1) == "," + axis) col0 = c[a] * local[1];
      if (axis == partial) parts = s.mesh.axes()[a].size;
    }
    std::vector<double> p;
    for (std::size_t i = 0; i < local[0]; ++i)
      for (std::size_t j = 0; j < local[1]; ++j) p.push_back(global_value(row0 + i, col0 + j) / double(parts));
    if (edit) edit(r, p);
    pieces.push_back(p);
  }
  data->pieces.push_back(pieces);
  data->references.push_back({});
  s.taps.push_back(t);
  s.data = data;
  return s;
}

ActivationSet columns_over_tp() { return run_of("a.h5", "tp=2", "-,tp", "", {kRows, kCols / 2}); }
ActivationSet rows_over_dp() { return run_of("b.h5", "dp=2", "dp,-", "", {kRows / 2, kCols}); }
ActivationSet partial_over_tp() { return run_of("c.h5", "tp=2", "-,-", "tp", {kRows, kCols}); }

TEST(Against, ReadGlobalLaysOutBlocksAndAddsPartialSums) {
  for (const ActivationSet& run : {columns_over_tp(), rows_over_dp(), partial_over_tp()}) {
    SCOPED_TRACE(run.source);
    // A slab that cuts across every block: rows 1-3, columns 2-5.
    const Slab slab{{1, 2}, {3, 4}};
    std::vector<double> out(12, -1);
    read_global(run, run.taps[0], slab, out.data());
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t j = 0; j < 4; ++j) EXPECT_NEAR(out[i * 4 + j], global_value(1 + i, 2 + j), 1e-15);
  }
}

TEST(Against, CleanRunsOnDifferentMeshesPass) {
  for (const ActivationSet& other : {rows_over_dp(), partial_over_tp()}) {
    const AgainstMatch m = match_runs(columns_over_tp(), other, {});
    const CompareResult res = compare(m.set, {});
    ASSERT_TRUE(res.taps[0].reference.present);
    EXPECT_TRUE(res.pass()) << other.source;
    EXPECT_LT(res.taps[0].reference.max_abs, 1e-15);
  }
}

TEST(Against, AWrongElementOfTheOtherRunIsFoundWhereItIs) {
  // Rank 1 of the dp run holds rows 2-3: its element (1, 4) is global (3, 4).
  const ActivationSet wrong = run_of("b.h5", "dp=2", "dp,-", "", {kRows / 2, kCols}, 6,
                                     [](int r, std::vector<double>& p) { if (r == 1) p[1 * kCols + 4] += 0.5; });
  const CompareResult res = compare(match_runs(columns_over_tp(), wrong, {}).set, {});
  ASSERT_FALSE(res.pass());
  const auto& ref = res.taps[0].reference;
  EXPECT_EQ(ref.n_fail, 1);
  EXPECT_EQ(ref.worst.index, (std::vector<std::size_t>{3, 4}));
  EXPECT_EQ(ref.worst_ranks, (std::vector<int>{1}));  // run A's tp rank 1 holds columns 3-5
}

TEST(Against, TheToleranceIsTheSumOfBothRunsBounds) {
  // Run A with reduction depth 8, run B with 4096: the allowed disagreement is both bounds.
  const ActivationSet a = run_of("a.h5", "tp=2", "-,tp", "", {kRows, kCols / 2}, 8);
  const ActivationSet b = run_of("b.h5", "dp=2", "dp,-", "", {kRows / 2, kCols}, 4096);
  const CompareResult res = compare(match_runs(a, b, {}).set, {});
  double sumsq = 0;
  for (std::size_t i = 0; i < kRows; ++i)
    for (std::size_t j = 0; j < kCols; ++j) sumsq += global_value(i, j) * global_value(i, j);
  const double rms = std::sqrt(sumsq / (kRows * kCols));
  const Tolerance ta = derive_tolerance({"float32", 8, {}, {}, {}, {}, rms});
  const Tolerance tb = derive_tolerance({"float32", 4096, {}, {}, {}, {}, rms});
  EXPECT_NEAR(res.taps[0].reference.tol.rtol, ta.rtol + tb.rtol, 1e-18);
  EXPECT_NEAR(res.taps[0].reference.tol.atol, ta.atol + tb.atol, 1e-15);
  EXPECT_GT(ta.rtol + tb.rtol, tb.rtol);
  EXPECT_NE(res.taps[0].reference.tol.yardstick.find("the other run"), std::string::npos);
  // Beyond either run's bound alone but within their sum: passes run against run.
  const double r = std::abs(global_value(0, 0));
  const double alone = std::max(ta.atol + ta.rtol * r, tb.atol + tb.rtol * r);
  const double both = ta.atol + tb.atol + (ta.rtol + tb.rtol) * r;
  const double off = 0.5 * (alone + both);
  ASSERT_LT(alone, off);
  const ActivationSet near = run_of("b.h5", "dp=2", "dp,-", "", {kRows / 2, kCols}, 4096,
                                    [&](int rank, std::vector<double>& p) { if (rank == 0) p[0] += off; });
  EXPECT_TRUE(compare(match_runs(a, near, {}).set, {}).pass());
  const ActivationSet beyond = run_of("b.h5", "dp=2", "dp,-", "", {kRows / 2, kCols}, 4096,
                                      [&](int rank, std::vector<double>& p) { if (rank == 0) p[0] += 1.1 * both; });
  EXPECT_FALSE(compare(match_runs(a, beyond, {}).set, {}).pass());
}

TEST(Against, NormWiseLimitsAddInQuadrature) {
  // With rounding counts each run has a derived rel L2 limit; two runs'
  // rounding errors are never opposed, so their norm-wise limits add in
  // quadrature, where the element-wise bounds add.
  ActivationSet a = run_of("a.h5", "tp=2", "-,tp", "", {kRows, kCols / 2}, 8);
  ActivationSet b = run_of("b.h5", "dp=2", "dp,-", "", {kRows / 2, kCols}, 4096);
  a.taps[0].rounding_steps = 3;
  b.taps[0].rounding_steps = 40;
  const CompareResult res = compare(match_runs(a, b, {}).set, {});
  ToleranceInputs ia{"float32", 8}, ib{"float32", 4096};
  ia.rounding_steps = 3;
  ib.rounding_steps = 40;
  const Tolerance ta = derive_tolerance(ia), tb = derive_tolerance(ib);
  ASSERT_TRUE(ta.rel_l2_limit && tb.rel_l2_limit);
  ASSERT_TRUE(res.taps[0].reference.tol.rel_l2_limit);
  EXPECT_NEAR(*res.taps[0].reference.tol.rel_l2_limit, std::hypot(*ta.rel_l2_limit, *tb.rel_l2_limit), 1e-18);
  EXPECT_NEAR(res.taps[0].reference.tol.rtol, ta.rtol + tb.rtol, 1e-18);
}

TEST(Against, ExactModeWantsEveryBit) {
  const ActivationSet same = columns_over_tp();
  EXPECT_TRUE(compare(match_runs(columns_over_tp(), same, {.exact = true}).set, {}).pass());
  const ActivationSet one_ulp = run_of("a2.h5", "tp=2", "-,tp", "", {kRows, kCols / 2}, 6,
                                       [](int r, std::vector<double>& p) {
                                         if (r == 1) p[5] = std::nextafter(p[5], 10.0);
                                       });
  EXPECT_TRUE(compare(match_runs(columns_over_tp(), one_ulp, {}).set, {}).pass());  // within rounding
  const CompareResult exact = compare(match_runs(columns_over_tp(), one_ulp, {.exact = true}).set, {});
  ASSERT_FALSE(exact.pass());
  EXPECT_EQ(exact.taps[0].reference.n_fail, 1);
  EXPECT_EQ(exact.taps[0].reference.worst.index, (std::vector<std::size_t>{1, 5}));
}

TEST(Against, RunsOfDifferentComputationsOrShapesAreRefusedNamingBoth) {
  ActivationSet a = columns_over_tp(), b = rows_over_dp();
  a.info["scenario"] = "tp_block";
  b.info["scenario"] = "flux_tp";
  try {
    match_runs(a, b, {});
    FAIL() << "two scenarios were compared";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("a.h5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("b.h5"), std::string::npos) << e.what();
  }
  const ActivationSet wide = run_of("w.h5", "dp=2", "dp,-", "", {kRows / 2, kCols + 2});
  EXPECT_THROW(match_runs(columns_over_tp(), wide, {}), InputError);
  ActivationSet bf16 = rows_over_dp();
  bf16.taps[0].dtype = "bfloat16";
  EXPECT_THROW(match_runs(columns_over_tp(), bf16, {}), InputError);
}

TEST(Against, ASmallerBatchIsComparedOnTheSamplesItShares) {
  // One sample (dp=1: rows 0-1) against two (dp=2: rows 0-3): the first
  // run's rows are the other's first rows, as in a batch that grows with dp.
  const ActivationSet small = run_of("s.h5", "dp=1", "dp,-", "", {kRows / 2, kCols});
  const ActivationSet big = rows_over_dp();
  EXPECT_FALSE(batch_larger(small, big));
  EXPECT_TRUE(batch_larger(big, small));
  const AgainstMatch m = match_runs(small, big, {});
  EXPECT_EQ(m.fewer_samples, (std::vector<std::string>{"y"}));
  EXPECT_NE(m.describe().find("fewer samples"), std::string::npos) << m.describe();
  EXPECT_TRUE(compare(m.set, {}).pass());
  // A wrong element in the shared rows is found; one in the rows only the
  // larger batch has cannot be, and is not claimed.
  const auto edited = [](std::size_t row) {
    return run_of("b.h5", "dp=2", "dp,-", "", {kRows / 2, kCols}, 6, [row](int r, std::vector<double>& p) {
      if (r == int(row / (kRows / 2))) p[(row % (kRows / 2)) * kCols + 1] += 0.5;
    });
  };
  const CompareResult shared = compare(match_runs(small, edited(1), {}).set, {});
  ASSERT_FALSE(shared.pass());
  EXPECT_EQ(shared.taps[0].reference.worst.index, (std::vector<std::size_t>{1, 1}));
  EXPECT_TRUE(compare(match_runs(small, edited(3), {}).set, {}).pass());
  // The larger batch as run A is refused (batch_larger orients a pair).
  EXPECT_THROW(match_runs(big, small, {}), InputError);
}

TEST(Against, BatchesThatDifferBothWaysAreRefused) {
  ActivationSet a = run_of("s.h5", "dp=1", "dp,-", "", {kRows / 2, kCols});
  ActivationSet b = rows_over_dp();
  // A second tap "x" where run A holds more samples than run B (shapes on
  // each set's own mesh: A's dp=1 holds 4 rows, B's two dp ranks 1 each).
  ActivationSet a2 = run_of("s.h5", "dp=1", "dp,-", "", {kRows, kCols});
  ActivationSet b2 = run_of("b.h5", "dp=2", "dp,-", "", {kRows / 4, kCols});
  a2.taps[0].name = b2.taps[0].name = "x";
  auto join = [](ActivationSet& into, const ActivationSet& more) {
    auto data = std::make_shared<InMemoryData>(*std::static_pointer_cast<const InMemoryData>(into.data));
    const auto& extra = *std::static_pointer_cast<const InMemoryData>(more.data);
    TapData t = more.taps[0];
    t.data_id = data->pieces.size();
    data->pieces.push_back(extra.pieces[0]);
    data->references.push_back({});
    into.taps.push_back(t);
    into.data = data;
  };
  join(a, a2);
  join(b, b2);
  try {
    batch_larger(a, b);
    FAIL() << "batches differing both ways were taken";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("'x'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'y'"), std::string::npos) << e.what();
  }
}

TEST(Against, ATapOneRunLacksIsListedNotFatal) {
  ActivationSet b = rows_over_dp();
  b.taps[0].name = "z";
  const AgainstMatch m = match_runs(columns_over_tp(), b, {});
  EXPECT_EQ(m.only_in_a, (std::vector<std::string>{"y"}));
  EXPECT_EQ(m.only_in_b, (std::vector<std::string>{"z"}));
  EXPECT_FALSE(m.set.taps[0].reference_shape.has_value());
  EXPECT_TRUE(compare(m.set, {}).pass());
  EXPECT_NE(m.describe().find("only in a.h5"), std::string::npos);
  EXPECT_NE(m.describe().find("no reference"), std::string::npos);
}

}  // namespace

namespace {

using namespace dc;

constexpr std::uint32_t kSeed = 7;
constexpr std::size_t kRowsK = 16, kTokens = 8, kWidth = 4;

double token_value(std::size_t t, std::size_t w) { return std::cos(0.3 + 1.7 * t + w); }

// A run of one sketch tap "s" of a [8 tokens, 4] tensor: on tp=2 with the
// tokens split ("tp,-"), or on dp=2 replicated ("-,-"); `scale` multiplies
// the values (a wrong run), `seed` is the sketch's.
ActivationSet sketch_run(const std::string& source, bool split_tokens, double scale = 1.0,
                         std::uint32_t seed = kSeed) {
  ActivationSet s;
  s.source = source;
  s.mesh = Mesh::parse(split_tokens ? "tp=2" : "dp=2");
  s.world_size = 2;
  TapData t;
  t.name = "s";
  t.dtype = "float32";
  t.layout = Layout::parse(split_tokens ? "tp,-" : "-,-", "");
  t.local_shape = {split_tokens ? kTokens / 2 : kTokens, kWidth};
  t.reduction_depth = 4;
  SketchInfo info;
  info.seed = seed;
  info.rows = kRowsK;
  info.stored_shape = {kRowsK + 1, kWidth};
  auto data = std::make_shared<InMemoryData>();
  std::vector<std::vector<double>> pieces;
  for (int r = 0; r < 2; ++r) {
    const std::size_t t0 = split_tokens ? r * kTokens / 2 : 0, n = t.local_shape[0];
    std::vector<double> p((kRowsK + 1) * kWidth, 0.0);
    for (std::size_t tok = t0; tok < t0 + n; ++tok)
      for (std::size_t w = 0; w < kWidth; ++w) {
        const double x = scale * token_value(tok, w);
        for (std::size_t i = 0; i < kRowsK; ++i) p[i * kWidth + w] += sketch_sign(seed, static_cast<std::uint32_t>(i), tok) * x;
        p[kRowsK * kWidth + w] += x;
      }
    pieces.push_back(p);
    info.pieces.push_back({0, 0, split_tokens ? "piece" + std::to_string(r) : "same"});
  }
  t.sketch = info;
  data->pieces.push_back(pieces);
  data->references.push_back({});
  s.taps.push_back(t);
  s.data = data;
  return s;
}

TEST(AgainstSketches, SketchesOfTwoMeshesCompareWithEachOther) {
  const CompareResult clean = compare(match_runs(sketch_run("a", true), sketch_run("b", false), {}).set, {});
  ASSERT_TRUE(clean.taps[0].reference.present);
  EXPECT_TRUE(clean.taps[0].reference.other_run);
  EXPECT_TRUE(clean.pass());
  EXPECT_LT(clean.taps[0].reference.rel_l2, 1e-12);
  const CompareResult wrong = compare(match_runs(sketch_run("a", true), sketch_run("b", false, 1.01), {}).set, {});
  EXPECT_FALSE(wrong.pass());
  EXPECT_NEAR(wrong.taps[0].reference.rel_l2, 0.01 / 1.01, 0.004);  // estimated from 16 rows
}

TEST(AgainstSketches, SketchesMadeOtherwiseOrWholeTapsAreRefused) {
  EXPECT_THROW(match_runs(sketch_run("a", true), sketch_run("b", false, 1.0, kSeed + 1), {}), InputError);
  ActivationSet whole = sketch_run("b", false);
  whole.taps[0].sketch.reset();
  EXPECT_THROW(match_runs(sketch_run("a", true), whole, {}), InputError);
}

TEST(Against, PerMeshTapsAreComparedOnlyOnOneMesh) {
  ActivationSet a = columns_over_tp(), b = rows_over_dp();
  a.taps[0].per_mesh = true;
  const AgainstMatch across = match_runs(a, b, {});
  EXPECT_EQ(across.per_mesh, (std::vector<std::string>{"y"}));
  EXPECT_FALSE(across.set.taps[0].reference_shape.has_value());
  const AgainstMatch same = match_runs(a, columns_over_tp(), {});
  EXPECT_TRUE(same.per_mesh.empty());
  EXPECT_TRUE(same.set.taps[0].reference_shape.has_value());
}

}  // namespace
