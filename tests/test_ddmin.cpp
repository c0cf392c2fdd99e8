// ddmin on synthetic predicates.
#include <gtest/gtest.h>

#include <algorithm>

#include "harness/search/ddmin.h"
#include "harness/search/flag_search.h"

using namespace dc;

namespace {
bool has(const FlagSet& s, const std::string& f) { return std::find(s.begin(), s.end(), f) != s.end(); }
FlagSet flags(int n) {
  FlagSet f;
  for (int i = 0; i < n; ++i) f.push_back("f" + std::to_string(i));
  return f;
}
Predicate fails_with(FlagSet culprits, FlagSet baseline = {}) {
  return [=](const FlagSet& subset) {
    FlagSet all = baseline;
    all.insert(all.end(), subset.begin(), subset.end());
    for (const auto& c : culprits)
      if (!has(all, c)) return Verdict::pass;
    return Verdict::fail;
  };
}
}  // namespace

TEST(Ddmin, OneCulprit) {
  auto r = ddmin(flags(8), fails_with({"f5"}));
  EXPECT_EQ(r.status, DdminResult::Status::found);
  EXPECT_EQ(r.minimal, FlagSet{"f5"});
}

TEST(Ddmin, PairThatFailsOnlyTogether) {
  for (int n : {2, 5, 8, 16}) {
    auto r = ddmin(flags(n), fails_with({"f0", "f" + std::to_string(n - 1)}));
    EXPECT_EQ(r.minimal, (FlagSet{"f0", "f" + std::to_string(n - 1)})) << n;
    if (n >= 5) {
      EXPECT_LT(r.trials.size(), std::size_t(1) << n) << n;
    }
  }
}

TEST(Ddmin, Triple) {
  auto r = ddmin(flags(12), fails_with({"f1", "f6", "f10"}));
  EXPECT_EQ(r.minimal, (FlagSet{"f1", "f6", "f10"}));
}

TEST(Ddmin, CulpritThatNeedsABaselineFlag) {
  // Fails only when f3 meets the baseline's "megacore": the baseline is always
  // applied, so the minimal set beyond it is {f3}.
  auto r = ddmin(flags(6), fails_with({"f3", "megacore"}, {"megacore"}));
  EXPECT_EQ(r.minimal, FlagSet{"f3"});
  auto without = ddmin(flags(6), fails_with({"f3", "megacore"}));
  EXPECT_EQ(without.status, DdminResult::Status::full_set_passes);
}

TEST(Ddmin, BaselineThatFailsAndNothingToFind) {
  EXPECT_EQ(ddmin(flags(3), [](const FlagSet&) { return Verdict::fail; }).status,
            DdminResult::Status::baseline_not_passing);
  EXPECT_EQ(ddmin(flags(3), [](const FlagSet&) { return Verdict::pass; }).status,
            DdminResult::Status::full_set_passes);
}

// A full set (or baseline) that crashes, hangs or errors is not "passing":
// the search stops and says which, instead of reporting nothing to find.
TEST(Ddmin, FullSetOrBaselineThatDoesNotRunIsNamed) {
  for (Verdict v : {Verdict::crashed, Verdict::timed_out, Verdict::error}) {
    auto r = ddmin(flags(3), [&](const FlagSet& s) { return s.size() == 3 ? v : Verdict::pass; });
    EXPECT_EQ(r.status, DdminResult::Status::full_set_not_failing) << verdict_name(v);
    EXPECT_EQ(r.full_set, v);
    auto b = ddmin(flags(3), [&](const FlagSet& s) { return s.empty() ? v : Verdict::fail; });
    EXPECT_EQ(b.status, DdminResult::Status::baseline_not_passing) << verdict_name(v);
    EXPECT_EQ(b.baseline, v);
  }
}

TEST(Ddmin, CrashesAndTimeoutsAreNotFailures) {
  auto base = fails_with({"f0", "f1"});
  auto r = ddmin(flags(4), [&](const FlagSet& s) {
    if (has(s, "f2") && !has(s, "f0")) return Verdict::timed_out;
    return base(s);
  });
  EXPECT_EQ(r.minimal, (FlagSet{"f0", "f1"}));
}

TEST(Ddmin, FlakyPredicateIsReportedNotBisected) {
  int calls = 0;
  Predicate coin = [&](const FlagSet& s) {
    ++calls;
    if (s.empty()) return Verdict::pass;
    return calls % 2 ? Verdict::fail : Verdict::pass;
  };
  auto r = ddmin(flags(4), repeated(coin, 3));
  EXPECT_EQ(r.status, DdminResult::Status::flaky);
  EXPECT_EQ(r.flaky_set, flags(4));
  // A deterministic predicate stays deterministic under repetition.
  EXPECT_EQ(ddmin(flags(4), repeated(fails_with({"f2"}), 3)).minimal, FlagSet{"f2"});
}

TEST(Sweep, AllSubsetsStartWithTheBaseline) {
  auto p = all_subsets({"a", "b", "c"});
  ASSERT_EQ(p.size(), 8u);
  EXPECT_EQ(p[0].name, "baseline");
  EXPECT_TRUE(p[0].flags.empty());
  EXPECT_EQ(p.back().flags, (FlagSet{"a", "b", "c"}));
}
