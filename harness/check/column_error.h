// The column-mean error of a tap (docs/tolerances.md, "Column means"): the
// error x - ref averaged over the tap's token dimension (the second to last)
// for each column (every other index), as an RMS relative to the
// reference's:
//
//   column_mean = sqrt(mean_c (sum_t (x - ref)[.., t, c] / tokens)^2) / rms(ref)
//
// Why: a fault that adds the same wrong amount to every token of a feature —
// a bias added on every tensor-parallel rank, a scale applied twice to a
// norm's weight — keeps it whole in the column mean, while rounding noise,
// which changes sign from token to token, shrinks by up to sqrt(tokens). In
// bfloat16 such a fault hides under the rel L2 of rounding until it is a few
// times larger than what this catches. The limit on it is measured like the
// others (check/noise_floor.h); a tap without that limit does not pay for it.
//
// The sums are exact (ExactSum, one per column, one float64 partial sum per
// summation unit), so the figure does not depend on chunks, threads or
// processes.
#pragma once
#include <cstddef>
#include <vector>

#include "harness/capture/activations.h"
#include "harness/check/chunks.h"
#include "harness/check/exact_sum.h"
#include "harness/check/scans.h"

namespace dc {

// Too few tokens and a column mean is no average; too many columns and the
// exact sums (about 560 bytes each, per thread) outgrow the memory budget.
inline constexpr std::size_t kColumnMinTokens = 16;
inline constexpr std::size_t kColumnMaxColumns = std::size_t{1} << 14;

struct ColumnLayout {
  std::size_t tokens = 0;   // the global tensor's second-to-last dimension
  std::size_t width = 0;    // its last dimension
  std::size_t columns = 0;  // elements / tokens; 0: the tap has no column means
  Shape lead;               // the dimensions before the tokens
  bool tracked() const { return columns > 0; }
};

// The layout of a global shape: no column means for fewer than two
// dimensions, fewer than kColumnMinTokens tokens or more than
// kColumnMaxColumns columns.
ColumnLayout column_layout(const Shape& global);

// Adds x - ref of one chunk to `sums` (resized to the layout's columns on
// first use). `box`: the chunk in global coordinates (the elements are its
// row-major order); `first`: its first flat index in the plan's tensor, for
// the summation units.
void add_column_errors(StoredValues x, StoredValues ref, std::size_t n, const ColumnLayout& layout, const Slab& box,
                       std::size_t first, const ChunkPlan& plan, std::vector<ExactSum>& sums);

// The column-mean error (above) from the exact column sums; NaN when a sum
// is not finite, 0 for a reference of RMS 0 with sums of 0.
double column_mean_error(const std::vector<ExactSum>& sums, const ColumnLayout& layout, double reference_rms);

}  // namespace dc
