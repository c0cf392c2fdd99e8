// PSNR and SSIM (check/image_metrics) against scikit-image's
// peak_signal_noise_ratio and structural_similarity on the same images
// (tests/fixtures/image_metrics_small.h5, scripts/fixtures/make_image_metrics_fixture.py).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "harness/capture/store.h"
#include "harness/check/image_metrics.h"
#include "harness/report/png.h"
#include "harness/core/error.h"

using namespace dc;

TEST(ImageMetrics, PsnrAndSsimMatchScikitImage) {
  const std::string path = std::string(DIFFCHECK_SOURCE_DIR) + "/tests/fixtures/image_metrics_small.h5";
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  ActivationSet f = read_activations(path);
  auto get = [&](const std::string& name) {
    for (const auto& t : f.taps)
      if (t.name == name) {
        Shape s = t.local_shape;  // images [H, W, C] (a leading batch dimension of 1 dropped)
        while (s.size() > 3 && s[0] == 1) s.erase(s.begin());
        return RefTensor(s, read_whole_piece(f, t, 0));
      }
    ADD_FAILURE() << "fixture has no tap " << name;
    return RefTensor();
  };
  int cases = 0;
  for (const char* name : {"noise", "seam", "blur", "range255"}) {
    const std::string c = name;
    const RefTensor ref = get(c + "/reference"), img = get(c + "/image"), m = get(c + "/metrics");
    ASSERT_EQ(m.size(), 3u);
    EXPECT_NEAR(psnr(ref, img, m.data[0]), m.data[1], 1e-10) << c;
    EXPECT_NEAR(ssim(ref, img, m.data[0]), m.data[2], 1e-10) << c;
    ++cases;
  }
  EXPECT_EQ(cases, 4);
}

TEST(ImageMetrics, EqualImagesAndShapeErrors) {
  RefTensor a({8, 8, 3});
  for (std::size_t i = 0; i < a.size(); ++i) a.data[i] = double(i % 7) / 7.0;
  EXPECT_TRUE(std::isinf(psnr(a, a, 1.0)));
  EXPECT_DOUBLE_EQ(ssim(a, a, 1.0), 1.0);
  EXPECT_THROW(ssim(a, RefTensor({8, 9, 3}), 1.0), Error);
  EXPECT_THROW(ssim(RefTensor({6, 6, 1}), RefTensor({6, 6, 1}), 1.0), Error);
}

// Images not in [0, 1] or [0, 255] (a VAE's decoded RGB) are drawn from their
// low end: -1, 0, 1 over [-1, 1] are black, mid-grey and white. Drawn from 0,
// as before data_low existed, -1 and 0 were both black.
TEST(ImagePictures, ValuesAreDrawnFromTheLowEndOfTheirRange) {
  const std::string got = dc::html::png_data_uri({-1.0, 0.0, 1.0}, 3, 1, 1, -1.0, 2.0, 1);
  const std::vector<std::uint8_t> want{0, 0, 0, 128, 128, 128, 255, 255, 255};
  EXPECT_EQ(got, "data:image/png;base64," + dc::html::base64(dc::html::png_bytes(want, 3, 1)));
}
