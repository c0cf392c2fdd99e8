// Sketch taps in the comparator (check/sketch_check.h): the signs are the
// function docs/FORMAT.md defines (the same table test_torch_sketch.py
// asserts for the Python side), and the estimator on sketches made here.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "harness/check/sketch_check.h"

namespace {

std::vector<double> sketch_of(const std::vector<double>& x, std::size_t tokens, std::size_t width, std::size_t k,
                              std::uint32_t seed) {
  std::vector<double> s((k + 1) * width, 0.0);
  for (std::size_t t = 0; t < tokens; ++t)
    for (std::size_t w = 0; w < width; ++w) {
      for (std::size_t i = 0; i < k; ++i)
        s[i * width + w] += dc::sketch_sign(seed, static_cast<std::uint32_t>(i), t) * x[t * width + w];
      s[k * width + w] += x[t * width + w];
    }
  return s;
}

}  // namespace

TEST(SketchCheck, SignsAreTheDocumentedFunction) {
  const int expected[3][8] = {{1, -1, 1, 1, 1, -1, -1, -1}, {-1, -1, 1, -1, -1, 1, -1, -1}, {-1, -1, -1, 1, -1, -1, 1, 1}};
  for (std::uint32_t i = 0; i < 3; ++i)
    for (std::uint64_t t = 0; t < 8; ++t) EXPECT_EQ(dc::sketch_sign(0, i, t), expected[i][t]) << i << "," << t;
  const auto sums = dc::sketch_sign_sums(0, 3, 8);
  EXPECT_EQ(sums, (std::vector<double>{0, -4, -2}));
}

TEST(SketchCheck, EstimatesRelL2AndColumnMeans) {
  const std::size_t tokens = 256, width = 64, k = 8;
  std::mt19937 gen(7);
  std::normal_distribution<double> n(0, 1);
  std::vector<double> ref(tokens * width), x(tokens * width);
  std::vector<double> offset(width);
  for (auto& o : offset) o = 3 * n(gen);
  double err = 0, norm = 0;
  for (std::size_t j = 0; j < ref.size(); ++j) {
    ref[j] = n(gen) + offset[j % width];
    x[j] = ref[j] + 1e-3 * n(gen);
    err += (x[j] - ref[j]) * (x[j] - ref[j]);
    norm += ref[j] * ref[j];
  }
  const dc::Shape global{tokens, width};
  const auto e = dc::estimate_from_sketches(sketch_of(x, tokens, width, k, 5), sketch_of(ref, tokens, width, k, 5), k,
                                            global, dc::sketch_sign_sums(5, k, tokens));
  const double exact = std::sqrt(err / norm);
  EXPECT_NEAR(e.rel_l2 / exact, 1.0, 0.25);
  EXPECT_GT(e.bound, 0.0);
  EXPECT_LT(e.bound, 0.5);
  EXPECT_NEAR(e.reference_rms / std::sqrt(norm / static_cast<double>(ref.size())), 1.0, 0.25);
  ASSERT_TRUE(e.column_mean.has_value());
  // The same x and ref: an estimate of exactly 0; a NaN: NaN, never a pass.
  EXPECT_EQ(dc::estimate_from_sketches(sketch_of(ref, tokens, width, k, 5), sketch_of(ref, tokens, width, k, 5), k,
                                       global, dc::sketch_sign_sums(5, k, tokens)).rel_l2, 0.0);
  x[3] = NAN;
  EXPECT_TRUE(std::isnan(dc::estimate_from_sketches(sketch_of(x, tokens, width, k, 5), sketch_of(ref, tokens, width, k, 5),
                                                    k, global, dc::sketch_sign_sums(5, k, tokens)).rel_l2));
}
