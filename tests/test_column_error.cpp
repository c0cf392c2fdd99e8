// Column means of a tap's error (check/column_error.h): the figure against a
// direct computation, its independence of chunks, threads and layouts, the
// limit that catches a bias in every token where the norm passes, and the
// floors and files that carry it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "harness/check/column_error.h"
#include "harness/check/compare.h"
#include "harness/check/noise_floor.h"
#include "harness/report/report.h"
#include "harness/report/steps.h"
#include "harness/core/files.h"
#include "tests/test_sets.h"

namespace {

using namespace dc;

constexpr std::size_t B = 2, T = 32, D = 8;

double reference_at(std::size_t b, std::size_t t, std::size_t d) {
  return std::sin(0.37 * double(t) + 1.3 * double(d) + 2.0 * double(b)) + 0.1;
}
// Rounding-like noise that changes sign from token to token, and a bias per column.
double error_at(std::size_t b, std::size_t t, std::size_t d, double noise, double bias) {
  return noise * std::sin(7.3 * double(t) + 1.1 * double(d) + 3.0 * double(b)) + bias * (1.0 + 0.25 * double(d % 3));
}

// A tap of global shape [B, T, D] on mesh dp=2,tp=2, in one of three layouts:
// tokens split over tp ("-,tp,-" with dp replicas: the path with replicas),
// batch and tokens split ("dp,tp,-": one piece per block), or batch split and
// tp partial sums (the summed path).
ActivationSet tap_set(const std::string& spec, const std::string& partial, double noise, double bias) {
  ActivationSet s = test::empty_set("dp=2,tp=2");
  const Mesh& mesh = s.mesh;
  auto data = std::make_shared<InMemoryData>();
  TapData t = test::tap_t("bfloat16", spec, partial);
  const bool batch_split = spec.rfind("dp", 0) == 0, token_split = spec.find("tp") != std::string::npos;
  t.local_shape = {batch_split ? B / 2 : B, token_split ? T / 2 : T, D};
  t.reference_shape = Shape{B, T, D};
  std::vector<std::vector<double>> pieces;
  for (int r = 0; r < 4; ++r) {
    const auto c = mesh.coords(r);
    std::vector<double> piece;
    for (std::size_t b = 0; b < t.local_shape[0]; ++b)
      for (std::size_t i = 0; i < t.local_shape[1]; ++i)
        for (std::size_t d = 0; d < D; ++d) {
          const std::size_t gb = batch_split ? c[0] * (B / 2) + b : b, gt = token_split ? c[1] * (T / 2) + i : i;
          const double x = reference_at(gb, gt, d) + error_at(gb, gt, d, noise, bias);
          piece.push_back(partial.empty() ? x : (c[1] == 0 ? 0.75 * x : 0.25 * x));  // halves that sum to x
        }
    pieces.push_back(piece);
  }
  std::vector<double> ref;
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t i = 0; i < T; ++i)
      for (std::size_t d = 0; d < D; ++d) ref.push_back(reference_at(b, i, d));
  t.data_id = 0;
  data->pieces.push_back(pieces);
  data->references.push_back(ref);
  s.taps.push_back(t);
  s.data = data;
  return s;
}

// The figure computed the plain way.
double direct_column_mean(double noise, double bias) {
  double ref_sq = 0, mean_sq = 0;
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t d = 0; d < D; ++d) {
      double sum = 0;
      for (std::size_t t = 0; t < T; ++t) {
        sum += error_at(b, t, d, noise, bias);
        ref_sq += reference_at(b, t, d) * reference_at(b, t, d);
      }
      mean_sq += (sum / T) * (sum / T);
    }
  return std::sqrt(mean_sq / (B * D)) / std::sqrt(ref_sq / (B * T * D));
}

TEST(ColumnMeans, LayoutNeedsTokensAndBoundedColumns) {
  EXPECT_FALSE(column_layout({4096}).tracked());
  EXPECT_FALSE(column_layout({2, kColumnMinTokens - 1, 8}).tracked());
  const ColumnLayout c = column_layout({2, 3, kColumnMinTokens, 8});
  ASSERT_TRUE(c.tracked());
  EXPECT_EQ(c.columns, 2u * 3u * 8u);
  EXPECT_EQ(c.tokens, kColumnMinTokens);
  EXPECT_FALSE(column_layout({kColumnMaxColumns + 1, kColumnMinTokens, 1}).tracked());
}

