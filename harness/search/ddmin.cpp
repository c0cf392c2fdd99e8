#include "harness/search/ddmin.h"

#include <algorithm>
#include <map>

namespace dc {

std::string verdict_name(Verdict v) {
  switch (v) {
    case Verdict::pass: return "pass";
    case Verdict::fail: return "FAIL";
    case Verdict::crashed: return "crashed";
    case Verdict::timed_out: return "timed out";
    case Verdict::flaky: return "FLAKY";
    case Verdict::interrupted: return "interrupted";
    default: return "error";
  }
}

namespace {

struct Flaky {};

class Search {
 public:
  Search(const FlagSet& all, const Predicate& test) : all_(all), test_(test) {}

  Verdict ask(const FlagSet& subset) {
    FlagSet key = subset;
    std::sort(key.begin(), key.end());
    auto it = seen_.find(key);
    if (it != seen_.end()) return it->second;
    Verdict v = test_(subset);
    seen_[key] = v;
    result.trials.emplace_back(subset, v);
    if (v == Verdict::flaky) {
      result.flaky_set = subset;
      throw Flaky{};
    }
    return v;
  }

  // Keeps the candidates' original order in every subset.
  FlagSet ordered(const FlagSet& s) const {
    FlagSet out;
    for (const auto& f : all_)
      if (std::find(s.begin(), s.end(), f) != s.end()) out.push_back(f);
    return out;
  }

  FlagSet run() {
    FlagSet c = all_;
    std::size_t n = 2;
    while (c.size() >= 2) {
      std::vector<FlagSet> parts(n);
      for (std::size_t i = 0; i < c.size(); ++i) parts[i * n / c.size()].push_back(c[i]);
      bool reduced = false;
      for (const auto& p : parts)
        if (!p.empty() && ask(p) == Verdict::fail) {
          c = p;
          n = 2;
          reduced = true;
          break;
        }
      // With two parts the complements are the parts themselves: skip them.
      if (!reduced && n > 2) {
        for (const auto& p : parts) {
          FlagSet rest;
          for (const auto& f : c)
            if (std::find(p.begin(), p.end(), f) == p.end()) rest.push_back(f);
          if (!rest.empty() && ask(rest) == Verdict::fail) {
            c = rest;
            n = std::max<std::size_t>(n - 1, 2);
            reduced = true;
            break;
          }
        }
      }
      if (!reduced) {
        if (n >= c.size()) break;
        n = std::min(c.size(), 2 * n);
      }
    }
    return ordered(c);
  }

  DdminResult result;

 private:
  FlagSet all_;
  const Predicate& test_;
  std::map<FlagSet, Verdict> seen_;
};

}  // namespace

DdminResult ddmin(const FlagSet& candidates, const Predicate& test) {
  Search s(candidates, test);
  try {
    s.result.baseline = s.ask({});
    if (s.result.baseline != Verdict::pass) {
      s.result.status = DdminResult::Status::baseline_not_passing;
      return s.result;
    }
    s.result.full_set = s.ask(candidates);
    if (s.result.full_set != Verdict::fail) {
      s.result.status = s.result.full_set == Verdict::pass ? DdminResult::Status::full_set_passes
                                                           : DdminResult::Status::full_set_not_failing;
      return s.result;
    }
    s.result.minimal = s.run();
    s.result.status = DdminResult::Status::found;
  } catch (const Flaky&) {
    s.result.status = DdminResult::Status::flaky;
  }
  return s.result;
}

Predicate repeated(Predicate test, int k) {
  return [test, k](const FlagSet& subset) {
    Verdict first = test(subset);
    for (int i = 1; i < k && first != Verdict::interrupted; ++i) {
      Verdict v = test(subset);
      if (v == Verdict::interrupted) return v;
      if (v != first) return Verdict::flaky;  // pass/fail, or a crash now and then
    }
    return first;
  };
}

}  // namespace dc
