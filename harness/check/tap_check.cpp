// How compare checks a tap of whole tensors, step by step: its tolerance,
// the scans of its chunks (check/scans.h) spread over the workers (and, for a
// distributed source, over the processes that hold the pieces), and the
// verdict made of what the scans found.
#include "harness/check/tap_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "harness/check/against.h"
#include "harness/check/chunks.h"
#include "harness/check/column_error.h"
#include "harness/check/scans.h"
#include "harness/check/tap_plan.h"
#include "harness/check/tap_stats.h"

namespace dc {
namespace {

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

// Values one round of a distributed source may stage for one process: an
// eighth of what the budget leaves beside the program (see chunk_elements),
// since a round's values exist up to four times (packed, sent, received,
// staged) next to the chunk buffers.
std::size_t staging_elements(std::size_t budget) {
  const std::size_t rest = budget > 2 * kProcessAllowance ? budget - kProcessAllowance : budget / 2;
  return std::max<std::size_t>(rest / 8 / sizeof(double), 4096);
}

// RMS of the reference, for a tolerance derived from it: one pass over the
// reference alone.
double reference_rms(const ActivationSet& set, const TapPlan& p, std::size_t chunk, std::size_t unit,
                     std::size_t budget, const Workers& threads, std::vector<ChunkBuffers>& bufs) {
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

// The tap's tolerance against its reference (none without one).
Tolerance tap_tolerance(const ActivationSet& set, const TapData& t, const TapPlan& p, const CompareOptions& opts,
                        std::size_t chunk, const Workers& threads, std::vector<ChunkBuffers>& bufs) {
  if (!t.reference_shape) return {};
  ToleranceInputs in = tap_tolerance_inputs(set, t, opts);
  const std::size_t unit = std::max<std::size_t>(opts.sum_unit, 1);
  const bool needs_rms = tolerance_needs_rms(in) ||
                         (t.against && tolerance_needs_rms(tap_tolerance_inputs(set, *t.against, opts)));
  if (needs_rms) in.reference_rms = reference_rms(set, p, chunk, unit, opts.memory_budget, threads, bufs);
  Tolerance tol = derive_tolerance(in);
  add_other_runs_bound(set, t, opts, in.reference_rms, tol);
  return tol;
}

// A distributed source: each block is checked by its owner, a run of chunk
// indices per round, as many as keep what a round stages for the busiest
// owner (its blocks' other pieces and reference) within the staging share of
// the budget: few rounds (each one collective exchange), bounded memory.
std::size_t chunks_per_round(const TapPlan& p, bool has_ref, std::size_t chunk, std::size_t budget) {
  std::map<int, std::size_t> reads;
  std::size_t reads_per_owner = 1;
  for (const auto& g : p.groups) {
    std::size_t n = has_ref ? 1 : 0;
    for (const auto& reps : g.replicas) n += 1 + reps.size();
    reads_per_owner = std::max(reads_per_owner, reads[g.owner] += n);
  }
  return std::max<std::size_t>(1, staging_elements(budget) / (reads_per_owner * chunk));
}

// The scans of one tap's chunks: one work item is one chunk of one block group.
struct TapScan {
  const ActivationSet& set;
  const TapData& t;
  const TapPlan& p;
  const Tolerance& tol;
  const ColumnLayout& columns;
  const ChunkPlan& plan;
  bool has_ref;
  std::vector<ChunkBuffers>& bufs;  // one per worker

  void operator()(std::size_t item, TapStats& st, int k) const {
    const BlockGroup& g = p.groups[item % p.groups.size()];
    const std::size_t ci = item / p.groups.size();
    const Slab slab = plan.slab(ci);
    const std::size_t n = numel(slab.count), first = plan.first_flat(ci);
    ChunkBuffers& b = bufs[static_cast<std::size_t>(k)];
    if (g.leaders.size() == 1 && g.replicas.front().empty())
      scan_single_piece(g, slab, n, first, b, st);
    else
      scan_replicated_or_summed(g, slab, n, first, b, st);
  }

  // One piece (no replica, no partial sum): scanned as stored, when the
  // source can give it so (a float32 file: no widening pass).
  void scan_single_piece(const BlockGroup& g, const Slab& slab, std::size_t n, std::size_t first, ChunkBuffers& b,
                         TapStats& st) const {
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
  }

  // Replicas against their leader; partial sums (several leaders) added
  // before the reference check.
  void scan_replicated_or_summed(const BlockGroup& g, const Slab& slab, std::size_t n, std::size_t first,
                                 ChunkBuffers& b, TapStats& st) const {
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
  }

  // Every chunk of every block group, on the workers; for a distributed
  // source in rounds, each group's pieces sent to its owner.
  TapStats run(const Workers& threads, std::size_t budget, std::size_t chunk) const {
    const Comm* holders = set.data->holders();
    if (!holders) return run_items(plan.count() * p.groups.size(), threads, *this);
    const std::size_t per_round = chunks_per_round(p, has_ref, chunk, budget);
    const std::size_t rounds = (plan.count() + per_round - 1) / per_round;
    return run_rounds(set, t, rounds, threads.threads, [&](std::size_t round) {
      Round r;
      for (std::size_t ci = round * per_round; ci < std::min(plan.count(), (round + 1) * per_round); ++ci) {
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
    }, *this);
  }
};

// The rel L2 of each block owner's own block over the tap's norm-wise limit
// (empty without one): a rank's share of a whole-tensor limit, its own.
std::vector<RankValue> owner_l2_ratios(const TapStats& s, const Tolerance& tol) {
  std::vector<RankValue> out;
  if (!tol.rel_l2_limit) return out;
  for (std::size_t i = 0; i < s.owner_err_sq.size() && i < s.owner_ref_sq.size(); ++i) {
    const double e = s.owner_err_sq[i].value, r = s.owner_ref_sq[i].value, limit = *tol.rel_l2_limit;
    const double l2 = r > 0 ? std::sqrt(e / r) : e > 0 ? INFINITY : 0.0;
    out.push_back({s.owner_err_sq[i].rank, std::isnan(e) ? INFINITY : limit > 0 ? l2 / limit : l2 > 0 ? INFINITY : 0.0});
  }
  return out;
}

// The value of `owner` in a list sorted by rank.
std::optional<double> value_of(const std::vector<RankValue>& v, int owner) {
  auto it = std::lower_bound(v.begin(), v.end(), RankValue{owner, 0});
  if (it == v.end() || it->rank != owner) return std::nullopt;
  return it->value;
}

// Every rank that holds owner's block: its leaders and their replicas.
template <class F>
void for_holders(const BlockGroup& g, F&& f) {
  for (std::size_t li = 0; li < g.leaders.size(); ++li) {
    f(g.leaders[li]);
    for (int r : g.replicas[li]) f(r);
  }
}

// Each rank's figures for heatmaps: non-finite count, replica difference,
// and err/tol (its block's worst element, given to each rank that holds the
// block; reference_verdict adds its own rel L2).
PerRank per_rank_figures(const TapStats& s, const TapPlan& p, int world_size, bool has_ref) {
  PerRank pr;
  const auto world = static_cast<std::size_t>(world_size);
  pr.nonfinite.assign(world, 0);
  for (const auto& x : s.rank_nonfinite) pr.nonfinite.at(static_cast<std::size_t>(x.rank)) = static_cast<long long>(x.value);
  pr.replica_diff.assign(world, 0.0);
  for (const auto& x : s.rank_replica_diff) pr.replica_diff.at(static_cast<std::size_t>(x.rank)) = x.value;
  if (!has_ref) return pr;
  pr.err_over_tol.assign(world, 0.0);
  for (const auto& g : p.groups)
    if (auto element = value_of(s.owner_err_ratio, g.owner))
      for_holders(g, [&](int r) { pr.err_over_tol.at(static_cast<std::size_t>(r)) = *element; });
  return pr;
}

NonFinite nonfinite_verdict(const TapStats& s, const TapData& t) {
  NonFinite nf;
  nf.nan = s.nan;
  nf.inf = s.inf;
  if (s.first_nan) nf.first_nan = ElementRef{s.first_nan->first, unravel(s.first_nan->second, t.local_shape)};
  if (s.first_inf) nf.first_inf = ElementRef{s.first_inf->first, unravel(s.first_inf->second, t.local_shape)};
  nf.ranks = s.nonfinite_ranks;
  return nf;
}

ReplicaCheck replica_verdict(const TapStats& s, const TapPlan& p, const TapData& t, const Mesh& mesh,
                             const CompareOptions& opts) {
  ReplicaCheck rc;
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
  return rc;
}

ReferenceCheck reference_verdict(const TapStats& s, const TapPlan& p, const Tolerance& tol,
                                 const ColumnLayout& columns, std::vector<double>& err_over_tol) {
  ReferenceCheck ref;
  ref.present = true;
  ref.other_run = p.tap->against != nullptr;
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
  for (std::size_t r = 0; r < err_over_tol.size(); ++r)  // element-wise, before the whole-tensor limits
    if (!(err_over_tol[r] <= 1)) ref.failing_ranks.push_back(static_cast<int>(r));
  if (columns.tracked()) ref.column_mean = column_mean_error(s.column_err, columns, s.ref_sq.rms(numel(p.global)));
  // A rank's cell shows its own block's rel L2 over the limit, not the whole
  // tensor's: a wrong block on rank 1 paints rank 1, not rank 0 too.
  const std::vector<RankValue> l2 = owner_l2_ratios(s, tol);
  for (const auto& g : p.groups)
    if (auto own = value_of(l2, g.owner))
      for_holders(g, [&](int r) {
        double& cell = err_over_tol.at(static_cast<std::size_t>(r));
        if (std::isnan(*own) || *own > cell) cell = *own;
      });
  judge_whole_tensor(ref, err_over_tol, /*charge_every_rank=*/false);
  return ref;
}

}  // namespace

TapVerdict check_tap(const ActivationSet& set, const TapData& t, const CompareOptions& opts, std::size_t chunk,
                     const Workers& threads, std::vector<ChunkBuffers>& bufs) {
  const TapPlan p = plan_tap(t, set.mesh);
  const bool has_ref = t.reference_shape.has_value();
  const Tolerance tol = tap_tolerance(set, t, p, opts, chunk, threads, bufs);
  // Column means when a floor is measured or a limit asks for them (they cost
  // an exact sum per column).
  const ColumnLayout columns =
      has_ref && (opts.measure_floor || tol.column_mean_limit) ? column_layout(p.global) : ColumnLayout{};
  const ChunkPlan plan(t.local_shape, chunk, std::max<std::size_t>(opts.sum_unit, 1));
  const TapScan scan{set, t, p, tol, columns, plan, has_ref, bufs};
  const TapStats s = scan.run(threads, opts.memory_budget, chunk);

  TapVerdict v = blank_verdict(t, p.global);
  v.ranks = per_rank_figures(s, p, set.world_size, has_ref);
  v.nonfinite = nonfinite_verdict(s, t);
  v.replica = replica_verdict(s, p, t, set.mesh, opts);
  if (has_ref) v.reference = reference_verdict(s, p, tol, columns, v.ranks.err_over_tol);
  return v;
}

}  // namespace dc
