// Splitting and trimming the short texts of attributes and options (a spec's
// entries, a stream list, a block order).
#pragma once
#include <string>
#include <vector>

namespace dc {

// The parts of `s` between separators: "a,b," gives {"a", "b", ""}; "" gives {}.
inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  std::size_t at = 0;
  for (;;) {
    const std::size_t end = s.find(sep, at);
    out.push_back(s.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) return out;
    at = end + 1;
  }
}

// `s` without leading and trailing blanks and tabs.
inline std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

}  // namespace dc
