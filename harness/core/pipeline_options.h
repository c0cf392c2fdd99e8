// Options of pipeline scenarios (a denoising loop rather than one block):
// how many steps, and whether each step starts from the reference's latents.
// Carried by a run, a sweep-mesh and a flag trial alike, and passed on to the
// child runs they start.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace dc {

struct PipelineOptions {
  int steps = 0;                          // 0: the scenario's default for its size
  std::string reference_mode = "forced";  // "forced" (each step from the reference's input) or "free"
  std::string tap_blocks = "all";         // which blocks' taps each step records: all, first,last or none

  bool is_default() const { return steps == 0 && reference_mode == "forced" && tap_blocks == "all"; }
  // Whether block k of n is tapped.
  bool taps_block(std::size_t k, std::size_t n) const;
  // Throws InputError for a negative step count or an unknown mode.
  void validate() const;
  // The command-line options that reproduce these (none for the defaults).
  std::vector<std::string> args() const;
  // For a trial's cache key ("" for the defaults, so old keys stay valid).
  std::string identity() const;
};

}  // namespace dc
