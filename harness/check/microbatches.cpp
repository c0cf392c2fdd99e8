#include "harness/check/microbatches.h"

#include <cmath>

#include "harness/check/tap_plan.h"

namespace dc {
namespace {

// The box of the global tensor that a block group's local slab is.
Slab global_slab(const TapData& t, const BlockGroup& g, const Slab& local) {
  Slab global = local;
  for (std::size_t d = 0; d < global.start.size(); ++d) global.start[d] += g.block[d] * t.local_shape[d];
  return global;
}

}  // namespace

std::vector<long> wrong_microbatches(const ActivationSet& set, const TapData& t, const TapVerdict& v) {
  std::vector<long> wrong;
  if (t.microbatches < 1 || !t.reference_shape || t.against || t.sketch || !set.data || t.local_shape.empty() ||
      !v.reference.present)
    return wrong;
  // A run's own data, held by its ranks: each microbatch's pieces and
  // reference rows move to the first process, which judges them (a round per
  // microbatch, collective: every process calls this for the same taps).
  const Comm* holders = set.data->holders();
  const bool judge = !holders || holders->rank() == 0;
  const auto m_count = static_cast<std::size_t>(t.microbatches);
  const std::size_t rows = t.local_shape[0] / m_count;
  const Tolerance& tol = v.reference.tol;
  const TapPlan plan = plan_tap(t, set.mesh);
  std::vector<double> err_sq(m_count, 0.0), ref_sq(m_count, 0.0);
  std::vector<bool> outside(m_count, false);
  for (std::size_t m = 0; m < m_count; ++m) {
    Slab local;
    local.start.assign(t.local_shape.size(), 0);
    local.count = t.local_shape;
    local.start[0] = m * rows;
    local.count[0] = rows;
    const std::size_t n = numel(local.count);
    std::vector<double> sum(n), piece(n), ref(n);
    if (holders) {
      std::vector<PlannedRead> reads;
      for (const auto& g : plan.groups) {
        for (int leader : g.leaders) reads.push_back({0, leader, local});
        reads.push_back({0, -1, global_slab(t, g, local)});
      }
      set.data->stage(t, reads);
      if (!judge) continue;
    }
    for (const auto& g : plan.groups) {
      std::fill(sum.begin(), sum.end(), 0.0);
      for (int leader : g.leaders) {
        set.data->read_piece(t, leader, local, piece.data());
        for (std::size_t i = 0; i < n; ++i) sum[i] += piece[i];
      }
      set.data->read_reference(t, global_slab(t, g, local), ref.data());
      for (std::size_t i = 0; i < n; ++i) {
        const double e = std::abs(sum[i] - ref[i]);
        if (!(e <= tol.atol + tol.rtol * std::abs(ref[i]))) outside[m] = true;
        err_sq[m] += e * e;
        ref_sq[m] += ref[i] * ref[i];
      }
    }
  }
  for (std::size_t m = 0; m < m_count; ++m) {
    const bool l2 = tol.rel_l2_limit && ref_sq[m] > 0 && !(std::sqrt(err_sq[m] / ref_sq[m]) <= *tol.rel_l2_limit);
    if (outside[m] || l2) wrong.push_back(static_cast<long>(m));
  }
  return wrong;
}

}  // namespace dc
