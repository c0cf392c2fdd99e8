// Input perturbation for noise-floor calibration (check/calibration, run/
// calibrate): while a perturbation is set, every generated input and weight
// of the run's computation moves by one rounding unit u of the run's dtype
// (relative, before it is rounded to the dtype; up or down at random, a pure
// function of the perturbation seed, the tensor and the element), as TTrace
// estimates the error a correct run may show: ||F(X + dX) - F(X)|| for dX of
// one rounding. References are exact:
// code that computes them runs inside an ExactInputs scope (ReferenceClock
// opens one), where generation is left alone, so every perturbed run is
// compared with the same float64 reference.
#pragma once
#include <cstdint>
#include <optional>

#include "harness/core/dtype.h"

namespace dc {

struct InputPerturbation {
  std::uint64_t seed = 0;
  DType dtype = DType::float32;
};

// Process-wide (a calibration runs one perturbed computation at a time).
void set_input_perturbation(std::optional<InputPerturbation> p);
// The perturbation in force here: none inside an ExactInputs scope.
const InputPerturbation* active_input_perturbation();

// `value` moved by u/2..3u/2 relative, its sign and size drawn for (tensor
// id, element index), and rounded to the perturbation's dtype. Zero, Inf and
// NaN are left alone.
float perturb_value(const InputPerturbation& p, std::uint32_t tensor_id, std::uint64_t index, float value);

class ExactInputs {
 public:
  ExactInputs();
  ~ExactInputs();
  ExactInputs(const ExactInputs&) = delete;
  ExactInputs& operator=(const ExactInputs&) = delete;
};

// Sets a perturbation for its lifetime (none: nothing changes).
class PerturbedInputs {
 public:
  explicit PerturbedInputs(std::optional<InputPerturbation> p) { set_input_perturbation(p); }
  ~PerturbedInputs() { set_input_perturbation(std::nullopt); }
  PerturbedInputs(const PerturbedInputs&) = delete;
  PerturbedInputs& operator=(const PerturbedInputs&) = delete;
};

}  // namespace dc
