// The halo exchange of vae_patch_decode over real MPI, at the rank count
// ctest launches: on every (dp, ph, pw) split of the world that tiles an 8 x 8
// image (down to 1-pixel tiles), each rank's padded tile after the exchange
// is exactly its window of the whole zero-padded image, by p2p (at once, and
// with the tile's interior computed in between) and by allgather; with the
// neighbour addressed by its patch-group rank (fault halo_wrong_peer) the
// halos of every dp group but the first are another item's.
#include <gtest/gtest.h>

#include "harness/core/comm.h"
#include "reference/generate.h"
#include "reference/vae_decoder.h"
#include "scenarios/halo_exchange.h"
#include "tests/mpi_world.h"

using namespace dc;

namespace {

constexpr std::size_t kSide = 8, kChannels = 3;

// Every split of n ranks into (dp, ph, pw) with dp <= 2 that tiles kSide.
std::vector<Mesh> splits(int n) {
  std::vector<Mesh> out;
  for (int dp = 1; dp <= 2; ++dp)
    for (int ph = 1; ph <= n; ++ph)
      if (n % (dp * ph) == 0) {
        const int pw = n / (dp * ph);
        if (kSide % std::size_t(ph) == 0 && kSide % std::size_t(pw) == 0)
          out.push_back(Mesh({{"dp", dp}, {"ph", ph}, {"pw", pw}}));
      }
  return out;
}

// The window of the zero-padded image of item `item` that tile (r, c) must
// hold after the exchange: [1, C, h + 2, w + 2].
Tensor expected_window(const Tensor& padded_all, std::size_t item, std::size_t h, std::size_t w, std::size_t r,
                       std::size_t c) {
  Tensor out({1, kChannels, h + 2, w + 2});
  for (std::size_t ch = 0; ch < kChannels; ++ch)
    for (std::size_t i = 0; i < h + 2; ++i)
      for (std::size_t j = 0; j < w + 2; ++j)
        out.data[(ch * (h + 2) + i) * (w + 2) + j] =
            padded_all.data[((item * kChannels + ch) * (kSide + 2) + r * h + i) * (kSide + 2) + c * w + j];
  return out;
}

}  // namespace

TEST(HaloExchange, EveryRankGetsItsWindowOfTheWholeImage) {
  const int n = world().size(), me = world().rank();
  for (const Mesh& mesh : splits(n)) {
    SCOPED_TRACE(mesh.str());
    const int dp = mesh.axis_size("dp"), ph = mesh.axis_size("ph"), pw = mesh.axis_size("pw");
    const std::size_t h = kSide / std::size_t(ph), w = kSide / std::size_t(pw);
    const auto place = vae::TilePlace::of(mesh, me);
    const std::size_t item = std::size_t(mesh.index_in(me, {"dp"}));
    const Shape global{std::size_t(dp), kChannels, kSide, kSide};
    const Tensor tile = ref::generate(11, "img", global, 1.0f,
                                      {{item, item + 1}, {0, kChannels}, {std::size_t(place.row) * h, std::size_t(place.row + 1) * h},
                                       {std::size_t(place.col) * w, std::size_t(place.col + 1) * w}});
    const Tensor padded_all = ref::pad1(ref::generate(11, "img", global, 1.0f));
    const Tensor want = expected_window(padded_all, item, h, w, std::size_t(place.row), std::size_t(place.col));
    const Comm group = world().split(mesh, {"ph", "pw"});
    for (const auto mode : {vae::HaloMode::p2p, vae::HaloMode::allgather}) {
      const vae::HaloExchange halo(mesh, world(), group, mode, {});
      vae::PendingHalo p = halo.start(tile);
      halo.finish(p);
      EXPECT_EQ(p.padded.data, want.data) << (mode == vae::HaloMode::p2p ? "p2p" : "allgather");
    }
    // The wrong peer: every dp group takes the first group's pieces.
    const vae::HaloExchange wrong(mesh, world(), group, vae::HaloMode::p2p, {.wrong_peer = true});
    vae::PendingHalo p = wrong.start(tile);
    wrong.finish(p);
    const Tensor first_group = expected_window(padded_all, 0, h, w, std::size_t(place.row), std::size_t(place.col));
    bool has_neighbour = ph * pw > 1;
    if (item == 0 || !has_neighbour) {
      EXPECT_EQ(p.padded.data, want.data);
    } else {
      EXPECT_NE(p.padded.data, want.data);
      // The halos (not the tile itself) are the first group's.
      for (std::size_t ch = 0; ch < kChannels; ++ch)
        for (std::size_t i = 0; i < h + 2; ++i)
          for (std::size_t j = 0; j < w + 2; ++j) {
            const std::size_t at = (ch * (h + 2) + i) * (w + 2) + j;
            const bool inside = i >= 1 && i <= h && j >= 1 && j <= w;
            EXPECT_EQ(p.padded.data[at], inside ? want.data[at] : first_group.data[at]) << ch << " " << i << " " << j;
          }
    }
  }
}