TEST(ColumnMeans, TheFigureIsTheDirectOneWhateverTheLayoutChunksAndThreads) {
  const double want = direct_column_mean(1e-3, 2e-4);
  std::optional<double> first;
  for (const auto& [spec, partial] : std::vector<std::pair<std::string, std::string>>{
           {"-,tp,-", ""}, {"dp,tp,-", ""}, {"dp,-,-", "tp"}}) {
    for (std::size_t chunk : {32, 64, 0}) {
      for (int threads : {1, 3}) {
        CompareOptions o = floor_measuring_options({});
        o.chunk_elements = chunk;
        o.sum_unit = 32;  // four tokens of every column: a unit sums each column four times
        o.threads = threads;
        const CompareResult res = compare(tap_set(spec, partial, 1e-3, 2e-4), o);
        const auto& rc = res.taps[0].reference;
        ASSERT_TRUE(rc.column_mean) << spec;
        EXPECT_NEAR(*rc.column_mean, want, 1e-9 * want) << spec << " chunk " << chunk;
        // Exact sums: the same bits whatever the chunks and threads (at one
        // summation unit; the layout moves which values share a unit).
        if (spec == "-,tp,-") {
          if (!first) first = rc.column_mean;
          EXPECT_EQ(*rc.column_mean, *first) << "chunk " << chunk << " threads " << threads;
        }
      }
    }
  }
  // A compare without a column limit does not measure them.
  EXPECT_FALSE(compare(tap_set("-,tp,-", "", 1e-3, 2e-4), {}).taps[0].reference.column_mean);
}

TEST(ColumnMeans, ABiasInEveryTokenFailsTheColumnLimitWhereTheNormPasses) {
  // Noise 1e-2 from token to token, a bias of 1e-3: the rel L2 barely moves,
  // the column mean grows several times.
  const double clean = direct_column_mean(1e-2, 0), biased = direct_column_mean(1e-2, 1e-3);
  ASSERT_GT(biased, 3 * clean);
  ToleranceTable table;
  table.source = ToleranceSource::calibrated;
  MeasuredTolerance m;
  m.rtol = 1;  // no element fails
  m.rel_l2_limit = 1;
  m.floor_column_mean = clean;
  m.column_mean_limit = 2 * clean;
  table.taps["t"] = m;
  CompareOptions o;
  o.tolerances = &table;
  const CompareResult pass = compare(tap_set("dp,tp,-", "", 1e-2, 0), o);
  EXPECT_TRUE(pass.pass());
  ASSERT_TRUE(pass.taps[0].reference.column_ratio);
  EXPECT_NEAR(*pass.taps[0].reference.column_ratio, 0.5, 1e-9);
  const CompareResult res = compare(tap_set("dp,tp,-", "", 1e-2, 1e-3), o);
  const auto& rc = res.taps[0].reference;
  EXPECT_EQ(rc.n_fail, 0);
  EXPECT_LT(*rc.l2_ratio, 1.0);
  ASSERT_TRUE(rc.column_ratio);
  EXPECT_NEAR(*rc.column_ratio, biased / (2 * clean), 1e-9);
  EXPECT_FALSE(res.pass());
  EXPECT_DOUBLE_EQ(rc.margin(), *rc.column_ratio);
  // A limit on the whole tensor is no rank's own: each rank's err/tol (a
  // heatmap cell) is its block's, under 1 here; the step summaries take the
  // tap's margin, and the heatmap marks the tap's label.
  ASSERT_EQ(res.taps[0].ranks.err_over_tol.size(), 4u);
  for (double r : res.taps[0].ranks.err_over_tol) EXPECT_LT(r, 1.0);
  EXPECT_DOUBLE_EQ(worst_err_over_tol(res.taps[0]), *rc.column_ratio);
  for (double r : pass.taps[0].ranks.err_over_tol) EXPECT_LE(r, 1.0);
  EXPECT_NE(describe_tap(res.taps[0], 0).find("column-mean error"), std::string::npos) << describe_tap(res.taps[0], 0);
  EXPECT_NE(tolerance_line(rc).find("column mean <="), std::string::npos) << tolerance_line(rc);
}

