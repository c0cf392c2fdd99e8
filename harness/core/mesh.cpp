#include "harness/core/mesh.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <set>
#include <sstream>

#include "harness/core/error.h"

namespace dc {

bool valid_axis_name(const std::string& s) {
  if (s.empty()) return false;
  auto head = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; };
  if (!head(s[0])) return false;
  return std::all_of(s.begin(), s.end(),
                     [&](char c) { return head(c) || std::isdigit(static_cast<unsigned char>(c)); });
}

Mesh::Mesh(std::vector<Axis> axes) : axes_(std::move(axes)) {
  std::set<std::string> seen;
  long long world = 1;
  for (const auto& a : axes_) {
    if (!valid_axis_name(a.name)) input_error("mesh axis name '{}' is not an identifier", a.name);
    if (a.size < 1) input_error("mesh axis '{}' has size {} (must be >= 1)", a.name, a.size);
    if (!seen.insert(a.name).second) input_error("mesh axis '{}' appears twice", a.name);
    // Ranks are MPI ints; a product beyond that is no mesh any job can have
    // (and would overflow every rank computation).
    world *= a.size;
    if (world > std::numeric_limits<int>::max())
      input_error("mesh has more than {} ranks (the product of the axis sizes)",
                  std::numeric_limits<int>::max());
  }
}

Mesh Mesh::parse(const std::string& text) {
  if (text.empty()) input_error("empty mesh string (expected e.g. 'dp=2,tp=4')");
  std::vector<Axis> axes;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    auto eq = part.find('=');
    if (eq == std::string::npos)
      input_error("mesh '{}': entry '{}' is not name=size", text, part);
    Axis a{part.substr(0, eq), 0};
    std::string num = part.substr(eq + 1);
    if (num.empty() || !std::all_of(num.begin(), num.end(), ::isdigit) || num.size() > 9)
      input_error("mesh '{}': size '{}' of axis '{}' is not a positive integer", text, num, a.name);
    a.size = std::stoi(num);
    axes.push_back(a);
  }
  try {
    return Mesh(std::move(axes));
  } catch (const InputError& e) {
    input_error("mesh '{}': {}", text, e.what());
  }
}

int Mesh::world_size() const {
  int n = 1;
  for (const auto& a : axes_) n *= a.size;
  return n;
}

std::string Mesh::str() const {
  std::string s;
  for (const auto& a : axes_) s += fmt::format("{}{}={}", s.empty() ? "" : ",", a.name, a.size);
  return s;
}

int Mesh::axis_index(const std::string& name) const {
  for (std::size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].name == name) return static_cast<int>(i);
  return -1;
}

int Mesh::axis_size(const std::string& name) const {
  int i = axis_index(name);
  if (i < 0) input_error("mesh {} has no axis '{}'", str(), name);
  return axes_[i].size;
}

std::vector<int> Mesh::coords(int rank) const {
  std::vector<int> c(axes_.size(), 0);
  for (std::size_t i = axes_.size(); i-- > 0;) {
    c[i] = rank % axes_[i].size;
    rank /= axes_[i].size;
  }
  return c;
}

int Mesh::rank_of(const std::vector<int>& c) const {
  int r = 0;
  for (std::size_t i = 0; i < axes_.size(); ++i) r = r * axes_[i].size + c[i];
  return r;
}

std::vector<int> Mesh::group(int rank, const std::vector<std::string>& group_axes) const {
  // Walk only the group's own coordinates (an odometer over its axes, last
  // axis fastest, which is rank order): O(group size), not O(world).
  std::vector<bool> in_group(axes_.size(), false);
  for (const auto& n : group_axes) {
    int i = axis_index(n);
    if (i < 0) input_error("mesh {} has no axis '{}'", str(), n);
    in_group[static_cast<std::size_t>(i)] = true;
  }
  auto c = coords(rank);
  for (std::size_t i = 0; i < axes_.size(); ++i)
    if (in_group[i]) c[i] = 0;
  std::vector<int> members;
  while (true) {
    members.push_back(rank_of(c));
    std::size_t i = axes_.size();
    while (i-- > 0) {
      if (!in_group[i]) continue;
      if (++c[i] < axes_[i].size) break;
      c[i] = 0;
    }
    if (i == static_cast<std::size_t>(-1)) break;
  }
  return members;
}

int Mesh::index_in(int rank, const std::vector<std::string>& group_axes) const {
  auto c = coords(rank);
  int idx = 0;
  for (const auto& n : group_axes) {
    int i = axis_index(n);
    if (i < 0) input_error("mesh {} has no axis '{}'", str(), n);
    idx = idx * axes_[i].size + c[i];
  }
  return idx;
}

void Mesh::require_world(int world) const {
  if (world_size() != world)
    input_error("mesh {} has {} ranks but the job has {} (the product of the axis sizes must "
                "equal the number of MPI ranks)",
                str(), world_size(), world);
}

std::string rank_ranges(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    s += (s.empty() ? "" : ",") + (j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
    i = j + 1;
  }
  return s;
}

}  // namespace dc
