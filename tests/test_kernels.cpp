// Block kernels against plain loops, and the FLUX block against PyTorch.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "harness/capture/store.h"
#include "reference/attention.h"
#include "reference/flash_attention.h"
#include "scenarios/ulysses_attention.h"
#include "harness/core/error.h"
#include "reference/flux_block.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "reference/norms.h"
#include "reference/ops.h"
#include "reference/rope.h"

using namespace dc;

namespace {
RefTensor rnd(const std::string& name, Shape s) { return ref::to_ref(ref::generate(3, name, s, 1.0f)); }
}  // namespace

TEST(Norms, LayerNormAndRmsNorm) {
  auto x = rnd("x", {3, 5});
  auto ln = ref::layer_norm(x, 1e-6);
  RefTensor wgt({5}, std::vector<double>{1, 2, 3, 4, 5});
  auto rms = ref::rms_norm(x, wgt, 1e-6);
  for (int r = 0; r < 3; ++r) {
    double mean = 0, var = 0, ms = 0;
    for (int i = 0; i < 5; ++i) mean += x.data[r * 5 + i] / 5;
    for (int i = 0; i < 5; ++i) var += std::pow(x.data[r * 5 + i] - mean, 2) / 5;
    for (int i = 0; i < 5; ++i) ms += std::pow(x.data[r * 5 + i], 2) / 5;
    for (int i = 0; i < 5; ++i) {
      EXPECT_NEAR(ln.data[r * 5 + i], (x.data[r * 5 + i] - mean) / std::sqrt(var + 1e-6), 1e-12);
      EXPECT_NEAR(rms.data[r * 5 + i], x.data[r * 5 + i] / std::sqrt(ms + 1e-6) * (i + 1), 1e-12);
    }
  }
}

TEST(Rope, RotatesInterleavedPairsByPositionTimesTheta) {
  auto t = ref::rope_table({{0, 0, 0}, {0, 2, 3}}, {2, 2, 4});
  auto x = rnd("x", {2, 1, 8});
  auto y = ref::apply_rope(x, t);
  // token 0 at the origin is unchanged
  for (int j = 0; j < 8; ++j) EXPECT_NEAR(y.data[j], x.data[j], 1e-15);
  // token 1, pair 3 belongs to axis 2 (dim 4), k = 1: angle = 3 * 10000^(-2/4)
  double ang = 3 * std::pow(10000.0, -0.5);
  double a = x.data[8 + 6], b = x.data[8 + 7];
  EXPECT_NEAR(y.data[8 + 6], a * std::cos(ang) - b * std::sin(ang), 1e-12);
  EXPECT_NEAR(y.data[8 + 7], b * std::cos(ang) + a * std::sin(ang), 1e-12);
  // pair 0 is axis 0 (position 0): unchanged
  EXPECT_NEAR(y.data[8], x.data[8], 1e-15);
}

TEST(Attention, MatchesLoops) {
  const int n = 5, m = 7, heads = 2, D = 3;
  auto q = rnd("q", {n, heads, D}), k = rnd("k", {m, heads, D}), v = rnd("v", {m, heads, D});
  auto o = ref::attention(q, k, v, 0.5);
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < n; ++i) {
      std::vector<double> s(m);
      double mx = -1e300, sum = 0;
      for (int j = 0; j < m; ++j) {
        for (int c = 0; c < D; ++c) s[j] += 0.5 * q.data[(i * heads + h) * D + c] * k.data[(j * heads + h) * D + c];
        mx = std::max(mx, s[j]);
      }
      for (int j = 0; j < m; ++j) sum += s[j] = std::exp(s[j] - mx);
      for (int c = 0; c < D; ++c) {
        double acc = 0;
        for (int j = 0; j < m; ++j) acc += s[j] / sum * v.data[(j * heads + h) * D + c];
        EXPECT_NEAR(o.data[(i * heads + h) * D + c], acc, 1e-12);
      }
    }
}

TEST(Ops, TakeLastConcatAndPackedColumns) {
  RefTensor x({2, 6}, std::vector<double>{0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15});
  auto y = ref::take_last(x, {{4, 6}, {0, 1}});
  EXPECT_EQ(y.data, (std::vector<double>{4, 5, 0, 14, 15, 10}));
  EXPECT_EQ(ref::concat_last(y, y).shape, (Shape{2, 6}));
  ref::FluxSizes z = ref::FluxSizes::preset("flux1-dev");
  // seeds/002: rank i needs [768i, 768(i+1)) and [3072 + 3072i, 3072 + 3072(i+1)) at W=4
  auto c = ref::proj_out_columns(z, 4, 1, false);
  EXPECT_EQ(c, (ref::ColumnRanges{{768, 1536}, {6144, 9216}}));
  EXPECT_EQ(ref::proj_out_columns(z, 4, 1, true), (ref::ColumnRanges{{3840, 7680}}));
}

