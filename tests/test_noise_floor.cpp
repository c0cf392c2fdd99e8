// Calibrated tolerances without MPI: the input perturbation, the precedence of
// measured tolerances, the norm-wise limit in the comparator, and tolerance
// files (round trip, refusals).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "harness/check/compare.h"
#include "harness/check/noise_floor.h"
#include "harness/report/report.h"
#include "harness/core/error.h"
#include "harness/core/files.h"
#include "harness/core/perturbation.h"
#include "reference/generate.h"
#include "tests/test_sets.h"

namespace {

using namespace dc;

TEST(Perturbation, MovesMostValuesByOneUlpAtMostAndIsDeterministic) {
  for (DType d : {DType::float32, DType::bfloat16}) {
    const InputPerturbation p{7, d};
    int moved = 0;
    const int n = 4000;
    for (int i = 0; i < n; ++i) {
      float x = ref::uniform_at(1, 99, static_cast<std::uint64_t>(i), 1.0f);
      if (d == DType::bfloat16) x = round_bf16(x);
      const float y = perturb_value(p, 99, static_cast<std::uint64_t>(i), x);
      EXPECT_EQ(y, perturb_value(p, 99, static_cast<std::uint64_t>(i), x));  // a pure function
      if (d == DType::bfloat16) {
        EXPECT_EQ(y, round_bf16(y));  // still a bfloat16
      }
      const float ulp = d == DType::float32 ? std::abs(std::nextafter(x, 2 * x) - x) : std::abs(x) * 0x1p-7f;
      EXPECT_LE(std::abs(y - x), 1.01f * ulp) << x << " -> " << y;
      moved += y != x;
    }
    EXPECT_GT(moved, n / 2) << dtype_name(d);
    EXPECT_LT(moved, 19 * n / 20) << dtype_name(d);
    EXPECT_EQ(perturb_value(p, 1, 1, 0.0f), 0.0f);
    EXPECT_TRUE(std::isnan(perturb_value(p, 1, 1, NAN)));
  }
}

TEST(Perturbation, GenerateIsPerturbedOutsideExactScopesOnly) {
  const Tensor plain = ref::generate(3, "w", {64}, 1.0f);
  {
    const PerturbedInputs on(InputPerturbation{5, DType::float32});
    const Tensor moved = ref::generate(3, "w", {64}, 1.0f);
    EXPECT_NE(moved.data, plain.data);
    {
      const ExactInputs exact;  // what ReferenceClock opens around references
      EXPECT_EQ(ref::generate(3, "w", {64}, 1.0f).data, plain.data);
    }
    EXPECT_EQ(ref::generate(3, "w", {64}, 1.0f).data, moved.data);
  }
  EXPECT_EQ(ref::generate(3, "w", {64}, 1.0f).data, plain.data);  // gone with its scope
}

TEST(MeasuredTolerance, PrecedenceAndSource) {
  MeasuredTolerance m = tolerance_from_floor({1e-6, 2e-7, "float32"});
  EXPECT_DOUBLE_EQ(m.rtol, kElementFactor * 1e-6 + std::ldexp(1.0, -24));
  EXPECT_DOUBLE_EQ(m.rel_l2_limit, kNormFactor * 2e-7 + std::ldexp(1.0, -24));
  ToleranceInputs in{"float32", 64, {}, {}, {}, {}, 2.0};
  in.measured = &m;
  in.measured_source = ToleranceSource::calibrated;
  Tolerance t = derive_tolerance(in);
  EXPECT_EQ(t.source, ToleranceSource::calibrated);
  EXPECT_DOUBLE_EQ(t.rtol, m.rtol);
  EXPECT_DOUBLE_EQ(t.atol, m.rtol * 2.0);
  ASSERT_TRUE(t.rel_l2_limit);
  EXPECT_DOUBLE_EQ(*t.rel_l2_limit, m.rel_l2_limit);
  // A measurement replaces a tap's estimate by formula...
  in.tap_atol = 0.5;
  EXPECT_EQ(derive_tolerance(in).source, ToleranceSource::calibrated);
  // ...but not a demand for exactness, nor the command line.
  in.tap_rtol = 0.0;
  in.tap_atol = 0.0;
  t = derive_tolerance(in);
  EXPECT_EQ(t.source, ToleranceSource::attribute);
  EXPECT_EQ(t.atol, 0.0);
  EXPECT_FALSE(t.rel_l2_limit);
  in.tap_atol.reset();
  in.tap_rtol.reset();
  in.cli_rtol = 0.125;
  t = derive_tolerance(in);
  EXPECT_EQ(t.source, ToleranceSource::command_line);
  EXPECT_EQ(t.rtol, 0.125);
  in.cli_rtol.reset();
  in.measured = nullptr;
  EXPECT_EQ(derive_tolerance(in).source, ToleranceSource::derived);
  EXPECT_EQ(source_name(ToleranceSource::noise_floor), "noise floor");
}

// One tap of n elements on one rank: x = ref + err.
ActivationSet one_tap(const std::vector<double>& ref, const std::vector<double>& x) {
  ActivationSet s = test::empty_set("dp=1");
  auto data = std::make_shared<InMemoryData>();
  TapData t = test::tap_t("float32", "", "");
  t.local_shape = {ref.size()};
  t.reference_shape = Shape{ref.size()};
  t.data_id = 0;
  data->pieces.push_back({x});
  data->references.push_back(ref);
  s.taps.push_back(t);
  s.data = data;
  return s;
}

TEST(MeasuredTolerance, NormWiseLimitCatchesAnErrorSpreadBelowTheElementBound) {
  std::vector<double> ref(1000), x(1000);
  for (std::size_t i = 0; i < ref.size(); ++i) {
    ref[i] = std::sin(0.1 * double(i)) + 0.01;
    x[i] = ref[i] + 1e-6 * (i % 2 ? 1 : -1);  // 1e-6 everywhere: rel L2 ~1.4e-6
  }
  ToleranceTable table;
  table.source = ToleranceSource::file;
  table.taps["t"] = {1e-6, 1e-7, 1e-5, 1e-6};  // element bound 1e-5 passes every element; rel L2 1e-6 does not
  CompareOptions o;
  o.tolerances = &table;
  const CompareResult res = compare(one_tap(ref, x), o);
  const auto& rc = res.taps[0].reference;
  EXPECT_EQ(rc.n_fail, 0);
  ASSERT_TRUE(rc.l2_ratio);
  EXPECT_GT(*rc.l2_ratio, 1.0);
  EXPECT_FALSE(rc.pass);
  EXPECT_FALSE(res.pass());
  EXPECT_DOUBLE_EQ(rc.margin(), *rc.l2_ratio);
  ASSERT_EQ(res.taps[0].ranks.err_over_tol.size(), 1u);
  EXPECT_DOUBLE_EQ(res.taps[0].ranks.err_over_tol[0], *rc.l2_ratio);  // the heatmap's cell fails too
  EXPECT_NE(describe_tap(res.taps[0], 0).find("rel L2"), std::string::npos);
  EXPECT_NE(tolerance_line(rc).find("file"), std::string::npos);
  // The same error under a looser limit passes, and a table without the tap
  // falls back to the derived rule, said so.
  table.taps["t"].rel_l2_limit = 1e-5;
  EXPECT_TRUE(compare(one_tap(ref, x), o).pass());
  table.taps.clear();
  const CompareResult fallback = compare(one_tap(ref, x), o);
  EXPECT_EQ(fallback.tolerance_fallbacks, std::vector<std::string>{"t"});
  EXPECT_EQ(fallback.taps[0].reference.tol.source, ToleranceSource::derived);
}

TEST(MeasuredTolerance, FloorsAreWhatTheMeasuringCompareSees) {
  std::vector<double> ref = {1, -2, 3, -4}, x = {1, -2, 3, -4.004};
  const CompareResult res = compare(one_tap(ref, x), floor_measuring_options({}));
  const Floors f = floors_of(res);
  ASSERT_EQ(f.count("t"), 1u);
  const double rms = std::sqrt((1 + 4 + 9 + 16) / 4.0);
  EXPECT_NEAR(f.at("t").element, 0.004 / (rms + 4), 1e-12);
  EXPECT_NEAR(f.at("t").rel_l2, 0.004 / std::sqrt(30.0), 1e-12);
  Floors more = {{"t", {1.0, 0.0, "float32"}}, {"u", {0.5, 0.5, "bfloat16"}}};
  Floors merged = f;
  merge_floors(merged, more);
  EXPECT_EQ(merged.at("t").element, 1.0);                 // the worst of the runs
  EXPECT_EQ(merged.at("t").rel_l2, f.at("t").rel_l2);
  EXPECT_EQ(merged.at("u").dtype, "bfloat16");
  EXPECT_EQ(decode_floors(encode_floors(merged)).at("t").rel_l2, merged.at("t").rel_l2);
  EXPECT_EQ(f.at("t").elements, 4u);
  EXPECT_EQ(decode_floors(encode_floors(f)).at("t").elements, 4u);
}

// Run 0's floor becomes the run's own only where it is a norm over enough
// numbers: a tap of a few (one per sample and branch) keeps the other limits.
TEST(MeasuredTolerance, OnlyTapsOfManyElementsKeepTheUnperturbedError) {
  std::vector<double> small_ref(kSameInputsMinElements - 1, 1.0), big_ref(kSameInputsMinElements, 1.0);
  std::vector<double> small_x = small_ref, big_x = big_ref;
  small_x[0] = big_x[0] = 1.001;
  Floors floors = floors_of(compare(one_tap(small_ref, small_x), floor_measuring_options({})));
  const Floors big = floors_of(compare(one_tap(big_ref, big_x), floor_measuring_options({})));
  floors["big"] = big.at("t");
  keep_unperturbed(floors);
  EXPECT_FALSE(floors.at("t").rel_l2_as_is.has_value());
  ASSERT_TRUE(floors.at("big").rel_l2_as_is.has_value());
  EXPECT_EQ(*floors.at("big").rel_l2_as_is, floors.at("big").rel_l2);
  // So the same-input limit is absent from the small tap's tolerance.
  EXPECT_FALSE(tolerance_from_floor(floors.at("t"), kElementFactor, kNormFactor, 2.0).rel_l2_limit_own_inputs);
  EXPECT_TRUE(tolerance_from_floor(floors.at("big"), kElementFactor, kNormFactor, 2.0).rel_l2_limit_own_inputs);
}

// On the run's own inputs the norm limit is k_same x the unperturbed
// one-device error, when that is tighter than k_norm x the worst floor.
TEST(MeasuredTolerance, SameInputsTightenTheNormLimitToTheUnperturbedError) {
  const double u = std::ldexp(1.0, -24);
  TapFloor f{0.01, 0.004, "bfloat16", 0.001};
  const auto other_seed = tolerance_from_floor(f);
  EXPECT_DOUBLE_EQ(other_seed.rel_l2_limit, kNormFactor * 0.004 + u);
  EXPECT_FALSE(other_seed.floor_rel_l2_as_is);
  const auto same = tolerance_from_floor(f, kElementFactor, kNormFactor, kSameInputsFactor);
  EXPECT_DOUBLE_EQ(same.rel_l2_limit, other_seed.rel_l2_limit);  // kept for per_mesh taps
  ASSERT_TRUE(same.rel_l2_limit_own_inputs);
  EXPECT_DOUBLE_EQ(*same.rel_l2_limit_own_inputs, kSameInputsFactor * 0.001 + u);
  ASSERT_TRUE(same.floor_rel_l2_as_is);
  EXPECT_DOUBLE_EQ(*same.floor_rel_l2_as_is, 0.001);
  EXPECT_DOUBLE_EQ(same.rtol, other_seed.rtol);  // the element bound keeps the perturbed runs
  // Never looser than the other-seed limit, and nothing to tighten without run 0.
  f.rel_l2_as_is = 0.1;
  EXPECT_FALSE(tolerance_from_floor(f, kElementFactor, kNormFactor, kSameInputsFactor).rel_l2_limit_own_inputs);
  f.rel_l2_as_is.reset();
  EXPECT_FALSE(tolerance_from_floor(f, kElementFactor, kNormFactor, kSameInputsFactor).rel_l2_limit_own_inputs);
  // Applied to a tap unless it is per mesh (a one-device run computes something else there).
  ToleranceInputs in{"bfloat16", {}, {}, {}, {}, {}, 1.0};
  in.measured = &same;
  const Tolerance applied = derive_tolerance(in);
  EXPECT_TRUE(applied.own_inputs);
  EXPECT_DOUBLE_EQ(*applied.rel_l2_limit, *same.rel_l2_limit_own_inputs);
  in.per_mesh = true;
  const Tolerance ring_step = derive_tolerance(in);
  EXPECT_FALSE(ring_step.own_inputs);
  EXPECT_DOUBLE_EQ(*ring_step.rel_l2_limit, other_seed.rel_l2_limit);
  // A partial sum's pieces were each rounded to the dtype on its own rank
  // before the sum, which the one device never does (a bfloat16 partial
  // over 8 ranks carries about sqrt(8) of its roundings per element): its
  // element-wise rtol grows by sqrt(8); its norm and column means, averages,
  // keep the same-input limits.
  in.per_mesh = false;
  in.partial_pieces = 8;
  const Tolerance partial = derive_tolerance(in);
  EXPECT_TRUE(partial.own_inputs);
  EXPECT_DOUBLE_EQ(*partial.rel_l2_limit, *same.rel_l2_limit_own_inputs);
  EXPECT_DOUBLE_EQ(partial.rtol, same.rtol * std::sqrt(8.0));
  in.partial_pieces = 1;  // partial over axes of size 1: one piece, as on one device
  EXPECT_DOUBLE_EQ(derive_tolerance(in).rtol, same.rtol);
  // A value summed in its dtype before the capture (`reduced` over 2 ranks: a
  // hand all-reduce of bfloat16 gradients): each piece rounded on its rank and
  // the sum again, in every element, so its norm and column means too: all
  // three limits grow by sqrt(2) (FLUX.2's bfloat16 parameter gradients failed
  // the column-mean check alone at 1.22x and 1.36x before).
  MeasuredTolerance with_columns = same;
  with_columns.column_mean_limit = 0.003;
  with_columns.column_mean_limit_own_inputs = 0.002;
  in.measured = &with_columns;
  in.reduced_pieces = 2;
  const Tolerance summed = derive_tolerance(in);
  EXPECT_DOUBLE_EQ(summed.rtol, same.rtol * std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(*summed.rel_l2_limit, *same.rel_l2_limit_own_inputs * std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(*summed.column_mean_limit, 0.002 * std::sqrt(2.0));
  ReferenceCheck said;  // and the report says why the limits are wider
  said.tol = summed;
  EXPECT_NE(tolerance_line(said).find("summed over 2 ranks in its dtype before the capture (`reduced`): limits x1.41"),
            std::string::npos) << tolerance_line(said);
  in.reduced_pieces = 1;
  EXPECT_DOUBLE_EQ(*derive_tolerance(in).column_mean_limit, 0.002);
  in.measured = &same;
  // Run 0's figure survives merging with perturbed runs and the trip between ranks.
  Floors runs = {{"t", {0.01, 0.002, "bfloat16", 0.002}}};
  merge_floors(runs, {{"t", {0.02, 0.005, "bfloat16", std::nullopt}}});
  EXPECT_EQ(runs.at("t").rel_l2, 0.005);
  ASSERT_TRUE(runs.at("t").rel_l2_as_is);
  EXPECT_EQ(*runs.at("t").rel_l2_as_is, 0.002);
  const Floors back = decode_floors(encode_floors(runs));
  EXPECT_EQ(back.at("t").rel_l2_as_is, runs.at("t").rel_l2_as_is);
  EXPECT_FALSE(decode_floors(encode_floors({{"u", {1, 1, "float32", std::nullopt}}})).at("u").rel_l2_as_is);
}

TEST(ToleranceFile, SameInputsOnlyForTheCalibrationsSeedFlagsAndSteps) {
  CalibrationInfo i;
  i.seed = 7;
  i.flags = "a=1";
  i.steps = 4;
  i.reference_mode = "forced";
  EXPECT_TRUE(same_inputs_as(i, 7, "a=1", 4, "forced"));
  EXPECT_FALSE(same_inputs_as(i, 8, "a=1", 4, "forced"));
  EXPECT_FALSE(same_inputs_as(i, 7, "a=2", 4, "forced"));
  EXPECT_FALSE(same_inputs_as(i, 7, "a=1", 5, "forced"));
  EXPECT_FALSE(same_inputs_as(i, 7, "a=1", 4, "free"));
}

TEST(ToleranceFile, RoundTripAndRefusals) {
  const std::string path = ::testing::TempDir() + "tolerances_test.json";
  ToleranceFile f;
  f.info.scenario = "flux_tp";
  f.info.size = "default";
  f.info.dtype = "bfloat16";
  f.info.seed = 9;
  f.info.runs = 4;
  f.floors["a/b"] = {0.01, 0.002, "bfloat16", 0.0005};
  f.floors["c"] = {0.01, 0.002, "bfloat16", std::nullopt};
  write_tolerance_file(path, f);
  const ToleranceFile back = read_tolerance_file(path);
  EXPECT_EQ(back.info.scenario, "flux_tp");
  EXPECT_EQ(back.info.seed, 9u);
  EXPECT_DOUBLE_EQ(back.info.k_same_inputs, kSameInputsFactor);
  EXPECT_DOUBLE_EQ(back.floors.at("a/b").element, 0.01);
  EXPECT_EQ(back.floors.at("a/b").rel_l2_as_is, 0.0005);
  EXPECT_FALSE(back.floors.at("c").rel_l2_as_is);
  const ToleranceTable t = tolerance_table(back, ToleranceSource::file, path);
  EXPECT_DOUBLE_EQ(t.find("a/b")->rtol, kElementFactor * 0.01 + std::ldexp(1.0, -24));
  EXPECT_DOUBLE_EQ(t.find("a/b")->rel_l2_limit, kNormFactor * 0.002 + std::ldexp(1.0, -24));
  EXPECT_FALSE(t.find("a/b")->rel_l2_limit_own_inputs);
  const ToleranceTable same = tolerance_table(back, ToleranceSource::file, path, /*same_inputs=*/true);
  EXPECT_DOUBLE_EQ(*same.find("a/b")->rel_l2_limit_own_inputs, kSameInputsFactor * 0.0005 + std::ldexp(1.0, -24));
  EXPECT_FALSE(same.find("c")->rel_l2_limit_own_inputs);
  {  // A file of an older diffcheck has no k_same_inputs: no same-input limit.
    std::string text = read_text_file(path, "test");
    const auto at = text.find("\"k_same_inputs\"");
    ASSERT_NE(at, std::string::npos);
    text.erase(at, text.find('\n', at) + 1 - at);
    const ToleranceFile old = parse_tolerance_file(text, path);
    EXPECT_EQ(old.info.k_same_inputs, 0.0);
    EXPECT_FALSE(tolerance_table(old, ToleranceSource::file, path, true).find("a/b")->rel_l2_limit_own_inputs);
  }
  EXPECT_NO_THROW(require_matching_file(back, path, "flux_tp", "default", "bfloat16"));
  auto refused = [&](const std::string& sc, const std::string& size, const std::string& dt, const char* word) {
    try {
      require_matching_file(back, path, sc, size, dt);
      ADD_FAILURE() << "accepted " << sc << " " << size << " " << dt;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  refused("usp_attention", "default", "bfloat16", "scenario 'flux_tp'");
  refused("flux_tp", "flux1-dev", "bfloat16", "size 'default'");
  refused("flux_tp", "default", "float32", "dtype 'bfloat16'");
  for (const char* bad : {"{}", "not json", R"({"format":"diffcheck-tolerances","version":1})",
                          R"({"format":"diffcheck-tolerances","version":2,"provenance":{},"taps":{}})"}) {
    std::ofstream(path) << bad;
    EXPECT_THROW(read_tolerance_file(path), InputError) << bad;
  }
  std::remove(path.c_str());
  EXPECT_THROW(read_tolerance_file(path), InputError);
}

}  // namespace
