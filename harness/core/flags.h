// Flags change HOW a sharded run executes (async collectives, chunking, buffer
// reuse), never what it must compute. Each scenario declares the flags it reads;
// values come from DIFFCHECK_FLAGS and then --flag (later wins).
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "harness/core/mesh.h"

namespace dc {

enum class FlagType { boolean, integer, string };

struct FlagSpec {
  std::string name;
  FlagType type = FlagType::boolean;
  std::string default_value = "false";
  std::string help;
  // Values the nightly matrix tries (every combination with the other flags);
  // empty: false and true for a boolean, the default alone otherwise.
  std::vector<std::string> matrix_values = {};
};

// A fault reproducing a real bug, and what a run with it must show: the
// nightly matrix holds every scenario to this on every mesh.
struct FaultSpec {
  std::string name;
  std::string help;
  // The first tap that diverges wherever the fault takes effect.
  std::string first_tap;
  // Flags ("name=value") without which the fault is inert.
  std::vector<std::string> needs_flags = {};
  // The meshes it takes effect on, in words and as a test; on the others the
  // run is correct. Empty: every mesh.
  std::string takes_effect_when = {};
  std::function<bool(const Mesh&)> takes_effect_on = {};
  // Where the fault crashes the code under test instead (a CRASH finding,
  // exit 1), in words and as a test of the mesh and size preset.
  std::string crashes_when = {};
  std::function<bool(const Mesh&, const std::string& size)> crashes_on = {};
  // Ranks take different paths (e.g. some skip collectives the others enter):
  // depending on the mesh and the data the run ends as a HANG or DESYNC
  // finding (exit 1, named by the watchdog or the collective fingerprints)
  // instead of a divergence at first_tap. Either is what it must show.
  bool may_hang = false;
  // A fault of continuous size: what --fault-scale A does to it (A = 1 the
  // fault as named, A = 0 none). Empty: not scalable.
  std::string scale_help = {};
  // Where runs on different meshes first part (sweep-mesh --no-reference),
  // when not at first_tap: first_tap depends on the mesh (per_mesh) and is
  // not compared across meshes. Empty: first_tap.
  std::string first_tap_across_meshes = {};
  // first_tap when it depends on the mesh (the first block of a pipeline's
  // stage 1 moves with pp); empty: first_tap on every mesh.
  std::function<std::string(const Mesh&)> first_tap_on = {};

  bool takes_effect(const Mesh& m) const { return !takes_effect_on || takes_effect_on(m); }
};

// The values the nightly matrix tries for one flag.
std::vector<std::string> matrix_values(const FlagSpec& f);

class FlagValues {
 public:
  // `assignments` are "name=value" (or bare "name" for a boolean true), applied
  // in order. Throws InputError for unknown flags (listing the known ones) and
  // for values of the wrong type.
  static FlagValues resolve(const std::vector<FlagSpec>& specs,
                            const std::vector<std::string>& assignments,
                            const std::string& scenario);

  bool get_bool(const std::string& name) const;
  long get_int(const std::string& name) const;
  const std::string& get_string(const std::string& name) const;

  // Every flag in effect, "name=value" separated by spaces (the `flags` root attribute).
  std::string str() const;

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, FlagType> types_;
  const std::string& raw(const std::string& name) const;
};

// DIFFCHECK_FLAGS holds assignments separated by spaces or commas.
std::vector<std::string> split_flag_list(const std::string& text);
std::string flag_type_name(FlagType t);

}  // namespace dc
