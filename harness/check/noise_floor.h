// Noise floors: how far a correct computation in the run's dtype on one
// device lands from the float64 reference, per tap, and the tolerances made
// of them (docs/tolerances.md, "Calibrated").
//
// A floor is measured by comparing such a computation (a scenario run on one
// rank, R times with its inputs and weights perturbed by one rounding: run/
// calibrate.h; or a user's single-device dump: compare --noise-floor) with the
// reference, in two figures per tap:
//   element  max_i |x_i - ref_i| / (rms(ref) + |ref_i|)   (the derived rule's form)
//   rel_l2   ||x - ref|| / ||ref||
// and the tolerance is k times the floor plus one rounding of the accumulator
// (u_acc: float32's for 16- and 32-bit dtypes, check/tolerance.h):
//   rtol         = kElementFactor * element + u_acc     atol = rtol * rms(ref)
//   rel_l2_limit = kNormFactor * rel_l2 + u_acc
// and, when the floor was measured on the run's own inputs (the same seed,
// flags and steps: --tolerance calibrated, or a file calibrated on the run's
// seed), the norm-wise limit is also at most
//   kSameInputsFactor * rel_l2_as_is + u_acc
// with rel_l2_as_is the unperturbed one-device run's (FlashAttention's test:
// the same computation in the same dtype on one device, 2x) — for the taps a
// one-device run computes alike: not those marked `per_mesh` (a ring step's
// partial attention covers one block of keys on the mesh, all on one device).
// Element-wise catches a few elements gone wrong (a tile's missing corner);
// norm-wise catches a small error spread over all of them (an offset LSE),
// which hides below an element-wise bound set by the worst of millions.
// A third figure, for taps with tokens (check/column_error.h), the error's
// mean over the tokens of each column, gets the norm's limits
// (kNormFactor x its floor; kSameInputsFactor x run 0's on the run's own
// inputs): it catches the same wrong amount in every token of a feature (a
// bias added on every tensor-parallel rank), which rounding noise, changing
// sign from token to token, does not reach.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "harness/check/compare.h"
#include "harness/check/tolerance.h"

namespace dc {

// Chosen from measurements (docs/tolerances.md): the largest ratio of a clean
// sharded run's error to a one-device floor measured on another seed, over
// every scenario, both dtypes and 100 seeds, was 2.9 element-wise (the worst
// of up to a million elements varies from seed to seed); norm-wise 1.3 over
// 10 seeds.
inline constexpr double kElementFactor = 4.0;
inline constexpr double kNormFactor = 3.0;
// On the run's own inputs the sharded run's rel L2 error stayed within 1.4x
// of the one-device run's (100 seeds of every scenario, both dtypes, taps
// not per_mesh; docs/tolerances.md): the two round the same values the same way, and only
// the order of their sums differs. A seed's own floor is not spread by
// other seeds, so the factor can be FlashAttention's 2.
inline constexpr double kSameInputsFactor = 2.0;

// A tap of fewer elements than this keeps no same-input limit: its rel L2 is
// the error of a few numbers, and the one-device run measures it on one
// sample and branch where the run has several, whose errors are as large by
// chance (flux_pipeline's cache statistic, one number per sample and branch:
// 2.4x the one-device error in 42 cells of the same-seed night). Over 64
// numbers a norm is an average: the 2x held for every tap of the 100-seed sweep.
inline constexpr std::size_t kSameInputsMinElements = 64;
// Likewise column means (check/column_error.h) over fewer columns than this
// at the calibration: the one-device run has one sample where the run has
// several, and an RMS over 16 columns of one sample says little of another
// sample's. Measured (docs/tolerances.md): 100 seeds of every scenario, the
// sharded run's column-mean error reached 2.24x the one-device run's on
// flux_pipeline's latents (16 columns: one sample's channels), 1.67x on its
// v_branch (32); at 256 columns or more at most 1.45x outside ring steps.
inline constexpr std::size_t kSameInputsMinColumns = 64;

struct TapFloor {
  double element = 0, rel_l2 = 0;
  std::string dtype;
  // The unperturbed one-device run's rel_l2 (calibration run 0), when measured.
  std::optional<double> rel_l2_as_is;
  std::size_t elements = 0;  // how many the floor was measured on (0: not known)
  // The column-mean error (check/column_error.h) for taps that have one, and
  // run 0's when measured.
  std::optional<double> column_mean, column_mean_as_is;
  std::size_t columns = 0;  // how many columns the column mean was measured over (0: not known)
};
using Floors = std::map<std::string, TapFloor>;

// Calibration run 0's floors as the run's own: rel_l2_as_is for the taps of
// at least kSameInputsMinElements elements, column_mean_as_is for those of at
// least kSameInputsMinColumns columns.
void keep_unperturbed(Floors& floors);

// The options that make compare() measure floors: every tap with a reference
// judged at rtol 1 and atol rms(ref), so its worst err/tol is the element
// figure; the tap's own tolerance attributes are set aside.
CompareOptions floor_measuring_options(CompareOptions base);
// The floors of a result compared with floor_measuring_options().
Floors floors_of(const CompareResult& res);
// Element-wise maximum of two measurements (runs of one calibration).
void merge_floors(Floors& into, const Floors& more);

// Serialized for sending between ranks (one line per tap).
std::string encode_floors(const Floors& f);
Floors decode_floors(const std::string& text);

// k_same > 0: the floor was measured on the run's own inputs, and the norm
// limit is also at most k_same x the unperturbed run's rel_l2 (+ u_acc).
MeasuredTolerance tolerance_from_floor(const TapFloor& f, double k_element = kElementFactor,
                                       double k_norm = kNormFactor, double k_same = 0);

// Where a tolerance file came from (its "provenance" object).
struct CalibrationInfo {
  std::string diffcheck;  // version that measured it
  std::string scenario, size, dtype, flags, mesh, reference_mode;
  int steps = 0;
  std::uint64_t seed = 0;
  int runs = 0;
  double k_element = kElementFactor, k_norm = kNormFactor;
  double k_same_inputs = kSameInputsFactor;  // 0 in files older than it: no same-input limit
  std::string method;  // how the floor was measured, in words
};

struct ToleranceFile {
  CalibrationInfo info;
  Floors floors;
};

// Whole or not at all. Throws Error naming the file.
void write_tolerance_file(const std::string& path, const ToleranceFile& f);
// Throws InputError naming the file and what is wrong with it.
ToleranceFile read_tolerance_file(const std::string& path);
ToleranceFile parse_tolerance_file(const std::string& text, const std::string& path);
// The table a file gives (its k, its floors), `source` and `origin` for
// reports. `same_inputs`: the floors were measured on the run's own inputs
// (same_inputs_as() below, or a calibration within the run).
ToleranceTable tolerance_table(const ToleranceFile& f, ToleranceSource source, const std::string& origin,
                               bool same_inputs = false);
// Whether a file's calibration runs had the inputs of a run of this seed,
// flags and pipeline settings (scenario, size and dtype are required to match
// anyway): then its unperturbed floor is the run's own.
bool same_inputs_as(const CalibrationInfo& i, std::uint64_t seed, const std::string& flags, int steps,
                    const std::string& reference_mode);
// Throws InputError unless the file was made for this scenario, size and
// dtype (a floor in float32 says nothing of bfloat16; one of another size
// names other taps or other depths).
void require_matching_file(const ToleranceFile& f, const std::string& path, const std::string& scenario,
                           const std::string& size, const std::string& dtype);

}  // namespace dc
