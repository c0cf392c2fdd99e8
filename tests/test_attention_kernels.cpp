// Attention as strided GEMMs with a vectorised exp pass (reference/attention.cpp,
// reference/softmax*.cpp) against float64 loops, against the per-head-copy
// kernel it replaced, and the AVX2 exp pass against the portable one, at
// awkward shapes: one token, odd token counts, one head, head sizes that are
// no multiple of the SIMD width, rows longer than one query block.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "reference/attention.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "reference/ops.h"
#include "reference/gelu.h"
#include "reference/softmax.h"

using namespace dc;

namespace {

template <class T>
BasicTensor<T> random(const char* name, Shape s) {
  return ref::cast<T>(ref::to_ref(ref::generate(7, name, s, 2.0f)));
}

// softmax(scale q kᵀ) v in long double loops: the exact answer.
template <class T>
std::vector<long double> exact(const BasicTensor<T>& q, const BasicTensor<T>& k, const BasicTensor<T>& v,
                               double scale) {
  const std::size_t nq = q.shape[0], nk = k.shape[0], heads = q.shape[1], d = q.shape[2];
  std::vector<long double> out(q.size());
  std::vector<long double> s(nk);
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t i = 0; i < nq; ++i) {
      long double mx = -INFINITY, sum = 0;
      for (std::size_t j = 0; j < nk; ++j) {
        s[j] = 0;
        for (std::size_t c = 0; c < d; ++c)
          s[j] += (long double)q.data[(i * heads + h) * d + c] * k.data[(j * heads + h) * d + c];
        s[j] *= scale;
        mx = std::max(mx, s[j]);
      }
      for (std::size_t j = 0; j < nk; ++j) sum += s[j] = std::exp(s[j] - mx);
      for (std::size_t c = 0; c < d; ++c) {
        long double acc = 0;
        for (std::size_t j = 0; j < nk; ++j) acc += s[j] * v.data[(j * heads + h) * d + c];
        out[(i * heads + h) * d + c] = acc / sum;
      }
    }
  return out;
}

// The kernel this one replaced: each head copied out, v transposed, the
// weights normalised before the second product.
template <class T>
BasicTensor<T> per_head_copies(const BasicTensor<T>& q, const BasicTensor<T>& k, const BasicTensor<T>& v,
                               double scale) {
  const std::size_t nq = q.shape[0], nk = k.shape[0], heads = q.shape[1], d = q.shape[2];
  auto head = [&](const BasicTensor<T>& x, std::size_t h) {
    const std::size_t n = x.shape[0];
    BasicTensor<T> y({n, d});
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t c = 0; c < d; ++c) y.data[i * d + c] = x.data[(i * heads + h) * d + c];
    return y;
  };
  BasicTensor<T> out(q.shape);
  for (std::size_t h = 0; h < heads; ++h) {
    auto s = ref::linear(head(q, h), head(k, h), BasicTensor<T>());
    for (std::size_t i = 0; i < nq; ++i) {
      T* row = s.ptr() + i * nk;
      double m = -INFINITY, sum = 0;
      for (std::size_t j = 0; j < nk; ++j) m = std::max(m, scale * row[j]);
      for (std::size_t j = 0; j < nk; ++j) sum += row[j] = static_cast<T>(std::exp(scale * row[j] - m));
      for (std::size_t j = 0; j < nk; ++j) row[j] = static_cast<T>(row[j] / sum);
    }
    auto o = ref::matmul_nn(s, head(v, h));
    for (std::size_t i = 0; i < nq; ++i)
      for (std::size_t c = 0; c < d; ++c) out.data[(i * heads + h) * d + c] = o.data[i * d + c];
  }
  return out;
}

using Dims = std::tuple<std::size_t, std::size_t, std::size_t, std::size_t>;  // nq, nk, heads, d
const Dims kShapes[] = {{1, 1, 1, 1},   {67, 129, 1, 5}, {130, 67, 3, 17}, {65, 200, 5, 9},
                        {64, 64, 24, 8}, {3, 1000, 2, 128}, {129, 7, 1, 3},
                        // past one query block of 256 rows, and two with a remainder
                        {257, 33, 2, 7}, {600, 19, 1, 4}};

