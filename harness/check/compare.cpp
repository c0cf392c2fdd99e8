#include "harness/check/compare.h"

#include <fmt/format.h>


#include "harness/check/microbatches.h"
#include "harness/check/images.h"

#include <algorithm>
#include <chrono>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <thread>

#include "harness/check/math_mode.h"
#include "harness/check/sketch_check.h"
#include "harness/check/tap_plan.h"
#include "harness/check/tap_check.h"
#include "harness/check/tap_stats.h"
#include "harness/check/work_items.h"
#include "harness/core/error.h"

namespace dc {
namespace {

constexpr std::size_t kCacheChunk = std::size_t{1} << 16;

// Maps a float's bits onto a line where adjacent floats are adjacent integers.
template <class F, class I>
I ordered_bits(F x) {
  I i = std::bit_cast<I>(x);
  return i < 0 ? std::numeric_limits<I>::min() - i : i;
}

}  // namespace

void judge_whole_tensor(ReferenceCheck& ref, std::vector<double>& err_over_tol, bool charge_every_rank) {
  const Tolerance& tol = ref.tol;
  if (tol.rel_l2_limit) {
    ref.l2_ratio = *tol.rel_l2_limit > 0 ? ref.rel_l2 / *tol.rel_l2_limit : ref.rel_l2 > 0 ? INFINITY : 0.0;
    ref.pass = ref.pass && *ref.l2_ratio <= 1;
  }
  if (ref.column_mean && tol.column_mean_limit) {
    const double c = *ref.column_mean, limit = *tol.column_mean_limit;
    ref.column_ratio = !(c >= 0) ? INFINITY : limit > 0 ? c / limit : c > 0 ? INFINITY : 0.0;
    ref.pass = ref.pass && *ref.column_ratio <= 1;
  }
  // Without each block's own figures (a sketch tap), a limit on the whole
  // tensor is every block's: each rank's err/tol shows at least its ratio
  // (a NaN one as infinite), or a tap failing by it alone would look like a
  // pass there. With them, the heatmap's tap label shows such a failure.
  if (!charge_every_rank) return;
  for (const auto& whole : {ref.l2_ratio, ref.column_ratio})
    if (whole) {
      const double w = std::isnan(*whole) ? INFINITY : *whole;
      for (double& r : err_over_tol)
        if (w > r) r = w;
    }
}

ToleranceInputs tap_tolerance_inputs(const ActivationSet& set, const TapData& t, const CompareOptions& opts) {
  ToleranceInputs in{t.dtype, t.reduction_depth, t.atol, t.rtol, opts.atol, opts.rtol, 0.0,
                     t.tolerance_factor.value_or(1.0)};
  in.rounding_steps = t.rounding_steps;
  if (auto m = set.info.find("math"); m != set.info.end()) {
    const MathRounding math = math_rounding(m->second, t.dtype, set.source);
    in.math_roundoff = math.roundoff;
    in.math_label = math.label;
  }
  if (opts.measure_floor) in = {t.dtype, t.reduction_depth, {}, {}, {}, 1.0, 0.0, 1.0};
  if (opts.tolerances) {
    in.measured = opts.tolerances->find(t.name);
    in.measured_source = opts.tolerances->source;
    in.per_mesh = t.per_mesh;
    for (const auto& axis : t.layout.partial) in.partial_pieces *= set.mesh.axis_size(axis);
  }
  for (const auto& axis : t.reduced) in.reduced_pieces *= set.mesh.axis_size(axis);
  return in;
}

std::size_t chunk_elements(std::size_t budget, int threads) {
  std::size_t for_buffers = budget > 2 * kProcessAllowance ? budget - kProcessAllowance : budget / 2;
  std::size_t per_buffer = for_buffers / (4 * sizeof(double) * static_cast<std::size_t>(std::max(1, threads)));
  // Small enough for the buffers of a chunk to stay in cache between the read
  // and the scans (larger chunks only cost memory bandwidth).
  return std::clamp<std::size_t>(per_buffer, 4096, kCacheChunk);
}

long long ulp_distance(double a, double b, StoredKind kind) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<long long>::max();
  switch (kind) {
    case StoredKind::integer: return static_cast<long long>(std::llabs(static_cast<long long>(a - b)));
    case StoredKind::float64: {
      auto ia = ordered_bits<double, std::int64_t>(a), ib = ordered_bits<double, std::int64_t>(b);
      // The distance in unsigned arithmetic (opposite extremes overflow a signed one), capped.
      const std::uint64_t d = ia > ib ? static_cast<std::uint64_t>(ia) - static_cast<std::uint64_t>(ib)
                                      : static_cast<std::uint64_t>(ib) - static_cast<std::uint64_t>(ia);
      constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<long long>::max());
      return static_cast<long long>(std::min(d, kMax));
    }
    default: {
      auto ia = static_cast<long long>(ordered_bits<float, std::int32_t>(static_cast<float>(a)));
      auto ib = static_cast<long long>(ordered_bits<float, std::int32_t>(static_cast<float>(b)));
      long long d = std::llabs(ia - ib);
      return kind == StoredKind::float16 ? d >> 13 : d;  // float16 has 13 fewer mantissa bits
    }
  }
}

