// JUnit XML, the format CI dashboards read (Jenkins, GitLab, GitHub Actions
// reporters): a <testsuites> root, one <testsuite> per run, one <testcase>
// per thing checked — a tap (run, compare), a mesh (sweep-mesh), a profile
// (sweep), a trial (bisect). Every command with --junit builds these structs;
// this file only writes them.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dc {

struct JUnitCase {
  std::string classname;  // e.g. "diffcheck.flux_tp"
  std::string name;       // e.g. the tap
  double seconds = 0;
  // A wrong answer is a <failure>; the tool or the code under test unable
  // to give one (crash, time-out, input error) is an <error>.
  enum class Outcome { pass, failure, error, skipped } outcome = Outcome::pass;
  std::string type;     // the failure's kind, e.g. "reference" or "crashed"
  std::string message;  // one line
  std::string text;     // the full explanation (first-divergence paragraph)
  std::string system_out;  // e.g. where the tap's tolerance came from
};

struct JUnitSuite {
  std::string name;
  double seconds = 0;
  std::string timestamp;  // ISO 8601, filled by now_iso8601() if empty
  std::vector<std::pair<std::string, std::string>> properties;
  std::vector<JUnitCase> cases;
  std::string system_out;  // e.g. the console report
};

// Writes FILE whole or not at all (a temporary renamed into place). Throws
// Error naming the file when it cannot.
void write_junit(const std::string& path, const std::vector<JUnitSuite>& suites);

std::string junit_xml(const std::vector<JUnitSuite>& suites);
std::string now_iso8601();

}  // namespace dc
