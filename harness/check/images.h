// Taps marked as images (the `image` attribute: "nhwc", "nchw" or "patches:H,W")
// are also judged the way image gates judge a sharded pipeline's output:
// PSNR and SSIM of each image against its reference (check/image_metrics),
// and the verdict of the gate xDiT's tools/image_quality.py applies (SSIM >=
// 0.80 and PSNR >= 15). The gate is shown beside diffcheck's own verdict, to
// show what it would have let through; it never decides the exit status.
#pragma once
#include <string>
#include <vector>

#include "harness/capture/activations.h"
#include "harness/check/compare.h"

namespace dc {

// The shape of one image of tap `t` ([H, W, C]) and the batch size; throws
// InputError (naming the tap) when the attribute does not fit the tap.
struct ImageGeometry {
  std::size_t batch = 0, height = 0, width = 0, channels = 0;
  std::size_t grid_h = 0, grid_w = 0, patch = 0;  // "patches:H,W"; 0 otherwise
  bool channels_first = false;                     // "nchw": [B, C, H, W]
};
ImageGeometry image_geometry(const TapData& t);

// Every image tap with a reference, judged on the first process (collective
// over the processes that hold a distributed set; each image tap's pieces and
// reference are gathered to it, so they must be small). Empty elsewhere.
std::vector<ImageVerdict> judge_images(const ActivationSet& set, const CompareOptions& opts);

}  // namespace dc
