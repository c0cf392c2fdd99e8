#include "harness/check/column_error.h"

#include <cmath>
#include <cstdint>

namespace dc {
namespace {

// One thread's per-column partial sums of the current summation unit. The
// entries are zero between units (flush() clears what it used), so a chunk
// costs its own elements, not the tap's columns.
struct Partials {
  std::vector<double> sum;
  std::vector<std::uint8_t> used;
  std::vector<std::size_t> touched;

  void fit(std::size_t columns) {
    if (sum.size() < columns) {
      sum.resize(columns, 0.0);
      used.resize(columns, 0);
    }
  }
  void add(std::size_t c, double e) {
    if (!used[c]) {
      used[c] = 1;
      touched.push_back(c);
    }
    sum[c] += e;
  }
  void flush(std::vector<ExactSum>& into) {
    for (std::size_t c : touched) {
      into[c].add(sum[c]);
      sum[c] = 0;
      used[c] = 0;
    }
    touched.clear();
  }
};

double value(StoredValues v, std::size_t i) {
  return v.element_size == sizeof(float) ? static_cast<const float*>(v.data)[i]
                                         : static_cast<const double*>(v.data)[i];
}

}  // namespace

ColumnLayout column_layout(const Shape& global) {
  ColumnLayout c;
  if (global.size() < 2) return c;
  const std::size_t tokens = global[global.size() - 2], n = numel(global);
  if (tokens < kColumnMinTokens || n == 0 || n / tokens > kColumnMaxColumns) return c;
  c.tokens = tokens;
  c.width = global.back();
  c.columns = n / tokens;
  c.lead.assign(global.begin(), global.end() - 2);
  return c;
}

void add_column_errors(StoredValues x, StoredValues ref, std::size_t n, const ColumnLayout& layout, const Slab& box,
                       std::size_t first, const ChunkPlan& plan, std::vector<ExactSum>& sums) {
  if (!layout.tracked() || n == 0) return;
  if (sums.empty()) sums.resize(layout.columns);
  thread_local Partials p;
  p.fit(layout.columns);
  const std::size_t dims = box.start.size();
  // The box's coordinates of the current row (all but the last dimension),
  // row-major; a row runs along the last dimension.
  std::vector<std::size_t> at(dims, 0);
  const std::size_t row = box.count[dims - 1];
  std::size_t unit_end = plan.unit_left(first);
  for (std::size_t i = 0; i < n;) {
    // A column is the element's index over the global dimensions other than
    // the tokens' (the second to last).
    std::size_t lead = 0;
    for (std::size_t d = 0; d + 2 < dims; ++d) lead = lead * layout.lead[d] + box.start[d] + at[d];
    const std::size_t base = lead * layout.width + box.start[dims - 1];
    for (std::size_t j = 0; j < row && i < n; ++j, ++i) {
      if (i == unit_end) {
        p.flush(sums);
        unit_end = i + plan.unit_left(first + i);
      }
      p.add(base + j, value(x, i) - value(ref, i));
    }
    for (std::size_t d = dims - 1; d-- > 0;) {
      if (++at[d] < box.count[d]) break;
      at[d] = 0;
    }
  }
  p.flush(sums);
}

double column_mean_error(const std::vector<ExactSum>& sums, const ColumnLayout& layout, double reference_rms) {
  if (!layout.tracked() || sums.empty()) return 0;
  double sq = 0;
  const double tokens = static_cast<double>(layout.tokens);
  for (const auto& s : sums) {
    const double m = s.value() / tokens;
    sq += m * m;
  }
  const double rms = std::sqrt(sq / static_cast<double>(sums.size()));
  if (!std::isfinite(rms)) return NAN;
  if (reference_rms > 0) return rms / reference_rms;
  return rms > 0 ? INFINITY : 0.0;
}

}  // namespace dc
