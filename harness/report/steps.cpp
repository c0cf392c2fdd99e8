#include "harness/report/steps.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>

namespace dc {

std::optional<StepName> split_step(const std::string& tap) {
  static const std::regex kStep(R"(^(step[0-9]+)/(.+)$)");
  std::smatch m;
  if (!std::regex_match(tap, m, kStep)) return std::nullopt;
  return StepName{m[1].str(), m[2].str()};
}

double worst_err_over_tol(const TapVerdict& t) {
  double worst = -1;
  for (double r : t.ranks.err_over_tol)
    if (std::isnan(r) || r > worst) worst = std::isnan(r) ? INFINITY : r;
  // The whole tensor's limits (rel L2, column mean) are no rank's cell.
  if (t.reference.present && worst >= 0) {
    const double m = t.reference.margin();
    if (std::isnan(m) || m > worst) worst = std::isnan(m) ? INFINITY : m;
  }
  return worst;
}

std::vector<StepSummary> summarize_steps(const CompareResult& res) {
  std::vector<StepSummary> steps;
  std::map<std::string, std::size_t> index;
  for (const auto& t : res.taps) {
    const auto name = split_step(t.name);
    if (!name) continue;
    auto [it, fresh] = index.emplace(name->step, steps.size());
    if (fresh) steps.push_back({name->step});
    StepSummary& s = steps[it->second];
    ++s.taps;
    const double worst = std::max(0.0, worst_err_over_tol(t));
    if (s.worst_tap.empty() || worst > s.worst_ratio) {
      s.worst_ratio = worst;
      s.worst_tap = name->rest;
    }
    if (!t.pass() && !s.first_failing) s.first_failing = name->rest;
  }
  return steps;
}

}  // namespace dc