template <class T>
void expect_matches(double exact_tol, double old_tol) {
  for (auto [nq, nk, heads, d] : kShapes) {
    SCOPED_TRACE(testing::Message() << "nq " << nq << " nk " << nk << " heads " << heads << " d " << d);
    auto q = random<T>("q", {nq, heads, d}), k = random<T>("k", {nk, heads, d}), v = random<T>("v", {nk, heads, d});
    const double scale = 1.0 / std::sqrt(double(d));
    auto o = ref::attention(q, k, v, scale);
    auto want = exact(q, k, v, scale);
    auto old = per_head_copies(q, k, v, scale);
    ASSERT_EQ(o.shape, q.shape);
    double worst_exact = 0, worst_old = 0;
    for (std::size_t i = 0; i < o.size(); ++i) {
      worst_exact = std::max(worst_exact, double(std::fabs(o.data[i] - want[i])));
      worst_old = std::max(worst_old, double(std::fabs(o.data[i] - old.data[i])));
    }
    // Outputs are convex combinations of v (|v| <= 2): absolute errors.
    EXPECT_LT(worst_exact, exact_tol);
    EXPECT_LT(worst_old, old_tol);
  }
}

TEST(AttentionKernel, Float64MatchesExactAndThePerHeadKernel) { expect_matches<double>(1e-13, 1e-13); }

TEST(AttentionKernel, Float32MatchesExactAndThePerHeadKernel) { expect_matches<float>(2e-5, 2e-5); }

TEST(AttentionKernel, ANaNInputMakesItsRowsNaNAndNoOthers) {
  for (bool in_k : {false, true}) {
    auto q = random<float>("q", {9, 3, 5}), k = random<float>("k", {11, 3, 5}), v = random<float>("v", {11, 3, 5});
    // Query token 4, head 1; or key token 6, head 1 (every query's row of head 1).
    (in_k ? k : q).data[((in_k ? 6 : 4) * 3 + 1) * 5 + 2] = std::numeric_limits<float>::quiet_NaN();
    auto o = ref::attention(q, k, v, 0.4);
    for (std::size_t i = 0; i < 9; ++i)
      for (std::size_t h = 0; h < 3; ++h)
        for (std::size_t c = 0; c < 5; ++c) {
          const bool poisoned = h == 1 && (in_k || i == 4);
          EXPECT_EQ(std::isnan(o.data[(i * 3 + h) * 5 + c]), poisoned) << "token " << i << " head " << h;
        }
  }
}

template <class T>
void expect_vectorised_matches_portable() {
  if (!ref::exp_rows_vectorised_available()) GTEST_SKIP() << "no AVX2+FMA on this CPU";
  for (std::size_t cols : {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33, 4608}) {
    SCOPED_TRACE(testing::Message() << "cols " << cols);
    const std::size_t rows = 3;
    auto x = random<T>("s", {rows, cols});
    x.data[0] = T(-80);  // exp underflows towards 0 for double, to 0 for float
    auto a = x, b = x;
    std::vector<double> sa(rows), sb(rows);
    ref::exp_rows_avx2(a.ptr(), rows, cols, 1.7, sa.data());
    ref::exp_rows_portable(b.ptr(), rows, cols, 1.7, sb.data());
    const double ulp = std::numeric_limits<T>::epsilon();
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_LE(std::fabs(double(a.data[i]) - double(b.data[i])), 4 * ulp * std::max(1.0, double(b.data[i])))
          << "element " << i;
      ASSERT_LE(a.data[i], T(1));
    }
    for (std::size_t r = 0; r < rows; ++r) {
      EXPECT_NEAR(sa[r], sb[r], 4 * ulp * cols);
      // The row's maximum became exp(0) = 1: the sum is at least 1.
      EXPECT_GE(sa[r], 1.0 - 4 * ulp);
    }
  }
}

