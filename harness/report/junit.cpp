#include "harness/report/junit.h"

#include <fmt/format.h>

#include <chrono>
#include <ctime>

#include "harness/core/files.h"

namespace dc {
namespace {

// XML 1.0 text: the five escapes, and no control characters (which XML 1.0
// cannot carry at all, escaped or not) other than tab and newline.
std::string xml(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (c < 0x20 && c != '\t' && c != '\n') out += ' ';
        else out += static_cast<char>(c);
    }
  }
  return out;
}

std::string secs(double s) { return fmt::format("{:.3f}", s < 0 ? 0.0 : s); }

struct Counts {
  std::size_t tests = 0, failures = 0, errors = 0, skipped = 0;
  void add(const JUnitCase& c) {
    ++tests;
    failures += c.outcome == JUnitCase::Outcome::failure;
    errors += c.outcome == JUnitCase::Outcome::error;
    skipped += c.outcome == JUnitCase::Outcome::skipped;
  }
  std::string attrs() const {
    return fmt::format("tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\"", tests, failures, errors,
                       skipped);
  }
};

}  // namespace

std::string now_iso8601() {
  std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return buf;
}

std::string junit_xml(const std::vector<JUnitSuite>& suites) {
  Counts all;
  double total = 0;
  for (const auto& s : suites) {
    total += s.seconds;
    for (const auto& c : s.cases) all.add(c);
  }
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += fmt::format("<testsuites name=\"diffcheck\" {} time=\"{}\">\n", all.attrs(), secs(total));
  for (std::size_t i = 0; i < suites.size(); ++i) {
    const auto& s = suites[i];
    Counts n;
    for (const auto& c : s.cases) n.add(c);
    out += fmt::format("  <testsuite name=\"{}\" id=\"{}\" {} time=\"{}\" timestamp=\"{}\" hostname=\"localhost\">\n",
                       xml(s.name), i, n.attrs(), secs(s.seconds), xml(s.timestamp.empty() ? now_iso8601() : s.timestamp));
    if (!s.properties.empty()) {
      out += "    <properties>\n";
      for (const auto& [k, v] : s.properties)
        out += fmt::format("      <property name=\"{}\" value=\"{}\"/>\n", xml(k), xml(v));
      out += "    </properties>\n";
    }
    for (const auto& c : s.cases) {
      out += fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"{}\"", xml(c.classname), xml(c.name),
                         secs(c.seconds));
      if (c.outcome == JUnitCase::Outcome::pass && c.system_out.empty()) {
        out += "/>\n";
        continue;
      }
      out += ">\n";
      const std::string case_out =
          c.system_out.empty() ? "" : fmt::format("      <system-out>{}</system-out>\n", xml(c.system_out));
      if (c.outcome == JUnitCase::Outcome::pass) {
        out += case_out + "    </testcase>\n";
        continue;
      }
      const char* tag = c.outcome == JUnitCase::Outcome::failure ? "failure"
                        : c.outcome == JUnitCase::Outcome::error  ? "error"
                                                                  : "skipped";
      if (c.outcome == JUnitCase::Outcome::skipped)
        out += fmt::format("      <skipped message=\"{}\"/>\n", xml(c.message));
      else
        out += fmt::format("      <{} message=\"{}\" type=\"{}\">{}</{}>\n", tag, xml(c.message), xml(c.type),
                           xml(c.text), tag);
      out += case_out + "    </testcase>\n";
    }
    if (!s.system_out.empty()) out += fmt::format("    <system-out>{}</system-out>\n", xml(s.system_out));
    out += "  </testsuite>\n";
  }
  out += "</testsuites>\n";
  return out;
}

void write_junit(const std::string& path, const std::vector<JUnitSuite>& suites) {
  write_whole_file(path, junit_xml(suites), "JUnit report");
}

}  // namespace dc
