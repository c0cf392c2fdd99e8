// Reference kernels against plain loops and published values.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "harness/core/dtype.h"
#include "harness/core/error.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "reference/ops.h"
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

TEST(Generate, VectorisedRunIsUniformAtBitForBit) {
  if (!ref::uniform_run_vectorised_available()) GTEST_SKIP() << "no AVX2 on this CPU";
  // Runs of every length around the 8 lanes, from starts that put the counter's
  // low word just below 2^32 (the high word changes inside a run), seeds whose
  // halves differ, scales of both signs.
  for (std::uint64_t seed : {std::uint64_t{7}, std::uint64_t{0x123456789abcdefULL}}) {
    for (std::uint64_t first : {std::uint64_t{0}, std::uint64_t{5}, (std::uint64_t{1} << 32) - 11,
                                (std::uint64_t{3} << 32) + 1}) {
      for (std::size_t n : {1, 7, 8, 9, 16, 23, 1000}) {
        for (float scale : {1.0f, 0.0173f, -3.5f}) {
          std::vector<float> a(n), b(n);
          ref::uniform_run_avx2(seed, 0xdeadbeefu, first, n, scale, a.data());
          ref::uniform_run_portable(seed, 0xdeadbeefu, first, n, scale, b.data());
          for (std::size_t i = 0; i < n; ++i)
            ASSERT_EQ(std::bit_cast<std::uint32_t>(a[i]), std::bit_cast<std::uint32_t>(b[i]))
                << "seed " << seed << " index " << first + i << " scale " << scale;
        }
      }
    }
  }
}

TEST(Generate, BlocksOfEveryRankAgreeWithTheWhole) {
  // A block of a 3-d tensor whose rows are not a multiple of 8, and a scalar.
  const auto whole = ref::generate(3, "t", {3, 5, 11}, 0.5f);
  const auto part = ref::generate(3, "t", {3, 5, 11}, 0.5f, {{1, 3}, {2, 5}, {3, 10}});
  ASSERT_EQ(part.shape, (Shape{2, 3, 7}));
  for (std::size_t a = 0; a < 2; ++a)
    for (std::size_t b = 0; b < 3; ++b)
      for (std::size_t c = 0; c < 7; ++c)
        EXPECT_EQ(part.data[(a * 3 + b) * 7 + c], whole.data[((a + 1) * 5 + b + 2) * 11 + c + 3]);
  for (std::size_t i = 0; i < whole.size(); ++i)
    ASSERT_EQ(whole.data[i], ref::uniform_at(3, ref::tensor_id("t"), i, 0.5f)) << i;
  const auto scalar = ref::generate(3, "s", {}, 2.0f);
  ASSERT_EQ(scalar.size(), 1u);
  EXPECT_EQ(scalar.data[0], ref::uniform_at(3, ref::tensor_id("s"), 0, 2.0f));
}

TEST(Linear, FloatWeightsWidenedBlockwiseGiveTheFloat64Product) {
  // k = 16000: blocks of 512 weight rows (64 MiB of float64, to a multiple of
  // 64); m = 1100 is two full blocks and a partial one. The float64 product of the widened weights, to rounding:
  // OpenBLAS's order of a sum over k can change with the width of the product
  // (seen: last-bit differences), so not bit for bit.
  for (std::size_t k : {7, 16000}) {
    const std::size_t n = 5, m = 1100;
    const RefTensor x = ref::to_ref(ref::generate(1, "x", {n, k}, 1.0f));
    const Tensor w = ref::generate(1, "w", {m, k}, 0.1f), b = ref::generate(1, "b", {m}, 0.5f);
    const RefTensor got = ref::linear(x, w, b);
    const RefTensor want = ref::linear(x, ref::to_ref(w), ref::to_ref(b));
    ASSERT_EQ(got.shape, want.shape);
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got.data[i], want.data[i], 1e-13 * (1 + std::abs(want.data[i]))) << "k " << k << " at " << i;
    // A wrong block (a row of w skipped or repeated) moves a column by O(1).
    EXPECT_GT(std::abs(want.data[0]), 1e-3);
    EXPECT_EQ(ref::linear(x, w, Tensor()).data.size(), n * m);  // no bias
  }
}

TEST(Linear, WeightRowsGivenABlockAtATimeGiveTheSameBits) {
  // The weight's rows asked for in linear's own blocks (k = 16000: [0, 512),
  // [512, 1024), [1024, 1100)), each once and in order: the same bits as the
  // whole weight, in float64 with float32 weights and in float32; a block of
  // the wrong shape is an error naming the rows.
  for (std::size_t k : {7, 16000}) {
    const std::size_t n = 5, m = 1100;
    const Tensor w = ref::generate(2, "w", {m, k}, 0.1f), b = ref::generate(2, "b", {m}, 0.5f);
    const Tensor x32 = ref::generate(2, "x", {n, k}, 1.0f);
    const RefTensor x = ref::to_ref(x32);
    std::vector<std::pair<std::size_t, std::size_t>> asked;
    const std::function<Tensor(std::size_t, std::size_t)> rows = [&](std::size_t r0, std::size_t r1) {
      asked.emplace_back(r0, r1);
      return ref::take_rows(w, r0, r1);
    };
    EXPECT_EQ((ref::linear_by_rows<double, float>(x, m, rows, b).data), ref::linear(x, w, b).data) << k;
    if (k == 16000) {
      EXPECT_EQ(asked, (std::vector<std::pair<std::size_t, std::size_t>>{{0, 512}, {512, 1024}, {1024, 1100}}));
    } else {
      EXPECT_EQ(asked, (std::vector<std::pair<std::size_t, std::size_t>>{{0, 1100}}));
    }
    const Tensor got32 = ref::linear_by_rows<float, float>(x32, m, rows, b), want32 = ref::linear(x32, w, b);
    ASSERT_EQ(got32.shape, want32.shape);
    for (std::size_t i = 0; i < got32.size(); ++i)
      ASSERT_NEAR(got32.data[i], want32.data[i], 1e-5 * (1 + std::abs(want32.data[i]))) << "k " << k << " at " << i;
  }
  const std::function<Tensor(std::size_t, std::size_t)> short_rows = [](std::size_t r0, std::size_t r1) {
    return Tensor({r1 - r0 - 1, 3});
  };
  const RefTensor x23({2, 3});
  EXPECT_THROW((ref::linear_by_rows<double, float>(x23, 4, short_rows, Tensor())), Error);
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
