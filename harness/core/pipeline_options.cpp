#include "harness/core/pipeline_options.h"

#include <fmt/format.h>

#include "harness/core/error.h"

namespace dc {

void PipelineOptions::validate() const {
  if (steps < 0) input_error("--steps must be >= 1 (0: the scenario's default), got {}", steps);
  if (reference_mode != "forced" && reference_mode != "free")
    input_error("--reference-mode must be forced or free, got '{}'", reference_mode);
  if (tap_blocks != "all" && tap_blocks != "first,last" && tap_blocks != "none")
    input_error("--tap-blocks must be all, first,last or none, got '{}'", tap_blocks);
}

bool PipelineOptions::taps_block(std::size_t k, std::size_t n) const {
  if (tap_blocks == "none") return false;
  if (tap_blocks == "first,last") return k == 0 || k + 1 == n;
  return true;
}

std::vector<std::string> PipelineOptions::args() const {
  std::vector<std::string> a;
  if (steps != 0) a.insert(a.end(), {"--steps", std::to_string(steps)});
  if (reference_mode != "forced") a.insert(a.end(), {"--reference-mode", reference_mode});
  if (tap_blocks != "all") a.insert(a.end(), {"--tap-blocks", tap_blocks});
  return a;
}

std::string PipelineOptions::identity() const {
  return is_default() ? "" : fmt::format(" steps={} reference_mode={} tap_blocks={}", steps, reference_mode, tap_blocks);
}

}  // namespace dc
