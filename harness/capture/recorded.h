// A run's taps as the comparator sees them, straight from the memory of the
// ranks that recorded them: the same ActivationSet the run file gives when
// read back (same taps, order, attributes and values), so an in-run check and
// a later `diffcheck compare` of the file cannot disagree — but no rank reads
// the file, and no rank holds more than its own pieces and reference boxes
// plus what one round of checking needs.
//
// What moves, per round of chunks (RecordedData::stage, point to point
// between the pairs concerned, no collective): a block's partial-sum pieces to the block's owner, the
// reference boxes under the owner's block to it, and a replica's piece only
// when its hash differs from its replica leader's (equal hashes mean equal
// bits, so the leader's values stand in for the replica's: same statistics,
// nothing sent).
#pragma once
#include <string>

#include "harness/capture/activations.h"
#include "harness/capture/store.h"
#include "harness/capture/tap.h"
#include "harness/core/comm.h"

namespace dc {

// Collective over `world`. `taps` must outlive the set; `source` names the
// run file in reports.
ActivationSet recorded_activations(const Comm& world, const TapRecorder& taps, const RunInfo& info,
                                   const std::string& source);

}  // namespace dc
