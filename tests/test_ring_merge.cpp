// The log-sum-exp merge of ring attention: against PyTorch (float64, both
// merge forms), against exact attention over every key for ring degrees 1-8
// with uneven blocks, and the two halves of a sequence merging to the whole.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <map>

#include "harness/capture/store.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "reference/ops.h"
#include "scenarios/ring_attention.h"

using namespace dc;

namespace {

// Keys [from, to) of a head-major [h, n, D] tensor.
RefTensor keys(const RefTensor& x, std::size_t from, std::size_t to) {
  const std::size_t h = x.shape[0], n = x.shape[1], d = x.shape[2];
  RefTensor y({h, to - from, d});
  for (std::size_t a = 0; a < h; ++a)
    std::copy(x.ptr() + (a * n + from) * d, x.ptr() + (a * n + to) * d, y.ptr() + a * (to - from) * d);
  return y;
}

// Merges block attention over `cuts` (block boundaries of the keys).
std::pair<RefTensor, RefTensor> merged(const RefTensor& q, const RefTensor& k, const RefTensor& v,
                                       const std::vector<std::size_t>& cuts, bool sigmoid) {
  RefTensor out, lse;
  for (std::size_t b = 0; b + 1 < cuts.size(); ++b) {
    auto [o, l] = block_attention(q, keys(k, cuts[b], cuts[b + 1]), keys(v, cuts[b], cuts[b + 1]));
    if (b == 0) {
      out = o;
      lse = ref::transpose2(l);
    } else {
      lse_merge(out, lse, o, ref::transpose2(l), sigmoid);
    }
  }
  return {out, ref::transpose2(lse)};
}

RefTensor random(const char* name, Shape s, float scale) { return ref::to_ref(ref::generate(5, name, s, scale)); }

void expect_near(const RefTensor& a, const RefTensor& b, double tol, const std::string& what) {
  ASSERT_EQ(a.shape, b.shape) << what;
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a.data[i], b.data[i], tol) << what << " at " << i;
}

}  // namespace

TEST(RingMerge, MatchesPyTorch) {
  ActivationSet f = read_activations(std::string(DIFFCHECK_SOURCE_DIR) + "/tests/fixtures/ring_merge_small.h5");
  std::map<std::string, RefTensor> t;
  for (const auto& tap : f.taps) t[tap.name] = RefTensor(tap.local_shape, read_whole_piece(f, tap, 0));
  for (bool sigmoid : {true, false}) {
    RefTensor out, lse;
    for (int b = 0; b < 3; ++b) {
      auto [o, l] = block_attention(t["q"], t[fmt::format("k{}", b)], t[fmt::format("v{}", b)]);
      expect_near(o, t[fmt::format("out{}", b)], 1e-12, "block output");
      expect_near(l, t[fmt::format("lse{}", b)], 1e-12, "block LSE");
      if (b == 0) out = o, lse = ref::transpose2(l);
      else lse_merge(out, lse, o, ref::transpose2(l), sigmoid);
    }
    const std::string form = sigmoid ? "sigmoid" : "maxexp";
    expect_near(out, t["merged_" + form], 1e-12, "merged " + form);
    expect_near(ref::transpose2(lse), t["lse_" + form], 1e-12, "LSE " + form);
    expect_near(out, t["exact"], 1e-12, "merged vs exact " + form);
    expect_near(ref::transpose2(lse), t["lse_exact"], 1e-12, "LSE vs exact " + form);
  }
}

TEST(RingMerge, RingDegreesAndUnevenBlocksEqualExactAttention) {
  const std::size_t h = 3, sq = 7, d = 8, n = 45;
  const RefTensor q = random("q", {h, sq, d}, 1.0f), k = random("k", {h, n, d}, 0.5f), v = random("v", {h, n, d}, 1.0f);
  auto [exact, exact_lse] = block_attention(q, k, v);
  for (std::size_t ring : {1, 2, 4, 8}) {
    std::vector<std::size_t> even, uneven{0};
    for (std::size_t b = 0; b <= ring; ++b) even.push_back(b * n / ring);
    for (std::size_t b = 1; b < ring; ++b) uneven.push_back(uneven.back() + 1 + b % 3);  // 2, 3, 1, 2, ...
    uneven.push_back(n);
    for (const auto& cuts : {even, uneven})
      for (bool sigmoid : {true, false}) {
        auto [out, lse] = merged(q, k, v, cuts, sigmoid);
        const std::string what = fmt::format("ring {} {} {}", ring, cuts == even ? "even" : "uneven", sigmoid ? "sigmoid" : "maxexp");
        expect_near(out, exact, 1e-13, what);
        expect_near(lse, exact_lse, 1e-13, what);
      }
  }
}

