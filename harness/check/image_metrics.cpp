#include "harness/check/image_metrics.h"

#include <cmath>
#include <limits>

#include "harness/core/error.h"

namespace dc {
namespace {

void check_pair(const RefTensor& a, const RefTensor& b, const char* what) {
  if (a.shape != b.shape) fail("{}: images of shapes {} and {}", what, shape_str(a.shape), shape_str(b.shape));
  if (a.size() == 0) fail("{}: empty images", what);
}

}  // namespace

double psnr(const RefTensor& reference, const RefTensor& image, double data_range) {
  check_pair(reference, image, "psnr");
  double sum = 0;
  for (std::size_t i = 0; i < image.size(); ++i) {
    const double d = image.data[i] - reference.data[i];
    sum += d * d;
  }
  const double mse = sum / double(image.size());
  if (mse == 0) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(data_range * data_range / mse);
}

double ssim(const RefTensor& reference, const RefTensor& image, double data_range) {
  check_pair(reference, image, "ssim");
  constexpr int kWin = 7;
  constexpr double kK1 = 0.01, kK2 = 0.03;
  if (image.rank() != 3 || image.shape[0] < kWin || image.shape[1] < kWin)
    fail("ssim: an image [H, W, channels] of at least {} x {} pixels, got {}", kWin, kWin, shape_str(image.shape));
  const std::size_t h = image.shape[0], w = image.shape[1], ch = image.shape[2];
  const double np = kWin * kWin, cov_norm = np / (np - 1);
  const double c1 = (kK1 * data_range) * (kK1 * data_range), c2 = (kK2 * data_range) * (kK2 * data_range);
  double total = 0;
  for (std::size_t c = 0; c < ch; ++c) {
    double sum_s = 0;
    std::size_t count = 0;
    // Window centres whose 7 x 7 window lies inside the image (skimage crops
    // the others away before taking the mean).
    for (std::size_t y = kWin / 2; y + kWin / 2 < h; ++y)
      for (std::size_t x = kWin / 2; x + kWin / 2 < w; ++x) {
        double ux = 0, uy = 0, uxx = 0, uyy = 0, uxy = 0;
        for (int dy = -kWin / 2; dy <= kWin / 2; ++dy)
          for (int dx = -kWin / 2; dx <= kWin / 2; ++dx) {
            const std::size_t at = ((y + dy) * w + (x + dx)) * ch + c;
            const double a = reference.data[at], b = image.data[at];
            ux += a, uy += b, uxx += a * a, uyy += b * b, uxy += a * b;
          }
        ux /= np, uy /= np, uxx /= np, uyy /= np, uxy /= np;
        const double vx = cov_norm * (uxx - ux * ux), vy = cov_norm * (uyy - uy * uy), vxy = cov_norm * (uxy - ux * uy);
        sum_s += ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2));
        ++count;
      }
    total += sum_s / double(count);
  }
  return total / double(ch);
}

}  // namespace dc
