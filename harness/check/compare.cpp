#include "harness/check/compare.h"
#include "harness/check/images.h"

#include <algorithm>
#include <chrono>
#include <bit>
#include <cmath>
#include <cstdint>
#include <map>
#include <limits>
#include <memory>
#include <thread>

#include "harness/check/chunks.h"
#include "harness/check/column_error.h"
#include "harness/check/math_mode.h"
#include "harness/check/scans.h"
#include "harness/check/sketch_check.h"
#include "harness/check/tap_plan.h"
#include "harness/check/tap_stats.h"
#include "harness/check/work_items.h"
#include "harness/core/error.h"

namespace dc {
namespace {

constexpr std::size_t kCacheChunk = std::size_t{1} << 16;

// Values as the source stores them when it can give them so (in `buf` or in
// a mapping of its file, which `keep` then holds), else widened to float64
// into `buf`.
template <class Stored, class Widened>
StoredValues as_stored(double* buf, std::shared_ptr<const void>& keep, Stored stored, Widened widened) {
  StoredSpan span = stored(static_cast<void*>(buf));
  if (span.element_size != 0) {
    keep = std::move(span.keep);
    return {span.data, span.element_size};
  }
  widened(buf);
  return {buf, sizeof(double)};
}

// Maps a float's bits onto a line where adjacent floats are adjacent integers.
template <class F, class I>
I ordered_bits(F x) {
  I i = std::bit_cast<I>(x);
  return i < 0 ? std::numeric_limits<I>::min() - i : i;
}

// Values one round of a distributed source may stage for one process: an
// eighth of what the budget leaves beside the program (see chunk_elements),
// since a round's values exist up to four times (packed, sent, received,
// staged) next to the chunk buffers.
std::size_t staging_elements(std::size_t budget) {
  const std::size_t rest = budget > 2 * kProcessAllowance ? budget - kProcessAllowance : budget / 2;
  return std::max<std::size_t>(rest / 8 / sizeof(double), 4096);
}

// A chunk's values. Not zeroed when made: every use writes before it reads,
// and a page no tap needs (the replica and sum buffers of a tap on one rank)
// is then never touched, where zeroing cost a first touch of each.
class Buffer {
 public:
  explicit Buffer(std::size_t n) : values_(new double[n]) {}
  double* data() { return values_.get(); }
  double& operator[](std::size_t i) { return values_[i]; }

