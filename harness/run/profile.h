// A run's profile (--profile, and the info log): per phase its seconds (the
// slowest rank's), its GEMM work (every rank's, core/work_counter.h) and the
// rate against this machine's GEMM peak, measured on every rank at the same
// time just before the scenario (so ranks sharing cores share the peak too).
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "harness/core/comm.h"

namespace dc {

// GFLOP/s of one rank's GEMMs (float32, float64); {0, 0}: not measured.
struct GemmPeak {
  double float32 = 0, float64 = 0;
};
using MeasureGemmPeak = std::function<GemmPeak()>;

struct Phase {
  std::string name;
  double seconds = 0;
  double flops32 = 0, flops64 = 0;  // GEMM work
  double bytes = 0;                 // data written or read, for phases that move data
  std::string note;                 // e.g. "from the cache"
  bool beside = false;              // ran beside the phases after it: not in the total
};

struct RunProfile {
  std::vector<Phase> phases;  // seconds: slowest rank; work: all ranks
  GemmPeak peak;              // all ranks together
  int ranks = 1;
};

// Collective over `world`: the phases (same names, same order on every rank)
// and the peaks, combined.
RunProfile combine_profile(const Comm& world, const std::vector<Phase>& mine, const GemmPeak& peak);

// The table rank 0 prints: phase, seconds, GFLOP, GFLOP/s, fraction of peak, MB/s.
std::string profile_table(const RunProfile& p);

// Flat numbers for the JSON report's "profile": <phase>_s, <phase>_gflop,
// <phase>_gflops, <phase>_peak_fraction, <phase>_mb_per_s, peak_float32_gflops, ...
std::vector<std::pair<std::string, double>> profile_numbers(const RunProfile& p);

}  // namespace dc
