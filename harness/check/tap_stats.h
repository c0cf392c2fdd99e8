// The statistics of one tap's three checks, accumulated chunk by chunk and
// merged across threads (or processes) into the same result whatever the
// partition: every "first" and "worst" is chosen by an explicit key with a
// tie-break on the element's position. Sums of squares (for rel L2 and the
// reference RMS) are plain float64 within a chunk and double-double across
// chunks, so they agree between partitions to the last few bits only; every
// count, maximum, index and verdict is exact.
#pragma once
#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

namespace dc {

// A sum kept as an unevaluated pair hi + lo (Knuth's TwoSum on every add).
struct DoubleDouble {
  double hi = 0, lo = 0;
  void add(double x) {
    double s = hi + x;
    double bp = s - hi;
    double err = (hi - (s - bp)) + (x - bp);
    hi = s;
    lo += err;
  }
  void add(const DoubleDouble& o) {
    add(o.hi);
    add(o.lo);
  }
  double value() const { return hi + lo; }
};

struct TapStats {
  // non-finite: counts, first (rank, local flat index) of each, ranks with any
  long long nan = 0, inf = 0;
  std::optional<std::pair<int, std::size_t>> first_nan, first_inf;
  std::vector<int> nonfinite_ranks;

  // replica: worst difference by (key desc, rank asc, index asc)
  struct ReplicaWorst {
    double key = -1;  // |a-b|, +inf for a NaN difference
    int rank = -1, leader = -1;
    std::size_t flat = 0;
    double leader_value = 0, value = 0, diff = 0;
  };
  std::optional<ReplicaWorst> replica_worst;
  long long max_ulp = 0;
  std::vector<int> differing;

  // reference: worst element by (ratio desc, global index asc)
  long long n_fail = 0, n_total = 0;
  bool any_nan_error = false;
  double max_abs = 0, max_rel = 0;
  DoubleDouble err_sq, ref_sq;
  struct RefWorst {
    double ratio = -1;
    std::size_t global_flat = 0;
    int owner = -1;  // the block owner (rank) of the element
    double value = 0, reference = 0;
  };
  std::optional<RefWorst> ref_worst;

  void offer_replica(const ReplicaWorst& w);
  void offer_reference(const RefWorst& w);
  void merge(const TapStats& o);
  // Sorts and de-duplicates the rank lists (after the last merge).
  void finish();
};

}  // namespace dc
