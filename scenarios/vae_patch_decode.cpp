// vae_patch_decode: the VAE decode after a diffusion loop, split spatially
// over ranks as xDiT's patch-parallel VAE (DistVAE), TensorRT-LLM's parallel
// VAE and sglang split it:
//   dp       items of the batch;
//   ph, pw   tile rows and columns: each rank of a patch group (the ranks
//            sharing a dp coordinate) holds one tile of every feature map.
// Every 3x3 convolution exchanges a one-pixel halo with the tile's
// neighbours (scenarios/halo_exchange.h); GroupNorm statistics are reduced
// over the patch group. The decoder is reference/vae_decoder.h.
//
// Faults, from the patch-parallel VAE bugs of real code:
//   halo_wrong_peer      patch-group ranks used as world ranks (TensorRT-LLM#16999)
//   halo_dropped         a fast path without the halo exchange (sglang#34424)
//   halo_corner_missing  edges exchanged, corners not
//   gn_local_stats       GroupNorm statistics of the tile alone (distrifuser#7)
#include <fmt/format.h>

#include "harness/core/error.h"
#include "harness/run/scenario.h"
#include "reference/vae_decoder.h"
#include "scenarios/vae_patch_decode_run.h"

namespace dc {
namespace {

using ref::VaeSizes;

int tiles(const Mesh& m) { return m.axis_size("ph") * m.axis_size("pw"); }

class VaePatchDecode final : public Scenario {
 public:
  std::string name() const override { return "vae_patch_decode"; }
  std::string summary() const override {
    return "VAE-style decoder (conv3x3, ResNet block with GroupNorm, 2 x nearest upsampling, to RGB) split into "
           "ph x pw tiles per item ('dp' over items): halo exchange before every conv, GroupNorm statistics over "
           "the patch group";
  }
  std::vector<std::string> sizes() const override { return VaeSizes::presets(); }
  std::vector<std::string> mesh_axes() const override { return {"dp", "ph", "pw"}; }
  std::vector<FlagSpec> flags() const override {
    return {{"halo", FlagType::string, "p2p",
             "how halos travel: p2p (point to point with each neighbour) or allgather (every tile's borders "
             "gathered over the patch group); the outputs are bitwise equal",
             {"p2p", "allgather"}},
            {"gn_stats", FlagType::string, "sumsq",
             "GroupNorm statistics over the patch group: sumsq (sums and sums of squares all-reduced) or welford "
             "(each tile's count, mean and M2, merged)",
             {"sumsq", "welford"}},
            {"overlap", FlagType::boolean, "false",
             "post the halo exchange, compute the tile's interior, then its border pixels"}};
  }
  std::vector<FaultSpec> faults() const override {
    return {{"halo_wrong_peer",
             "the neighbour's patch-group rank (row x pw + column) is used as a world rank, as if the patch group "
             "started at rank 0: tiles of the second and later dp groups take their halos from the first group's "
             "tiles, i.e. another item (TensorRT-LLM#16999)",
             "conv_in", {"halo=p2p"}, "dp > 1 and ph x pw > 1",
             [](const Mesh& m) { return m.axis_size("dp") > 1 && tiles(m) > 1; }},
            {"halo_dropped",
             "a fast path replaces the patched convolution and drops its halo exchange: zero padding at every tile "
             "border, seams in the image (sglang#34424)",
             "conv_in", {}, "ph x pw > 1", [](const Mesh& m) { return tiles(m) > 1; }},
            {"halo_corner_missing",
             "the edges are exchanged, the four corner pixels are not (left zero): wrong only at the tiles' corners",
             "conv_in", {}, "ph > 1 and pw > 1",
             [](const Mesh& m) { return m.axis_size("ph") > 1 && m.axis_size("pw") > 1; }},
            {"gn_local_stats",
             "GroupNorm statistics of the local tile only, not reduced over the patch group: each tile normalizes "
             "itself, blockiness (distrifuser#7)",
             "res0/norm1/stats", {}, "ph x pw > 1", [](const Mesh& m) { return tiles(m) > 1; }}};
  }
  std::string default_mesh(int world) const override {
    // From 8 ranks on, two items at once (dp = 2), so that the default mesh
    // shows every fault (halo_wrong_peer needs a second patch group); the
    // tiles as square as powers of two allow, rows first; an odd rest to dp.
    int dp = world >= 8 && world % 2 == 0 ? 2 : 1, ph = 1, pw = 1, rest = world / dp;
    for (int* axis = &ph; rest % 2 == 0; axis = axis == &ph ? &pw : &ph) *axis *= 2, rest /= 2;
    return fmt::format("dp={},ph={},pw={}", dp * rest, ph, pw);
  }
  void check_mesh(const Mesh& mesh, const std::string& size) const override {
    const auto axes = mesh_axes();
    bool ordered = mesh.axes().size() == axes.size();
    for (std::size_t i = 0; ordered && i < axes.size(); ++i) ordered = mesh.axis_index(axes[i]) == int(i);
    if (!ordered)
      input_error("vae_patch_decode needs a mesh with exactly the axes dp, ph, pw (in that order), got {}", mesh.str());
    const VaeSizes z = VaeSizes::preset(size);
    const auto dp = std::size_t(mesh.axis_size("dp"));
    if (z.batch % dp) input_error("vae_patch_decode ({}): dp={} does not divide the batch of {}", size, dp, z.batch);
    auto tiling = [&](const char* axis, std::size_t extent, const char* what) {
      const auto n = std::size_t(mesh.axis_size(axis));
      if (n > extent)
        input_error("vae_patch_decode ({}): {}={} is more than the latent {} of {}: a tile needs at least one pixel "
                    "(the halo is one pixel wide)", size, axis, n, what, extent);
      if (extent % n)
        input_error("vae_patch_decode ({}): {}={} does not split the latent {} of {} into equal tiles", size, axis, n,
                    what, extent);
    };
    tiling("ph", z.height, "height");
    tiling("pw", z.width, "width");
  }

  void run(RunContext& ctx) const override { vae::run_patch_decode(ctx); }
};

}  // namespace

DIFFCHECK_REGISTER_SCENARIO(VaePatchDecode)

}  // namespace dc
