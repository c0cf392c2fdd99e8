// Tolerances for the reference check, derived from the tap's dtype and its
// reduction depth unless overridden.
//
//   rtol = kToleranceScale * (u + u_acc * sqrt(max(1, reduction_depth)))
//   atol = rtol * rms(reference)
//
// u is the unit roundoff of the logical dtype (2^-24 float32, 2^-8 bfloat16,
// 2^-11 float16, 2^-53 float64; integers are exact): rounding a value to the
// dtype costs u whatever the depth. u_acc is the unit roundoff of the
// accumulator (float32 for 16- and 32-bit dtypes, float64 for float64): a sum
// of `depth` random-sign terms grows its rounding error like sqrt(depth).
// atol is scaled by the reference's RMS so that elements near zero (where rtol
// alone would demand more digits than the arithmetic carries) are judged on the
// tensor's own scale. kToleranceScale covers the rounding that reaches a tap
// through the ops before it; docs/tolerances.md says how it was chosen.
//
// Precedence: the tap's own `atol`/`rtol` attributes, then --atol/--rtol, then
// the derived default, times the tap's `tolerance_factor` (for taps whose
// inputs carry the error of earlier steps).
#pragma once
#include <optional>
#include <string>

namespace dc {

inline constexpr double kToleranceScale = 16.0;

// Unit roundoff of the accumulator used for `dtype`.
double accumulator_roundoff(const std::string& dtype);

double unit_roundoff(const std::string& dtype);

struct Tolerance {
  double atol = 0;
  double rtol = 0;
};

struct ToleranceInputs {
  std::string dtype;
  std::optional<long> reduction_depth;
  std::optional<double> tap_atol, tap_rtol;  // tap attributes
  std::optional<double> cli_atol, cli_rtol;  // command line
  double reference_rms = 0;
  double factor = 1.0;  // the tap's tolerance_factor: multiplies the derived atol and rtol
};

Tolerance derive_tolerance(const ToleranceInputs& in);

}  // namespace dc
