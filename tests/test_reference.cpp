// Reference kernels against plain loops and published values.
#include <gtest/gtest.h>

#include <cmath>

#include "harness/core/dtype.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "reference/timestep.h"

using namespace dc;

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(round_bf16(1.0f), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even -> 1.
  EXPECT_EQ(round_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(round_bf16(std::nanf(""))));
  EXPECT_TRUE(std::isinf(round_bf16(INFINITY)));
}

TEST(Generate, DeterministicAndSliceable) {
  auto full = ref::generate(7, "w", {4, 6}, 1.0f);
  auto block = ref::generate(7, "w", {4, 6}, 1.0f, {{1, 3}, {2, 5}});
  ASSERT_EQ(block.shape, (Shape{2, 3}));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(block.data[i * 3 + j], full.data[(i + 1) * 6 + j + 2]);
  auto other = ref::generate(8, "w", {4, 6}, 1.0f);
  EXPECT_NE(full.data, other.data);
  EXPECT_NE(full.data, ref::generate(7, "v", {4, 6}, 1.0f).data);
  for (float v : full.data) EXPECT_TRUE(v >= -1.0f && v < 1.0f);
}

TEST(Linear, MatchesLoops) {
  auto x = ref::generate(1, "x", {3, 5}, 1.0f), w = ref::generate(1, "w", {4, 5}, 1.0f),
       b = ref::generate(1, "b", {4}, 1.0f);
  auto y = ref::linear(x, w, b);
  ASSERT_EQ(y.shape, (Shape{3, 4}));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) {
      double acc = b.data[j];
      for (int k = 0; k < 5; ++k) acc += double(x.data[i * 5 + k]) * w.data[j * 5 + k];
      EXPECT_NEAR(y.data[i * 4 + j], acc, 1e-5);
    }
}

TEST(Activations, MatchFormulas) {
  RefTensor x({3}, std::vector<double>{-2.0, 0.0, 1.5});
  auto s = ref::silu(x);
  auto g = ref::gelu_tanh(x);
  for (int i = 0; i < 3; ++i) {
    double v = x.data[i];
    EXPECT_NEAR(s.data[i], v / (1 + std::exp(-v)), 1e-15);
    EXPECT_NEAR(g.data[i], 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 1e-15);
  }
}

TEST(Schedule, FluxDefaultsAt1024) {
  auto s = ref::flow_match_schedule(28, 4096);
  ASSERT_EQ(s.timesteps.size(), 28u);
  ASSERT_EQ(s.sigmas.size(), 29u);
  EXPECT_DOUBLE_EQ(s.timesteps[0], 1000.0);  // step 0 is exactly t = 1.0
  EXPECT_NEAR(s.timesteps[1] / 1000, 0.9884, 1e-4);
  EXPECT_NEAR(s.timesteps[27] / 1000, 0.1047, 1e-4);
  EXPECT_EQ(s.sigmas.back(), 0.0);
}

TEST(Timestep, SinusoidLayout) {
  auto e = ref::timestep_sinusoid<double>(0.0, 8);
  EXPECT_EQ(e.data, (std::vector<double>{1, 1, 1, 1, 0, 0, 0, 0}));  // [cos | sin] at t=0
  auto f = ref::timestep_sinusoid<double>(3.0, 8);
  EXPECT_DOUBLE_EQ(f.data[0], std::cos(3.0));
  EXPECT_DOUBLE_EQ(f.data[5], std::sin(3.0 * std::exp(-std::log(10000.0) / 4)));
}
