// Which run leaves the consensus (check/consensus.h).
#include "harness/check/consensus.h"

#include <algorithm>
#include <map>
#include <set>

namespace dc {
namespace {

// Whether runs i and j agree on every tap up to and including `tap`.
class Agreement {
 public:
  explicit Agreement(const std::vector<PairVerdict>& pairs) {
    for (const auto& p : pairs) first_[{std::min(p.a, p.b), std::max(p.a, p.b)}] = p.first_divergence;
  }
  bool through(std::size_t i, std::size_t j, std::size_t tap) const {
    if (i == j) return true;
    auto it = first_.find({std::min(i, j), std::max(i, j)});
    return it == first_.end() || !it->second || *it->second > tap;
  }
  // The largest groups of `among` that all agree through `tap` (maximum
  // cliques; runs are few, so every subset is tried, largest first).
  std::vector<std::vector<std::size_t>> largest_groups(const std::vector<std::size_t>& among, std::size_t tap) const {
    std::vector<std::vector<std::size_t>> best;
    const std::size_t n = among.size();
    for (std::size_t size = n; size >= 1 && best.empty(); --size)
      for (unsigned mask = 0; mask < (1u << n); ++mask) {
        if (static_cast<std::size_t>(__builtin_popcount(mask)) != size) continue;
        std::vector<std::size_t> g;
        for (std::size_t k = 0; k < n; ++k)
          if (mask >> k & 1u) g.push_back(among[k]);
        bool all = true;
        for (std::size_t x = 0; x < g.size() && all; ++x)
          for (std::size_t y = x + 1; y < g.size() && all; ++y) all = through(g[x], g[y], tap);
        if (all) best.push_back(g);
      }
    return best;
  }

 private:
  std::map<std::pair<std::size_t, std::size_t>, std::optional<std::size_t>> first_;
};

}  // namespace

Consensus find_consensus(std::size_t runs, const std::vector<PairVerdict>& pairs) {
  Consensus c;
  c.runs.resize(runs);
  const Agreement agree(pairs);
  std::set<std::size_t> splits;  // the taps where some pair parts, in order
  for (const auto& p : pairs)
    if (p.first_divergence) splits.insert(*p.first_divergence);
  if (!splits.empty()) c.first_split = *splits.begin();
  // The runs still in the consensus: a run that left it is not asked again,
  // and the rest are judged among themselves at the later taps.
  std::vector<std::size_t> staying(runs);
  for (std::size_t r = 0; r < runs; ++r) staying[r] = r;
  for (std::size_t tap : splits) {
    const auto groups = agree.largest_groups(staying, tap);
    if (groups.size() != 1 || 2 * groups.front().size() <= staying.size()) {
      c.undecided = true;
      c.groups_at_undecided = groups;
      break;  // past a split with no majority, no run can be named
    }
    const auto& consensus = groups.front();
    for (std::size_t r : staying) {
      if (std::find(consensus.begin(), consensus.end(), r) != consensus.end()) continue;
      c.runs[r].leaves_at = tap;
      for (std::size_t m : consensus)
        if (!agree.through(r, m, tap)) c.runs[r].disagrees_with.push_back(m);
    }
    staying = consensus;
  }
  return c;
}

}  // namespace dc