TEST(RingMerge, TwoHalvesMergeToTheWhole) {
  const RefTensor q = random("q2", {2, 5, 4}, 1.0f), k = random("k2", {2, 10, 4}, 1.0f), v = random("v2", {2, 10, 4}, 1.0f);
  auto [whole, whole_lse] = block_attention(q, k, v);
  auto [out, lse] = merged(q, k, v, {0, 5, 10}, true);
  expect_near(out, whole, 1e-14, "halves");
  expect_near(lse, whole_lse, 1e-14, "halves LSE");
  // An LSE lowered by the same constant in every block cancels in the merge
  // (only the LSE itself shows it); lse_offset's offset differs per block.
  auto [o0, l0] = block_attention(q, keys(k, 0, 5), keys(v, 0, 5));
  auto [o1, l1] = block_attention(q, keys(k, 5, 10), keys(v, 5, 10));
  for (auto* l : {&l0, &l1})
    for (auto& x : l->data) x -= 0.75;
  RefTensor m = o0, ml = ref::transpose2(l0);
  lse_merge(m, ml, o1, ref::transpose2(l1), true);
  expect_near(m, whole, 1e-14, "a shared offset cancels");
  for (auto& x : l1.data) x -= 0.5;  // a different offset per block does not
  m = o0, ml = ref::transpose2(l0);
  lse_merge(m, ml, o1, ref::transpose2(l1), true);
  double worst = 0;
  for (std::size_t i = 0; i < m.size(); ++i) worst = std::max(worst, std::abs(m.data[i] - whole.data[i]));
  EXPECT_GT(worst, 1e-2);
}

namespace {

// The per-element loop the GEMM kernel replaced, kept as the oracle: float64
// dot products, max, exp, weighted sums, for each head and query.
std::pair<RefTensor, RefTensor> loop_attention(const RefTensor& q, const RefTensor& k, const RefTensor& v) {
  const std::size_t h = q.shape[0], sq = q.shape[1], d = q.shape[2], sk = k.shape[1];
  RefTensor out({h, sq, d}), lse({h, sq});
  for (std::size_t a = 0; a < h; ++a)
    for (std::size_t i = 0; i < sq; ++i) {
      std::vector<double> s(sk), o(d, 0.0);
      double m = -INFINITY, l = 0;
      for (std::size_t j = 0; j < sk; ++j) {
        for (std::size_t x = 0; x < d; ++x) s[j] += q.data[(a * sq + i) * d + x] * k.data[(a * sk + j) * d + x];
        m = std::max(m, s[j]);
      }
      for (std::size_t j = 0; j < sk; ++j) {
        const double p = std::exp(s[j] - m);
        l += p;
        for (std::size_t x = 0; x < d; ++x) o[x] += p * v.data[(a * sk + j) * d + x];
      }
      for (std::size_t x = 0; x < d; ++x) out.data[(a * sq + i) * d + x] = o[x] / l;
      lse.data[a * sq + i] = m + std::log(l);
    }
  return {out, lse};
}

}  // namespace

TEST(BlockAttention, GemmKernelMatchesTheLoopAtAwkwardShapes) {
  // One head, one query, one key; odd sizes; more queries than a row block (64).
  const std::vector<std::array<std::size_t, 4>> shapes{{1, 1, 1, 1}, {1, 3, 5, 7}, {3, 67, 5, 9}, {2, 130, 33, 16}};
  for (const auto& [h, sq, sk, d] : shapes) {
    SCOPED_TRACE(testing::Message() << "h " << h << " sq " << sq << " sk " << sk << " d " << d);
    const Tensor q = ref::generate(9, "q", {h, sq, d}, 1.0f), k = ref::generate(9, "k", {h, sk, d}, 0.5f),
                 v = ref::generate(9, "v", {h, sk, d}, 1.0f);
    const auto [want, want_lse] = loop_attention(ref::to_ref(q), ref::to_ref(k), ref::to_ref(v));
    // float64: the same numbers up to the order of the sums.
    const auto [o64, l64] = block_attention(ref::to_ref(q), ref::to_ref(k), ref::to_ref(v));
    expect_near(o64, want, 1e-13, "float64 output");
    expect_near(l64, want_lse, 1e-13, "float64 LSE");
    // float32 inputs, computed in float64 and rounded once: within one float32 rounding.
    const auto [o32, l32] = block_attention(q, k, v);
    for (std::size_t i = 0; i < o32.size(); ++i)
      ASSERT_NEAR(o32.data[i], want.data[i], 1.2e-7 * std::max(1.0, std::abs(want.data[i]))) << "output " << i;
    for (std::size_t i = 0; i < l32.size(); ++i)
      ASSERT_NEAR(l32.data[i], want_lse.data[i], 1.2e-7 * std::max(1.0, std::abs(want_lse.data[i]))) << "LSE " << i;
  }
}
