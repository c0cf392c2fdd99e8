// Noise-floor calibration of a scenario (docs/tolerances.md, "Calibrated"):
// the scenario run on one device — one rank, every mesh axis 1, the
// accumulation order a single device uses — in the run's dtype, R times: run
// 0 as it is, runs 1..R-1 with every generated input and weight moved by one
// rounding of the dtype (core/perturbation.h); each compared with the float64
// reference, which is never perturbed. A tap's floor is the worst of its R
// comparisons (check/noise_floor.h).
//
// The runs are spread over the ranks like references are (run j on rank
// j mod world), each rank on its own; the floors are then shared by all.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "harness/capture/reference_cache.h"
#include "harness/check/noise_floor.h"
#include "harness/core/comm.h"
#include "harness/core/dtype.h"
#include "harness/core/flags.h"
#include "harness/core/pipeline_options.h"

namespace dc {

class Scenario;

inline constexpr int kDefaultCalibrationRuns = 8;

struct NoiseFloorRequest {
  const Scenario* scenario = nullptr;
  DType dtype = DType::float32;
  std::uint64_t seed = 0;
  std::string size = "default";
  FlagValues flags;
  PipelineOptions pipeline;
  int runs = kDefaultCalibrationRuns;
  // Floors measured before for the same request (and build) are read from
  // here instead (capture/reference_cache.h); disabled by default.
  ReferenceCacheSettings cache;
};

// The one-device mesh the floors are measured on.
std::string calibration_mesh(const Scenario& s, const std::string& size);

// Collective over `world`: every rank returns the same floors. `from_cache`
// (if given) says whether they were read from the cache.
Floors measure_noise_floors(const Comm& world, const NoiseFloorRequest& r, bool* from_cache = nullptr);

// The provenance of floors measured for `r`.
CalibrationInfo calibration_info(const NoiseFloorRequest& r);

struct CalibrateOptions {
  std::string scenario;
  std::string dtype = "float32";
  std::uint64_t seed = 1234;
  std::string size = "default";
  std::vector<std::string> flags;
  PipelineOptions pipeline;
  int runs = kDefaultCalibrationRuns;
  std::string out;  // the tolerance file
  ReferenceCacheSettings cache;
};

// `diffcheck calibrate` (collective over MPI_COMM_WORLD): measures the floors,
// writes the file on rank 0 and prints its table. Returns 0; throws
// InputError for bad options.
int calibrate_scenario(const CalibrateOptions& opts);

}  // namespace dc
