// Tolerances for the reference check: derived from the tap's dtype and its
// reduction depth, or measured (a noise floor: check/noise_floor.h), unless
// overridden.
//
// Derived:
//   rtol = kToleranceScale * (u * sqrt(max(1, rounding_steps))
//                             + u_acc * sqrt(max(1, reduction_depth)))
//   atol = rtol * rms(reference)
// u is the unit roundoff of the logical dtype (2^-24 float32, 2^-8 bfloat16,
// 2^-11 float16, 2^-53 float64; integers are exact): rounding a value to the
// dtype costs u whatever the depth, and a value rounded after each of
// `rounding_steps` ops (a tap attribute diffcheck.torch writes: the ops of the
// forward before it) carries sqrt(steps) such errors of random sign. Math
// beyond the dtype (TF32 matmuls, autocast: the root attribute `math`,
// check/math_mode.h) raises u to that math's. u_acc is the unit roundoff of the
// accumulator (float32 for 16- and 32-bit dtypes, float64 for float64): a sum
// of `depth` random-sign terms grows its rounding error like sqrt(depth).
// atol is scaled by the reference's RMS so that elements near zero (where rtol
// alone would demand more digits than the arithmetic carries) are judged on the
// tensor's own scale. kToleranceScale covers the rounding that reaches a tap
// through the ops before it; docs/tolerances.md says how it was chosen.
//
// Measured (a tolerance table): the same element-wise form with the tap's
// own rtol, plus a norm-wise limit on its relative L2 error.
//
// Precedence: a tap attribute that demands exactness (atol = rtol = 0) wins;
// then --atol/--rtol (behind the tap's own atol/rtol attributes, as always);
// then a measured tolerance (it replaces the tap's non-exact attributes, which
// are estimates by formula, and the derived rule); then the tap's attributes;
// then the derived rule, times the tap's `tolerance_factor` (for taps whose
// inputs carry the error of earlier steps).
#pragma once
#include <map>
#include <optional>
#include <string>

namespace dc {

inline constexpr double kToleranceScale = 16.0;
// A tap with rounding counts (`rounding_steps`: its error budget known op by
// op) is also held norm-wise: rel L2 <= kNormScale * (u sqrt(steps) + u_acc
// sqrt(depth)). The worst element of thousands needs K = 16; the RMS error
// does not, and an error spread over every element (a stale timestep) shows
// there first. Clean torch runs reach about 1.1 of the bracket
// (docs/tolerances.md).
inline constexpr double kNormScale = 4.0;

// Unit roundoff of the accumulator used for `dtype`.
double accumulator_roundoff(const std::string& dtype);

double unit_roundoff(const std::string& dtype);

// Where a tap's tolerance came from (every report says it per tap).
enum class ToleranceSource { derived, attribute, command_line, file, calibrated, noise_floor };
std::string source_name(ToleranceSource s);

// A tap's measured noise floor and the tolerance made of it.
struct MeasuredTolerance {
  double floor_element = 0;  // max over runs and elements of |x - ref| / (rms(ref) + |ref|)
  double floor_rel_l2 = 0;   // max over runs of ||x - ref|| / ||ref||
  double rtol = 0;           // element-wise: |x - ref| <= rtol (rms(ref) + |ref|)
  double rel_l2_limit = 0;   // norm-wise: ||x - ref|| / ||ref|| <= rel_l2_limit
  // On the run's own inputs (check/noise_floor.h): the unperturbed one-device
  // run's rel_l2 and the tighter norm limit made of it, for the taps a
  // one-device run computes alike (not `per_mesh` ones).
  std::optional<double> floor_rel_l2_as_is;
  std::optional<double> rel_l2_limit_own_inputs;
  // Column means (check/column_error.h), for taps that have them: the floor
  // (max over runs), its limit, and on the run's own inputs run 0's and the
  // tighter limit made of it.
  std::optional<double> floor_column_mean, column_mean_limit;
  std::optional<double> floor_column_mean_as_is, column_mean_limit_own_inputs;
};

// Per-tap measured tolerances and where they came from.
struct ToleranceTable {
  ToleranceSource source = ToleranceSource::file;
  std::string origin;  // for messages: the file, or "calibrated in this run"
  std::map<std::string, MeasuredTolerance> taps;
  const MeasuredTolerance* find(const std::string& tap) const {
    auto it = taps.find(tap);
    return it == taps.end() ? nullptr : &it->second;
  }
};

struct Tolerance {
  double atol = 0;
  double rtol = 0;
  int reduced_pieces = 1;  // the `reduced` pieces it was widened for (said in the report)
  std::optional<double> rel_l2_limit;  // measured tolerances, and derived ones of taps with rounding counts
  ToleranceSource source = ToleranceSource::derived;
  const MeasuredTolerance* measured = nullptr;  // the floor behind a measured tolerance
  bool own_inputs = false;  // rel_l2_limit is measured->rel_l2_limit_own_inputs
  std::optional<double> column_mean_limit;  // measured tolerances of taps with column means
  bool column_own_inputs = false;  // column_mean_limit is measured->column_mean_limit_own_inputs
  // What the derived rule held the tap to, for the report: "float32, depth 1536,
  // 9 roundings, TF32 matmuls"; empty for other sources.
  std::string yardstick;
  std::optional<long> depth;  // derived: the depth it used, and the math beyond the dtype (for the table's cell)
  std::string math_label;
  // A derived float32 tolerance whose math the file does not state: the rtols
  // TF32 matmuls and bfloat16 autocast would give, so that a failure of that
  // size can say so (0: not applicable).
  double rtol_if_tf32 = 0, rtol_if_bf16 = 0;
};

struct ToleranceInputs {
  std::string dtype;
  std::optional<long> reduction_depth;
  std::optional<double> tap_atol, tap_rtol;  // tap attributes
  std::optional<double> cli_atol, cli_rtol;  // command line
  double reference_rms = 0;
  double factor = 1.0;  // the tap's tolerance_factor: multiplies the derived atol and rtol
  const MeasuredTolerance* measured = nullptr;  // this tap's entry of a tolerance table
  ToleranceSource measured_source = ToleranceSource::file;
  bool per_mesh = false;  // the tap's `per_mesh` attribute: no same-input limit
  // Pieces summed into each element (the size of the tap's partial group):
  // above 1, each piece was rounded on its own rank, which the one-device
  // run does not do: a measured element-wise rtol grows by sqrt(pieces).
  int partial_pieces = 1;
  // Pieces summed in the tap's own dtype before the capture (its `reduced`
  // axes): each rounded on its rank, and their sum rounded again, where the
  // one-device run rounded the whole once. A measured rtol, norm limit and
  // column-mean limit grow by sqrt(pieces); the derived rule counts pieces - 1
  // more roundings.
  int reduced_pieces = 1;
  std::optional<long> rounding_steps;  // the tap's `rounding_steps` attribute
  double math_roundoff = 0;  // what the run's math adds (check/math_mode.h); 0: the dtype's own
  std::string math_label;    // "TF32 matmuls", ...: said in the yardstick
};

// Whether the tolerance chosen for `in` scales with the reference's RMS (so
// the caller must measure it first).
bool tolerance_needs_rms(const ToleranceInputs& in);

Tolerance derive_tolerance(const ToleranceInputs& in);

}  // namespace dc
