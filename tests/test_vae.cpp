// The patch-parallel convolution of vae_patch_decode in one process: a tile
// padded with the border pieces its neighbours would send
// (scenarios/halo_exchange.h) gives, through conv3x3_rect, exactly the
// pixels of the whole-image convolution, for every tiling from 1x1 to 4x4
// (1-pixel-wide tiles included), whether computed at once or interior first;
// the meshes that cannot be tiled are refused with a message naming why.
#include <gtest/gtest.h>

#include "harness/core/error.h"
#include "harness/run/scenario.h"
#include "reference/generate.h"
#include "reference/vae_decoder.h"
#include "scenarios/halo_exchange.h"

using namespace dc;

namespace {

// Tile (r, c) of a ph x pw grid over x [n, C, H, W].
Tensor tile_of(const Tensor& x, std::size_t ph, std::size_t pw, std::size_t r, std::size_t c) {
  const std::size_t planes = x.shape[0] * x.shape[1], h = x.shape[2] / ph, w = x.shape[3] / pw;
  Tensor t({x.shape[0], x.shape[1], h, w});
  for (std::size_t p = 0; p < planes; ++p)
    for (std::size_t i = 0; i < h; ++i)
      for (std::size_t j = 0; j < w; ++j)
        t.data[(p * h + i) * w + j] = x.data[(p * x.shape[2] + r * h + i) * x.shape[3] + c * w + j];
  return t;
}

// The tiled convolution: each tile padded with its neighbours' pieces, as the
// exchange delivers them, then convolved at once or interior first.
Tensor tiled_conv(const Tensor& x, const ref::Conv3x3<float>& conv, std::size_t ph, std::size_t pw, bool interior_first) {
  const std::size_t n = x.shape[0], h = x.shape[2] / ph, w = x.shape[3] / pw, co = conv.cout();
  Tensor out({n, co, x.shape[2], x.shape[3]});
  for (std::size_t r = 0; r < ph; ++r)
    for (std::size_t c = 0; c < pw; ++c) {
      Tensor padded = ref::pad1(tile_of(x, ph, pw, r, c));
      for (std::size_t d = 0; d < 8; ++d) {
        const long nr = long(r) + vae::kNeighbours[d].first, nc = long(c) + vae::kNeighbours[d].second;
        if (nr < 0 || nc < 0 || nr >= long(ph) || nc >= long(pw)) continue;
        vae::place_halo(padded, d, vae::border_piece(tile_of(x, ph, pw, std::size_t(nr), std::size_t(nc)), d));
      }
      Tensor t({n, co, h, w});
      for (std::size_t b = 0; b < n; ++b) {
        const float* in = padded.data.data() + b * conv.cin() * (h + 2) * (w + 2);
        float* o = t.data.data() + b * co * h * w;
        if (!interior_first) {
          ref::conv3x3_rect(in, h, w, conv, o, {0, h, 0, w});
          continue;
        }
        ref::conv3x3_rect(in, h, w, conv, o, {1, h - 1, 1, w - 1});
        ref::conv3x3_rect(in, h, w, conv, o, {0, 1, 0, w});
        ref::conv3x3_rect(in, h, w, conv, o, {h - 1, h, 0, w});
        ref::conv3x3_rect(in, h, w, conv, o, {1, h - 1, 0, 1});
        ref::conv3x3_rect(in, h, w, conv, o, {1, h - 1, w - 1, w});
      }
      // Back into place.
      for (std::size_t p = 0; p < n * co; ++p)
        for (std::size_t i = 0; i < h; ++i)
          for (std::size_t j = 0; j < w; ++j)
            out.data[(p * x.shape[2] + r * h + i) * x.shape[3] + c * w + j] = t.data[(p * h + i) * w + j];
    }
  return out;
}

ref::Conv3x3<float> test_conv(std::size_t cin, std::size_t cout) {
  return {ref::generate(7, "w", {cout, cin, 3, 3}, 0.5f), ref::generate(7, "b", {cout}, 0.1f)};
}

}  // namespace

TEST(PatchConv, TiledWithHalosEqualsTheWholeImageBitwise) {
  const auto conv = test_conv(3, 5);
  for (const std::size_t side : {12, 4}) {  // 12: every tiling 1..4; 4: down to 1-pixel tiles
    const Tensor x = ref::generate(3, "x", {2, 3, side, side}, 1.0f);
    const Tensor whole = ref::conv3x3(x, conv);
    for (std::size_t ph = 1; ph <= 4; ++ph)
      for (std::size_t pw = 1; pw <= 4; ++pw) {
        if (side % ph || side % pw) continue;
        for (const bool interior_first : {false, true}) {
          SCOPED_TRACE(testing::Message() << side << "x" << side << " in " << ph << "x" << pw << " tiles"
                                          << (interior_first ? ", interior first" : ""));
          EXPECT_EQ(tiled_conv(x, conv, ph, pw, interior_first).data, whole.data);
        }
      }
  }
}

TEST(PatchConv, AMissingCornerChangesOnlyTheTilesCornerPixels) {
  // The fault halo_corner_missing in miniature: 2x2 tiles, corners left zero.
  const auto conv = test_conv(2, 2);
  const Tensor x = ref::generate(5, "x", {1, 2, 6, 6}, 1.0f);
  const Tensor whole = ref::conv3x3(x, conv);
  Tensor padded = ref::pad1(tile_of(x, 2, 2, 0, 0));  // top-left tile: right, below, below-right
  for (std::size_t d : {1u, 3u}) vae::place_halo(padded, d, vae::border_piece(tile_of(x, 2, 2, d == 1 ? 1 : 0, d == 3 ? 1 : 0), d));
  Tensor t({1, 2, 3, 3});
  ref::conv3x3_rect(padded.data.data(), 3, 3, conv, t.data.data(), {0, 3, 0, 3});
  for (std::size_t c = 0; c < 2; ++c)
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t j = 0; j < 3; ++j) {
        const float got = t.data[(c * 3 + i) * 3 + j], want = whole.data[(c * 6 + i) * 6 + j];
        if (i == 2 && j == 2) EXPECT_NE(got, want) << "the corner pixel needs the diagonal neighbour";
        else EXPECT_EQ(got, want) << c << " " << i << " " << j;
      }
}

TEST(PatchConv, MeshesThatCannotBeTiledAreRefused) {
  const Scenario* s = find_scenario("vae_patch_decode");
  ASSERT_NE(s, nullptr);
  auto refusal = [&](const std::string& mesh, const std::string& size) -> std::string {
    try {
      s->check_mesh(Mesh::parse(mesh), size);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(refusal("dp=1,ph=4,pw=4", "default"), "");
  EXPECT_EQ(refusal("dp=1,ph=16,pw=1", "default"), "");  // 1-pixel-high tiles of 16 latent rows
  EXPECT_EQ(refusal("dp=2,ph=8,pw=1", "tiny"), "");
  EXPECT_NE(refusal("dp=1,ph=3,pw=1", "default").find("ph=3 does not split the latent height of 16 into equal tiles"),
            std::string::npos);
  EXPECT_NE(refusal("dp=1,ph=1,pw=16", "tiny").find("pw=16 is more than the latent width of 8: a tile needs at least "
                                                    "one pixel"),
            std::string::npos);
  EXPECT_NE(refusal("dp=4,ph=1,pw=1", "tiny").find("dp=4 does not divide the batch of 2"), std::string::npos);
  EXPECT_NE(refusal("dp=1,pw=2,ph=2", "default").find("exactly the axes dp, ph, pw"), std::string::npos);
}
