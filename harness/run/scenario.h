// Subsystem run (harness/run/, library diffcheck_run), on check, capture and
// core. Owns the scenario interface and registry (here) and the run driver
// (run.h): run the sharded block on the mesh, write the run file, check it
// and report. The built-in scenarios (scenarios/) are written against it.
//
// A scenario runs one model block sharded over the mesh and records its taps
// (and, on the reference rank, the single-rank reference of each). Scenarios
// speak in tensors, taps and collectives: they never call MPI or HDF5.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "harness/core/comm.h"
#include "harness/core/dtype.h"
#include "harness/core/flags.h"
#include "harness/core/mesh.h"
#include "harness/core/pipeline_options.h"
#include "harness/capture/tap.h"

namespace dc {

struct RunContext {
  const Mesh& mesh;
  const Comm& world;
  TapRecorder& taps;
  const FlagValues& flags;
  std::string fault;  // empty: no fault injected
  DType dtype = DType::float32;
  std::uint64_t seed = 0;
  std::string size = "default";
  PipelineOptions pipeline;
  // --fault-scale: the size of a fault of continuous size (FaultSpec::scale_help).
  double fault_scale = 1.0;

  bool injected(const std::string& name) const { return fault == name; }
};

class Scenario {
 public:
  virtual ~Scenario() = default;
  virtual std::string name() const = 0;
  virtual std::string summary() const = 0;
  virtual std::vector<FlagSpec> flags() const { return {}; }
  virtual std::vector<FaultSpec> faults() const { return {}; }
  virtual std::vector<std::string> sizes() const { return {"default"}; }
  // A denoising loop: takes --steps and --reference-mode.
  virtual bool is_pipeline() const { return false; }
  // The names of the mesh axes, in order (sweep-mesh assigns sizes to them).
  virtual std::vector<std::string> mesh_axes() const;
  // The mesh used when --mesh is not given; throws InputError when the scenario
  // cannot run on `world` ranks.
  virtual std::string default_mesh(int world) const = 0;
  // Throws InputError when `mesh` (already matching the world size) does not fit.
  virtual void check_mesh(const Mesh& mesh, const std::string& size) const = 0;
  virtual void run(RunContext& ctx) const = 0;
  // Whether a run with these flags may take its references from the
  // reference cache: the scenario's reference code is skipped then
  // (TapRecorder::references_cached), so the references must depend on
  // nothing the sharded run computes, and any value of them the sharded run
  // needs must be kept with them (TapRecorder::keep_reference_value).
  virtual bool reference_cacheable(const FlagValues&) const { return true; }

  // --mesh naming only some of the axes means size 1 for the others: with
  // axes dp,tp, "tp=4" is dp=1,tp=4. Axes it does not know, or given out of
  // the scenario's order, are left for check_mesh to judge.
  Mesh complete_mesh(const Mesh& given) const;
};

// The default split of `world` ranks into (outer, inner) for two-axis
// scenarios: inner gets 4 ranks when it can, else 2, else 1.
std::pair<int, int> default_two_axis_split(int world);

// Throws InputError unless `size` is one of the scenario's sizes and the
// pipeline options (--steps, --reference-mode, --tap-blocks) fit it (valid,
// and left at their defaults for a scenario that is not a denoising loop).
void check_size_and_pipeline(const Scenario& s, const std::string& size, const PipelineOptions& p);

// The registry refuses duplicate names, so two scenarios cannot shadow each other.
bool register_scenario(std::unique_ptr<Scenario> s);
const Scenario* find_scenario(const std::string& name);
std::vector<const Scenario*> all_scenarios();  // sorted by name

}  // namespace dc

#define DIFFCHECK_REGISTER_SCENARIO(Class) \
  namespace {                              \
  const bool registered_##Class = ::dc::register_scenario(std::make_unique<Class>()); \
  }
