// Which microbatches of a pipeline's failing tap are wrong (its `microbatches`
// attribute): each microbatch's rows of every block, summed over partial-sum
// leaders, held to the tap's tolerance against the reference, one microbatch
// of a block at a time (memory: a piece / M).
#pragma once
#include <vector>

#include "harness/capture/activations.h"
#include "harness/check/compare.h"

namespace dc {

// The 0-based microbatches with an element outside the verdict's atol + rtol
// |ref| (or NaN), or whose rel L2 error is over its limit. Empty when the tap
// has no microbatches or no reference. Collective over the data's holders
// when a run's ranks hold it (the first process gets the answer).
std::vector<long> wrong_microbatches(const ActivationSet& set, const TapData& t, const TapVerdict& v);

}  // namespace dc
