#include "harness/check/compare.h"
#include "harness/check/images.h"

#include <algorithm>
#include <chrono>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <exception>
#include <map>
#include <limits>
#include <mutex>
#include <thread>

#include "harness/check/chunks.h"
#include "harness/check/tap_stats.h"
#include "harness/core/error.h"

namespace dc {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::size_t kCacheChunk = std::size_t{1} << 16;

// Maps a float's bits onto a line where adjacent floats are adjacent integers.
template <class F, class I>
I ordered_bits(F x) {
  I i = std::bit_cast<I>(x);
  return i < 0 ? std::numeric_limits<I>::min() - i : i;
}

bool same_value(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// The pieces a block of the global tensor is made of: its partial-sum leaders
// (rank order, the order of the float64 sum) and each leader's replicas.
struct BlockGroup {
  int owner = 0;
  std::vector<std::size_t> block;
  std::vector<int> leaders;
  std::vector<std::vector<int>> replicas;  // per leader, without the leader
};

struct TapPlan {
  const TapData* tap = nullptr;
  Shape global;
  std::vector<BlockGroup> groups;
  bool replicated = false;  // some replica group has more than one rank
};

// Coordinates decide everything: a rank is a replica leader when its
// coordinates on the replica axes are 0, a block owner when also those on the
// partial axes are; each is O(axes) per rank.
TapPlan plan_tap(const TapData& t, const Mesh& mesh) {
  TapPlan p;
  p.tap = &t;
  p.global = t.layout.global_shape(mesh, t.local_shape);
  std::vector<bool> is_replica_axis(mesh.axes().size(), false), is_partial_axis = is_replica_axis;
  for (const auto& a : t.layout.replica_axes(mesh)) {
    is_replica_axis[mesh.axis_index(a)] = true;
    p.replicated = p.replicated || mesh.axis_size(a) > 1;
  }
  for (const auto& a : t.layout.partial) is_partial_axis[mesh.axis_index(a)] = true;
  const auto replica_axes = t.layout.replica_axes(mesh);
  for (int r = 0; r < mesh.world_size(); ++r) {
    auto c = mesh.coords(r);
    bool owner = true;
    for (std::size_t i = 0; i < c.size() && owner; ++i)
      owner = c[i] == 0 || (!is_replica_axis[i] && !is_partial_axis[i]);
    if (!owner) continue;
    BlockGroup g;
    g.owner = r;
    g.block = t.layout.block_of(mesh, r, t.local_shape.size());
    g.leaders = mesh.group(r, t.layout.partial);
    for (int l : g.leaders) {
      auto reps = mesh.group(l, replica_axes);
      reps.erase(std::remove(reps.begin(), reps.end(), l), reps.end());
      g.replicas.push_back(std::move(reps));
    }
    p.groups.push_back(std::move(g));
  }
  return p;
}

int replica_leader_of(const TapData& t, const Mesh& mesh, int rank) {
  auto c = mesh.coords(rank);
  for (const auto& a : t.layout.replica_axes(mesh)) c[mesh.axis_index(a)] = 0;
  return mesh.rank_of(c);
}

void scan_nonfinite(const double* x, std::size_t n, int rank, std::size_t first, TapStats& s) {
  // x - x is 0 for finite x and NaN otherwise: a branch-free first look, in
  // four independent lanes so the adds do not wait on each other.
  double probe[4] = {0, 0, 0, 0};
  std::size_t i4 = n / 4 * 4;
  for (std::size_t i = 0; i < i4; i += 4)
    for (int k = 0; k < 4; ++k) probe[k] += x[i + k] - x[i + k];
  for (std::size_t i = i4; i < n; ++i) probe[0] += x[i] - x[i];
  if (probe[0] + probe[1] + probe[2] + probe[3] == 0) return;
  long long count = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isfinite(x[i])) continue;
    ++count;
    std::pair<int, std::size_t> at{rank, first + i};
    if (std::isnan(x[i])) {
      ++s.nan;
      if (!s.first_nan || at < *s.first_nan) s.first_nan = at;
    } else {
      ++s.inf;
      if (!s.first_inf || at < *s.first_inf) s.first_inf = at;
    }
  }
  if (count == 0) return;
  s.nonfinite_ranks.push_back(rank);
  s.rank_nonfinite.push_back({rank, static_cast<double>(count)});
}

