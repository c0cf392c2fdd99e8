// Which of several runs leaves the consensus, from the pairs' first
// divergent taps (check/consensus.h).
#include <gtest/gtest.h>

#include "harness/check/consensus.h"

namespace {

using namespace dc;
using Taps = std::vector<std::size_t>;

TEST(Consensus, TwoRunsThatPartHaveNoConsensus) {
  const Consensus c = find_consensus(2, {{0, 1, 3}});
  EXPECT_EQ(c.first_split, 3u);
  EXPECT_TRUE(c.undecided);
  EXPECT_EQ(c.groups_at_undecided.size(), 2u);
  EXPECT_FALSE(c.runs[0].leaves_at);
  EXPECT_FALSE(c.runs[1].leaves_at);
}

TEST(Consensus, AgreeingRunsLeaveNothing) {
  const Consensus c = find_consensus(3, {{0, 1, {}}, {0, 2, {}}, {1, 2, {}}});
  EXPECT_FALSE(c.first_split);
  EXPECT_FALSE(c.undecided);
  for (const auto& r : c.runs) EXPECT_FALSE(r.leaves_at);
}

TEST(Consensus, TheOddRunOutOfThreeIsNamedAtItsFirstTap) {
  for (std::size_t odd = 0; odd < 3; ++odd) {
    std::vector<PairVerdict> pairs;
    for (std::size_t a = 0; a < 3; ++a)
      for (std::size_t b = a + 1; b < 3; ++b)
        pairs.push_back({a, b, a == odd || b == odd ? std::optional<std::size_t>(5) : std::nullopt});
    const Consensus c = find_consensus(3, pairs);
    SCOPED_TRACE(odd);
    EXPECT_FALSE(c.undecided);
    EXPECT_EQ(c.first_split, 5u);
    for (std::size_t r = 0; r < 3; ++r) {
      EXPECT_EQ(c.runs[r].leaves_at.has_value(), r == odd);
    }
    Taps others;
    for (std::size_t r = 0; r < 3; ++r)
      if (r != odd) others.push_back(r);
    EXPECT_EQ(c.runs[odd].disagrees_with, others);
  }
}

TEST(Consensus, OfFourRunsOneLeavesThenAnotherAmongTheRest) {
  // Run 3 parts from everyone at tap 2; run 1 from runs 0 and 2 at tap 6.
  const Consensus c = find_consensus(4, {{0, 1, 6}, {0, 2, {}}, {0, 3, 2}, {1, 2, 6}, {1, 3, 2}, {2, 3, 2}});
  EXPECT_FALSE(c.undecided);
  EXPECT_EQ(c.runs[3].leaves_at, 2u);
  EXPECT_EQ(c.runs[3].disagrees_with, (Taps{0, 1, 2}));
  EXPECT_EQ(c.runs[1].leaves_at, 6u);
  EXPECT_EQ(c.runs[1].disagrees_with, (Taps{0, 2}));
  EXPECT_FALSE(c.runs[0].leaves_at);
  EXPECT_FALSE(c.runs[2].leaves_at);
}

TEST(Consensus, AnEvenSplitIsUndecidedNotGuessed) {
  // {0, 1} against {2, 3} from tap 4.
  const Consensus c = find_consensus(4, {{0, 1, {}}, {0, 2, 4}, {0, 3, 4}, {1, 2, 4}, {1, 3, 4}, {2, 3, {}}});
  EXPECT_TRUE(c.undecided);
  EXPECT_EQ(c.groups_at_undecided, (std::vector<Taps>{{0, 1}, {2, 3}}));
  for (const auto& r : c.runs) EXPECT_FALSE(r.leaves_at);
}

TEST(Consensus, ThreeRunsAllApartAreUndecided) {
  const Consensus c = find_consensus(3, {{0, 1, 1}, {0, 2, 1}, {1, 2, 1}});
  EXPECT_TRUE(c.undecided);
  EXPECT_EQ(c.groups_at_undecided.size(), 3u);
}

}  // namespace