long TapVerdict::microbatch_of(const std::vector<std::size_t>& index, bool global) const {
  if (microbatches < 1 || index.empty() || local_shape.empty() || local_shape[0] == 0) return -1;
  const std::size_t local = global ? index[0] % local_shape[0] : index[0];
  return static_cast<long>(local / (local_shape[0] / static_cast<std::size_t>(microbatches)));
}

std::vector<std::string> TapVerdict::failed_checks() const {
  std::vector<std::string> out;
  if (nonfinite.nan || nonfinite.inf) out.push_back("nonfinite");
  if (!replica.pass) out.push_back("replica");
  if (!reference.pass) out.push_back(reference.mismatched_shape ? "shape" : "reference");
  if (unchecked && unchecked_fails) out.push_back("no reference");
  if (!microbatch_copies_differ.empty()) out.push_back("microbatches");
  return out;
}

TapVerdict blank_verdict(const TapData& t, const Shape& global) {
  TapVerdict v;
  v.name = t.name;
  v.layout = t.layout.str() + (t.complex_parts ? " complex" : "");  // the real view of a complex tensor
  v.dtype = t.dtype;
  v.local_shape = t.local_shape;
  v.stage = t.layout.stage_str();
  v.microbatches = t.microbatches;
  v.global_shape = global;
  return v;
}

std::vector<std::string> CompareResult::unchecked_taps() const {
  std::vector<std::string> out;
  for (const auto& t : taps)
    if (t.unchecked) out.push_back(t.name);
  return out;
}

// A run has a reference when any of its taps was compared with one; each tap
// that was not is then unchecked, not passed (a tied weight's second name, a
// module the reference model lacks), and a failure under --require-reference.
static void mark_unchecked(CompareResult& res, bool require_reference) {
  auto referenced = [](const TapVerdict& t) { return t.reference.present || t.reference.mismatched_shape; };
  if (!std::any_of(res.taps.begin(), res.taps.end(), referenced)) return;
  for (auto& t : res.taps)
    if (!referenced(t)) {
      t.unchecked = true;
      t.unchecked_fails = require_reference;
    }
}

CompareResult compare(const ActivationSet& set, const CompareOptions& opts) {
  int threads = opts.threads > 0 ? opts.threads
                                 : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // A chunk is at least one summation unit (ChunkPlan's rule).
  const std::size_t chunk = std::max(
      opts.chunk_elements ? opts.chunk_elements : chunk_elements(opts.memory_budget, threads),
      std::max<std::size_t>(opts.sum_unit, 1));
  // Buffers for the largest chunk any tap needs, made once.
  std::size_t need = 1;
  for (const auto& t : set.taps) {
    need = std::max(need, std::min(chunk, numel(t.local_shape)));
    if (t.reference_shape) need = std::max(need, std::min(chunk, numel(*t.reference_shape)));
  }
  std::vector<ChunkBuffers> bufs;
  for (int k = 0; k < threads; ++k) bufs.emplace_back(need);
  const Workers workers{threads, opts.processes};
  const auto dtype_info = set.info.find("dtype");
  const std::string run_dtype = dtype_info == set.info.end() ? std::string{} : dtype_info->second;

  CompareResult res;
  for (const auto& t : set.taps) {
    const auto t0 = std::chrono::steady_clock::now();
    TapVerdict v = t.sketch ? check_sketch_tap(set, t, opts) : check_tap(set, t, opts, chunk, workers, bufs);
    if (opts.tolerances && t.reference_shape && !opts.tolerances->find(t.name))
      res.tolerance_fallbacks.push_back(t.name);
    v.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!v.reference.pass && t.microbatches > 0) v.wrong_microbatches = wrong_microbatches(set, t, v);
    if (v.reference.present) v.reference.narrow_reference = narrow_reference(t, run_dtype);
    for (const auto& [rank, which] : t.microbatch_copies_differ)
      v.microbatch_copies_differ.push_back(fmt::format("rank {}: microbatches {}", rank, which));
    if (t.mismatched_reference_shape) {
      v.reference.mismatched_shape = t.mismatched_reference_shape;
      v.reference.pass = false;
      // Every rank's block is wrong as a whole (heatmaps paint it failing, not "no reference").
      v.ranks.err_over_tol.assign(static_cast<std::size_t>(set.world_size), INFINITY);
    }
    res.taps.push_back(std::move(v));
  }
  mark_unchecked(res, opts.require_reference);
  for (std::size_t i = 0; i < res.taps.size() && !res.first_divergence; ++i)
    if (!res.taps[i].pass()) res.first_divergence = i;
  res.images = judge_images(set, opts);
  return res;
}

}  // namespace dc
