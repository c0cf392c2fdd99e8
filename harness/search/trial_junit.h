// A trial's verdict as a JUnit test case (bisect, sweep, sweep-mesh): a wrong
// answer is a <failure>; a crash, time-out, error or flaky trial is an
// <error> (no answer to judge); an interrupted one is <skipped>.
#pragma once
#include <string>

#include "harness/report/junit.h"
#include "harness/search/ddmin.h"

namespace dc {

JUnitCase junit_case(Verdict v, const std::string& detail);

}  // namespace dc
