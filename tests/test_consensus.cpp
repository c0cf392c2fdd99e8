// Which of several runs leaves the consensus, from the pairs' first
// divergent taps (check/consensus.h).
#include <gtest/gtest.h>

#include "harness/check/consensus.h"

#include <algorithm>

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

// Runs in groups that agree within and part across at `tap`.
std::vector<PairVerdict> grouped(const std::vector<std::size_t>& group_of, std::size_t tap) {
  std::vector<PairVerdict> pairs;
  for (std::size_t a = 0; a < group_of.size(); ++a)
    for (std::size_t b = a + 1; b < group_of.size(); ++b)
      pairs.push_back({a, b, group_of[a] == group_of[b] ? std::optional<std::size_t>() : tap});
  return pairs;
}

TEST(Consensus, ThirtyTwoRunsWithAClearMajority) {
  // 17 agreeing runs against 15 that agree among themselves: the 17 are the
  // consensus (every subset was tried before, and a 32-bit mask overflowed
  // here: "the runs part into ;", no group at all).
  std::vector<std::size_t> group_of(32, 0);
  for (std::size_t r = 1; r < 31; r += 2) group_of[r] = 1;  // the odd runs but 31: 15
  const auto in0 = std::count(group_of.begin(), group_of.end(), 0u);
  ASSERT_EQ(in0, 17u);
  const Consensus c = find_consensus(32, grouped(group_of, 7));
  EXPECT_FALSE(c.undecided);
  for (std::size_t r = 0; r < 32; ++r) {
    SCOPED_TRACE(r);
    EXPECT_EQ(c.runs[r].leaves_at.has_value(), group_of[r] == 1);
    if (group_of[r] == 1) {
      EXPECT_EQ(c.runs[r].leaves_at, 7u);
      EXPECT_EQ(c.runs[r].disagrees_with.size(), 17u);
    }
  }
}

TEST(Consensus, ThirtyTwoRunsSplitEvenlyOrInThreeAreUndecided) {
  std::vector<std::size_t> halves(32), thirds(32);
  for (std::size_t r = 0; r < 32; ++r) halves[r] = r % 2, thirds[r] = r % 3;
  const Consensus even = find_consensus(32, grouped(halves, 3));
  EXPECT_TRUE(even.undecided);
  ASSERT_EQ(even.groups_at_undecided.size(), 2u);
  EXPECT_EQ(even.groups_at_undecided[0].size(), 16u);
  EXPECT_EQ(even.groups_at_undecided[0].front(), 0u);
  EXPECT_EQ(even.groups_at_undecided[1].front(), 1u);
  const Consensus three = find_consensus(32, grouped(thirds, 3));
  EXPECT_TRUE(three.undecided);  // 11 + 11 + 10: no group holds more than half
  ASSERT_EQ(three.groups_at_undecided.size(), 2u);  // the largest groups: the two of 11
  EXPECT_EQ(three.groups_at_undecided[0].size(), 11u);
  for (const auto& r : three.runs) EXPECT_FALSE(r.leaves_at);
}

TEST(Consensus, ThirtyTwoRunsWhereAgreementIsNotTransitive) {
  // Each run agrees with its neighbours in a ring and with runs 0-19 all
  // agreeing among themselves: the largest group is runs 0-19 (20 > 16).
  std::vector<PairVerdict> pairs;
  for (std::size_t a = 0; a < 32; ++a)
    for (std::size_t b = a + 1; b < 32; ++b) {
      const bool agree = (a < 20 && b < 20) || b == a + 1 || (a == 0 && b == 31);
      pairs.push_back({a, b, agree ? std::optional<std::size_t>() : 2});
    }
  const Consensus c = find_consensus(32, pairs);
  EXPECT_FALSE(c.undecided);
  for (std::size_t r = 0; r < 32; ++r) EXPECT_EQ(c.runs[r].leaves_at.has_value(), r >= 20) << r;
}

}  // namespace
