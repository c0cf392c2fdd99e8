#include "harness/cli/list.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>

#include <nlohmann/json.hpp>

#include "harness/core/error.h"
#include "harness/run/scenario.h"

namespace dc::cli {

int list_scenarios_json() {
  nlohmann::json all = nlohmann::json::array();
  for (const auto* s : dc::all_scenarios()) {
    nlohmann::json j{{"name", s->name()}, {"summary", s->summary()}, {"sizes", s->sizes()}};
    j["flags"] = nlohmann::json::array();
    for (const auto& f : s->flags())
      j["flags"].push_back({{"name", f.name}, {"type", dc::flag_type_name(f.type)},
                            {"default", f.default_value}, {"help", f.help},
                            {"matrix_values", dc::matrix_values(f)}});
    j["faults"] = nlohmann::json::array();
    for (const auto& f : s->faults())
      j["faults"].push_back({{"name", f.name}, {"help", f.help}, {"first_tap", f.first_tap},
                             {"needs_flags", f.needs_flags},
                             {"takes_effect_when", f.takes_effect_when.empty() ? "always" : f.takes_effect_when},
                             {"crashes_when", f.crashes_when}, {"may_hang", f.may_hang},
                             {"scalable", !f.scale_help.empty()}, {"fault_scale", f.scale_help},
                             {"first_tap_across_meshes",
                              f.first_tap_across_meshes.empty() ? f.first_tap : f.first_tap_across_meshes}});
    j["default_mesh"] = nlohmann::json::object();
    for (int n : {1, 2, 4, 8, 16}) {
      try {
        j["default_mesh"][std::to_string(n)] = s->default_mesh(n);
      } catch (const dc::Error&) {
      }
    }
    all.push_back(j);
  }
  std::cout << all.dump(2) << "\n";
  return dc::kExitPass;
}

int list_scenarios() {
  for (const auto* s : dc::all_scenarios()) {
    std::cout << fmt::format("{}\n  {}\n", s->name(), s->summary());
    std::string meshes;
    for (int n : {1, 2, 4, 8, 16}) {
      try {
        meshes += fmt::format("    {:>2} ranks: {}\n", n, s->default_mesh(n));
      } catch (const dc::Error&) {
      }
    }
    std::cout << "  default meshes:\n" << meshes;
    std::string sizes;
    for (const auto& z : s->sizes()) sizes += (sizes.empty() ? "" : ", ") + z;
    std::cout << "  sizes: " << sizes << "\n  flags:\n";
    if (s->flags().empty()) std::cout << "    (none)\n";
    for (const auto& f : s->flags())
      std::cout << fmt::format("    {} ({}, default {}): {}\n", f.name, dc::flag_type_name(f.type),
                               f.default_value, f.help);
    std::cout << "  faults (--inject):\n";
    for (const auto& f : s->faults()) {
      std::cout << fmt::format("    {}: {}\n      first divergent tap '{}'", f.name, f.help, f.first_tap);
      if (!f.takes_effect_when.empty()) std::cout << fmt::format(" when {}", f.takes_effect_when);
      if (!f.first_tap_across_meshes.empty())
        std::cout << fmt::format(" (across meshes, with no reference: '{}')", f.first_tap_across_meshes);
      if (!f.crashes_when.empty()) std::cout << fmt::format("; a crash when {}", f.crashes_when);
      if (f.may_hang) std::cout << " (or, ranks having taken different paths, a HANG or DESYNC finding)";
      if (!f.needs_flags.empty()) std::cout << fmt::format("; needs --flag {}", fmt::join(f.needs_flags, " --flag "));
      std::cout << "\n";
      if (!f.scale_help.empty()) std::cout << fmt::format("      --fault-scale A: {}\n", f.scale_help);
    }
    std::cout << "\n";
  }
  return dc::kExitPass;
}

}  // namespace dc::cli
