#include "harness/check/tap_stats.h"

#include <algorithm>
#include <tuple>

namespace dc {
namespace {

template <class T>
void keep_first(std::optional<T>& mine, const std::optional<T>& other) {
  if (other && (!mine || *other < *mine)) mine = other;
}

void append(std::vector<int>& a, const std::vector<int>& b) { a.insert(a.end(), b.begin(), b.end()); }

void sort_unique(std::vector<int>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

}  // namespace

void TapStats::offer_replica(const ReplicaWorst& w) {
  if (!replica_worst ||
      std::make_tuple(-w.key, w.rank, w.flat) <
          std::make_tuple(-replica_worst->key, replica_worst->rank, replica_worst->flat))
    replica_worst = w;
}

void TapStats::offer_reference(const RefWorst& w) {
  if (!ref_worst || std::make_tuple(-w.ratio, w.global_flat) <
                        std::make_tuple(-ref_worst->ratio, ref_worst->global_flat))
    ref_worst = w;
}

void TapStats::merge(const TapStats& o) {
  nan += o.nan;
  inf += o.inf;
  keep_first(first_nan, o.first_nan);
  keep_first(first_inf, o.first_inf);
  append(nonfinite_ranks, o.nonfinite_ranks);
  if (o.replica_worst) offer_replica(*o.replica_worst);
  max_ulp = std::max(max_ulp, o.max_ulp);
  append(differing, o.differing);
  n_fail += o.n_fail;
  n_total += o.n_total;
  any_nan_error = any_nan_error || o.any_nan_error;
  max_abs = std::max(max_abs, o.max_abs);
  max_rel = std::max(max_rel, o.max_rel);
  err_sq.add(o.err_sq);
  ref_sq.add(o.ref_sq);
  if (o.ref_worst) offer_reference(*o.ref_worst);
}

void TapStats::finish() {
  sort_unique(nonfinite_ranks);
  sort_unique(differing);
}

}  // namespace dc
