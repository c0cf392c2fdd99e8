// The sharded run of vae_patch_decode: the decoder of reference/vae_decoder.h
// on this rank's tile, with the halo exchange before every convolution
// (scenarios/halo_exchange.h) and GroupNorm statistics reduced over the patch
// group; each layer tapped; the float64 reference of each item computed by the
// ranks in turn.
#pragma once
#include "harness/run/scenario.h"
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

void run_patch_decode(RunContext& ctx);

}  // namespace dc::vae
