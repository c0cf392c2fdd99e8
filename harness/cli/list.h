// `diffcheck list`: the scenarios with their flags, faults and default
// meshes, as text or as JSON for scripts (sweeps, margins).
#pragma once

namespace dc::cli {

int list_scenarios();
int list_scenarios_json();

}  // namespace dc::cli
