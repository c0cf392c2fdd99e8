#include "harness/run/profile.h"

#include <fmt/format.h>

#include <algorithm>

namespace dc {
namespace {

// The peak a phase's work is held against: float64 when it is mostly float64.
double peak_for(const Phase& ph, const GemmPeak& peak) {
  const double flops = ph.flops32 + ph.flops64;
  if (flops <= 0) return 0;
  // Time-weighted mix: each precision's share of the work at its own peak.
  if (peak.float32 <= 0 || peak.float64 <= 0) return 0;
  const double ideal_s = ph.flops32 / (peak.float32 * 1e9) + ph.flops64 / (peak.float64 * 1e9);
  return flops / ideal_s / 1e9;
}

}  // namespace

RunProfile combine_profile(const Comm& world, const std::vector<Phase>& mine, const GemmPeak& peak) {
  RunProfile p;
  p.ranks = world.size();
  for (const auto& ph : mine) {
    Phase all = ph;
    all.seconds = world.max_double(ph.seconds);
    std::vector<double> work{ph.flops32, ph.flops64, ph.bytes};
    world.all_reduce_sum(std::span<double>(work));
    all.flops32 = work[0], all.flops64 = work[1], all.bytes = work[2];
    p.phases.push_back(std::move(all));
  }
  std::vector<double> pk{peak.float32, peak.float64};
  world.all_reduce_sum(std::span<double>(pk));
  p.peak = {pk[0], pk[1]};
  return p;
}

std::string profile_table(const RunProfile& p) {
  std::string out = fmt::format("\nProfile ({} ranks; seconds: the slowest rank; work: all ranks)\n", p.ranks);
  out += fmt::format("  {:<12} {:>9} {:>10} {:>9} {:>8} {:>9}  {}\n", "phase", "seconds", "GEMM GFLOP", "GFLOP/s",
                     "of peak", "MB/s", "");
  double total = 0;
  for (const auto& ph : p.phases) {
    if (!ph.beside) total += ph.seconds;
    const double flops = ph.flops32 + ph.flops64;
    const double pk = peak_for(ph, p.peak);
    const double rate = ph.seconds > 0 ? flops / ph.seconds / 1e9 : 0;
    out += fmt::format("  {:<12} {:>9.3f} {:>10} {:>9} {:>8} {:>9}  {}\n", ph.name, ph.seconds,
                       flops > 0 ? fmt::format("{:.1f}", flops / 1e9) : "-", flops > 0 ? fmt::format("{:.1f}", rate) : "-",
                       flops > 0 && pk > 0 ? fmt::format("{:.0f}%", 100 * rate / pk) : "-",
                       ph.bytes > 0 && ph.seconds > 0 ? fmt::format("{:.0f}", ph.bytes / ph.seconds / 1e6) : "-", ph.note);
  }
  out += fmt::format("  {:<12} {:>9.3f}\n", "total", total);
  if (p.peak.float32 > 0)
    out += fmt::format("  GEMM peak of these {} ranks together, measured just before the run: float32 {:.1f} GFLOP/s, "
                       "float64 {:.1f} GFLOP/s\n",
                       p.ranks, p.peak.float32, p.peak.float64);
  return out;
}

std::vector<std::pair<std::string, double>> profile_numbers(const RunProfile& p) {
  std::vector<std::pair<std::string, double>> v;
  for (const auto& ph : p.phases) {
    const double flops = ph.flops32 + ph.flops64;
    v.emplace_back(ph.name + "_s", ph.seconds);
    if (flops > 0) {
      v.emplace_back(ph.name + "_gflop", flops / 1e9);
      if (ph.seconds > 0) v.emplace_back(ph.name + "_gflops", flops / ph.seconds / 1e9);
      if (const double pk = peak_for(ph, p.peak); pk > 0 && ph.seconds > 0)
        v.emplace_back(ph.name + "_peak_fraction", flops / ph.seconds / 1e9 / pk);
    }
    if (ph.bytes > 0 && ph.seconds > 0) v.emplace_back(ph.name + "_mb_per_s", ph.bytes / ph.seconds / 1e6);
  }
  if (p.peak.float32 > 0) {
    v.emplace_back("peak_float32_gflops", p.peak.float32);
    v.emplace_back("peak_float64_gflops", p.peak.float64);
  }
  return v;
}

}  // namespace dc
