#include "harness/core/pipeline_options.h"

#include <fmt/format.h>

#include "harness/core/error.h"

namespace dc {

void PipelineOptions::validate() const {
  if (steps < 0) input_error("--steps must be >= 1 (0: the scenario's default), got {}", steps);
  if (reference_mode != "forced" && reference_mode != "free")
    input_error("--reference-mode must be forced or free, got '{}'", reference_mode);
}

std::vector<std::string> PipelineOptions::args() const {
  std::vector<std::string> a;
  if (steps != 0) a.insert(a.end(), {"--steps", std::to_string(steps)});
  if (reference_mode != "forced") a.insert(a.end(), {"--reference-mode", reference_mode});
  return a;
}

std::string PipelineOptions::identity() const {
  return is_default() ? "" : fmt::format(" steps={} reference_mode={}", steps, reference_mode);
}

}  // namespace dc
