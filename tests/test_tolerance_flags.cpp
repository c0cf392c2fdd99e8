#include <gtest/gtest.h>

#include <cmath>

#include "harness/core/error.h"
#include "harness/core/flags.h"
#include "harness/check/tolerance.h"

TEST(Tolerance, DerivedFromDtypeAndDepth) {
  auto t1 = dc::derive_tolerance({"float32", 1, {}, {}, {}, {}, 2.0});
  auto t256 = dc::derive_tolerance({"float32", 256, {}, {}, {}, {}, 2.0});
  const double u = std::ldexp(1.0, -24);
  EXPECT_DOUBLE_EQ(t1.rtol, dc::kToleranceScale * (u + u));
  EXPECT_DOUBLE_EQ(t256.rtol, dc::kToleranceScale * (u + 16 * u));
  EXPECT_DOUBLE_EQ(t256.atol, 2.0 * t256.rtol);  // scaled by the reference RMS
  auto bf = dc::derive_tolerance({"bfloat16", 256, {}, {}, {}, {}, 1.0});
  EXPECT_GT(bf.rtol, 60 * t256.rtol);
  EXPECT_EQ(dc::derive_tolerance({"integer", 100, {}, {}, {}, {}, 1.0}).rtol, 0.0);
}

TEST(Tolerance, TapAttributesBeatCommandLineBeatDefault) {
  auto cli = dc::derive_tolerance({"float32", 1, {}, {}, 0.5, 0.25, 1.0});
  EXPECT_EQ(cli.atol, 0.5);
  EXPECT_EQ(cli.rtol, 0.25);
  auto tap = dc::derive_tolerance({"float32", 1, 0.1, 0.2, 0.5, 0.25, 1.0});
  EXPECT_EQ(tap.atol, 0.1);
  EXPECT_EQ(tap.rtol, 0.2);
}

TEST(Tolerance, FactorScalesTheDerivedToleranceOnly) {
  // A free-running pipeline's step t: sqrt(t + 1) times the derived tolerance.
  auto base = dc::derive_tolerance({"bfloat16", 64, {}, {}, {}, {}, 2.0});
  auto grown = dc::derive_tolerance({"bfloat16", 64, {}, {}, {}, {}, 2.0, 3.0});
  EXPECT_DOUBLE_EQ(grown.rtol, 3.0 * base.rtol);
  EXPECT_DOUBLE_EQ(grown.atol, 3.0 * base.atol);
  // Tolerances given outright are what they say.
  auto given = dc::derive_tolerance({"bfloat16", 64, 1e-3, 1e-2, {}, {}, 2.0, 3.0});
  EXPECT_DOUBLE_EQ(given.atol, 1e-3);
  EXPECT_DOUBLE_EQ(given.rtol, 1e-2);
}

TEST(Flags, DefaultsAssignmentsAndErrors) {
  std::vector<dc::FlagSpec> specs = {{"async", dc::FlagType::boolean, "false", ""},
                                     {"chunks", dc::FlagType::integer, "1", ""}};
  auto fv = dc::FlagValues::resolve(specs, {"async", "chunks=3", "chunks=4"}, "s");
  EXPECT_TRUE(fv.get_bool("async"));
  EXPECT_EQ(fv.get_int("chunks"), 4);  // later wins (--flag after DIFFCHECK_FLAGS)
  EXPECT_EQ(fv.str(), "async=true chunks=4");
  EXPECT_THROW(dc::FlagValues::resolve(specs, {"nope=1"}, "s"), dc::InputError);
  EXPECT_THROW(dc::FlagValues::resolve(specs, {"chunks=x"}, "s"), dc::InputError);
  EXPECT_THROW(dc::FlagValues::resolve(specs, {"async=maybe"}, "s"), dc::InputError);
  EXPECT_THROW(dc::FlagValues::resolve(specs, {"chunks"}, "s"), dc::InputError);
  try {
    dc::FlagValues::resolve(specs, {"nope"}, "s");
  } catch (const dc::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("async, chunks"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dc::split_flag_list(" a=1,b=2  c "), (std::vector<std::string>{"a=1", "b=2", "c"}));
}

TEST(Tolerance, ASumBeforeTheCaptureCountsItsRoundings) {
  // `reduced` over 4 ranks: 3 more roundings than the tap's own count.
  dc::ToleranceInputs in{"bfloat16", 64, {}, {}, {}, {}, 1.0};
  in.rounding_steps = 2;
  const auto own = dc::derive_tolerance(in);
  in.reduced_pieces = 4;
  const auto summed = dc::derive_tolerance(in);
  in.reduced_pieces = 1;
  in.rounding_steps = 5;
  EXPECT_DOUBLE_EQ(summed.rtol, dc::derive_tolerance(in).rtol);
  EXPECT_GT(summed.rtol, own.rtol);
}
