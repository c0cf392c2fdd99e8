#include "harness/run/scenario.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "harness/core/error.h"

namespace dc {
namespace {
std::map<std::string, std::unique_ptr<Scenario>>& registry() {
  static std::map<std::string, std::unique_ptr<Scenario>> r;
  return r;
}
}  // namespace

std::vector<std::string> Scenario::mesh_axes() const {
  std::vector<std::string> names;
  const Mesh mesh = Mesh::parse(default_mesh(1));
  for (const auto& a : mesh.axes()) names.push_back(a.name);
  return names;
}

Mesh Scenario::complete_mesh(const Mesh& given) const {
  const auto axes = mesh_axes();
  std::vector<Axis> out;
  std::size_t next = 0;  // given axes must appear in the scenario's order
  for (const auto& name : axes) {
    const int i = given.axis_index(name);
    if (i < 0) {
      out.push_back({name, 1});
      continue;
    }
    if (static_cast<std::size_t>(i) != next) return given;
    ++next;
    out.push_back(given.axes()[static_cast<std::size_t>(i)]);
  }
  if (next != given.axes().size()) return given;  // an axis the scenario does not have
  return Mesh(out);
}

std::pair<int, int> default_two_axis_split(int world) {
  const int inner = world % 4 == 0 ? 4 : world % 2 == 0 ? 2 : 1;
  return {world / inner, inner};
}

void check_size_and_pipeline(const Scenario& s, const std::string& size, const PipelineOptions& p) {
  std::string known;
  bool found = false;
  for (const auto& z : s.sizes()) {
    found = found || z == size;
    known += (known.empty() ? "" : ", ") + z;
  }
  if (!found) input_error("unknown size '{}' for scenario '{}'; its sizes are: {}", size, s.name(), known);
  p.validate();
  if (!p.is_default() && !s.is_pipeline())
    input_error("--steps, --reference-mode and --tap-blocks are for pipeline scenarios (a denoising loop, e.g. "
                "flux_pipeline); {} runs one block", s.name());
}

bool register_scenario(std::unique_ptr<Scenario> s) {
  auto name = s->name();
  if (!registry().emplace(name, std::move(s)).second) {
    // Static initialisation: no logger or exception handler can be relied on yet.
    std::fprintf(stderr, "diffcheck: scenario '%s' registered twice\n", name.c_str());
    std::exit(2);
  }
  return true;
}

const Scenario* find_scenario(const std::string& name) {
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second.get();
}

std::vector<const Scenario*> all_scenarios() {
  std::vector<const Scenario*> out;
  for (const auto& [k, v] : registry()) out.push_back(v.get());
  return out;
}

}  // namespace dc