TEST(FluxBlock, MatchesPyTorch) {
  const std::string path = std::string(DIFFCHECK_SOURCE_DIR) + "/tests/fixtures/flux_block_small.h5";
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  ActivationSet f = read_activations(path);
  auto get = [&](const std::string& name) {
    for (const auto& t : f.taps)
      if (t.name == name) return RefTensor(t.local_shape, read_whole_piece(f, t, 0));
    ADD_FAILURE() << "fixture has no tap " << name;
    return RefTensor();
  };
  ref::FluxSizes z{32, 4, 8, 128, 4, 3, 4, {2, 2, 4}};
  ref::FluxWeights<double> w{get("adaln.w"), get("adaln.b"), get("q.w"),      get("q.b"),
                             get("k.w"),     get("k.b"),     get("v.w"),      get("v.b"),
                             get("mlp.w"),   get("mlp.b"),   get("norm_q.w"), get("norm_k.w"),
                             get("proj_out.w"), get("proj_out.b")};
  auto h = get("hidden");
  std::function<void(RefTensor&)> exact = [](RefTensor&) {};
  auto a = ref::flux_block_forward(h, get("temb"), w, z, ref::flux_rope(z), true, exact);
  auto out = ref::gated_residual(a.partial, a.ada, h);
  auto expect_close = [&](const RefTensor& got, const std::string& name) {
    RefTensor want = get(name);
    ASSERT_EQ(got.size(), want.size()) << name;
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got.data[i], want.data[i], 1e-12) << name << " at " << i;
  };
  expect_close(a.ada, "out/adaln");
  expect_close(a.nx, "out/nx");
  expect_close(a.mlp, "out/mlp");
  expect_close(a.q, "out/q");
  expect_close(a.k, "out/k");
  expect_close(a.attn, "out/attn");
  expect_close(a.partial, "out/y");
  expect_close(out, "out/out");
}

TEST(FluxBlock, TheLeanForwardIsTheForwardWithItsWeightsGivenUpOnTheWay) {
  // flux_tp's float64 reference (float32 weights) at a small size, on all
  // tokens and on the second half with the first's k and v gathered: the
  // same bits as the forward that holds every weight. The weights before
  // attention are given up before proj_out's rows are asked for, each row once.
  ref::FluxSizes z{32, 4, 8, 128, 4, 3, 4, {2, 2, 4}};
  const auto rope = ref::flux_rope(z);
  const std::size_t n = z.tokens();
  const RefTensor h = ref::to_ref(ref::generate(5, "h", {n, z.dim}, 1.0f));
  const RefTensor temb = ref::to_ref(ref::generate(5, "t", {1, z.dim}, 1.0f));
  const std::function<void(RefTensor&)> exact = [](RefTensor&) {};
  const auto all = ref::make_flux_weights<float>(5, z, 1, 0, false, DType::float32);
  const auto full = ref::flux_block_forward(h, temb, all, z, rope, true, exact);
  for (std::size_t first : {std::size_t{0}, n / 2}) {
    SCOPED_TRACE(first);
    const RefTensor mine = ref::take_rows(h, first, n);
    // k or v of all tokens, for this part's k or v.
    const ref::GatherTokens<double> gather = [&](const RefTensor& part) {
      return ref::take_rows(full.k, first, n).data == part.data ? full.k : full.v;
    };
    const auto want = ref::flux_block_forward(mine, temb, all, z, rope, true, exact, first,
                                              first ? gather : ref::GatherTokens<double>{});
    auto w = all;
    w.out_w = Tensor();  // its rows come from out_w_rows
    std::vector<std::pair<std::size_t, std::size_t>> asked;
    bool weights_given_up = false;
    const ref::OutWeightRows<float> out_w_rows = [&](std::size_t r0, std::size_t r1) {
      asked.emplace_back(r0, r1);
      weights_given_up = w.ada_w.size() == 0 && w.q_w.size() == 0 && w.k_w.size() == 0 && w.v_w.size() == 0 &&
                         w.mlp_w.size() == 0;
      return ref::take_rows(all.out_w, r0, r1);
    };
    const auto got = ref::flux_block_forward_lean(mine, temb, std::move(w), out_w_rows, z, rope, true, exact, first,
                                                  first ? gather : ref::GatherTokens<double>{});
    // Every row once, in order (one block at this size).
    ASSERT_FALSE(asked.empty());
    for (std::size_t b = 0; b < asked.size(); ++b)
      EXPECT_EQ(asked[b].first, b ? asked[b - 1].second : 0);
    EXPECT_EQ(asked.back().second, z.dim);
    EXPECT_TRUE(weights_given_up);
    for (auto [g, e] : {std::pair{&got.ada, &want.ada}, {&got.nx, &want.nx}, {&got.q, &want.q}, {&got.k, &want.k},
                        {&got.v, &want.v}, {&got.mlp, &want.mlp}, {&got.attn, &want.attn}, {&got.cat, &want.cat},
                        {&got.partial, &want.partial}}) {
      EXPECT_EQ(g->shape, e->shape);
      EXPECT_EQ(g->data, e->data);
    }
    EXPECT_GT(want.partial.size(), 0u);
  }
  // The part before attention, asked to give up each weight after its last
  // use: the same bits, every weight it used freed, proj_out's kept.
  auto w = all;
  const auto kept = ref::flux_pre_attention(h, temb, all, z, rope, exact);
  const auto lean = ref::flux_pre_attention(h, temb, w, z, rope, exact, &w);
  EXPECT_EQ(lean.mlp.data, kept.mlp.data);
  EXPECT_EQ(lean.q.data, kept.q.data);
  EXPECT_EQ(lean.k.data, kept.k.data);
  EXPECT_EQ(lean.v.data, kept.v.data);
  for (const Tensor* t : {&w.ada_w, &w.ada_b, &w.q_w, &w.q_b, &w.k_w, &w.k_b, &w.v_w, &w.v_b, &w.mlp_w, &w.mlp_b,
                          &w.gq, &w.gk})
    EXPECT_EQ(t->size(), 0u);
  EXPECT_EQ(w.out_w.data, all.out_w.data);
  EXPECT_EQ(w.out_b.data, all.out_b.data);
}

