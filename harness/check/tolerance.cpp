#include "harness/check/tolerance.h"

#include <cmath>

namespace dc {

double unit_roundoff(const std::string& dtype) {
  if (dtype == "float64") return std::ldexp(1.0, -53);
  if (dtype == "float32") return std::ldexp(1.0, -24);
  if (dtype == "bfloat16") return std::ldexp(1.0, -8);
  if (dtype == "float16") return std::ldexp(1.0, -11);
  return 0.0;  // integers compare exactly
}

double accumulator_roundoff(const std::string& dtype) {
  if (dtype == "float64") return std::ldexp(1.0, -53);
  if (dtype == "float32" || dtype == "bfloat16" || dtype == "float16") return std::ldexp(1.0, -24);
  return 0.0;
}

Tolerance derive_tolerance(const ToleranceInputs& in) {
  double depth = std::max(1.0, static_cast<double>(in.reduction_depth.value_or(1)));
  const double derived =
      in.factor * kToleranceScale * (unit_roundoff(in.dtype) + accumulator_roundoff(in.dtype) * std::sqrt(depth));
  double rtol = derived;
  if (in.cli_rtol) rtol = *in.cli_rtol;
  if (in.tap_rtol) rtol = *in.tap_rtol;
  double atol = rtol * in.reference_rms;
  if (in.cli_atol) atol = *in.cli_atol;
  if (in.tap_atol) atol = *in.tap_atol;
  return {atol, rtol};
}

}  // namespace dc
