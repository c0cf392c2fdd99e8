// A run or comparison as a JUnit suite: one test case per tap.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "harness/report/report.h"

namespace dc {

JUnitSuite junit_suite(const ActivationSet& set, const CompareResult& res, const std::string& name,
                       double seconds) {
  JUnitSuite suite;
  suite.name = name;
  suite.seconds = seconds;
  suite.properties = {{"source", set.source}, {"mesh", set.mesh.str()},
                      {"world_size", std::to_string(set.world_size)}};
  for (const auto& [k, v] : set.info) suite.properties.emplace_back(k, v);
  const auto scenario = set.info.find("scenario");
  const std::string classname =
      "diffcheck." + (scenario != set.info.end() && !scenario->second.empty() ? scenario->second : "compare");
  for (std::size_t i = 0; i < res.taps.size(); ++i) {
    const TapVerdict& t = res.taps[i];
    JUnitCase c;
    c.classname = classname;
    c.name = t.name;
    c.seconds = t.seconds;
    if (t.reference.present) c.system_out = "tolerance " + tolerance_line(t.reference);
    if (!t.pass()) {
      c.outcome = JUnitCase::Outcome::failure;
      const auto checks = t.failed_checks();
      c.type = fmt::format("{}", fmt::join(checks, ","));
      c.message = fmt::format("tap '{}' fails its {} check{}{}", t.name, c.type, checks.size() > 1 ? "s" : "",
                              res.first_divergence == i ? " (the first divergence)" : "");
      c.text = (res.first_divergence == i ? "First divergence: " : "") + describe_tap(t, i);
    } else if (t.unchecked) {
      c.outcome = JUnitCase::Outcome::skipped;
      c.message = fmt::format("tap '{}' was not checked against the reference (no reference tap of that name); "
                              "its non-finite and replica checks pass", t.name);
    }
    suite.cases.push_back(std::move(c));
  }
  return suite;
}

}  // namespace dc
