// The root attribute `math` (TF32, autocast) and the rounding counts in the
// derived rule, and what the report says of them.
#include <gtest/gtest.h>

#include <cmath>

#include "harness/check/compare.h"
#include "harness/check/math_mode.h"
#include "harness/report/report.h"
#include "harness/check/tolerance.h"
#include "harness/core/error.h"

namespace {

const std::string kOff =
    "device=cuda float32_matmul_precision=highest tf32_matmul=0 tf32_cudnn=0 autocast_cpu=off autocast_cuda=off";

}  // namespace

TEST(MathMode, Float32WithoutExtraMathAddsNothing) {
  EXPECT_EQ(dc::math_rounding(kOff, "float32", "f").roundoff, 0.0);
  EXPECT_EQ(dc::math_rounding("", "float32", "f").roundoff, 0.0);
}

TEST(MathMode, Tf32MatmulsGiveTenBitMantissas) {
  for (const std::string m : {"device=cuda tf32_matmul=1", "float32_matmul_precision=high"}) {
    auto r = dc::math_rounding(m, "float32", "f");
    EXPECT_EQ(r.roundoff, std::ldexp(1.0, -11)) << m;
    EXPECT_EQ(r.label, "TF32 matmuls") << m;
  }
  EXPECT_EQ(dc::math_rounding("tf32_cudnn=1", "float32", "f").label, "TF32 convolutions");
  EXPECT_EQ(dc::math_rounding("float32_matmul_precision=medium", "float32", "f").roundoff, std::ldexp(1.0, -8));
  // TF32 is a float32 matter: a bfloat16 tap is rounding more already.
  EXPECT_EQ(dc::math_rounding("tf32_matmul=1", "bfloat16", "f").roundoff, 0.0);
}

TEST(MathMode, CudaSettingsDoNotApplyToACpuRun) {
  EXPECT_EQ(dc::math_rounding("device=cpu tf32_matmul=1 float32_matmul_precision=high", "float32", "f").roundoff,
            0.0);
  EXPECT_EQ(dc::math_rounding("device=cpu autocast_cuda=bfloat16", "float32", "f").roundoff, 0.0);
  auto cpu = dc::math_rounding("device=cpu autocast_cpu=bfloat16", "float32", "f");
  EXPECT_EQ(cpu.roundoff, std::ldexp(1.0, -8));
  EXPECT_EQ(cpu.label, "autocast bfloat16");
  EXPECT_EQ(dc::math_rounding("device=cuda autocast_cpu=bfloat16", "float32", "f").roundoff, 0.0);
}

TEST(MathMode, AutocastRaisesANarrowerTapOnlyWhenItIsCoarser) {
  EXPECT_EQ(dc::math_rounding("autocast_cuda=float16", "float32", "f").roundoff, std::ldexp(1.0, -11));
  EXPECT_EQ(dc::math_rounding("autocast_cuda=bfloat16", "float16", "f").roundoff, std::ldexp(1.0, -8));
  EXPECT_EQ(dc::math_rounding("autocast_cuda=float16", "bfloat16", "f").roundoff, 0.0);
}

TEST(MathMode, TextThatIsNotPairsIsAnInputErrorNamingTheFile) {
  try {
    dc::math_rounding("tf32 on", "float32", "run.rank0.h5");
    FAIL() << "no error";
  } catch (const dc::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("run.rank0.h5"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("'math'"), std::string::npos);
  }
}

TEST(DerivedRule, RoundingStepsAddInQuadrature) {
  const double u = std::ldexp(1.0, -8), u_acc = std::ldexp(1.0, -24);
  dc::ToleranceInputs in{"bfloat16", 64, {}, {}, {}, {}, 1.0};
  in.rounding_steps = 9;
  auto t = dc::derive_tolerance(in);
  EXPECT_DOUBLE_EQ(t.rtol, dc::kToleranceScale * (3 * u + 8 * u_acc));
  EXPECT_EQ(t.yardstick, "bfloat16, depth 64, 9 roundings");
  // With the counts known, the norm is held too, at a quarter of the element bound's constant.
  ASSERT_TRUE(t.rel_l2_limit.has_value());
  EXPECT_DOUBLE_EQ(*t.rel_l2_limit, dc::kNormScale * (3 * u + 8 * u_acc));
  EXPECT_FALSE(dc::derive_tolerance({"bfloat16", 64, {}, {}, {}, {}, 1.0}).rel_l2_limit.has_value());
  // Without the attribute: one rounding, as before.
  EXPECT_DOUBLE_EQ(dc::derive_tolerance({"bfloat16", 64, {}, {}, {}, {}, 1.0}).rtol,
                   dc::kToleranceScale * (u + 8 * u_acc));
}

TEST(DerivedRule, MathRaisesTheRoundoffAndIsNamed) {
  dc::ToleranceInputs in{"float32", 1024, {}, {}, {}, {}, 1.0};
  in.rounding_steps = 4;
  const auto plain = dc::derive_tolerance(in);
  EXPECT_GT(plain.rtol_if_tf32, 0.0);  // the file says no math: the report can tell a TF32-sized error
  in.math_roundoff = std::ldexp(1.0, -11);
  in.math_label = "TF32 matmuls";
  const auto tf32 = dc::derive_tolerance(in);
  EXPECT_DOUBLE_EQ(tf32.rtol, dc::kToleranceScale * (2 * std::ldexp(1.0, -11) + 32 * std::ldexp(1.0, -24)));
  EXPECT_DOUBLE_EQ(tf32.rtol, plain.rtol_if_tf32);
  EXPECT_EQ(tf32.yardstick, "float32, depth 1024, 4 roundings, TF32 matmuls");
  EXPECT_EQ(tf32.rtol_if_tf32, 0.0);  // stated: nothing to guess
  EXPECT_EQ(dc::tolerance_cell(tf32), "derived d1024 TF32");
}

TEST(DerivedRule, AFailureOfTf32SizeSaysSo) {
  dc::ToleranceInputs in{"float32", 512, {}, {}, {}, {}, 1.0};
  dc::ReferenceCheck ref;
  ref.present = true;
  ref.pass = false;
  ref.tol = dc::derive_tolerance(in);
  ref.worst_ratio = 0.5 * ref.tol.rtol_if_tf32 / ref.tol.rtol;  // fails here, passes under TF32's tolerance
  ASSERT_GT(ref.margin(), 1.0);
  EXPECT_NE(dc::math_hint(ref).find("TF32 matmuls"), std::string::npos);
  ref.worst_ratio = 0.5 * ref.tol.rtol_if_bf16 / ref.tol.rtol;  // too large for TF32, bfloat16's size
  EXPECT_NE(dc::math_hint(ref).find("bfloat16 matmuls"), std::string::npos);
  ref.worst_ratio = 2 * ref.tol.rtol_if_bf16 / ref.tol.rtol;  // larger than any math: a bug, no excuse offered
  EXPECT_EQ(dc::math_hint(ref), "");
}
