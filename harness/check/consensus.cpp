// Which run leaves the consensus (check/consensus.h).
#include "harness/check/consensus.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <stdexcept>
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
  // The largest groups of `among` that all agree through `tap`: the maximum
  // cliques of the agreement graph, by Bron-Kerbosch with Tomita's pivot on
  // 64-bit sets. Its time is bounded by the number of maximal cliques, at
  // most 3^(n/3) (Moon-Moser): about 10^5 at 32 runs, where trying every
  // subset (as this did) took 2^32 steps and its 32-bit mask overflowed.
  std::vector<std::vector<std::size_t>> largest_groups(const std::vector<std::size_t>& among, std::size_t tap) const {
    const std::size_t n = among.size();
    if (n > 64) throw std::invalid_argument("consensus: more than 64 runs");
    std::vector<std::uint64_t> neighbours(n, 0);
    for (std::size_t x = 0; x < n; ++x)
      for (std::size_t y = 0; y < n; ++y)
        if (x != y && through(among[x], among[y], tap)) neighbours[x] |= bit(y);
    std::vector<std::uint64_t> best;
    std::size_t best_size = 0;
    const std::uint64_t all = n == 64 ? ~std::uint64_t{0} : (bit(n) - 1);
    expand(0, all, 0, neighbours, best, best_size);
    std::vector<std::vector<std::size_t>> groups;
    for (std::uint64_t clique : best) {
      std::vector<std::size_t> g;
      for (std::size_t k = 0; k < n; ++k)
        if (clique & bit(k)) g.push_back(among[k]);
      groups.push_back(std::move(g));
    }
    std::sort(groups.begin(), groups.end());
    return groups;
  }

 private:
  static std::uint64_t bit(std::size_t k) { return std::uint64_t{1} << k; }

  // Every maximal clique containing R, extended from P and not from X; the
  // largest kept.
  static void expand(std::uint64_t r, std::uint64_t p, std::uint64_t x, const std::vector<std::uint64_t>& nb,
                     std::vector<std::uint64_t>& best, std::size_t& best_size) {
    if (!p && !x) {
      const auto size = static_cast<std::size_t>(std::popcount(r));
      if (size > best_size) best.clear(), best_size = size;
      if (size == best_size) best.push_back(r);
      return;
    }
    if (static_cast<std::size_t>(std::popcount(r) + std::popcount(p)) < best_size) return;  // cannot reach the best
    std::uint64_t pivot_nb = 0;  // the pivot with the most neighbours in P: its neighbours need no branch of their own
    int most = -1;
    for (std::uint64_t u = p | x; u; u &= u - 1) {
      const auto k = static_cast<std::size_t>(std::countr_zero(u));
      if (const int c = std::popcount(p & nb[k]); c > most) most = c, pivot_nb = nb[k];
    }
    for (std::uint64_t cand = p & ~pivot_nb; cand; cand &= cand - 1) {
      const auto k = static_cast<std::size_t>(std::countr_zero(cand));
      expand(r | bit(k), p & nb[k], x & nb[k], nb, best, best_size);
      p &= ~bit(k);
      x |= bit(k);
    }
  }

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
