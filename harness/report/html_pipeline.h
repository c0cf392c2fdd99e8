// The pictures of a pipeline's report page (run or compare of a file with
// step-indexed taps or image taps): a step x tap heatmap of err/tol, the
// error growth over steps, and each image three ways — reference, result,
// |difference| amplified — with PSNR, SSIM and the image gate's verdict.
#pragma once
#include <string>

#include "harness/check/compare.h"

namespace dc::html {

// Empty when the result has fewer than two steps.
std::string step_heatmap(const CompareResult& res);
// rel L2 of each step's `latents_out` (or, without it, the worst err/tol) on
// a log scale; empty when the result has fewer than two steps.
std::string error_growth(const CompareResult& res);
// One figure per judged image.
std::string image_figures(const CompareResult& res);

}  // namespace dc::html
