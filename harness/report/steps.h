// Taps of a pipeline are step-indexed ("step07/block1/attn"): the reports
// group them by step, one line per step with its worst err/tol, so the step
// where a run went wrong (and how the error grows over steps) reads at once.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "harness/check/compare.h"

namespace dc {

struct StepSummary {
  std::string step;          // "step07"
  std::size_t taps = 0;      // taps of this step
  double worst_ratio = 0;    // largest err/tol of its taps against the reference (0 without references)
  std::string worst_tap;     // the tap below the step that has it ("block1/attn")
  std::optional<std::string> first_failing;  // its first tap that fails any check
};

// "step07/block1/attn" -> {"step07", "block1/attn"}; nothing for other names.
struct StepName {
  std::string step, rest;
};
std::optional<StepName> split_step(const std::string& tap);

// A tap's worst err/tol over its ranks (a NaN counts as +inf); -1 without a reference.
double worst_err_over_tol(const TapVerdict& t);

// The steps, in order of their first tap; empty when no tap name starts with
// step<digits>/.
std::vector<StepSummary> summarize_steps(const CompareResult& res);

}  // namespace dc
