// The three checks of a sketch tap (docs/FORMAT.md, "Sketch taps"), made
// from each piece's linear sketch, exact NaN/Inf counts and bits hash:
//
//   non-finite  the counts, summed over ranks (exact; no element index)
//   replicas    every piece's hash against its replica leader's (bitwise)
//   reference   the global sketch (pieces summed over token shards and
//               partial sums, placed along lead and width shards) against the
//               reference's (stored as a sketch, or sketched here from the
//               whole reference with the same signs): the rel L2 error and the
//               reference's RMS estimated, the column means exact
//
// The estimate. Each sketch row i < k is R_i x with R_i a row of +-1 signs,
// so E (R_i d)^2 = ||d||^2 for any column d: every row gives an unbiased
// estimate of ||x - ref||^2 and of ||ref||^2. The exact column sums (row k)
// are taken out first (the centred part is sketched, the mean part is known
// exactly), which removes what is rank one in activations (a feature's
// offset shared by every token) and with it most of the estimate's variance.
// The k rows' spread gives the estimate's standard error; the report states
// 2.6 of them (99% of a normal) as its bound.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "harness/capture/activations.h"
#include "harness/check/compare.h"

namespace dc {

// R[i, t] for sketch row i and global token t (docs/FORMAT.md spells it out).
int sketch_sign(std::uint32_t seed, std::uint32_t row, std::uint64_t token);

// sum_t R[i, t] over tokens 0..tokens-1, for each row i < k.
std::vector<double> sketch_sign_sums(std::uint32_t seed, std::size_t k, std::size_t tokens);

struct SketchEstimate {
  double rel_l2 = 0;         // ||x - ref|| / ||ref||, estimated
  double bound = 0;          // its relative uncertainty (99%)
  double reference_rms = 0;  // estimated
  std::optional<double> column_mean;  // exact column-mean error (check/column_error.h), when the shape has one
};

// The figures of a global sketch `x` against the reference's `ref` (both
// [lead, k+1, width], row-major) of a tensor of shape `global`.
SketchEstimate estimate_from_sketches(const std::vector<double>& x, const std::vector<double>& ref, std::size_t k,
                                      const Shape& global, const std::vector<double>& sign_sums);

// The global sketch of a sketch tap (its pieces assembled) and of its reference.
std::vector<double> global_sketch(const ActivationSet& set, const TapData& t);
std::vector<double> reference_sketch(const ActivationSet& set, const TapData& t);

TapVerdict check_sketch_tap(const ActivationSet& set, const TapData& t, const CompareOptions& opts);

}  // namespace dc