void scan_replica(const double* a, const double* b, std::size_t n, int leader, int rank,
                  std::size_t first, StoredKind kind, TapStats& s) {
  bool differs = false;
  TapStats::ReplicaWorst w;
  for (std::size_t i = 0; i < n; ++i) {
    if (same_value(a[i], b[i])) continue;
    differs = true;
    double d = std::abs(a[i] - b[i]);
    double key = std::isnan(d) ? kInf : d;
    if (key > w.key) w = {key, rank, leader, first + i, a[i], b[i], d};
    s.max_ulp = std::max(s.max_ulp, ulp_distance(a[i], b[i], kind));
  }
  if (!differs) return;
  s.differing.push_back(rank);
  s.rank_replica_diff.push_back({rank, w.key});
  s.offer_replica(w);
}

void scan_reference(const double* x, const double* ref, std::size_t n, const Tolerance& tol,
                    const TapPlan& p, const BlockGroup& g, std::size_t first, const ChunkPlan& plan,
                    TapStats& s) {
  double worst_ratio = -1, max_abs = 0, max_rel = 0;
  std::size_t worst = 0;
  long long fails = 0;
  bool nan_error = false;
  auto element = [&](std::size_t i, double& e_acc, double& r_acc) {
    const double r = ref[i], err = std::abs(x[i] - r), bound = tol.atol + tol.rtol * std::abs(r);
    e_acc += err * err;
    r_acc += r * r;
    max_abs = std::max(max_abs, err);  // a NaN error leaves it unchanged
    // Divisions only for elements that may raise a maximum (the margin covers
    // the rounding of the product).
    if (r != 0 && err > max_rel * std::abs(r) * (1 - 1e-12))
      max_rel = std::max(max_rel, err / std::abs(r));
    // Fails, NaN included; an infinite error fails even against an infinite
    // bound (an Inf in the reference must not excuse a finite value).
    if (!(err <= bound) || err == kInf) {
      ++fails;
      nan_error = nan_error || std::isnan(err);
    }
    if (i == 0 || err > worst_ratio * bound * (1 - 1e-12) || std::isnan(err)) {
      double ratio = std::isnan(err) ? kInf : bound > 0 ? err / bound : err > 0 ? kInf : 0.0;
      if (ratio > worst_ratio) {
        worst_ratio = ratio;
        worst = i;
      }
    }
  };
  // One summation unit at a time (see ChunkPlan), each in four independent
  // lanes kept in registers so no add waits on another; a unit's sum goes
  // into the exact sum.
  for (std::size_t at = 0; at < n;) {
    const std::size_t end = at + std::min(n - at, plan.unit_left(first + at));
    double e0 = 0, e1 = 0, e2 = 0, e3 = 0, r0 = 0, r1 = 0, r2 = 0, r3 = 0;
    const std::size_t end4 = at + (end - at) / 4 * 4;
    // A unit equal to its reference (every x - ref exactly 0: no NaN, no
    // Inf) moves no maximum, failure or error sum, and only a chunk's first
    // element can be its worst (ratio 0): only the reference's squares are
    // left, summed in the same lanes as below, so the result is bit-identical.
    // One branch-free compare pass instead of the per-element bookkeeping.
    bool identical = true;
    for (std::size_t i = at; i < end; ++i) identical &= (x[i] - ref[i] == 0);
    if (identical) {
      for (std::size_t i = at; i < end4; i += 4) {
        r0 += ref[i] * ref[i];
        r1 += ref[i + 1] * ref[i + 1];
        r2 += ref[i + 2] * ref[i + 2];
        r3 += ref[i + 3] * ref[i + 3];
      }
      for (std::size_t i = end4; i < end; ++i) r0 += ref[i] * ref[i];
      if (at == 0) {
        worst_ratio = std::max(worst_ratio, 0.0);
        worst = 0;
      }
      if (!s.ref_sq.add_partial((r0 + r1) + (r2 + r3)))
        for (std::size_t i = at; i < end; ++i) s.ref_sq.add_value(ref[i]);
      at = end;
      continue;
    }
    for (std::size_t i = at; i < end4; i += 4) {
      element(i, e0, r0);
      element(i + 1, e1, r1);
      element(i + 2, e2, r2);
      element(i + 3, e3, r3);
    }
    for (std::size_t i = end4; i < end; ++i) element(i, e0, r0);
    // A unit whose squares overflowed (values beyond ~1e154) is added again
    // value by value, scaled (see SquareSum): rare, and never on clean data.
    if (!s.err_sq.add_partial((e0 + e1) + (e2 + e3)))
      for (std::size_t i = at; i < end; ++i) s.err_sq.add_value(std::abs(x[i] - ref[i]));
    if (!s.ref_sq.add_partial((r0 + r1) + (r2 + r3)))
      for (std::size_t i = at; i < end; ++i) s.ref_sq.add_value(ref[i]);
    at = end;
  }
  s.n_fail += fails;
  s.any_nan_error = s.any_nan_error || nan_error;
  s.max_abs = std::max(s.max_abs, max_abs);
  s.max_rel = std::max(s.max_rel, max_rel);
  s.n_total += static_cast<long long>(n);
  if (n == 0) return;
  s.owner_err_ratio.push_back({g.owner, worst_ratio});
  // Within a block, local row-major order is global order, so the first worst
  // element of the chunk is also its lowest global index.
  s.offer_reference({worst_ratio,
                     global_flat_index(p.tap->local_shape, p.global, g.block, first + worst),
                     g.owner, x[worst], ref[worst]});
}

