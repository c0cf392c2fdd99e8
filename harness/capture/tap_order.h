// The order taps are checked and reported in: the order the data reached
// them, so that the first failing tap is where a fault entered.
#pragma once
#include <vector>

#include "harness/capture/activations.h"

namespace dc {

// Without pipeline stages: the `order` attribute, then creation order (taps
// without `order` last).
//
// With stages (any tap carries `stage`), each rank numbers its own taps from
// 0, so `order` alone would interleave the stages and name a fault of stage 0
// at stage 1's first tap. Then the key is, in turn: the step (a `step<t>/`
// name prefix), the phase (activations, then `grad/` taps, then `param/` and
// `param_grad/`), the stage as the data flows (`pipeline_stage` where a rank
// holds several, else the `stage` coordinate; forward from the first stage,
// gradients from the last; taps every rank holds before the stages), and
// only then `order`. A schedule's capture (diffcheck.torch) writes orders
// that already follow this key, so it keeps them.
void sort_taps(std::vector<TapData>& taps);

}  // namespace dc