 private:
  std::unique_ptr<double[]> values_;
};

struct Buffers {
  Buffer leader, other, sum, ref;
  explicit Buffers(std::size_t n) : leader(n), other(n), sum(n), ref(n) {}
};

// RMS of the reference, for a tolerance derived from it: one pass over the
// reference alone.
double reference_rms(const ActivationSet& set, const TapPlan& p, std::size_t chunk, std::size_t unit,
                     std::size_t budget, const Workers& threads, std::vector<Buffers>& bufs) {
  const Shape& shape = *p.tap->reference_shape;
  const std::size_t n = numel(shape);
  if (n == 0) return 0;
  // A distributed source: each chunk read by the process holding its first
  // element (so it rarely moves), in rounds of as many chunks as the staging
  // share of the budget holds should all of them move (at least one per process).
  const Comm* holders = set.data->holders();
  ChunkPlan plan(shape, chunk, unit);
  const std::size_t per_round =
      holders ? std::max<std::size_t>(static_cast<std::size_t>(holders->size()), staging_elements(budget) / chunk) : 1;
  auto work = [&](std::size_t i, TapStats& st, int k) {
    Slab slab = plan.slab(i);
    double* r = bufs[static_cast<std::size_t>(k)].ref.data();
    set.data->read_reference(*p.tap, slab, r);
    const std::size_t first = plan.first_flat(i), m = numel(slab.count);
    for (std::size_t at = 0; at < m;) {
      const std::size_t end = at + std::min(m - at, plan.unit_left(first + at));
      double sum = 0;
      for (std::size_t j = at; j < end; ++j) sum += r[j] * r[j];
      // Non-finite reference values stay out of the scale: an RMS of inf
      // would be an infinite atol, and every element would pass.
      if (!st.ref_sq.add_partial(sum))
        for (std::size_t j = at; j < end; ++j)
          if (std::isfinite(r[j])) st.ref_sq.add_value(r[j]);
      at = end;
    }
  };
  TapStats s;
  if (!holders) {
    s = run_items(plan.count(), threads, work);
  } else {
    const std::size_t rounds = (plan.count() + per_round - 1) / per_round;
    s = run_rounds(set, *p.tap, rounds, threads.threads, [&](std::size_t round) {
      Round r;
      for (std::size_t i = round * per_round; i < std::min(plan.count(), (round + 1) * per_round); ++i) {
        const Slab slab = plan.slab(i);
        r.items.push_back(i);
        r.reader.push_back(set.data->reference_holder(*p.tap, slab));
        r.reads.push_back({r.reader.back(), -1, slab});
      }
      return r;
    }, work);
  }
  return s.ref_sq.rms(n);
}

TapVerdict check_tap(const ActivationSet& set, const TapData& t, const CompareOptions& opts,
                     std::size_t chunk, const Workers& threads, std::vector<Buffers>& bufs) {
  const Mesh& mesh = set.mesh;
  const std::size_t unit = std::max<std::size_t>(opts.sum_unit, 1);
  TapPlan p = plan_tap(t, mesh);
  TapVerdict v;
  v.name = t.name;
  v.layout = t.layout.str();
  v.dtype = t.dtype;
  v.local_shape = t.local_shape;
  v.global_shape = p.global;
  const bool has_ref = t.reference_shape.has_value();

  Tolerance tol;
  if (has_ref) {
    ToleranceInputs in = tap_tolerance_inputs(set, t, opts);
    if (tolerance_needs_rms(in)) in.reference_rms = reference_rms(set, p, chunk, unit, opts.memory_budget, threads, bufs);
    tol = derive_tolerance(in);
  }
  // Column means when a floor is measured or a limit asks for them (they cost
  // an exact sum per column).
  const ColumnLayout columns =
      has_ref && (opts.measure_floor || tol.column_mean_limit) ? column_layout(p.global) : ColumnLayout{};

  // A distributed source: each block is checked by its owner, a run of chunk
  // indices per round, as many as keep what a round stages for the busiest
  // owner (its blocks' other pieces and reference) within the staging share
  // of the budget: few rounds (each one collective exchange), bounded memory.
  const Comm* holders = set.data->holders();
  std::size_t reads_per_owner = 1;
  if (holders) {
    std::map<int, std::size_t> reads;
    for (const auto& g : p.groups) {
      std::size_t n = has_ref ? 1 : 0;
      for (const auto& reps : g.replicas) n += 1 + reps.size();
      reads_per_owner = std::max(reads_per_owner, reads[g.owner] += n);
    }
  }
  ChunkPlan plan(t.local_shape, chunk, unit);
  const std::size_t chunks_per_round =
      std::max<std::size_t>(1, staging_elements(opts.memory_budget) / (reads_per_owner * chunk));
  const std::size_t n_items = plan.count() * p.groups.size();
  auto work = [&](std::size_t item, TapStats& st, int k) {
    const BlockGroup& g = p.groups[item % p.groups.size()];
    const std::size_t ci = item / p.groups.size();
    Slab slab = plan.slab(ci);
    const std::size_t n = numel(slab.count), first = plan.first_flat(ci);
    Buffers& b = bufs[static_cast<std::size_t>(k)];
    if (g.leaders.size() == 1 && g.replicas.front().empty()) {
      // One piece (no replica, no partial sum): scanned as stored, when the
      // source can give it so (a float32 file: no widening pass).
      const int l = g.leaders.front();
      std::shared_ptr<const void> keep_x, keep_r;  // mappings the scans read from
      const StoredValues x = as_stored(
          b.leader.data(), keep_x, [&](void* out) { return set.data->read_piece_stored(t, l, slab, out); },
          [&](double* out) { set.data->read_piece(t, l, slab, out); });
      if (!has_ref) return scan_nonfinite(x, n, l, first, st);
      const Slab global = to_global(slab, t.local_shape, g.block);
      const StoredValues r = as_stored(
          b.ref.data(), keep_r, [&](void* out) { return set.data->read_reference_stored(t, global, out); },
          [&](double* out) { set.data->read_reference(t, global, out); });
      // The reference scan tells whether the values may hold a NaN or an Inf
      // (the non-finite scan's own pass over them is then needed).
      if (scan_reference(x, r, n, tol, p, g, first, plan, st)) scan_nonfinite(x, n, l, first, st);
      add_column_errors(x, r, n, columns, global, first, plan, st.column_err);
      return;
    }
    const bool sum = has_ref && g.leaders.size() > 1;
    if (sum) std::fill_n(b.sum.data(), n, 0.0);
    for (std::size_t li = 0; li < g.leaders.size(); ++li) {
      const int l = g.leaders[li];
      set.data->read_piece(t, l, slab, b.leader.data());
      scan_nonfinite(b.leader.data(), n, l, first, st);
      for (int r : g.replicas[li]) {
        set.data->read_piece(t, r, slab, b.other.data());
        scan_nonfinite(b.other.data(), n, r, first, st);
        scan_replica(b.leader.data(), b.other.data(), n, l, r, first, t.stored, st);
      }
      if (sum)
        for (std::size_t j = 0; j < n; ++j) b.sum[j] += b.leader[j];
    }
    if (!has_ref) return;
    const Slab global = to_global(slab, t.local_shape, g.block);
    set.data->read_reference(t, global, b.ref.data());
    const double* x = sum ? b.sum.data() : b.leader.data();
    scan_reference(x, b.ref.data(), n, tol, p, g, first, plan, st);
    add_column_errors({x, sizeof(double)}, {b.ref.data(), sizeof(double)}, n, columns, global, first, plan,
                      st.column_err);
  };
  TapStats s;
  if (!holders) {
    s = run_items(n_items, threads, work);
  } else {
    const std::size_t rounds = (plan.count() + chunks_per_round - 1) / chunks_per_round;
    s = run_rounds(set, t, rounds, threads.threads, [&](std::size_t round) {
      Round r;
      for (std::size_t ci = round * chunks_per_round; ci < std::min(plan.count(), (round + 1) * chunks_per_round); ++ci) {
        const Slab slab = plan.slab(ci);
        for (std::size_t gi = 0; gi < p.groups.size(); ++gi) {
          const BlockGroup& g = p.groups[gi];
          r.items.push_back(ci * p.groups.size() + gi);
          r.reader.push_back(g.owner);
          for (std::size_t li = 0; li < g.leaders.size(); ++li) {
            r.reads.push_back({g.owner, g.leaders[li], slab});
            for (int rep : g.replicas[li]) r.reads.push_back({g.owner, rep, slab});
          }
          if (has_ref) r.reads.push_back({g.owner, -1, to_global(slab, t.local_shape, g.block)});
        }
      }
      return r;
    }, work);
  }

  PerRank& pr = v.ranks;
  const auto world = static_cast<std::size_t>(set.world_size);
  pr.nonfinite.assign(world, 0);
  for (const auto& x : s.rank_nonfinite) pr.nonfinite.at(static_cast<std::size_t>(x.rank)) = static_cast<long long>(x.value);
  pr.replica_diff.assign(world, 0.0);
  for (const auto& x : s.rank_replica_diff) pr.replica_diff.at(static_cast<std::size_t>(x.rank)) = x.value;
  if (has_ref) {
    pr.err_over_tol.assign(world, 0.0);
    for (const auto& g : p.groups) {
      auto it = std::lower_bound(s.owner_err_ratio.begin(), s.owner_err_ratio.end(), RankValue{g.owner, 0});
      if (it == s.owner_err_ratio.end() || it->rank != g.owner) continue;
      for (std::size_t li = 0; li < g.leaders.size(); ++li) {
        pr.err_over_tol.at(static_cast<std::size_t>(g.leaders[li])) = it->value;
        for (int r : g.replicas[li]) pr.err_over_tol.at(static_cast<std::size_t>(r)) = it->value;
      }
    }
  }

  NonFinite& nf = v.nonfinite;
  nf.nan = s.nan;
  nf.inf = s.inf;
  if (s.first_nan) nf.first_nan = ElementRef{s.first_nan->first, unravel(s.first_nan->second, t.local_shape)};
  if (s.first_inf) nf.first_inf = ElementRef{s.first_inf->first, unravel(s.first_inf->second, t.local_shape)};
  nf.ranks = s.nonfinite_ranks;

  ReplicaCheck& rc = v.replica;
  rc.applies = p.replicated;
  rc.differing = s.differing;
  rc.max_ulp = s.max_ulp;
  if (s.replica_worst) {
    const auto& w = *s.replica_worst;
    rc.max_abs = w.diff;
    rc.leader = w.leader;
    rc.other = w.rank;
    rc.index = unravel(w.flat, t.local_shape);
    rc.leader_value = w.leader_value;
    rc.other_value = w.value;
  }
  rc.pass = rc.differing.empty() || rc.max_ulp <= opts.replica_ulps;
  rc.axes = replica_axes_apart(t, mesh, rc.differing);

  if (has_ref) {
    ReferenceCheck& ref = v.reference;
    ref.present = true;
    ref.tol = tol;
    ref.n_fail = s.n_fail;
    ref.n_total = s.n_total;
    ref.max_abs = s.any_nan_error ? std::nan("") : s.max_abs;
    ref.max_rel = s.any_nan_error ? std::nan("") : s.max_rel;
    ref.rel_l2 = SquareSum::sqrt_ratio(s.err_sq, s.ref_sq);
    if (s.ref_worst) {
      const auto& w = *s.ref_worst;
      ref.worst.index = unravel(w.global_flat, p.global);
      ref.worst_ratio = std::max(0.0, w.ratio);
      ref.worst_value = w.value;
      ref.worst_reference = w.reference;
      for (const auto& g : p.groups)
        if (g.owner == w.owner) ref.worst_ranks = g.leaders;
      ref.worst.rank = ref.worst_ranks.empty() ? -1 : ref.worst_ranks.front();
    }
    ref.pass = ref.n_fail == 0;
    if (columns.tracked()) ref.column_mean = column_mean_error(s.column_err, columns, s.ref_sq.rms(numel(p.global)));
    judge_whole_tensor(ref, pr.err_over_tol);
  }
  return v;
}

}  // namespace

void judge_whole_tensor(ReferenceCheck& ref, std::vector<double>& err_over_tol) {
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
  // A limit on the whole tensor is every block's: each rank's err/tol
  // (heatmaps, step summaries) shows at least its ratio (a NaN one as
  // infinite), or a tap failing by it alone would look like a pass there.
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
  }
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

std::vector<std::string> TapVerdict::failed_checks() const {
  std::vector<std::string> out;
  if (nonfinite.nan || nonfinite.inf) out.push_back("nonfinite");
  if (!replica.pass) out.push_back("replica");
  if (!reference.pass) out.push_back("reference");
  return out;
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
  std::vector<Buffers> bufs;
  for (int k = 0; k < threads; ++k) bufs.emplace_back(need);
  const Workers workers{threads, opts.processes};

  CompareResult res;
  for (const auto& t : set.taps) {
    const auto t0 = std::chrono::steady_clock::now();
    TapVerdict v = t.sketch ? check_sketch_tap(set, t, opts) : check_tap(set, t, opts, chunk, workers, bufs);
    if (opts.tolerances && t.reference_shape && !opts.tolerances->find(t.name))
      res.tolerance_fallbacks.push_back(t.name);
    v.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!v.pass() && !res.first_divergence) res.first_divergence = res.taps.size();
    res.taps.push_back(std::move(v));
  }
  res.images = judge_images(set, opts);
  return res;
}

}  // namespace dc