// Where the items of a tap run: this process's threads, and the processes
// that share the work (each takes the items i with i % size == rank).
struct Workers {
  int threads = 1;
  const Comm* processes = nullptr;  // null: this process alone
  int rank() const { return processes ? processes->rank() : 0; }
  int size() const { return processes ? processes->size() : 1; }
};

// Items `items` on up to `threads` threads, each thread with its own stats,
// merged. The first exception (e.g. an unreadable file) stops the other
// threads and is rethrown.
template <class Work>
TapStats run_item_list(const std::vector<std::size_t>& items, int threads_wanted, Work& work) {
  int threads = static_cast<int>(std::min<std::size_t>(std::max(1, threads_wanted), std::max<std::size_t>(items.size(), 1)));
  std::vector<TapStats> parts(static_cast<std::size_t>(threads));
  std::atomic<std::size_t> next{0};
  std::atomic<bool> stop{false};
  std::exception_ptr error;
  std::mutex error_mu;
  auto loop = [&](int k) {
    try {
      for (std::size_t j; !stop && (j = next++) < items.size();)
        work(items[j], parts[static_cast<std::size_t>(k)], k);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
      stop = true;
    }
  };
  if (threads == 1) {
    loop(0);
  } else {
    std::vector<std::thread> pool;
    for (int k = 0; k < threads; ++k) pool.emplace_back(loop, k);
    for (auto& t : pool) t.join();
  }
  if (error) std::rethrow_exception(error);
  TapStats all;
  for (const auto& p : parts) all.merge(p);
  all.finish();  // compact: one per-rank entry per rank before it travels
  return all;
}

// This process's share of items 0..n-1 (i % size == rank) on its threads.
template <class Work>
TapStats run_local_items(std::size_t n, const Workers& w, Work& work) {
  std::vector<std::size_t> mine;
  for (std::size_t i = static_cast<std::size_t>(w.rank()); i < n; i += static_cast<std::size_t>(w.size()))
    mine.push_back(i);
  return run_item_list(mine, w.threads, work);
}

// Every process's stats from `local()`, merged on every process. Processes
// agree on failure as well: a process that could not read its share sends its
// error instead, and every process throws the lowest rank's error, so none
// waits for another.
template <class Local>
TapStats merge_processes(const Comm* processes, Local&& local) {
  if (!processes || processes->size() == 1) {
    TapStats s = local();
    s.finish();
    return s;
  }
  std::string mine;
  try {
    mine = "S" + local().encode();
  } catch (const InputError& e) {
    mine = std::string("I") + e.what();
  } catch (const std::exception& e) {
    mine = std::string("E") + e.what();
  }
  auto all = processes->all_gather_strings(mine);
  TapStats s;
  for (const auto& part : all) {
    if (part.empty()) fail("comparator: empty statistics from another process");
    if (part[0] == 'I') throw InputError(part.substr(1));
    if (part[0] == 'E') throw Error(part.substr(1));
    s.merge(TapStats::decode(part.substr(1)));
  }
  s.finish();
  return s;
}

