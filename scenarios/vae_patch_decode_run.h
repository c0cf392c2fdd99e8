// The sharded run of vae_patch_decode: the decoder of reference/vae_decoder.h
// on this rank's tile, with the halo exchange before every convolution
// (scenarios/halo_exchange.h) and GroupNorm statistics reduced over the patch
// group; each layer tapped; the float64 reference of each item computed by the
// ranks in turn.
#pragma once
#include "harness/core/layout.h"
#include "harness/run/scenario.h"
#include "reference/vae_decoder.h"
#include "scenarios/halo_exchange.h"

namespace dc::vae {

struct DecodeOptions {
  HaloMode halo = HaloMode::p2p;
  bool welford = false;  // gn_stats=welford: (count, mean, M2) merged; else sums and sums of squares
  bool overlap = false;  // interior while the halos travel, borders after
  HaloFaults faults;
  bool local_stats = false;  // fault gn_local_stats
  static DecodeOptions from(const RunContext& ctx);
};

// Where a decode runs: the mesh its halos are addressed in (axes dp, ph, pw:
// this rank holds tile (ph, pw) of item dp), the patch group (the ranks
// holding the other tiles of the same items), how its taps are laid out on the
// run's mesh, and the taps' name prefix and tolerance factor. The scenario
// vae_patch_decode decodes on its own mesh; flux_pipeline decodes its final
// latents on a mesh derived from its own (scenarios/flux_pipeline_run.cpp).
struct DecodePlace {
  const Mesh& tiles;
  const Comm& patch_group;
  Layout tile_layout;   // over [B, C, H, W]
  Layout stats_layout;  // over [B, G, 2], replicated over the patch group
  std::string prefix;
  double tolerance_factor = 1.0;
};

// The sharded decode of this rank's tile of latents [n, C_lat, h, w], every
// layer tapped.
void decode_tiles(RunContext& ctx, const ref::VaeSizes& z, const DecodeOptions& o, const DecodePlace& where,
                  Tensor latents);
// The float64 reference decode of item `item` ([1, C_lat, H, W]), put as row
// `item` of each tap's reference under `prefix`.
void decode_reference(RunContext& ctx, const ref::VaeSizes& z, const ref::VaeDecoderWeights<double>& w,
                      const std::string& prefix, std::size_t item, const RefTensor& latents);

// The scenario vae_patch_decode.
void run_patch_decode(RunContext& ctx);

}  // namespace dc::vae
