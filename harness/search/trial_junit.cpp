#include "harness/search/trial_junit.h"

namespace dc {

JUnitCase junit_case(Verdict v, const std::string& detail) {
  JUnitCase c;
  switch (v) {
    case Verdict::pass: return c;
    case Verdict::fail: c.outcome = JUnitCase::Outcome::failure; break;
    case Verdict::interrupted: c.outcome = JUnitCase::Outcome::skipped; break;
    default: c.outcome = JUnitCase::Outcome::error; break;
  }
  c.type = verdict_name(v);
  const auto eol = detail.find('\n');
  c.message = verdict_name(v) + (detail.empty() ? "" : ": " + detail.substr(0, eol));
  c.text = detail;
  return c;
}

}  // namespace dc
