#include "harness/check/sketch_check.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "harness/check/against.h"
#include "harness/check/column_error.h"
#include "harness/check/tap_plan.h"
#include "harness/check/tolerance.h"
#include "harness/core/error.h"

namespace dc {
namespace {

// 2.6 standard errors: 99% of a normal.
constexpr double kBoundSigmas = 2.6;

// The sketch's own layout: the token dimension's axes become partial-sum axes
// (pieces along tokens add up), lead and width shards stay where they are.
TapData sketch_as_tap(const TapData& t) {
  TapData s = t;
  s.local_shape = t.sketch->stored_shape;
  const std::size_t tokens_dim = t.sketch->token_dim(s.local_shape.size());
  if (s.layout.spec.size() > tokens_dim) {
    auto& entry = s.layout.spec[tokens_dim];
    s.layout.partial.insert(s.layout.partial.end(), entry.begin(), entry.end());
    entry.clear();
  }
  // Replicas that each sketched a share of the tokens: their sketches add up.
  s.layout.partial.insert(s.layout.partial.end(), t.sketch->shared_axes.begin(), t.sketch->shared_axes.end());
  return s;
}

Shape sketch_shape(const Shape& tensor, std::size_t k, std::size_t token_dim) {
  Shape s = tensor;
  s[token_dim] = k + 1;
  return s;
}

// The shape as the estimate reads it: [lead..., tokens, width], the
// dimensions after the token dimension one width (row-major, as stored).
Shape tokens_by_width(const Shape& tensor, std::size_t token_dim) {
  Shape s(tensor.begin(), tensor.begin() + static_cast<std::ptrdiff_t>(token_dim) + 1);
  std::size_t width = 1;
  for (std::size_t i = token_dim + 1; i < tensor.size(); ++i) width *= tensor[i];
  s.push_back(width);
  return s;
}

}  // namespace

int sketch_sign(std::uint32_t seed, std::uint32_t row, std::uint64_t token) {
  std::uint32_t h = seed * 0x9E3779B1u + row * 0x85EBCA77u + static_cast<std::uint32_t>(token) * 0xC2B2AE3Du;
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return (h & 1u) ? -1 : 1;
}

std::vector<double> sketch_sign_sums(std::uint32_t seed, std::size_t k, std::size_t tokens) {
  std::vector<double> sums(k, 0.0);
  for (std::size_t i = 0; i < k; ++i) {
    long long s = 0;
    for (std::size_t t = 0; t < tokens; ++t) s += sketch_sign(seed, static_cast<std::uint32_t>(i), t);
    sums[i] = static_cast<double>(s);
  }
  return sums;
}

SketchEstimate estimate_from_sketches(const std::vector<double>& x, const std::vector<double>& ref, std::size_t k,
                                      const Shape& global, const std::vector<double>& sign_sums) {
  const std::size_t tokens = global[global.size() - 2], width = global.back();
  const std::size_t lead = tokens > 0 && width > 0 ? numel(global) / (tokens * width) : 0;
  const double T = static_cast<double>(tokens);
  std::vector<double> qd(k, 0.0), qr(k, 0.0);
  double mean_d = 0, mean_r = 0, column_sq = 0;
  for (std::size_t l = 0; l < lead; ++l)
    for (std::size_t w = 0; w < width; ++w) {
      const auto at = [&](std::size_t i) { return (l * (k + 1) + i) * width + w; };
      const double c = x[at(k)] - ref[at(k)], cr = ref[at(k)];
      mean_d += c * c / T;
      mean_r += cr * cr / T;
      column_sq += (c / T) * (c / T);
      for (std::size_t i = 0; i < k; ++i) {
        const double a = (x[at(i)] - ref[at(i)]) - sign_sums[i] * c / T;
        const double b = ref[at(i)] - sign_sums[i] * cr / T;
        qd[i] += a * a;
        qr[i] += b * b;
      }
    }
  // Each row's estimate of the squared norms, the exact mean part added.
  const auto mean_and_se = [&](const std::vector<double>& q, double exact) {
    double m = 0;
    for (double v : q) m += v;
    m /= static_cast<double>(k);
    double var = 0;
    for (double v : q) var += (v - m) * (v - m);
    const double se = k > 1 ? std::sqrt(var / static_cast<double>(k - 1) / static_cast<double>(k)) : INFINITY;
    const double total = m + exact;
    return std::pair{total, total > 0 ? se / total : 0.0};
  };
  const auto [err_sq, se_d] = mean_and_se(qd, mean_d);
  const auto [ref_sq, se_r] = mean_and_se(qr, mean_r);
  SketchEstimate e;
  e.rel_l2 = ref_sq > 0 ? std::sqrt(err_sq / ref_sq) : err_sq > 0 ? INFINITY : 0.0;
  if (std::isnan(err_sq)) e.rel_l2 = NAN;
  e.bound = kBoundSigmas * 0.5 * std::sqrt(se_d * se_d + se_r * se_r);
  const double n = static_cast<double>(numel(global));
  e.reference_rms = n > 0 ? std::sqrt(ref_sq / n) : 0.0;
  const ColumnLayout cl = column_layout(global);
  if (cl.tracked()) {
    const double rms = std::sqrt(column_sq / static_cast<double>(cl.columns));
    e.column_mean = !std::isfinite(rms) ? NAN : e.reference_rms > 0 ? rms / e.reference_rms : rms > 0 ? INFINITY : 0.0;
  }
  return e;
}

std::vector<double> global_sketch(const ActivationSet& set, const TapData& t) {
  const TapData s = sketch_as_tap(t);
  const TapPlan p = plan_tap(s, set.mesh);
  std::vector<double> out(numel(p.global), 0.0), piece(numel(s.local_shape));
  const Slab all{Shape(s.local_shape.size(), 0), s.local_shape};
  for (const auto& g : p.groups)
    for (int leader : g.leaders) {  // rank order: the order of the float64 sum
      set.data->read_piece(s, leader, all, piece.data());
      for (std::size_t j = 0; j < piece.size(); ++j)
        out[global_flat_index(s.local_shape, p.global, g.block, j)] += piece[j];
    }
  return out;
}

std::vector<double> reference_sketch(const ActivationSet& set, const TapData& t) {
  const Shape& global = *t.reference_shape;
  const std::size_t k = t.sketch->rows, nd = global.size(), d = t.sketch->token_dim(nd);
  const Shape shape = sketch_shape(global, k, d);
  std::vector<double> out(numel(shape), 0.0);
  if (t.sketch->reference_is_sketch) {
    set.data->read_reference(t, Slab{Shape(nd, 0), shape}, out.data());
    return out;
  }
  // Sketched here from the whole reference, a few token rows at a time (a
  // token row: every element after the token dimension, one width).
  const Shape flat = tokens_by_width(global, d);
  const std::size_t tokens = global[d], width = flat.back();
  const std::size_t lead = tokens > 0 && width > 0 ? numel(global) / (tokens * width) : 0;
  const std::size_t rows_per_read = std::max<std::size_t>(1, (std::size_t{1} << 20) / std::max<std::size_t>(width, 1));
  const Shape lead_shape(global.begin(), global.begin() + static_cast<std::ptrdiff_t>(d));
  std::vector<double> buf;
  for (std::size_t l = 0; l < lead; ++l) {
    Slab slab{unravel(l, lead_shape), Shape(d, 1)};
    slab.start.insert(slab.start.end(), nd - d, 0);
    slab.count.push_back(0);
    slab.count.insert(slab.count.end(), global.begin() + static_cast<std::ptrdiff_t>(d) + 1, global.end());
    double* o = out.data() + l * (k + 1) * width;
    for (std::size_t t0 = 0; t0 < tokens; t0 += rows_per_read) {
      const std::size_t n = std::min(rows_per_read, tokens - t0);
      slab.start[d] = t0;
      slab.count[d] = n;
      buf.resize(n * width);
      set.data->read_reference(t, slab, buf.data());
      for (std::size_t j = 0; j < n; ++j) {
        const double* row = buf.data() + j * width;
        for (std::size_t i = 0; i < k; ++i) {
          const double s = sketch_sign(t.sketch->seed, static_cast<std::uint32_t>(i), t0 + j);
          double* oi = o + i * width;
          for (std::size_t w = 0; w < width; ++w) oi[w] += s * row[w];
        }
        double* ok = o + k * width;
        for (std::size_t w = 0; w < width; ++w) ok[w] += row[w];
      }
    }
  }
  return out;
}

TapVerdict check_sketch_tap(const ActivationSet& set, const TapData& t, const CompareOptions& opts) {
  const SketchInfo& sk = *t.sketch;
  const Mesh& mesh = set.mesh;
  const auto world = static_cast<std::size_t>(set.world_size);
  TapVerdict v = blank_verdict(t, t.layout.global_shape(mesh, t.local_shape));
  if (sk.pieces.size() != world) fail("tap '{}': sketch pieces of {} ranks, not {}", t.name, sk.pieces.size(), world);

  // Non-finite: the exact counts, per rank (no index: the values are not here).
  NonFinite& nf = v.nonfinite;
  v.ranks.nonfinite.assign(world, 0);
  v.ranks.replica_diff.assign(world, 0.0);
  for (std::size_t r = 0; r < world; ++r) {
    const SketchPiece& p = sk.pieces[r];
    nf.nan += p.nan;
    nf.inf += p.inf;
    v.ranks.nonfinite[r] = p.nan + p.inf;
    if (p.nan && !nf.first_nan) nf.first_nan = ElementRef{static_cast<int>(r), {}};
    if (p.inf && !nf.first_inf) nf.first_inf = ElementRef{static_cast<int>(r), {}};
    if (p.nan || p.inf) nf.ranks.push_back(static_cast<int>(r));
  }

  // Replicas: bitwise, by hash.
  const TapPlan plan = plan_tap(t, mesh);
  ReplicaCheck& rc = v.replica;
  rc.applies = plan.replicated;
  rc.by_hash = true;
  for (const auto& g : plan.groups)
    for (std::size_t li = 0; li < g.leaders.size(); ++li)
      for (int r : g.replicas[li])
        if (sk.pieces[static_cast<std::size_t>(r)].bits_hash != sk.pieces[static_cast<std::size_t>(g.leaders[li])].bits_hash) {
          if (rc.differing.empty()) rc.leader = g.leaders[li], rc.other = r;
          rc.differing.push_back(r);
          v.ranks.replica_diff[static_cast<std::size_t>(r)] = INFINITY;  // how far apart is not known
        }
  std::sort(rc.differing.begin(), rc.differing.end());
  rc.max_abs = rc.differing.empty() ? 0.0 : NAN;
  rc.pass = rc.differing.empty();
  rc.axes = replica_axes_apart(t, mesh, rc.differing);

  if (!t.reference_shape) return v;
  const Shape& global = v.global_shape;
  const std::size_t d = sk.token_dim(global.size());
  // Run against run: the other run's global sketch, made alike, stands for the reference's.
  const std::vector<double> x = global_sketch(set, t),
                            r = t.against ? global_sketch(*t.against_run, *t.against) : reference_sketch(set, t);
  SketchEstimate e = estimate_from_sketches(x, r, sk.rows, tokens_by_width(global, d),
                                            sketch_sign_sums(sk.seed, sk.rows, global[d]));
  // Columns along another dimension than a whole tap's (its second-to-last):
  // a column-mean limit, measured or derived for those, would not apply.
  if (d + 2 != global.size()) e.column_mean.reset();
  ToleranceInputs in = tap_tolerance_inputs(set, t, opts);
  in.reference_rms = e.reference_rms;
  Tolerance tol = derive_tolerance(in);
  add_other_runs_bound(set, t, opts, e.reference_rms, tol);
  // Without a norm-wise limit of its own, the one an element-wise pass
  // implies: |x - ref| <= atol + rtol |ref| for all elements gives
  // ||x - ref|| <= atol sqrt(n) + rtol ||ref||.
  if (!tol.rel_l2_limit) tol.rel_l2_limit = (e.reference_rms > 0 ? tol.atol / e.reference_rms : 0.0) + tol.rtol;
  ReferenceCheck& ref = v.reference;
  ref.present = true;
  ref.other_run = t.against != nullptr;
  ref.estimated = true;
  ref.estimate_bound = e.bound;
  ref.tol = tol;
  ref.rel_l2 = e.rel_l2;
  ref.max_abs = ref.max_rel = NAN;
  ref.n_total = static_cast<long long>(numel(global));
  // A floor measured from sketches has no element figure: infinite, so that
  // a whole tap held to it is held norm-wise and by its column means only.
  if (opts.measure_floor) ref.worst_ratio = INFINITY;
  if (e.column_mean && (opts.measure_floor || tol.column_mean_limit)) ref.column_mean = e.column_mean;
  v.ranks.err_over_tol.assign(world, 0.0);
  judge_whole_tensor(ref, v.ranks.err_over_tol);  // rel L2 always has a limit here
  return v;
}

}  // namespace dc
