#include "harness/check/tolerance.h"

#include <cmath>

#include <fmt/format.h>

namespace dc {
namespace {

bool exact_attribute(const ToleranceInputs& in) {
  return in.tap_atol && in.tap_rtol && *in.tap_atol == 0 && *in.tap_rtol == 0;
}

bool measured_applies(const ToleranceInputs& in) {
  return in.measured && !exact_attribute(in) && !in.cli_atol && !in.cli_rtol;
}

}  // namespace

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

std::string source_name(ToleranceSource s) {
  switch (s) {
    case ToleranceSource::derived: return "derived";
    case ToleranceSource::attribute: return "attribute";
    case ToleranceSource::command_line: return "command line";
    case ToleranceSource::file: return "file";
    case ToleranceSource::calibrated: return "calibrated";
    case ToleranceSource::noise_floor: return "noise floor";
  }
  return "derived";
}

bool tolerance_needs_rms(const ToleranceInputs& in) {
  if (measured_applies(in)) return true;
  return !in.tap_atol && !in.cli_atol;
}

Tolerance derive_tolerance(const ToleranceInputs& in) {
  const int reduced_pieces = std::max(1, in.reduced_pieces);  // `reduced`: said in the report, either way
  if (measured_applies(in)) {
    Tolerance t;
    t.reduced_pieces = reduced_pieces;
    // A partial sum's element is g pieces, each rounded on its own rank where
    // the one device rounded the whole once: independent roundings of
    // like-sized values, whose worst element grows as sqrt(g). (Its norm and
    // column means are averages over many elements, which that moves far
    // less: they keep their limits, the same-input ones included.)
    // A sum made in the tap's dtype before the capture (`reduced`): every
    // element, and so its norm and column means too, carries the pieces' own
    // roundings and the sum's beside the one the one-device run made.
    const double reduced = std::sqrt(static_cast<double>(reduced_pieces));
    t.rtol = in.measured->rtol * std::sqrt(static_cast<double>(std::max(1, in.partial_pieces))) * reduced;
    t.atol = t.rtol * in.reference_rms;
    auto widened = [&](std::optional<double> v) { return v ? std::optional<double>(*v * reduced) : v; };
    t.rel_l2_limit = widened(in.measured->rel_l2_limit);
    if (in.measured->rel_l2_limit_own_inputs && !in.per_mesh) {
      t.rel_l2_limit = widened(in.measured->rel_l2_limit_own_inputs);
      t.own_inputs = true;
    }
    t.column_mean_limit = widened(in.measured->column_mean_limit);
    if (in.measured->column_mean_limit_own_inputs && !in.per_mesh) {
      t.column_mean_limit = widened(in.measured->column_mean_limit_own_inputs);
      t.column_own_inputs = true;
    }
    t.source = in.measured_source;
    t.measured = in.measured;
    return t;
  }
  const double depth = std::max(1.0, static_cast<double>(in.reduction_depth.value_or(1)));
  const double steps = std::max(1.0, static_cast<double>(in.rounding_steps.value_or(1))) +
                       static_cast<double>(reduced_pieces - 1);
  auto rule = [&](double u) {
    return in.factor * kToleranceScale * (u * std::sqrt(steps) + accumulator_roundoff(in.dtype) * std::sqrt(depth));
  };
  const double u = std::max(unit_roundoff(in.dtype), in.math_roundoff);
  Tolerance t;
  t.reduced_pieces = reduced_pieces;
  t.rtol = rule(u);
  if (in.cli_rtol) t.rtol = *in.cli_rtol;
  if (in.tap_rtol) t.rtol = *in.tap_rtol;
  t.atol = t.rtol * in.reference_rms;
  if (in.cli_atol) t.atol = *in.cli_atol;
  if (in.tap_atol) t.atol = *in.tap_atol;
  t.source = in.tap_atol || in.tap_rtol ? ToleranceSource::attribute
             : in.cli_atol || in.cli_rtol ? ToleranceSource::command_line
                                          : ToleranceSource::derived;
  if (t.source == ToleranceSource::derived) {
    if (in.rounding_steps) t.rel_l2_limit = rule(u) * kNormScale / kToleranceScale;
    t.depth = in.reduction_depth;
    t.math_label = in.math_label;
    t.yardstick = in.dtype;
    if (in.reduction_depth) t.yardstick += fmt::format(", depth {}", *in.reduction_depth);
    if (in.rounding_steps) t.yardstick += fmt::format(", {} roundings", *in.rounding_steps);
    if (in.factor != 1.0) t.yardstick += fmt::format(", x{:.3g}", in.factor);
    if (!in.math_label.empty()) t.yardstick += ", " + in.math_label;
    if (in.dtype == "float32" && in.math_roundoff == 0) {
      t.rtol_if_tf32 = rule(std::ldexp(1.0, -11));
      t.rtol_if_bf16 = rule(std::ldexp(1.0, -8));
    }
  }
  return t;
}

}  // namespace dc
