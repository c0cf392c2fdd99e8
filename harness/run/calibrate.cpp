#include "harness/run/calibrate.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <iostream>

#include "harness/capture/recorded.h"
#include "harness/core/error.h"
#include "harness/core/perturbation.h"
#include "harness/run/scenario.h"

namespace dc {
namespace {

// One calibration run on this rank alone: the scenario on the one-device
// mesh, perturbed unless `run` is 0, compared with its reference.
Floors one_run(const Comm& self, const NoiseFloorRequest& r, const Mesh& mesh, int run) {
  std::optional<InputPerturbation> perturb;
  if (run > 0) perturb = InputPerturbation{r.seed * 1000003ull + static_cast<std::uint64_t>(run), r.dtype};
  TapRecorder taps(mesh, 0, r.dtype);
  {
    const PerturbedInputs scope(perturb);
    RunContext ctx{mesh, self, taps, r.flags, "", r.dtype, r.seed, r.size, r.pipeline};
    try {
      r.scenario->run(ctx);
    } catch (const InputError&) {
      throw;
    } catch (const std::exception& e) {
      fail("calibration run {} of {} (one device, mesh {}) failed: {}", run, r.scenario->name(), mesh.str(), e.what());
    }
  }
  const RunInfo info{r.scenario->name(), r.flags.str(), dtype_name(r.dtype), r.seed, "diffcheck calibrate"};
  const ActivationSet set = recorded_activations(self, taps, info, fmt::format("calibration run {}", run));
  CompareOptions o;
  o.threads = 1;
  o.processes = &self;
  Floors floors = floors_of(compare(set, floor_measuring_options(o)));
  if (run == 0) keep_unperturbed(floors);
  return floors;
}

}  // namespace

std::string calibration_mesh(const Scenario& s, const std::string& size) {
  const Mesh mesh = s.complete_mesh(Mesh::parse(s.default_mesh(1)));
  s.check_mesh(mesh, size);
  return mesh.str();
}

Floors measure_noise_floors(const Comm& world, const NoiseFloorRequest& r, bool* from_cache) {
  if (r.runs < 1) input_error("--calibration-runs must be at least 1");
  if (from_cache) *from_cache = false;
  // The floors depend on what the runs compute, and on nothing of the sharded run's mesh.
  const ReferenceCache cache(
      r.cache, fmt::format("noise floors\nscenario {}\nsize {}\nseed {}\ndtype {}\nflags {}\nmesh {}\npipeline "
                           "steps={} reference_mode={} tap_blocks={}\nruns {}\n",
                           r.scenario->name(), r.size, r.seed, dtype_name(r.dtype), r.flags.str(),
                           calibration_mesh(*r.scenario, r.size), r.pipeline.steps, r.pipeline.reference_mode,
                           r.pipeline.tap_blocks, r.runs));
  if (r.cache.enabled()) {
    std::string found;
    if (world.rank() == 0)
      if (auto text = cache.load_text("floors.txt")) found = "hit\n" + *text;
    found = world.broadcast_string(found, 0);
    if (!found.empty()) {
      if (world.rank() == 0) spdlog::info("noise floors read from the reference cache {}", cache.entry_dir());
      if (from_cache) *from_cache = true;
      return decode_floors(found.substr(4));
    }
  }
  const Mesh one = Mesh::parse(calibration_mesh(*r.scenario, r.size));
  const Comm self = world.split(Mesh::parse(fmt::format("rank={}", world.size())), {});
  Floors mine;
  for (int run = world.rank(); run < r.runs; run += world.size()) {
    const auto t0 = std::chrono::steady_clock::now();
    merge_floors(mine, one_run(self, r, one, run));
    spdlog::info("calibration run {} of {} ({}) in {:.2f}s", run + 1, r.runs, run ? "perturbed inputs" : "as is",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  Floors all;
  for (const auto& text : world.all_gather_strings(encode_floors(mine))) merge_floors(all, decode_floors(text));
  if (r.cache.enabled() && world.rank() == 0) {
    cache.store_text("floors.txt", encode_floors(all));
    cache.evict();
  }
  return all;
}

CalibrationInfo calibration_info(const NoiseFloorRequest& r) {
  CalibrationInfo i;
  i.diffcheck = fmt::format("diffcheck {}", DIFFCHECK_VERSION);
  i.scenario = r.scenario->name();
  i.size = r.size;
  i.dtype = dtype_name(r.dtype);
  i.flags = r.flags.str();
  i.mesh = calibration_mesh(*r.scenario, r.size);
  i.steps = r.pipeline.steps;
  i.reference_mode = r.pipeline.reference_mode;
  i.seed = r.seed;
  i.runs = r.runs;
  i.method = fmt::format(
      "{} runs on one device (mesh {}) in {}, run 0 as is, runs 1..{} with every generated input and weight moved "
      "one ulp of {}; each tap's floor the worst over the runs of its error against the float64 reference; "
      "floor_rel_l2_as_is is run 0's, which a run on seed {} with these flags takes as its own (rel L2 limit at "
      "most {} x it)",
      r.runs, i.mesh, i.dtype, r.runs - 1, i.dtype, r.seed, i.k_same_inputs);
  return i;
}

int calibrate_scenario(const CalibrateOptions& opts) {
  Comm world = Comm::world();
  const Scenario* s = find_scenario(opts.scenario);
  if (!s) input_error("unknown scenario '{}' (see 'diffcheck list')", opts.scenario);
  if (opts.out.empty()) input_error("calibrate: give the tolerance file to write with -o FILE");
  check_size_and_pipeline(*s, opts.size, opts.pipeline);
  NoiseFloorRequest r{s, parse_dtype(opts.dtype), opts.seed, opts.size,
                      FlagValues::resolve(s->flags(), opts.flags, s->name()), opts.pipeline, opts.runs, opts.cache};
  if (world.rank() == 0)
    spdlog::info("calibrating {} ({} {}, flags [{}]): {} one-device runs over {} ranks", s->name(), opts.size,
                 opts.dtype, r.flags.str(), opts.runs, world.size());
  const Floors floors = measure_noise_floors(world, r);
  if (world.rank() != 0) return kExitPass;
  const ToleranceFile file{calibration_info(r), floors};
  write_tolerance_file(opts.out, file);
  std::size_t w = 4;
  for (const auto& [name, f] : floors) w = std::max(w, name.size());
  std::cout << fmt::format("Noise floors of {} ({} {}, {} runs on mesh {}), tolerance = k x floor + u_acc with k = {} "
                           "(element), {} (rel L2):\n",
                           s->name(), opts.size, opts.dtype, opts.runs, file.info.mesh, file.info.k_element,
                           file.info.k_norm);
  std::cout << fmt::format("  {:<{}}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}  {:>14}  {:>12}  {:>14}\n", "tap", w,
                           "floor elem", "rtol", "floor rel L2", "rel L2 limit", "run 0 rel L2",
                           fmt::format("limit, seed {}", opts.seed), "column mean", "its limit, seed");
  for (const auto& [name, f] : floors) {
    const auto m = tolerance_from_floor(f, file.info.k_element, file.info.k_norm);
    const auto same = tolerance_from_floor(f, file.info.k_element, file.info.k_norm, file.info.k_same_inputs);
    const double column_limit =
        same.column_mean_limit_own_inputs ? *same.column_mean_limit_own_inputs : same.column_mean_limit.value_or(NAN);
    std::cout << fmt::format("  {:<{}}  {:>12.3e}  {:>12.3e}  {:>12.3e}  {:>12.3e}  {:>12.3e}  {:>14.3e}  {:>12.3e}  {:>14.3e}\n",
                             name, w, f.element, m.rtol, f.rel_l2, m.rel_l2_limit, f.rel_l2_as_is.value_or(NAN),
                             same.rel_l2_limit_own_inputs.value_or(same.rel_l2_limit), f.column_mean.value_or(NAN),
                             column_limit);
  }
  std::cout << fmt::format("A run on seed {} with these flags holds rel L2 to at most {} x run 0's (unperturbed) "
                           "error; one on another seed to the rel L2 limit.\n",
                           opts.seed, file.info.k_same_inputs);
  std::cout << fmt::format("wrote {} ({} taps)\n", opts.out, floors.size());
  return kExitPass;
}

}  // namespace dc
