// Image quality metrics of a result against its reference, as the image
// gates of diffusion projects compute them (xDiT's tools/image_quality.py:
// SSIM >= 0.80 and PSNR >= 15 against a single-GPU image), defined as
// scikit-image defines them so the figures can be checked against it:
//   peak_signal_noise_ratio(ref, img, data_range)
//   structural_similarity(ref, img, data_range, channel_axis=-1)
// (7 x 7 uniform window, K1 = 0.01, K2 = 0.03, sample covariance, the mean
// over the window positions that fit inside the image, then over channels).
#pragma once
#include "harness/core/tensor.h"

namespace dc {

// 10 log10(data_range^2 / MSE); +inf when the images are equal.
double psnr(const RefTensor& reference, const RefTensor& image, double data_range);

// Images [H, W, channels]; H and W at least 7.
double ssim(const RefTensor& reference, const RefTensor& image, double data_range);

}  // namespace dc