TEST(Gelu, InPlaceForAnActivationGivenUp) {
  const RefTensor x = ref::to_ref(ref::generate(2, "g", {7, 13}, 3.0f));
  RefTensor y = x;
  const double* memory = y.ptr();
  const RefTensor in_place = ref::gelu_tanh(std::move(y));
  EXPECT_EQ(in_place.ptr(), memory);
  EXPECT_EQ(in_place.data, ref::gelu_tanh(x).data);
}

TEST(FlashAttention, MatchesExactForBlocksThatDoNotDivideTheLengths) {
  const std::size_t heads = 2, nq = 37, nk = 45, d = 8;
  auto q = rnd("fq", {heads, nq, d}), k = rnd("fk", {heads, nk, d}), v = rnd("fv", {heads, nk, d});
  // exact attention takes [N, heads, D]
  using ref::token_major;
  auto exact = ref::attention(token_major(q), token_major(k), token_major(v), 1.0);
  for (auto [bq, bk] : std::vector<std::pair<std::size_t, std::size_t>>{{64, 64}, {16, 16}, {5, 7}, {1, 45}, {37, 1}}) {
    auto f = ref::flash_attention(q, k, v, bq, bk);
    auto ft = token_major(f);
    for (std::size_t i = 0; i < ft.size(); ++i)
      ASSERT_NEAR(ft.data[i], exact.data[i], 1e-12) << "blocks " << bq << "x" << bk << " at " << i;
  }
  EXPECT_THROW(ref::flash_attention(q, k, v, 0, 4), dc::Error);
}

TEST(FlashAttention, MatchesPyTorch) {
  const std::string path = std::string(DIFFCHECK_SOURCE_DIR) + "/tests/fixtures/attention_small.h5";
  ActivationSet f = read_activations(path);
  std::map<std::string, RefTensor> t;
  for (const auto& tap : f.taps) t[tap.name] = RefTensor(tap.local_shape, read_whole_piece(f, tap, 0));
  auto out = ref::flash_attention(t["q"], t["k"], t["v"], 16, 16);
  ASSERT_EQ(out.shape, t["out"].shape);
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out.data[i], t["out"].data[i], 1e-12) << i;
}

TEST(Ulysses, HeadChunksFollowMaxDiffusion) {
  using C = std::vector<std::pair<std::size_t, std::size_t>>;
  auto pairs = [](const std::vector<dc::HeadChunk>& cs) {
    C out;
    for (auto c : cs) out.emplace_back(c.begin, c.end);
    return out;
  };
  EXPECT_EQ(pairs(dc::ulysses_head_chunks(40, 8, 2)), (C{{0, 16}, {16, 40}}));  // the repo's tests
  EXPECT_EQ(pairs(dc::ulysses_head_chunks(40, 8, 3)), (C{{0, 8}, {8, 16}, {16, 40}}));
  EXPECT_EQ(pairs(dc::ulysses_head_chunks(16, 4, 3)), (C{{0, 4}, {4, 8}, {8, 16}}));
  EXPECT_EQ(pairs(dc::ulysses_head_chunks(16, 4, 9)), (C{{0, 4}, {4, 8}, {8, 12}, {12, 16}}));
  EXPECT_EQ(pairs(dc::ulysses_head_chunks(16, 4, 1)), (C{{0, 16}}));
  EXPECT_THROW(dc::ulysses_head_chunks(10, 4, 1), dc::InputError);
  EXPECT_THROW(dc::ulysses_head_chunks(16, 4, 0), dc::InputError);
}
