// Three or more runs of one computation and no reference: which run is
// wrong. From each pair's first divergent tap (run against run,
// check/against.h) it finds, tap by tap in order, the largest group of runs
// that all agree so far: the consensus, when it holds more than half of the
// runs. A run leaves the consensus at the first tap where it is not in it:
// "tp=4 disagrees with dp=2,tp=2 and sp=4 from tap attn.out (#6)". Two runs,
// or an even split, have no consensus: the runs part at the tap, and the
// report says so rather than guessing.
#pragma once
#include <cstddef>
#include <optional>
#include <vector>

namespace dc {

// Runs `a` and `b` (a < b) agree on every tap before `first_divergence` (an
// index into the taps' order; none: on every tap).
struct PairVerdict {
  std::size_t a = 0, b = 0;
  std::optional<std::size_t> first_divergence;
};

struct RunStanding {
  std::optional<std::size_t> leaves_at;     // the tap where it leaves the consensus; none: it stays
  std::vector<std::size_t> disagrees_with;  // there: the consensus runs it disagrees with
};

struct Consensus {
  std::vector<RunStanding> runs;            // per run
  std::optional<std::size_t> first_split;   // the first tap where any two runs part
  bool undecided = false;                   // at some split no group held more than half of the runs
  std::vector<std::vector<std::size_t>> groups_at_undecided;  // then: the groups that agree among themselves
};

Consensus find_consensus(std::size_t runs, const std::vector<PairVerdict>& pairs);

}  // namespace dc