TEST(ColumnMeans, FloorsLimitsAndFilesCarryThem) {
  const double u = std::ldexp(1.0, -24);
  Floors floors = floors_of(compare(tap_set("dp,tp,-", "", 1e-2, 0), floor_measuring_options({})));
  ASSERT_TRUE(floors.at("t").column_mean);
  EXPECT_NEAR(*floors.at("t").column_mean, direct_column_mean(1e-2, 0), 1e-12);
  // B x D = 16 columns: one-device column means over so few say little of
  // another sample's, so run 0's figure is not the run's own...
  EXPECT_EQ(floors.at("t").columns, B * D);
  keep_unperturbed(floors);
  EXPECT_FALSE(floors.at("t").column_mean_as_is);
  EXPECT_TRUE(floors.at("t").rel_l2_as_is);
  // ...from kSameInputsMinColumns on it is.
  floors.at("t").columns = kSameInputsMinColumns;
  keep_unperturbed(floors);
  EXPECT_EQ(floors.at("t").column_mean_as_is, floors.at("t").column_mean);
  // A perturbed run's larger figure is the floor; run 0's stays the run's own.
  Floors perturbed = floors_of(compare(tap_set("dp,tp,-", "", 3e-2, 0), floor_measuring_options({})));
  merge_floors(floors, perturbed);
  const TapFloor f = floors.at("t");
  EXPECT_EQ(f.column_mean, perturbed.at("t").column_mean);
  EXPECT_NEAR(*f.column_mean_as_is, direct_column_mean(1e-2, 0), 1e-12);
  const Floors back = decode_floors(encode_floors(floors));
  EXPECT_EQ(back.at("t").column_mean, f.column_mean);
  EXPECT_EQ(back.at("t").column_mean_as_is, f.column_mean_as_is);
  EXPECT_EQ(back.at("t").columns, f.columns);
  // Limits: k_norm x the floor; on the run's own inputs k_same x run 0's.
  const auto other = tolerance_from_floor(f);
  EXPECT_DOUBLE_EQ(*other.column_mean_limit, kNormFactor * *f.column_mean + u);
  EXPECT_FALSE(other.column_mean_limit_own_inputs);
  const auto same = tolerance_from_floor(f, kElementFactor, kNormFactor, kSameInputsFactor);
  EXPECT_DOUBLE_EQ(*same.column_mean_limit_own_inputs, kSameInputsFactor * *f.column_mean_as_is + u);
  ToleranceInputs in{"bfloat16", {}, {}, {}, {}, {}, 1.0};
  in.measured = &same;
  EXPECT_DOUBLE_EQ(*derive_tolerance(in).column_mean_limit, *same.column_mean_limit_own_inputs);
  EXPECT_TRUE(derive_tolerance(in).column_own_inputs);
  in.per_mesh = true;  // a ring step: the other-seed limit
  EXPECT_DOUBLE_EQ(*derive_tolerance(in).column_mean_limit, *same.column_mean_limit);
  // The file keeps them; one without them (older) gives no column limit.
  const std::string path = ::testing::TempDir() + "column_tolerances_test.json";
  ToleranceFile file;
  file.info.scenario = "s";
  file.floors = floors;
  write_tolerance_file(path, file);
  const ToleranceFile read = read_tolerance_file(path);
  EXPECT_EQ(read.floors.at("t").column_mean, f.column_mean);
  EXPECT_EQ(read.floors.at("t").column_mean_as_is, f.column_mean_as_is);
  std::string text = read_text_file(path, "test");
  for (const char* key : {"\"floor_column_mean_as_is\"", "\"floor_column_mean\"", "\"column_mean_limit\""}) {
    const auto at = text.find(key);
    ASSERT_NE(at, std::string::npos) << key;
    text.erase(at, text.find('\n', at) + 1 - at);
  }
  const ToleranceFile old = parse_tolerance_file(text, path);
  EXPECT_FALSE(old.floors.at("t").column_mean);
  EXPECT_FALSE(tolerance_table(old, ToleranceSource::file, path, true).find("t")->column_mean_limit);
  std::remove(path.c_str());
}

}  // namespace