// Every item's stats, merged on every process.
template <class Work>
TapStats run_items(std::size_t n, const Workers& w, Work&& work) {
  return merge_processes(w.processes, [&] { return run_local_items(n, w, work); });
}

// Items of a distributed source (see ActivationData::holders), in rounds: a
// round's items run on the process that plan(round) names for each, after
// the source has staged every process's reads of the round. A process whose
// work failed keeps joining the rounds (they are collective) and reports its
// error at the merge.
struct Round {
  std::vector<std::size_t> items;  // item numbers of the round
  std::vector<int> reader;         // per item, the process that runs it
  std::vector<PlannedRead> reads;  // of every process
};

template <class Plan, class Work>
TapStats run_rounds(const ActivationSet& set, const TapData& t, std::size_t rounds, int threads,
                    Plan&& plan, Work&& work) {
  const Comm* holders = set.data->holders();
  TapStats mine;
  std::exception_ptr error;
  for (std::size_t round = 0; round < rounds; ++round) {
    const Round r = plan(round);
    set.data->stage(t, r.reads);
    if (error) continue;
    std::vector<std::size_t> local;
    for (std::size_t i = 0; i < r.items.size(); ++i)
      if (r.reader[i] == holders->rank()) local.push_back(r.items[i]);
    try {
      mine.merge(run_item_list(local, threads, work));
    } catch (...) {
      error = std::current_exception();
    }
  }
  return merge_processes(holders, [&] {
    if (error) std::rethrow_exception(error);
    return mine;
  });
}

// Values one round of a distributed source may stage for one process: an
// eighth of what the budget leaves beside the program (see chunk_elements),
// since a round's values exist up to four times (packed, sent, received,
// staged) next to the chunk buffers.
std::size_t staging_elements(std::size_t budget) {
  const std::size_t rest = budget > 2 * kProcessAllowance ? budget - kProcessAllowance : budget / 2;
  return std::max<std::size_t>(rest / 8 / sizeof(double), 4096);
}

struct Buffers {
  std::vector<double> leader, other, sum, ref;
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
    ToleranceInputs in{t.dtype, t.reduction_depth, t.atol, t.rtol, opts.atol, opts.rtol, 0.0,
                       t.tolerance_factor.value_or(1.0)};
    if (opts.measure_floor) in = {t.dtype, t.reduction_depth, {}, {}, {}, 1.0, 0.0, 1.0};
    if (opts.tolerances) {
      in.measured = opts.tolerances->find(t.name);
      in.measured_source = opts.tolerances->source;
    }
    if (tolerance_needs_rms(in)) in.reference_rms = reference_rms(set, p, chunk, unit, opts.memory_budget, threads, bufs);
    tol = derive_tolerance(in);
  }

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
    const bool sum = has_ref && g.leaders.size() > 1;
    if (sum) std::fill_n(b.sum.begin(), n, 0.0);
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
    set.data->read_reference(t, to_global(slab, t.local_shape, g.block), b.ref.data());
    scan_reference(sum ? b.sum.data() : b.leader.data(), b.ref.data(), n, tol, p, g, first, plan, st);
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
  // Every axis along which some differing rank sits apart from its leader.
  std::vector<bool> apart(mesh.axes().size(), false);
  for (int r : rc.differing) {
    auto a = mesh.coords(replica_leader_of(t, mesh, r)), b = mesh.coords(r);
    for (std::size_t i = 0; i < a.size(); ++i) apart[i] = apart[i] || a[i] != b[i];
  }
  for (std::size_t i = 0; i < apart.size(); ++i)
    if (apart[i]) rc.axes.push_back(mesh.axes()[i].name);

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
    if (tol.rel_l2_limit) {
      ref.l2_ratio = *tol.rel_l2_limit > 0 ? ref.rel_l2 / *tol.rel_l2_limit : ref.rel_l2 > 0 ? INFINITY : 0.0;
      ref.pass = ref.pass && *ref.l2_ratio <= 1;
    }
  }
  return v;
}

}  // namespace

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
      return ia > ib ? ia - ib : ib - ia;  // may wrap for opposite extremes; fine as "huge"
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
    TapVerdict v = check_tap(set, t, opts, chunk, workers, bufs);
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