TEST(ExpRows, VectorisedMatchesPortableFloat32) { expect_vectorised_matches_portable<float>(); }
TEST(ExpRows, VectorisedMatchesPortableFloat64) { expect_vectorised_matches_portable<double>(); }

TEST(ExpRows, NaNAndInfinityReachTheSum) {
  for (bool vectorised : {false, true}) {
    if (vectorised && !ref::exp_rows_vectorised_available()) continue;
    for (std::size_t cols : {3, 8, 13}) {
      std::vector<float> s(2 * cols, 0.5f);
      s[1] = std::numeric_limits<float>::quiet_NaN();  // row 0
      s[2 * cols - 1] = std::numeric_limits<float>::infinity();  // row 1, in the tail
      std::vector<double> sums(2);
      using ExpRows = void (*)(float*, std::size_t, std::size_t, double, double*);
      const ExpRows f = vectorised ? ExpRows(ref::exp_rows_avx2) : ExpRows(ref::exp_rows_portable);
      f(s.data(), 2, cols, 1.0, sums.data());
      EXPECT_TRUE(std::isnan(sums[0])) << cols << (vectorised ? " avx2" : " portable");
      EXPECT_TRUE(std::isnan(sums[1])) << cols << (vectorised ? " avx2" : " portable");  // inf - inf
    }
  }
}

template <class T>
void expect_gelu_builds_agree() {
  if (!ref::gelu_tanh_vectorised_available()) GTEST_SKIP() << "no AVX2+FMA on this CPU";
  for (std::size_t n : {1, 3, 4, 5, 7, 8, 9, 17, 1000}) {
    SCOPED_TRACE(testing::Message() << "n " << n);
    auto x = random<T>("g", {n});
    for (std::size_t i = 0; i < n; ++i) x.data[i] *= T(4);  // into both tails of tanh
    if (n > 2) x.data[1] = T(30), x.data[2] = T(-30);      // saturated: x and 0
    std::vector<T> a(n), b(n);
    ref::gelu_tanh_values_avx2(x.ptr(), a.data(), n);
    ref::gelu_tanh_values_portable(x.ptr(), b.data(), n);
    const double eps = std::numeric_limits<T>::epsilon();
    for (std::size_t i = 0; i < n; ++i) {
      // tanh within 1 ulp in each build: at most a few ulps of the result's scale, |x|.
      ASSERT_LE(std::fabs(double(a[i]) - double(b[i])), 4 * eps * std::max(1.0, std::fabs(double(x.data[i]))))
          << "x " << x.data[i];
    }
    if (n > 2) {
      EXPECT_EQ(a[1], T(30));
      EXPECT_EQ(a[2], T(0));
    }
  }
  // NaN in, NaN out, in the vector body and in the tail.
  std::vector<T> x(11, T(0.5)), y(11);
  x[3] = x[10] = std::numeric_limits<T>::quiet_NaN();
  ref::gelu_tanh_values_avx2(x.data(), y.data(), x.size());
  EXPECT_TRUE(std::isnan(y[3]));
  EXPECT_TRUE(std::isnan(y[10]));
  EXPECT_FALSE(std::isnan(y[4]));
}

TEST(GeluTanh, VectorisedMatchesPortableFloat32) { expect_gelu_builds_agree<float>(); }
TEST(GeluTanh, VectorisedMatchesPortableFloat64) { expect_gelu_builds_agree<double>(); }

TEST(GeluTanh, PortableIsTheFormula) {
  // y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), against float64 math.
  for (double v : {-6.0, -1.5, -0.3, 0.0, 0.2, 1.0, 2.5, 7.0}) {
    double y = 0;
    ref::gelu_tanh_values_portable(&v, &y, 1);
    EXPECT_NEAR(y, 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 1e-15);
  }
}

}  // namespace
