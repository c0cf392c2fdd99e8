// The statistics of one tap's three checks, accumulated chunk by chunk and
// merged across threads (or processes) into the same result whatever the
// partition: every "first" and "worst" is chosen by an explicit key with a
// tie-break on the element's position, and sums of squares (for rel L2 and the
// reference RMS) are exact sums of per-unit partial sums (units that do not
// depend on the partition), so a merged result is bit-identical whatever the
// chunks, threads or processes.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "harness/check/exact_sum.h"

namespace dc {

// A value attributed to one rank (or one block owner), merged by rank.
struct RankValue {
  int rank = -1;
  double value = 0;
  bool operator<(const RankValue& o) const { return rank < o.rank; }
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
  SquareSum err_sq, ref_sq;  // per summation unit, see compare.cpp
  // Exact sums of x - ref per column (check/column_error.h); empty unless the
  // tap's column means are measured.
  std::vector<ExactSum> column_err;
  struct RefWorst {
    double ratio = -1;
    std::size_t global_flat = 0;
    int owner = -1;  // the block owner (rank) of the element
    double value = 0, reference = 0;
  };
  std::optional<RefWorst> ref_worst;

  // Per rank, for reports that show every rank (heatmaps), sparse: non-finite
  // counts of ranks that have any, largest |difference| to the replica leader
  // of ranks that differ (+inf for NaN), and the worst err/tol of each block
  // owner's block (for the reference check). finish() leaves one entry per
  // rank, sorted: counts summed, the others the maximum.
  std::vector<RankValue> rank_nonfinite, rank_replica_diff, owner_err_ratio;
  // Each block owner's own sums of squared errors and of squared reference
  // values (plain doubles: a heatmap cell's rel L2, not a verdict), summed.
  std::vector<RankValue> owner_err_sq, owner_ref_sq;

  void offer_replica(const ReplicaWorst& w);
  void offer_reference(const RefWorst& w);
  void merge(const TapStats& o);
  // A byte string another process can merge (same build, same machine kind).
  std::string encode() const;
  static TapStats decode(const std::string& bytes);
  // Sorts and de-duplicates the rank lists (after the last merge).
  void finish();
};

}  // namespace dc
