// Ring attention over the whole world (ring degree = ranks): each rank's
// merged output and LSE equal exact float64 attention of its query block over
// every rank's key/value block, for every schedule and merge form; the K/V
// transfers (p2p ring steps, all-gather) give bitwise equal results; the
// injected buffer reuse changes them.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "harness/core/comm.h"
#include "reference/generate.h"
#include "reference/nn.h"
#include "scenarios/ring_attention.h"
#include "tests/mpi_world.h"

using namespace dc;

namespace {
constexpr std::size_t kHeads = 2, kBlock = 6, kDim = 8;

// Rank r's block of a [heads, n*kBlock, D] tensor.
Tensor block_of(const char* name, std::size_t r, std::size_t n, float scale) {
  return ref::generate(3, name, {kHeads, n * kBlock, kDim}, scale, {{0, kHeads}, {r * kBlock, (r + 1) * kBlock}, {0, kDim}});
}
}  // namespace

TEST(RingAttention, EveryScheduleEqualsExactAttention) {
  const std::size_t n = static_cast<std::size_t>(world().size()), me = static_cast<std::size_t>(world().rank());
  const Tensor q = block_of("q", me, n, 1.0f), k = block_of("k", me, n, 0.5f), v = block_of("v", me, n, 1.0f);
  const RefTensor all_k = ref::to_ref(ref::generate(3, "k", {kHeads, n * kBlock, kDim}, 0.5f));
  const RefTensor all_v = ref::to_ref(ref::generate(3, "v", {kHeads, n * kBlock, kDim}, 1.0f));
  auto [exact, exact_lse] = block_attention(ref::to_ref(q), all_k, all_v);
  std::vector<float> p2p_out;
  for (bool overlap : {false, true})
    for (bool allgather : {false, true})
      for (bool sigmoid : {true, false}) {
        RingOptions o;
        o.overlap = overlap, o.allgather = allgather, o.sigmoid_merge = sigmoid;
        std::size_t steps = 0;
        auto [out, lse] = ring_attention(world(), q, k, v, o, [&](std::size_t t, const Tensor&, const Tensor&) {
          EXPECT_EQ(t, steps++);
        });
        const std::string what = fmt::format("overlap {} allgather {} sigmoid {}", overlap, allgather, sigmoid);
        EXPECT_EQ(steps, n) << what;
        for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out.data[i], exact.data[i], 2e-6) << what << " " << i;
        for (std::size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse.data[i], exact_lse.data[i], 2e-6) << what << " " << i;
        if (sigmoid && !allgather) p2p_out = out.data;
        if (sigmoid && allgather) {
          EXPECT_EQ(out.data, p2p_out) << "p2p and all-gather differ: " << what;
        }
      }
}

TEST(RingAttention, KvReuseFaultChangesTheResultOnlyWithOverlap) {
  const std::size_t n = static_cast<std::size_t>(world().size()), me = static_cast<std::size_t>(world().rank());
  const Tensor q = block_of("q", me, n, 1.0f), k = block_of("k", me, n, 0.5f), v = block_of("v", me, n, 1.0f);
  RingOptions clean, faulty;
  faulty.fault_kv_reuse = true;
  const auto base = ring_attention(world(), q, k, v, clean, {}).first;
  EXPECT_EQ(ring_attention(world(), q, k, v, faulty, {}).first.data, base.data);  // no overlap: inert
  clean.overlap = faulty.overlap = true;
  const auto good = ring_attention(world(), q, k, v, clean, {}).first;
  const auto bad = ring_attention(world(), q, k, v, faulty, {}).first;
  if (n == 1) {
    EXPECT_EQ(bad.data, good.data);  // nothing in flight on a ring of one
  } else {
    double worst = 0;
    for (std::size_t i = 0; i < bad.size(); ++i) {
      ASSERT_TRUE(std::isfinite(bad.data[i]));
      worst = std::max(worst, double(std::abs(bad.data[i] - good.data[i])));
    }
    EXPECT_GT(worst, 1e-2);
  }
}
