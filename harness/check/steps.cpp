#include "harness/check/steps.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>

namespace dc {

std::vector<StepSummary> summarize_steps(const CompareResult& res) {
  static const std::regex kStep(R"(^(step[0-9]+)/(.+)$)");
  std::vector<StepSummary> steps;
  std::map<std::string, std::size_t> index;
  for (const auto& t : res.taps) {
    std::smatch m;
    if (!std::regex_match(t.name, m, kStep)) continue;
    auto [it, fresh] = index.emplace(m[1].str(), steps.size());
    if (fresh) steps.push_back({m[1].str()});
    StepSummary& s = steps[it->second];
    ++s.taps;
    double worst = 0;
    for (double r : t.ranks.err_over_tol)
      if (std::isnan(r) || r > worst) worst = std::isnan(r) ? INFINITY : r;
    if (s.worst_tap.empty() || worst > s.worst_ratio) {
      s.worst_ratio = worst;
      s.worst_tap = m[2].str();
    }
    if (!t.pass() && !s.first_failing) s.first_failing = m[2].str();
  }
  return steps;
}

}  // namespace dc
